"""What a user can rely on when things go wrong: damaged checkpoints, a full disk, a policy update or a host
that diverges, non-finite numbers in events. Each user-facing failure is one stderr line and a known exit
status (2: the input or the machine, 3: training diverged), and never leaves a broken run behind."""

from __future__ import annotations

import errno
import math
import os
import shutil
from pathlib import Path

import pytest
import torch

import morphogen.control.trainer as trainer_module
from morphogen.cli import EXIT_DIVERGED, EXIT_USER_ERROR, main
from morphogen.control.checkpoint import load_checkpoint
from morphogen.run_directory import CHECKPOINT_NAME, EVENTS_FILENAME
from morphogen.telemetry.sinks import read_events

TINY = ["--envs", "1", "--episode-length", "2", "--max-train-samples", "100", "--hidden-size", "16"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-round training run; tests copy it before changing anything."""
    run = tmp_path_factory.mktemp("robust") / "run"
    assert main(["train", *TINY, "--rounds", "1", "--run-dir", str(run)]) == 0
    return run


def one_line(capsys: pytest.CaptureFixture[str], prefix: str) -> str:
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(prefix), lines[0]
    return lines[0]


def damage(run: Path) -> Path:
    """Change one weight by hand, as a bad disk would (the stored checksum no longer matches)."""
    path = run / CHECKPOINT_NAME
    raw = torch.load(path, weights_only=True)
    name = next(key for key, tensor in raw["policy"].items() if tensor.is_floating_point())
    raw["policy"][name].view(-1)[0] = 1.29e29
    torch.save(raw, path)
    return path


@pytest.mark.parametrize("command", [
    ["train", "--resume", "{run}", "--rounds", "2"],
    ["eval", "--policy", "{run}", "--episodes", "1"],
    ["run", "--policy", "{run}", "--no-baseline", "--run-dir", "{run}-episode"],
], ids=["resume", "eval", "run-policy"])
def test_damaged_checkpoint_is_refused_by_every_command(trained: Path, tmp_path: Path, command: list[str],
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    run = Path(shutil.copytree(trained, tmp_path / "run"))
    path = damage(run)
    before = path.read_bytes()
    capsys.readouterr()
    assert main([part.format(run=run) for part in command]) == EXIT_USER_ERROR
    line = one_line(capsys, f"morphogen {command[0]}: error: checkpoint {path} is damaged")
    assert "checksum" in line
    assert path.read_bytes() == before


def test_a_planted_events_link_is_one_line_on_resume(trained: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """`train --resume` cuts and appends to `events.jsonl`; a link planted there (a copied run) is refused in one
    line and exit 2, not a traceback, and the file it leads to is left as it was."""
    run = Path(shutil.copytree(trained, tmp_path / "run"))
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_bytes((run / EVENTS_FILENAME).read_bytes() + b'{"torn')
    before = elsewhere.read_bytes()
    (run / EVENTS_FILENAME).unlink()
    (run / EVENTS_FILENAME).symlink_to(elsewhere)
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--rounds", "2"]) == EXIT_USER_ERROR
    assert one_line(capsys, "morphogen train: error: ") == (
        f"morphogen train: error: {run / EVENTS_FILENAME} is a symbolic link; morphogen does not write through "
        "links in a run directory (remove it)")
    assert elsewhere.read_bytes() == before


def test_disk_full_while_checkpointing_is_one_line_and_keeps_the_last_checkpoint(
        trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    run = Path(shutil.copytree(trained, tmp_path / "run"))
    before = (run / CHECKPOINT_NAME).read_bytes()

    def no_space(descriptor: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--rounds", "2"]) == EXIT_USER_ERROR
    monkeypatch.undo()
    line = one_line(capsys, f"morphogen train: error: no space left to write {run / CHECKPOINT_NAME}: it needs ")
    assert " bytes" in line
    assert (run / CHECKPOINT_NAME).read_bytes() == before
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint.pt", "config.json", "events.jsonl"]
    # The run goes on once there is room: round 2's events of the failed attempt are cut first.
    assert main(["train", "--resume", str(run), "--rounds", "2"]) == 0
    rounds = [e.round for e in read_events(run / EVENTS_FILENAME) if e.kind == "round_completed"]  # type: ignore[attr-defined]
    assert rounds == [1, 2]


def poison_updates(monkeypatch: pytest.MonkeyPatch, rounds: set[int]) -> None:
    """Make the PPO update of the given rounds (1-based) leave NaN in every policy weight."""
    real_update = trainer_module.ppo_update
    seen = [0]

    def update(policy: torch.nn.Module, *args: object, **kwargs: object) -> object:
        seen[0] += 1
        statistics = real_update(policy, *args, **kwargs)  # type: ignore[arg-type]
        if seen[0] in rounds:
            with torch.no_grad():
                for parameter in policy.parameters():
                    parameter.fill_(math.nan)
        return statistics

    monkeypatch.setattr(trainer_module, "ppo_update", update)


def test_non_finite_policy_update_is_undone_and_never_saved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    run = tmp_path / "run"
    poison_updates(monkeypatch, {2})
    assert main(["train", *TINY, "--rounds", "3", "--run-dir", str(run)]) == 0
    state = load_checkpoint(run)  # refuses NaN: loading at all proves the saved policy is finite
    assert state["round"] == 3
    learning_rates = [group["lr"] for group in state["optimizer"]["param_groups"]]
    assert learning_rates == [pytest.approx(3e-4 / 2)], "the undone update halves the learning rate"
    anomalies = [e for e in read_events(run / EVENTS_FILENAME) if e.kind == "anomaly_detected"]
    assert any("PPO update of round 2 left NaN/Inf" in e.message for e in anomalies)  # type: ignore[attr-defined]
    assert "anomaly non_finite: the PPO update of round 2 left NaN/Inf" in caplog.text, "the console says it too"


def test_policy_diverging_every_round_stops_training_with_exit_3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    poison_updates(monkeypatch, {1, 2, 3, 4})
    assert main(["train", *TINY, "--rounds", "5", "--run-dir", str(run)]) == EXIT_DIVERGED
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("morphogen train: diverged: training stopped in round 3: 3 PPO updates in a row")
    state = load_checkpoint(run)
    assert state["round"] == 2 and all(torch.isfinite(t).all() for t in state["policy"].values()
                                       if t.is_floating_point())


def test_host_that_keeps_diverging_stops_run_with_exit_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "lr.toml"
    config.write_text("[episode.optimizer]\nhost_lr = 1e4\n")
    assert main(["run", "--config", str(config), "--epochs", "8", "--max-train-samples", "100", "--no-baseline",
                 "--run-dir", str(tmp_path / "run")]) == EXIT_DIVERGED
    out, err = capsys.readouterr()
    assert err.startswith("morphogen run: diverged: env 0 epoch 5: training diverged 5 epochs in a row") and \
        len(err.splitlines()) == 1
    assert out.count("ROLLBACK") == 4
    rollbacks = [e for e in read_events(tmp_path / "run" / EVENTS_FILENAME) if e.kind == "governor_rollback"]
    assert len(rollbacks) == 5
