"""`benchmarks/pareto.py`: what it cannot sweep is one line and exit 2 before any worker starts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import pareto


@pytest.mark.parametrize(("argv", "message"), [
    (["--tasks", "digits,my_task:make_task"],
     "--tasks: 'my_task:make_task' is not one of mnist1d, digits: pareto.py sweeps the sizes of those built-in hosts; "
     "to compare a model of your own with other sizes of it, run `morphogen run --task module:function --seeds N "
     "--compare NAME=module:function`"),
    (["--tasks", "cifar10"], "--tasks: 'cifar10' is not one of mnist1d, digits"),  # it needs a data directory
    (["--config", "no_such_preset"], "--config: config 'no_such_preset': not a preset"),
])
def test_a_task_or_config_the_sweep_cannot_use_is_one_line_and_exit_2(
        argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "pareto.jsonl"
    with pytest.raises(SystemExit) as exited:
        pareto.main([*argv, "--results", str(results)])
    out, err = capsys.readouterr()
    assert exited.value.code == 2 and out == "" and not results.exists()
    assert len(err.splitlines()) == 1 and err.startswith(f"pareto.py: error: {message}")
