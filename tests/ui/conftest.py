"""Tiny real run directories, made once per test session by the CLI itself (nothing checked in)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from morphogen.cli import main

#: A run whose heuristic germinates early and whose seeds train, blend and hold within 8 epochs.
QUICK_GROWTH = """
max_train_samples = 200
slots = ["r0c0", "r0c1"]
[episode]
max_epochs = 8
[episode.slots]
blend_epochs = 2
[episode.slots.gates]
mode = "permissive"
min_training_epochs = 2
[heuristic]
warmup_epochs = 1
plateau_epochs = 1
plateau_threshold = 100.0
min_training_epochs = 2
"""


def _quiet_main(argv: list[str]) -> None:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    assert code == 0, err.getvalue()


@pytest.fixture(scope="session")
def grown_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`morphogen run` (with its no-growth baseline) in which seeds are germinated, blended and measured."""
    directory = tmp_path_factory.mktemp("grown")
    config = directory / "quick.toml"
    config.write_text(QUICK_GROWTH)
    _quiet_main(["run", "--config", str(config), "--run-dir", str(directory / "run")])
    return directory / "run"


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`morphogen train`: 2 envs, 2 rounds of 4-epoch episodes."""
    directory = tmp_path_factory.mktemp("trained") / "run"
    _quiet_main(["train", "--envs", "2", "--rounds", "2", "--episode-length", "4", "--max-train-samples", "200",
                 "--hidden-size", "16", "--run-dir", str(directory)])
    return directory
