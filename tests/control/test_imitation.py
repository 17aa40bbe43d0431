"""The imitation warm start: the policy watches the heuristic, then reproduces its decisions."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from morphogen.cli import EXIT_USER_ERROR, main
from morphogen.config import ConfigError, build_config
from morphogen.control.checkpoint import load_checkpoint
from morphogen.control.imitation import ImitationConfig, concatenate_batches
from morphogen.control.trainer import PPOTrainer, TrainConfig, train
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
    expected = trainer.space.encode(Action(op=Op.GERMINATE, slot=trainer.slot_ids[0], blueprint="conv_light"))
    assert batch.actions[2, 0].tolist() == expected
    for episode in trainer.vector.episodes:  # the demonstrated germination took effect in every env
        assert episode.model is not None and next(episode.model.slots()).stage is not Stage.DORMANT


def test_imitation_makes_the_policy_reproduce_the_heuristic(digits: Task) -> None:
    trainer = PPOTrainer(imitation_config(), digits)
    statistics = trainer.imitate()
    assert trainer.state.imitated
    assert statistics.episodes == 2
    assert statistics.action_loss_after < 0.5 * statistics.action_loss_before
    assert statistics.agreement >= 0.9, statistics
    assert 0.0 < statistics.match_probability <= 1.0


def test_concatenate_batches_puts_envs_side_by_side(digits: Task) -> None:
    trainer = PPOTrainer(imitation_config(), digits)
    first = trainer.collect(0).batch
    second = trainer.collect(1).batch
    both = concatenate_batches([first, second])
    assert both.observations.shape[:2] == (10, 4)
    assert both.actions[:, 2:].equal(second.actions) and both.initial_state[0].shape[1] == 4
    assert both.action_masks is not None and first.action_masks is not None
    assert [m.shape[1] for m in both.action_masks] == [4] * len(first.action_masks)
    with pytest.raises(ValueError, match="no demonstrations"):
        concatenate_batches([])


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

