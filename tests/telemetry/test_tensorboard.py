"""TensorBoardSink: event files with the shared metric names at the right steps; missing package error."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from morphogen.run_directory import RunDirectoryRefused
from morphogen.telemetry.config import TelemetryConfig
from morphogen.telemetry.events import (
    ALL_ENVS,
    EpisodeCompleted,
    EpochCompleted,
    PPOUpdateCompleted,
    RewardComputed,
    StageTransition,
)
from morphogen.telemetry.sinks import Telemetry
from morphogen.telemetry.tensorboard import TensorBoardSink, logged_steps


def _epoch(epoch: int, accuracy: float, env_id: int = 0) -> EpochCompleted:
    return EpochCompleted(epoch, env_id, 1.0, 0.5, accuracy, 1000, (), "WAIT", True)


def _ppo(round_number: int, kl: float) -> PPOUpdateCompleted:
    return PPOUpdateCompleted(
        epoch=60, env_id=ALL_ENVS, round=round_number, policy_loss=0.1, value_loss=0.2, entropy_loss=-0.3,
        entropy_per_head=(("op", 1.25),), approx_kl=kl, clip_fraction=0.1, explained_variance=0.5,
        grad_norm=1.0, epochs_completed=4, early_stopped=False,
    )  # fmt: skip


def _scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    accumulator = EventAccumulator(str(log_dir))
    accumulator.Reload()
    return {
        tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
        for tag in accumulator.Tags()["scalars"]
    }


def test_sink_writes_scalars_at_cumulative_epochs_and_rounds_one_run_per_env(tmp_path: Path) -> None:
    sink = TensorBoardSink(tmp_path / "tb")
    sink.write(_epoch(1, 50.0))
    sink.write(_epoch(2, 60.0))
    sink.write(EpisodeCompleted(2, 0, 60.0, 1100, 1000, 0, 0, 1.5))
    sink.write(_epoch(1, 55.0))  # the next episode of env 0 continues at step 3
    sink.write(_epoch(1, 40.0, env_id=1))  # env 1 has its own count and its own run
    sink.write(RewardComputed(2, 0, 0.25, (("rent", -0.125),)))
    sink.write(StageTransition(2, 0, "r0c0", "norm", "TRAINING", "BLENDING", "gate"))  # no scalars
    sink.write(_ppo(0, 0.01))
    sink.write(_ppo(1, 0.02))
    sink.close()
    assert sorted(path.name for path in (tmp_path / "tb").iterdir()) == ["env0", "env1", "trainer"]
    env0, env1, trainer = (_scalars(tmp_path / "tb" / run) for run in ("env0", "env1", "trainer"))
    assert env0["episode/val_accuracy"] == [(1, 50.0), (2, 60.0), (3, 55.0)]
    assert env1["episode/val_accuracy"] == [(1, 40.0)]
    assert env0["episode/final_accuracy"] == [(2, 60.0)]
    assert env0["episode/reward/rent"] == [(4, -0.125)]
    assert [step for step, _ in trainer["ppo/approx_kl"]] == [0, 1]
    assert trainer["ppo/approx_kl"][1][1] == pytest.approx(0.02)
    assert trainer["ppo/entropy/op"] == [(0, 1.25), (1, 1.25)]


def test_steps_continue_after_a_resume(tmp_path: Path) -> None:
    """A resumed run opens a new sink; its env epochs must continue after the episodes already logged."""
    with Telemetry(tmp_path, config=TelemetryConfig(tensorboard=True)) as telemetry:
        for episode in range(2):
            telemetry.emit(_epoch(1, 50.0 + episode))
            telemetry.emit(_epoch(2, 60.0 + episode))
            telemetry.emit(EpisodeCompleted(2, 0, 60.0, 1100, 1000, 0, 0, 1.5))
    with Telemetry(tmp_path, config=TelemetryConfig(tensorboard=True)) as telemetry:  # --resume
        telemetry.emit(_epoch(1, 70.0))
    steps = [step for step, _ in _scalars(tmp_path / "tb" / "env0")["episode/val_accuracy"]]
    assert steps == [1, 2, 3, 4, 5], "no step restarts at 1, so TensorBoard drops no point"


def test_epochs_a_resume_replays_are_shown_once(tmp_path: Path) -> None:
    """`run --resume` cuts events.jsonl back to its last saved epoch and replays the rest: TensorBoard must show the
    replayed epochs' points, not those the killed run wrote past the cut, nor both."""
    with Telemetry(tmp_path, config=TelemetryConfig(tensorboard=True)) as telemetry:
        for epoch in (1, 2):
            telemetry.emit(_epoch(epoch, 50.0 + epoch))
            telemetry.emit(_ppo(epoch, 0.01))
        saved = (tmp_path / "events.jsonl").stat().st_size  # the state saved after epoch 2
        for epoch in (3, 4):  # played by the run that is killed
            telemetry.emit(_epoch(epoch, 0.0))
            telemetry.emit(_ppo(epoch, 9.0))
    with (tmp_path / "events.jsonl").open("r+b") as events:
        events.truncate(saved)
    assert logged_steps(tmp_path / "events.jsonl").last_steps == {"env0": 2, "trainer": 2}
    with Telemetry(tmp_path, config=TelemetryConfig(tensorboard=True)) as telemetry:  # --resume
        for epoch in (3, 4):
            telemetry.emit(_epoch(epoch, 70.0 + epoch))
            telemetry.emit(_ppo(epoch, 0.02))
    assert _scalars(tmp_path / "tb" / "env0")["episode/val_accuracy"] == [(1, 51.0), (2, 52.0), (3, 73.0), (4, 74.0)]
    assert [(step, round(kl, 4)) for step, kl in _scalars(tmp_path / "tb" / "trainer")["ppo/approx_kl"]] == [
        (1, 0.01), (2, 0.01), (3, 0.02), (4, 0.02)]


def test_a_run_started_again_from_nothing_shows_only_its_new_points(tmp_path: Path) -> None:
    """`train --resume` of a run stopped before its first checkpoint cuts its whole events.jsonl and plays round 1
    again: TensorBoard must not show the killed round's points beside the new ones at the same steps."""
    with Telemetry(tmp_path, config=TelemetryConfig(tensorboard=True)) as telemetry:  # the round the kill cut short
        for epoch in (1, 2):
            telemetry.emit(_epoch(epoch, 10.0 * epoch))
            telemetry.emit(_ppo(epoch, 9.0))
    for old in (tmp_path / "tb").glob("*/events.out.tfevents.*"):  # written by a process of an earlier second
        parts = old.name.split(".")
        old.rename(old.with_name(".".join([*parts[:3], str(int(parts[3]) - 60), *parts[4:]])))
    (tmp_path / "events.jsonl").write_bytes(b"")  # the resume's cut: nothing was saved
    with Telemetry(tmp_path, config=TelemetryConfig(tensorboard=True)) as telemetry:
        for epoch in (1, 2):
            telemetry.emit(_epoch(epoch, 70.0 + epoch))
            telemetry.emit(_ppo(epoch, 0.02))
    assert _scalars(tmp_path / "tb" / "env0")["episode/val_accuracy"] == [(1, 71.0), (2, 72.0)]
    assert [(step, round(kl, 4)) for step, kl in _scalars(tmp_path / "tb" / "trainer")["ppo/approx_kl"]] == [
        (1, 0.02), (2, 0.02)]


def test_hub_adds_the_sink_when_configured(tmp_path: Path) -> None:
    with Telemetry(tmp_path, config=TelemetryConfig(tensorboard=True)) as telemetry:
        assert [type(sink).__name__ for sink in telemetry.sinks] == ["JsonLinesSink", "TensorBoardSink"]
        telemetry.emit(_epoch(1, 70.0))
    assert _scalars(tmp_path / "tb" / "env0")["episode/val_accuracy"] == [(1, 70.0)]
    with pytest.raises(ValueError, match="give a run_dir"):
        Telemetry(None, config=TelemetryConfig(tensorboard=True))


def test_missing_tensorboard_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry in sys.modules makes the import raise ImportError, as if the package were absent.
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(ImportError, match=r"pip install 'morphogen\[tensorboard\]'"):
        TensorBoardSink(tmp_path / "tb")


def test_a_resume_counts_past_epochs_over_damaged_lines(tmp_path: Path) -> None:
    """The events of a copied run may hold damage: a resumed sink skips it instead of failing the run."""
    with Telemetry(tmp_path, config=TelemetryConfig(tensorboard=False)) as telemetry:
        telemetry.emit(EpisodeCompleted(3, 0, 60.0, 1100, 1000, 0, 0, 1.5))
    with (tmp_path / "events.jsonl").open("a") as events:
        events.write('{"event": "episode_completed", "env_id": "zero", "epoch": 2}\n[1, 2]\n{"episode_completed": \n'
                     '{"event": "episode_completed", "env_id": 0, "epoch": 1e999}\n' + "[" * 100_000 + "\n")
    assert logged_steps(tmp_path / "events.jsonl").epoch_offsets == {0: 3}


def test_a_planted_tb_link_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "tb").symlink_to(elsewhere)
    with pytest.raises(RunDirectoryRefused, match="symbolic link"):
        Telemetry(tmp_path / "run", config=TelemetryConfig(tensorboard=True))
    assert list(elsewhere.iterdir()) == []
