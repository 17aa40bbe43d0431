"""The benchmark scripts' command lines: a user's mistake is one line and exit 2 before anything trains, not a
traceback from a worker nor an empty table (`benchmarks/arguments.py`)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import arguments
from morphogen.data.errors import DataError


@pytest.mark.parametrize(("script", "argv", "message"), [
    ("growth", ["--seeds", "0"], "argument --seeds: must be at least 1, got 0"),
    ("growth", ["--tasks", "digits,nosuch"], "--tasks: 'nosuch' is not a built-in task; valid: digits"),
    ("growth", ["--json", "{tmp}"], "argument --json: {tmp} is a directory"),
    ("growth_plans", ["--results", "{tmp}"], "argument --results: {tmp} is a directory"),
    ("pareto", ["--seeds", "0"], "argument --seeds: must be at least 1, got 0"),
    ("pareto", ["--report-only", "--results", "{tmp}/none.jsonl"], "--results: no results file {tmp}/none.jsonl"),
    ("your_model", ["--models", "mlp", "--seeds", "0"], "argument --seeds: must be at least 1, got 0"),
    ("lm_growth", ["--seeds", "0"], "argument --seeds: must be at least 1, got 0"),
    ("measurement_cost", ["--jobs", "0"], "argument --jobs: must be at least 1, got 0"),
    ("overhead", ["--threads", "two"], "argument --threads: expected a whole number >= 1, got 'two'"),
    ("transfer", ["--settings", "digits,nosuch"], "--settings: 'nosuch' is not a setting; valid: digits"),
    ("transfer", ["--cache", "{tmp}"], "argument --cache: {tmp} is a directory"),
    ("transfer", ["--policy", "{tmp}/no_policy"], "no checkpoint at {tmp}/no_policy"),
    ("ppo_vs_sb3", ["--seeds", "0,x"], "--seeds: '0,x' is not comma-separated whole numbers"),
    ("ppo_vs_sb3", ["--ours", "gama=0.9"], "--ours: 'gama=0.9': 'gama' is not a key; valid: n_envs"),
    ("pareto", ["--widths", "4,x"], "argument --widths: expected comma-separated whole numbers, got '4,x'"),
    ("pareto", ["--grow-from", "2-8"], "argument --grow-from: '2-8' is not BLOCKSxWIDTH (as 2x8), each at least 1"),
    ("your_model", ["--fixed-widths", "16,a"], "argument --fixed-widths: expected comma-separated whole numbers"),
    ("distributed", ["--ranks", "0"], "argument --ranks: every number must be at least 1, got '0'"),
    ("overhead", ["--configs", "2,x"], "argument --configs: expected comma-separated whole numbers"),
    ("growth_plans", ["--sweep", "x"], "argument --sweep: expected comma-separated whole numbers"),
    ("growth_plans", ["--epochs", "0"], "argument --epochs: must be at least 1, got 0"),
    ("late_width", ["--late", "40"], "--late and --branch-epoch: epochs from 1 to 29 (training is 30 epochs)"),
    ("late_width", ["--epochs", "4", "--late", "2", "--branch-epoch", "4"],
     "--late and --branch-epoch: epochs from 1 to 3 (training is 4 epochs)"),
    ("jobs", ["--commands", "evaluate"], "--commands: give some of eval, seeds, got 'evaluate'"),
    ("jobs", ["--tasks", "digit"], "--tasks: give some of the built-in tasks digits"),
    ("step_overhead", ["--tasks", "digit"], "--tasks: give some of the built-in tasks digits"),
    ("step_overhead", ["--rounds", "0"], "argument --rounds: must be at least 1, got 0"),
    ("lm_growth", ["--grow-at", "40"], "--grow-at: a fraction of the budget between 0 and 1, got 40"),
    ("lm_growth", ["--lr", "0"], "--lr: must be > 0, got 0"),
])
def test_a_bad_argument_is_one_line_and_exit_2(script: str, argv: list[str], message: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    argv = [part.replace("{tmp}", str(tmp_path)) for part in argv]
    message = message.replace("{tmp}", str(tmp_path))
    monkeypatch.setattr(sys, "argv", [f"{script}.py", *argv])  # the scripts whose main reads sys.argv
    module = importlib.import_module(script)
    with pytest.raises(SystemExit) as exited:
        arguments.run_script(module.main)
    out, err = capsys.readouterr()
    assert exited.value.code == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith(f"{script}.py: error: {message}")
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_a_user_error_from_a_script_is_one_line_and_a_bug_keeps_its_traceback(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["growth.py"])

    def bad_data() -> None:
        raise DataError("unknown task 'x';\n valid task names: digits")

    with pytest.raises(SystemExit) as exited:
        arguments.run_script(bad_data)
    assert exited.value.code == 2
    assert capsys.readouterr().err == "growth.py: error: unknown task 'x'; valid task names: digits\n"

    def bug() -> None:
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        arguments.run_script(bug)
    assert arguments.run_script(lambda: 3) == 3  # what main returns is the exit status of the scripts that exit so



def test_a_reader_that_closes_the_pipe_ends_a_script_quietly(capsys: pytest.CaptureFixture[str]) -> None:
    """`python benchmarks/pareto.py --report-only | head` stops with the shell's SIGPIPE status, no traceback."""
    def table_into_a_closed_pipe() -> None:
        raise BrokenPipeError(32, "Broken pipe")

    with pytest.raises(SystemExit) as exited:
        arguments.run_script(table_into_a_closed_pipe)
    assert exited.value.code == arguments.BROKEN_PIPE == 141
    assert capsys.readouterr().err == ""
