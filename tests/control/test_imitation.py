"""The imitation warm start: the policy watches the heuristic, then reproduces its decisions."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from morphogen.cli import EXIT_USER_ERROR, main
from morphogen.config import ConfigError, build_config
from morphogen.control.checkpoint import load_checkpoint
from morphogen.control.imitation import ImitationConfig, imitation_fit
from morphogen.control.trainer import MixEntry, PPOTrainer, TrainConfig, train
from morphogen.core.lifecycle import GateMode, Stage
from morphogen.data import Task
from morphogen.env.actions import Action, Op
from morphogen.env.snapshot import EpisodeSnapshot
from morphogen.run_directory import CHECKPOINT_NAME
from morphogen.telemetry.config import TelemetryConfig


def imitation_config(**changes: Any) -> TrainConfig:
    base = TrainConfig(n_envs=2, rounds=1, hidden_size=32, max_train_samples=200,
                       telemetry=TelemetryConfig(level="off"), imitation=ImitationConfig(rounds=1, epochs=150))
    return dataclasses.replace(base, episode=dataclasses.replace(base.episode, max_epochs=10), **changes)


class GerminateOnce:
    """Waits, germinates conv_light in the first slot at epoch 2, then waits: an easy demonstration."""

    def __init__(self) -> None:
        self.calls = 0

    def reset(self) -> None:
        self.calls = 0

    def act(self, snapshot: EpisodeSnapshot, masks: Sequence[np.ndarray]) -> Action:
        self.calls += 1
        if snapshot.epoch == 2:
            return Action(op=Op.GERMINATE, slot=snapshot.slots[0].slot_id, blueprint="conv_light")
        return Action()


def test_collect_stores_the_demonstrators_actions(digits: Task) -> None:
    trainer = PPOTrainer(imitation_config(), digits)
    demonstrators = [GerminateOnce(), GerminateOnce()]
    batch = trainer.collect(0, demonstrators=demonstrators).batch
    assert [d.calls for d in demonstrators] == [10, 10]
    ops = batch.actions[..., 0]  # [T, B]
    germinate = int(Op.GERMINATE)
    assert (ops[2] == germinate).all() and (ops[:2] == int(Op.WAIT)).all() and (ops[3:] == int(Op.WAIT)).all()
    vector = trainer.groups[0].vector
    space = vector.episodes[0].action_space
    expected = space.encode(Action(op=Op.GERMINATE, slot=space.slot_ids[0], blueprint="conv_light"))
    assert batch.actions[2, 0].tolist() == expected
    for episode in vector.episodes:  # the demonstrated germination took effect in every env
        assert episode.model is not None and next(episode.model.slots()).stage is not Stage.DORMANT


class SignalRecorder:
    """Waits, recording each epoch whether every empty slot's growth signal was measured."""

    def __init__(self) -> None:
        self.measured: list[bool] = []

    def reset(self) -> None:
        self.measured = []

    def act(self, snapshot: EpisodeSnapshot, masks: Sequence[np.ndarray]) -> Action:
        self.measured.append(all(slot.depth_signal is not None for slot in snapshot.slots))
        return Action()


def test_training_episodes_measure_the_growth_signals_the_policy_and_the_heuristic_read(digits: Task) -> None:
    """Every epoch after the first (nothing is measured before the host has trained) carries every empty slot's
    signal, so the policy sees them and the heuristic it watches chooses by them, as it does in `run`."""
    trainer = PPOTrainer(imitation_config(), digits)
    recorders = [SignalRecorder(), SignalRecorder()]
    trainer.collect(0, demonstrators=recorders)
    assert [recorder.measured for recorder in recorders] == [[False] + [True] * 9] * 2


def test_imitation_makes_the_policy_reproduce_the_heuristic(digits: Task) -> None:
    trainer = PPOTrainer(imitation_config(), digits)
    statistics = trainer.imitate()
    assert trainer.state.imitated
    assert statistics.episodes == 2
    assert statistics.action_loss_after < 0.5 * statistics.action_loss_before
    assert statistics.agreement >= 0.9, statistics
    assert 0.0 < statistics.match_probability <= 1.0


def test_imitation_fits_demonstrations_of_different_lengths_and_slot_counts(digits: Task,
                                                                            mnist1d_three_blocks: Task) -> None:
    """Rounds of a mix differ in episode length and in the number of slots: the fit takes them as they are."""
    mix = (MixEntry("digits", episode_length=6), MixEntry("mnist1d", {"n_blocks": 3}, episode_length=4))
    # Every entry sets its episode length: the run-wide one stays the default, which a mix is not refused beside.
    config = dataclasses.replace(imitation_config(), mix=mix, episode=TrainConfig().episode)
    trainer = PPOTrainer(config, [digits, mnist1d_three_blocks])
    short = trainer.collect(next(i for i in range(50) if trainer.group_of(i).entry.task == "mnist1d"),
                            demonstrators=[GerminateOnce(), GerminateOnce()]).batch
    long = trainer.collect(next(i for i in range(50) if trainer.group_of(i).entry.task == "digits"),
                           demonstrators=[GerminateOnce(), GerminateOnce()]).batch
    assert short.actions.shape[0] == 4 and long.actions.shape[0] == 6
    assert short.observations.slots.shape[2] == 3 and long.observations.slots.shape[2] == 2
    statistics = imitation_fit(trainer.state.agent.policy, [short, long], ImitationConfig(rounds=1, epochs=100))
    assert statistics.episodes == 4
    assert statistics.action_loss_after < 0.5 * statistics.action_loss_before


def test_train_imitates_once_and_a_resumed_run_does_not_repeat_it(digits: Task, tmp_path: Path) -> None:
    trainer = PPOTrainer(imitation_config(rounds=1), digits)
    train(trainer, tmp_path)
    state = load_checkpoint(tmp_path / CHECKPOINT_NAME)
    assert state["imitated"] is True and state["round"] == 1
    resumed = PPOTrainer(imitation_config(rounds=2), digits)
    resumed.load_state_dict(state, tmp_path)
    calls: list[int] = []
    resumed.imitate = lambda on_round=None: calls.append(1)  # type: ignore[method-assign, assignment, return-value]
    train(resumed, tmp_path)
    assert calls == [] and resumed.state.next_round == 2


@pytest.mark.parametrize(("table", "message"), [
    ({"rounds": -1}, "imitation.rounds: must be >= 0, got -1"),
    ({"epochs": 0}, "imitation.epochs: must be >= 1, got 0"),
    ({"learning_rate": 0.0}, "imitation.learning_rate: must be a finite number > 0, got 0.0"),
    ({"entropy_coef": -0.1}, "imitation.entropy_coef: must be a finite number >= 0, got -0.1"),
    ({"teacher": "heuristic"}, "imitation.teacher: unknown key"),
])
def test_bad_imitation_settings_name_the_key(table: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_config(TrainConfig, {"imitation": table})


def test_an_episode_table_changes_only_the_keys_it_names() -> None:
    """`[episode] max_epochs` (or --episode-length) must not reset the training episode's permissive gates."""
    assert TrainConfig().episode.slots.gates.mode is GateMode.PERMISSIVE
    config = build_config(TrainConfig, {"episode": {"max_epochs": 30}})
    assert config.episode.max_epochs == 30 and config.episode.slots.gates.mode is GateMode.PERMISSIVE
    nested = build_config(TrainConfig, {"episode": {"slots": {"gates": {"min_training_epochs": 3}}}})
    assert nested.episode.slots.gates.mode is GateMode.PERMISSIVE
    assert nested.episode.slots.gates.min_training_epochs == 3


def test_cli_imitation_writes_its_statistics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    assert main(["train", "--task", "digits", "--envs", "2", "--rounds", "1", "--episode-length", "6",
          "--hidden-size", "16", "--max-train-samples", "150", "--imitate-rounds", "1", "--telemetry", "off",
          "--run-dir", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "imitation   1  return" in out and "imitation fit: action NLL" in out
    statistics = json.loads((run_dir / "imitation.json").read_text())
    assert statistics["episodes"] == 2 and statistics["action_loss_after"] < statistics["action_loss_before"]


def test_cli_rejects_a_negative_imitation_round_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--imitate-rounds", "-2", "--run-dir", str(tmp_path / "run")]) == EXIT_USER_ERROR
    error = capsys.readouterr().err.strip().splitlines()
    assert error == ["morphogen train: error: imitation.rounds: must be >= 0, got -2"]
    assert not (tmp_path / "run").exists()



IMITATING = ["train", "--task", "digits", "--envs", "2", "--rounds", "1", "--episode-length", "4", "--hidden-size",
             "16", "--max-train-samples", "150", "--imitate-rounds", "1"]


def _timeless_events(path: Path) -> list[dict[str, Any]]:
    """A run's events without what no rerun repeats: wall-clock fields and phase times."""
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return [{key: value for key, value in record.items() if key not in ("time", "seconds")}
            for record in records if record["event"] != "phase_times"]


def test_the_watched_episodes_are_told_from_round_1_in_events_and_report(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The heuristic's episodes come before round 1's in events.jsonl; an `imitation_completed` record (the fit's
    figures, as imitation.json has them) ends them, and `report` shows them apart instead of as round 1."""
    run_dir = tmp_path / "run"
    assert main([*IMITATING, "--run-dir", str(run_dir)]) == 0
    capsys.readouterr()
    records = _timeless_events(run_dir / "events.jsonl")
    kinds = [record["event"] for record in records]
    marker = kinds.index("imitation_completed")
    assert kinds[:marker].count("episode_completed") == 2 and kinds[marker:].count("episode_completed") == 2
    fitted = json.loads((run_dir / "imitation.json").read_text())
    assert {key: records[marker][key] for key in fitted} == fitted and records[marker]["rounds"] == 1

    assert main(["report", str(run_dir)]) == 0
    report = capsys.readouterr().out
    episodes = report[report.index("episodes:"):report.index("epochs of round 1")].splitlines()[2:-1]
    assert [row.split()[0] for row in episodes] == ["imit", "imit", "1", "1"]
    assert f"agreement with the heuristic {100 * fitted['agreement']:.1f}% of steps" in report
    assert "watched the heuristic for 1 round (2 episodes" in report


def test_a_run_stopped_after_watching_the_heuristic_keeps_those_events_on_resume(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Stopped in round 1, after the checkpoint of the imitation warm start: the resume cuts round 1's events but
    keeps the watched episodes' (that checkpoint saw them), and ends with the events of an uninterrupted run."""
    uninterrupted, stopped = tmp_path / "uninterrupted", tmp_path / "stopped"
    assert main([*IMITATING, "--run-dir", str(uninterrupted)]) == 0

    def interrupted(self: PPOTrainer) -> None:
        with (stopped / "events.jsonl").open("a") as events:  # round 1 had begun: a record, then a torn one
            events.write(json.dumps({"time": 1.0, "event": "action_taken"}) + '\n{"time": 2.0, "ev')
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr(PPOTrainer, "run_round", interrupted)
        assert main([*IMITATING, "--run-dir", str(stopped)]) == 130
    assert load_checkpoint(stopped)["round"] == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(stopped)]) == 0
    out = capsys.readouterr().out
    assert "written after the checkpoint of the imitation warm start" in out and "imitation fit" not in out
    assert _timeless_events(stopped / "events.jsonl") == _timeless_events(uninterrupted / "events.jsonl")


def test_a_run_stopped_while_watching_the_heuristic_starts_again_on_resume(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Stopped before the imitation's checkpoint, a run has only its config.json and some events: the resume watches
    the heuristic again and ends with the policy and events of a run that was not stopped."""
    uninterrupted, stopped = tmp_path / "uninterrupted", tmp_path / "stopped"
    assert main([*IMITATING, "--run-dir", str(uninterrupted)]) == 0
    stopped.mkdir()
    (stopped / "config.json").write_bytes((uninterrupted / "config.json").read_bytes())
    first_lines = (uninterrupted / "events.jsonl").read_text().splitlines(keepends=True)[:5]
    (stopped / "events.jsonl").write_text("".join(first_lines) + '{"time": 2.0, "ev')
    capsys.readouterr()
    assert main(["train", "--resume", str(stopped)]) == 0
    out = capsys.readouterr().out
    assert "it starts again from the beginning" in out and "imitation fit" in out
    assert _timeless_events(stopped / "events.jsonl") == _timeless_events(uninterrupted / "events.jsonl")
    expected, got = load_checkpoint(uninterrupted)["policy"], load_checkpoint(stopped)["policy"]
    assert all(torch.equal(expected[name], got[name]) for name in expected)
