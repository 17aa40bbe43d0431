"""docs/architecture.md is the design of record: every section the code points to exists, and the code
cites no document a reader cannot open."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
CODE = [path for folder in ("src", "tests", "benchmarks") for path in (ROOT / folder).rglob("*.py")]


def anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_section_the_code_points_to_exists() -> None:
    text = DOC.read_text()
    anchors = {anchor(line.lstrip("#")) for line in text.splitlines() if line.startswith("## ")}
    cited = {(path.relative_to(ROOT), name) for path in CODE
             for name in re.findall(r"docs/architecture\.md#([\w-]+)", path.read_text())}
    cited |= {(DOC.relative_to(ROOT), name) for name in re.findall(r"\]\(#([\w-]+)\)", text)}
    assert len(cited) > 20
    missing = sorted(f"{path}: #{name}" for path, name in cited if name not in anchors)
    assert not missing, missing


def test_the_code_cites_no_design_brief_outside_the_repository() -> None:
    citing = [str(path.relative_to(ROOT)) for path in CODE if re.search(r"(DESIGN|STYLE) §", path.read_text())]
    assert not citing, citing
