"""`morphogen run --seeds N`: the run once per seed, then means over the seeds and differences paired by seed."""

import json
from pathlib import Path

import pytest

from morphogen.cli import EXIT_USER_ERROR, main


def test_run_over_seeds_writes_each_seed_and_the_figures_over_them(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--task", "digits", "--max-train-samples", "200", "--epochs", "2", "--seed", "4",
                 "--seeds", "2", "--no-from-scratch", "--threads", "1", "--run-dir", str(tmp_path / "seeds")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("seed 4: grown ") and "\nseed 5: grown " in out
    assert "2 seeds (4, 5): mean ± std over the seeds" in out and "grown - no growth" in out
    assert "grown - from scratch" not in out  # --no-from-scratch
    figures = json.loads((tmp_path / "seeds" / "seeds.json").read_text())
    assert set(figures["seeds"]) == {"4", "5"} and set(figures["differences"]) == {"no growth"}
    for seed in (4, 5):
        assert json.loads((tmp_path / "seeds" / f"seed_{seed}" / "config.json").read_text())["seed"] == seed
    # The same directory again: refused in one line before anything runs.
    assert main(["run", "--epochs", "2", "--seeds", "2", "--run-dir", str(tmp_path / "seeds")]) == EXIT_USER_ERROR
    assert "already holds another run" in capsys.readouterr().err


def test_run_over_no_seeds_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--seeds", "0"]) == EXIT_USER_ERROR
    assert "--seeds must be >= 1, got 0" in capsys.readouterr().err
