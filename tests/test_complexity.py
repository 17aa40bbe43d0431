"""No function of the package is harder to follow than `MAX_COMPLEXITY` allows.

Complexity is radon's cyclomatic complexity, which counts each boolean operator (`and`, `or`) and each
comprehension as a branch, unlike ruff's mccabe check: a condition of five clauses reads like five `if`s.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from radon.complexity import cc_visit
from radon.visitors import Class, Function

SOURCE = Path(__file__).resolve().parents[1] / "src" / "morphogen"
#: Radon's grade C ends at 20; past 15 a function is split into named steps.
MAX_COMPLEXITY = 15
#: Functions allowed above the limit, each with its own ceiling (none today).
ALLOWED: dict[str, int] = {}


def _functions(blocks: list[Function | Class]) -> Iterator[Function]:
    for block in blocks:
        if isinstance(block, Class):
            yield from _functions(list(block.methods))
            continue
        yield block
        yield from _functions(list(block.closures))


def measured() -> dict[str, int]:
    """`path:function` -> cyclomatic complexity, for every function, method and closure of the package."""
    return {f"{path.relative_to(SOURCE)}:{function.name}": function.complexity
            for path in sorted(SOURCE.rglob("*.py"))
            for function in _functions(cc_visit(path.read_text()))}


def test_no_function_is_more_complex_than_the_limit() -> None:
    complexity = measured()
    assert len(complexity) > 500
    too_complex = {name: value for name, value in complexity.items()
                   if value > ALLOWED.get(name, MAX_COMPLEXITY)}
    assert not too_complex, f"split these into named steps (limit {MAX_COMPLEXITY}): {too_complex}"
