"""Every reader of a run directory on damaged, hostile files: `report`, `report --html`, `runs`, the dashboard.

Hypothesis builds event files from a real run's lines and damage of every kind a copied run directory
can hold (torn and huge lines, deep nesting, unknown kinds, wrong types, non-finite and extreme
numbers, Rich markup and terminal escapes in strings) plus damaged `config.json`/`summary.json`. The
oracle is independent of the readers: each run must end with exit 0 or 2, at most one stderr line,
no raw control character on stdout, within a time cap (hypothesis' deadline) and a memory cap
(traced Python allocations).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import shutil
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from morphogen.cli import EXIT_USER_ERROR, main
from morphogen.run_directory import CONFIG_FILENAME, EVENTS_FILENAME, SUMMARY_FILENAME
from morphogen.ui.dashboard import Dashboard
from morphogen.ui.run_files import MAX_LINE_BYTES

#: Traced Python memory one reader may allocate on one generated run (the files are at most a few MB).
MEMORY_CAP_BYTES = 256 * 2**20
#: Seconds one generated example may take (all readers together).
DEADLINE_MS = 60_000

HOSTILE_STRINGS = ["[/x]", "[bold red]x", "\x1b]52;c;aGVsbG8=\x07", "\x1b[2J\x1b[H", "line\nbreak", "carriage\rreturn",
                   "\u202eevil", "", "x" * 5_000, "<script>alert(1)</script>"]
EXTREME_NUMBERS: list[Any] = [1e308, -1e308, 10**400, -(10**30), 2**63, 0, -1, 5e-324, "NaN", "Infinity", "-Infinity",
                              None, True, [], {}]


HUGE_LINE = "<a line past MAX_LINE_BYTES>"
"""Stands for a line longer than the readers read (written out by `write_run`; short in failure reports)."""


def fuzz_settings(examples: int) -> Any:
    """Hypothesis settings of these tests: `examples` runs, each within `DEADLINE_MS` (fixtures are per session)."""
    return settings(max_examples=examples, deadline=DEADLINE_MS,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large])


def _mutate(record: dict[str, Any], key: str, value: Any) -> str:
    changed = dict(record)
    changed[key] = value
    return json.dumps(changed)


def damaged_line(records: list[dict[str, Any]]) -> st.SearchStrategy[str]:
    """One line: a real record, or one of the kinds of damage in the module docstring."""
    record = st.sampled_from(records)
    keys = record.flatmap(lambda r: st.tuples(st.just(r), st.sampled_from(sorted(r))))
    return st.one_of(
        record.map(json.dumps),
        record.flatmap(lambda r: st.integers(1, max(1, len(json.dumps(r)) - 1)).map(lambda cut: json.dumps(r)[:cut])),
        st.integers(1, 3_000).map(lambda depth: "[" * depth * 100),
        st.just(HUGE_LINE),
        keys.flatmap(lambda pair: st.sampled_from(EXTREME_NUMBERS + HOSTILE_STRINGS).map(
            lambda value: _mutate(pair[0], pair[1], value))),
        keys.flatmap(lambda pair: st.sampled_from(HOSTILE_STRINGS).map(
            lambda text: _mutate(pair[0], pair[1], text) if isinstance(pair[0][pair[1]], str)
            else _mutate(pair[0], "event", text))),
        st.sampled_from(["", "null", "[]", '"text"', "{}", '{"event": "from_the_future", "time": 1}', "\x00\xff",
                         '{"time": 1e999, "event": "epoch_completed"}']),
    )


def damaged_json_file() -> st.SearchStrategy[str | None]:
    """A config.json or summary.json: kept (None), or replaced by damage."""
    return st.one_of(st.none(), st.sampled_from([
        "", "{not json", "[]", "[" * 100_000, '{"task": "[/bad]\\u001b[2J", "seed": 1e999, "rounds": "many"}',
        '{"grown": {"final_accuracy": "high", "parameters": 1e999}, "baseline": []}',
        '{"task": ' + '{"a": ' * 500 + "1" + "}" * 500 + "}", '{"episode": {"max_epochs": -5}, "n_envs": 1e9}',
    ]))


def run_reader(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    tracemalloc.start()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MEMORY_CAP_BYTES, f"{argv[0]} allocated {peak:,} bytes"
    return code, out.getvalue(), err.getvalue()


def check_outcome(argv: list[str]) -> None:
    code, out, err = run_reader(argv)
    assert code in (0, EXIT_USER_ERROR), (code, err)
    assert len(err.splitlines()) <= 1, err
    assert "Traceback" not in err
    if code == 0:
        assert not any(ord(character) < 32 and character != "\n" for character in out), "a raw control character"


def _records(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / EVENTS_FILENAME).read_text().splitlines()]


@pytest.fixture(scope="module")
def real_records(grown_run: Path, trained_run: Path) -> list[dict[str, Any]]:
    return _records(grown_run) + _records(trained_run)


def write_run(directory: Path, source: Path, lines: list[str], config: str | None, summary: str | None) -> Path:
    shutil.copytree(source, directory)
    huge = json.dumps({"time": 1.0, "event": "epoch_completed", "action": "x" * (MAX_LINE_BYTES + 10)})
    (directory / EVENTS_FILENAME).write_text("\n".join(huge if line == HUGE_LINE else line for line in lines) + "\n")
    for name, text in ((CONFIG_FILENAME, config), (SUMMARY_FILENAME, summary)):
        if text is not None:
            (directory / name).write_text(text)
    return directory


@fuzz_settings(25)
@given(data=st.data())
def test_report_html_and_runs_end_in_exit_0_or_one_line(grown_run: Path, real_records: list[dict[str, Any]],
                                                         data: st.DataObject) -> None:
    lines = data.draw(st.lists(damaged_line(real_records), min_size=1, max_size=40), label="lines")
    config, summary = data.draw(damaged_json_file(), label="config"), data.draw(damaged_json_file(), label="summary")
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch) / "runs"
        run = write_run(root / "damaged", grown_run, lines, config, summary)
        shutil.copytree(grown_run, root / "intact")
        check_outcome(["report", str(run)])
        check_outcome(["report", str(run), "--html", "--output", str(Path(scratch) / "report.html")])
        check_outcome(["runs", str(root)])
        code, out, _ = run_reader(["runs", str(root)])
        assert code == 0 and "intact" in out, "a damaged run never hides the others"


@fuzz_settings(6)
@given(data=st.data())
def test_the_dashboard_shows_damaged_runs_to_the_end(grown_run: Path, real_records: list[dict[str, Any]],
                                                     data: st.DataObject) -> None:
    lines = data.draw(st.lists(damaged_line(real_records), min_size=1, max_size=30), label="lines")
    config = data.draw(damaged_json_file(), label="config")

    async def drive(run: Path) -> int | None:
        app = Dashboard(run, poll_seconds=0.05)
        async with app.run_test(size=(160, 40)) as pilot:
            await pilot.pause(0.3)
            await pilot.press("d")
            await pilot.pause(0.1)
            await pilot.press("escape")
            await pilot.press("q")
        return app.return_code

    with tempfile.TemporaryDirectory() as scratch:
        run = write_run(Path(scratch) / "run", grown_run, lines, config, None)
        assert asyncio.run(drive(run)) == 0
