"""The PPO round loop: rollouts of whole episodes, checkpoints every round, and exact resumption."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from morphogen.control.checkpoint import load_checkpoint
from morphogen.control.ppo import PPOConfig, PPOStatistics
from morphogen.control.trainer import (
    ROUND_HEADER,
    MixEntry,
    PPOTrainer,
    RoundSummary,
    TrainConfig,
    format_round,
    train,
)
from morphogen.data import Task, load_task
from morphogen.env.actions import HEADS
from morphogen.run_directory import CHECKPOINT_NAME
from morphogen.telemetry.anomalies import Anomaly
from morphogen.telemetry.config import TelemetryConfig
from morphogen.telemetry.sinks import Telemetry


def tiny_config(**changes: Any) -> TrainConfig:
    base = TrainConfig(n_envs=2, rounds=3, hidden_size=16, max_train_samples=200,
                       telemetry=TelemetryConfig(level="off"))
    return dataclasses.replace(base, episode=dataclasses.replace(base.episode, max_epochs=3), **changes)


def policy_parameters(trainer: PPOTrainer) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in trainer.state.agent.policy.state_dict().items()}


def test_config_rejects_impossible_settings() -> None:
    with pytest.raises(ValueError, match="n_envs must be >= 1, got 0"):
        TrainConfig(n_envs=0)
    with pytest.raises(ValueError, match="rounds must be >= 1, got 0"):
        TrainConfig(rounds=0)
    with pytest.raises(ValueError, match=r"ppo.minibatches \(3\) cannot exceed n_envs \(2\)"):
        TrainConfig(n_envs=2, ppo=PPOConfig(minibatches=3))


def test_settings_beside_the_mix_that_it_plays_or_that_keep_their_default_pass() -> None:
    """The shipped policy's config: an episode length every entry plays, and the task's default host resolved."""
    episode = dataclasses.replace(TrainConfig().episode, max_epochs=30)
    config = TrainConfig(task="digits", host={"n_blocks": 2, "base_channels": 8, "kernel_size": 3}, episode=episode,
                         mix=(MixEntry("digits", episode_length=30), MixEntry("mnist1d", episode_length=30)))
    assert [entry.episode_length for entry in config.training_mix()] == [30, 30]
    TrainConfig(episode=episode, max_train_samples=100, mix=(MixEntry("digits", episode_length=30),
                                                             MixEntry("mnist1d", max_train_samples=50)))


def test_mix_weights_whose_sum_overflows_draw_by_their_ratio(digits: Task) -> None:
    """Each weight is finite (accepted), their sum is not: rounds still draw entries, in their 1:1 ratio."""
    mix = (MixEntry("digits", weight=1e308), MixEntry("digits", {"base_channels": 4}, weight=1e308))
    tasks = [digits, load_task("digits", max_train_samples=200, host={"base_channels": 4})]
    trainer = PPOTrainer(tiny_config(mix=mix), tasks)
    drawn = [trainer.group_of(index).entry.host["base_channels"] for index in range(40)]
    assert set(drawn) == {8, 4}
    reference = PPOTrainer(tiny_config(mix=tuple(dataclasses.replace(entry, weight=1.0) for entry in mix)), tasks)
    assert drawn == [reference.group_of(index).entry.host["base_channels"] for index in range(40)]


def test_resumed_run_equals_the_uninterrupted_run(digits: Task, tmp_path: Path) -> None:
    uninterrupted = PPOTrainer(tiny_config(rounds=3), digits)
    after_two = None
    for _ in range(3):
        uninterrupted.run_round()
        if uninterrupted.state.next_round == 2:
            after_two = policy_parameters(uninterrupted)
    assert after_two is not None

    # Stop after 2 rounds (a run configured for 2), then continue to 3 in a fresh trainer from the file.
    first_leg = PPOTrainer(tiny_config(rounds=2), digits)
    checkpointed_rounds: list[int] = []
    train(first_leg, tmp_path,
          on_round=lambda summary: checkpointed_rounds.append(load_checkpoint(tmp_path)["round"]))
    assert checkpointed_rounds == [1, 2], "a checkpoint is written after every round, before on_round"
    resumed = PPOTrainer(tiny_config(rounds=3), digits)
    resumed.load_state_dict(load_checkpoint(tmp_path / CHECKPOINT_NAME), tmp_path)
    assert resumed.state.next_round == 2
    summaries = train(resumed, tmp_path)
    assert [s.round for s in summaries] == [3]

    expected, got = policy_parameters(uninterrupted), policy_parameters(resumed)
    assert expected.keys() == got.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0.0, atol=1e-6, msg=name)
    changed = [name for name in expected if not torch.equal(expected[name], after_two[name])]
    assert changed, "round 3 must have changed the policy, or the comparison above proves nothing"
    assert load_checkpoint(tmp_path)["round"] == 3


def test_collect_fills_whole_episodes_and_one_round_updates(digits: Task, tmp_path: Path) -> None:
    config = tiny_config(rounds=1, n_envs=2)
    trainer = PPOTrainer(config, digits)
    before = policy_parameters(trainer)
    rollout = trainer.collect(0)
    batch, collected = rollout.batch, rollout.summary
    steps, envs = config.episode_length, config.n_envs
    assert batch.actions.shape == (steps, envs, len(HEADS))
    assert batch.episode_starts[0].all() and not batch.episode_starts[1:].any()
    assert torch.isfinite(batch.advantages).all() and torch.isfinite(batch.returns).all()
    assert 0.0 <= collected.mean_final_accuracy <= 100.0
    normalizer = trainer.state.agent.observation_normalizer
    assert normalizer.globals.count.item() == pytest.approx(steps * envs + normalizer.globals.epsilon), \
        "one update per observation"
    slots = len(trainer.groups[0].action_space.slot_ids)  # every slot of every observation, once
    assert normalizer.slots.count.item() == pytest.approx(steps * envs * slots + normalizer.slots.epsilon)

    summaries = train(trainer, tmp_path)
    assert len(summaries) == 1 and summaries[0].round == 1 and trainer.state.next_round == 1
    assert any(not torch.equal(before[k], v) for k, v in policy_parameters(trainer).items())
    summary = summaries[0]
    assert summary.collect_seconds > 0 and summary.update_seconds > 0
    assert summary.seconds == pytest.approx(summary.collect_seconds + summary.update_seconds, rel=1e-6)
    assert len(format_round(summary)) == len(ROUND_HEADER) <= 120, "round rows fit a 120-column terminal"


def test_round_rows_sit_under_a_header_in_words_a_newcomer_reads() -> None:
    """No `kl`/`vloss`/`ev`/`fossil` to decode: the header says what each figure is, as `report`'s table does."""
    statistics = PPOStatistics(policy_loss=0.0, value_loss=0.1234, entropy_loss=0.0, approx_kl=0.0123,
                               clip_fraction=0.0, explained_variance=-0.25, entropy_per_head=(), grad_norm=0.0,
                               entropy_coef=0.0, epochs_completed=1, early_stopped=False)
    summary = RoundSummary(round=12, mean_return=-1.5, mean_final_accuracy=85.0, mean_parameters_added=123456,
                           fossilized=1.5, pruned=0.5, statistics=statistics, seconds=123.4, collect_seconds=100.0,
                           update_seconds=23.4)
    assert not ROUND_HEADER.startswith("round")
    assert ROUND_HEADER.split() == ["return", "final", "score", "params", "added", "fossilized", "pruned", "approx",
                                    "KL", "value", "loss", "explained", "variance", "seconds"]
    row = format_round(summary)
    assert row.split() == ["round", "12", "-1.500", "acc", "85.00%", "123,456", "1.5", "0.5", "0.0123", "0.1234",
                           "-0.25", "123.4"]
    assert len(row) == len(ROUND_HEADER) <= 120
    assert format_round(dataclasses.replace(summary, setting="digits"), setting=True).endswith("  digits")


def test_value_head_learns_standardized_returns(digits: Task) -> None:
    trainer = PPOTrainer(tiny_config(rounds=1), digits)
    batch = trainer.collect(0).batch
    normalizer = trainer.state.value_normalizer
    # One round of returns is all the normalizer has seen, so the batch's targets come out standardized...
    assert abs(batch.returns.mean().item()) < 0.05
    assert abs(batch.returns.std(correction=0).item() - 1.0) < 0.05
    # ...and mapping them back gives returns in reward units again (GAE ran on de-standardized values).
    real = normalizer.denormalize(batch.returns)
    assert not torch.allclose(real, batch.returns)


def test_detector_and_escalation_state_survive_attaching_the_runs_telemetry(digits: Task, tmp_path: Path) -> None:
    """`train --resume` loads the checkpoint, then attaches the run's telemetry: the restored state must stay."""
    source = PPOTrainer(tiny_config(telemetry=TelemetryConfig(level="normal")), digits)
    source.attach_telemetry(Telemetry(None, config=TelemetryConfig(level="normal")))
    source.detector.check(gradient_norms={"env0/host": 1.5})
    source.telemetry.report_anomalies([Anomaly("kl_spike", "m", "a")], epoch=3)  # escalates to debug
    state = source.state_dict()
    assert state["telemetry"]["levels"]["epochs_left"] > 0 and state["anomaly_detector"]["gradient_averages"]

    resumed = PPOTrainer(tiny_config(telemetry=TelemetryConfig(level="normal")), digits)
    resumed.load_state_dict(state, tmp_path)
    resumed.attach_telemetry(Telemetry(None, config=TelemetryConfig(level="normal")), tmp_path)
    again = resumed.state_dict()
    assert again["anomaly_detector"] == state["anomaly_detector"]
    assert again["telemetry"] == state["telemetry"] and resumed.telemetry.level == "debug"


def test_a_policy_that_follows_the_advice_is_not_reported_as_collapsed(digits: Task, tmp_path: Path) -> None:
    # The op head adds the heuristic's advice to the advised op: a new policy picks it with probability ~0.95,
    # by design. That is what the advice says, not one op always: no entropy_collapse anomaly for that head.
    config = dataclasses.replace(tiny_config(rounds=1), telemetry=TelemetryConfig(level="normal"))
    trainer = PPOTrainer(config, digits)
    reported: list[Anomaly] = []
    trainer.attach_telemetry(Telemetry(None, config=TelemetryConfig(level="normal")))
    original = trainer.telemetry.report_anomalies
    trainer.telemetry.report_anomalies = lambda anomalies, **where: (  # type: ignore[method-assign]
        reported.extend(anomalies), original(anomalies, **where))
    train(trainer, tmp_path)
    assert trainer.state.next_round == 1
    assert not [a for a in reported if a.kind == "entropy_collapse" and "head 'op'" in a.message]
