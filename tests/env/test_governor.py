"""Tests for the governor: thresholds worked out by hand, snapshot/rollback semantics, and a NaN epoch in a
real episode that is rolled back while the episode carries on."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import Tensor, nn

import morphogen.env.training as training
from morphogen.core.hosts import CNNHost
from morphogen.core.isolation import IsolationMonitor
from morphogen.core.lifecycle import GateConfig, GateMode, Stage
from morphogen.core.model import MorphogeneticModel
from morphogen.core.slot import SlotConfig
from morphogen.data import Task, load_task
from morphogen.env.actions import Action, Op
from morphogen.env.episode import EpisodeConfig, MorphogenesisEpisode
from morphogen.env.governor import DivergenceError, Governor, GovernorConfig
from morphogen.env.optimizer import OptimizerConfig
from morphogen.env.training import HostAndSeedTrainer
from morphogen.telemetry import events

PERMISSIVE_SLOTS = SlotConfig(gates=GateConfig(mode=GateMode.PERMISSIVE, min_training_epochs=0), blend_epochs=0)


def tiny_model(slots: tuple[str, ...] = ("r0c0", "r0c1")) -> MorphogeneticModel:
    torch.manual_seed(0)
    return MorphogeneticModel(CNNHost(num_classes=3, in_channels=1, n_blocks=2, base_channels=4), slots,
                              PERMISSIVE_SLOTS)


def fossilize(model: MorphogeneticModel, slot_id: str, blueprint: str = "conv_small") -> None:
    """Walk a seed through its whole life with permissive gates (signals recorded by hand)."""
    slot = model.germinate(slot_id, blueprint, epoch=0)
    assert slot.advance(0).passed  # -> TRAINING
    slot.record_signals(gradient_health=1.0, accuracy=50.0)
    while slot.stage is not Stage.HOLDING:  # BLENDING with a 0-epoch ramp, which may auto-advance to HOLDING
        assert slot.advance(0).passed
    slot.record_signals(contribution=2.0)
    assert slot.fossilize(0).passed
    assert slot.stage is Stage.FOSSILIZED


def host_state(model: MorphogeneticModel) -> dict[str, Tensor]:
    return {key: value.clone() for key, value in model.host.state_dict().items()}


def assert_same_state(actual: dict[str, Tensor], expected: dict[str, Tensor]) -> None:
    assert actual.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(actual[key], value), key


# ---------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"sigma": 0.0}, "sigma"),
        ({"sigma": -1.0}, "sigma"),
        ({"sigma": math.nan}, "sigma"),
        ({"window": 1, "min_history": 1}, "min_history"),
        ({"min_history": 1}, "min_history"),
        ({"min_history": 11}, "min_history"),
        ({"absolute_ceiling": 0.0}, "absolute_ceiling"),
        ({"absolute_ceiling": math.nan}, "absolute_ceiling"),
        ({"initial_loss_factor": 0.5}, "initial_loss_factor"),
        ({"initial_loss_factor": math.inf}, "initial_loss_factor"),
        ({"initial_loss_factor": math.nan}, "initial_loss_factor"),
    ],
)
def test_config_rejects_bad_values(overrides: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GovernorConfig(**overrides)  # type: ignore[arg-type]


def test_config_accepts_min_history_equal_to_window() -> None:
    config = GovernorConfig(window=4, min_history=4)
    assert (config.window, config.min_history) == (4, 4)


# ---------------------------------------------------------------- thresholds


def governor_with_losses(losses: list[float], **config: float) -> Governor:
    governor = Governor(tiny_model(), GovernorConfig(**config))  # type: ignore[arg-type]
    governor.losses.extend(losses)
    return governor


def test_threshold_is_the_ceiling_until_min_history_losses() -> None:
    assert governor_with_losses([]).threshold() == 50.0
    assert governor_with_losses([1.0, 1.1]).threshold() == 50.0
    assert governor_with_losses([1.0, 1.1], absolute_ceiling=7.5).threshold() == 7.5


def test_sigma_rule_threshold_by_hand() -> None:
    # [1, 2, 3]: mean 2, population std sqrt(2/3) = 0.816496580927726; 2 + 6 * 0.8164965... = 6.898979485566356.
    assert governor_with_losses([1.0, 2.0, 3.0]).threshold() == pytest.approx(6.898979485566356, rel=1e-12)
    # sigma 3: 2 + 3 * 0.8164965... = 4.449489742783178.
    assert governor_with_losses([1.0, 2.0, 3.0], sigma=3.0).threshold() == pytest.approx(4.449489742783178, rel=1e-12)


def test_flat_window_uses_the_relative_spread_floor() -> None:
    # std 0 -> spread floor 5% of the mean: 0.5 + 6 * 0.025 = 0.65.
    assert governor_with_losses([0.5, 0.5, 0.5]).threshold() == pytest.approx(0.65, rel=1e-12)


def test_tiny_flat_window_uses_the_absolute_spread_floor() -> None:
    # 5% of 0.01 is 0.0005 < 1e-3, so the floor is 1e-3: 0.01 + 6 * 0.001 = 0.016.
    assert governor_with_losses([0.01, 0.01, 0.01]).threshold() == pytest.approx(0.016, rel=1e-12)


def test_absolute_ceiling_caps_the_sigma_rule() -> None:
    # mean 20, std 8.16 -> 69 by the sigma rule, capped at the ceiling.
    assert governor_with_losses([10.0, 20.0, 30.0]).threshold() == 50.0
    assert governor_with_losses([10.0, 20.0, 30.0], absolute_ceiling=30.0).threshold() == 30.0


def test_the_ceiling_scales_with_the_untrained_models_loss_where_that_is_larger() -> None:
    # A classifier's cross-entropy starts near ln(10) = 2.3: 20 x 2.3 = 46 < 50, the ceiling stays 50.
    classifier = governor_with_losses([])
    classifier.observe_validation(2.3, 10.0)
    assert classifier.threshold() == 50.0
    # A regression in raw units starts at 2e4: the ceiling is 20 x 2e4, and such an epoch is healthy.
    regression = governor_with_losses([])
    regression.observe_validation(2e4, 0.0)
    regression.observe_validation(5e3, 0.0)  # only the first (the untrained model's) scales it
    assert regression.threshold() == 4e5
    assert regression.check(1.5e4, epoch=1, val_loss=1.2e4, val_accuracy=0.0) is None
    assert regression.check(4.1e5, epoch=2) is not None


def test_the_scaled_ceiling_survives_state_dict_and_a_state_from_before_it() -> None:
    governor = governor_with_losses([])
    governor.observe_validation(2e4, 0.0)
    restored = governor_with_losses([])
    restored.load_state_dict(governor.state_dict())
    assert restored.ceiling() == 4e5
    older = {key: value for key, value in governor.state_dict().items() if key != "initial_validation_loss"}
    restored = governor_with_losses([])
    restored.load_state_dict(older)
    assert restored.ceiling() == 4e5, "the window's first validation loss stands in for it"


def test_window_keeps_only_the_most_recent_losses() -> None:
    governor = Governor(tiny_model(), GovernorConfig(window=3, min_history=3))
    for loss in (40.0, 1.0, 2.0, 3.0):
        assert governor.check(loss, epoch=1) is None
    assert list(governor.losses) == [1.0, 2.0, 3.0]
    assert governor.threshold() == pytest.approx(6.898979485566356, rel=1e-12)


def test_check_accepts_a_loss_at_the_threshold_and_rejects_one_above() -> None:
    governor = governor_with_losses([0.5, 0.5, 0.5])
    assert governor.check(0.65, epoch=4) is None
    governor = governor_with_losses([0.5, 0.5, 0.5])
    rollback = governor.check(0.651, epoch=4)
    assert rollback is not None
    assert rollback.threshold == pytest.approx(0.65)
    assert "above threshold" in rollback.reason
    assert governor.rollbacks == 1
    assert list(governor.losses) == [0.5, 0.5, 0.5], "a divergent loss must not enter the window"


@pytest.mark.parametrize("loss", [math.nan, math.inf, -math.inf])
def test_non_finite_loss_rolls_back_even_without_history(loss: float) -> None:
    rollback = Governor(tiny_model()).check(loss, epoch=1)
    assert rollback is not None
    assert rollback.reason == "non-finite training loss"


def test_loss_above_the_ceiling_rolls_back_without_history() -> None:
    rollback = Governor(tiny_model(), GovernorConfig(absolute_ceiling=10.0)).check(10.5, epoch=1)
    assert rollback is not None and rollback.threshold == 10.0


# ---------------------------------------------------------------- snapshot and rollback


def test_rollback_restores_last_healthy_state_prunes_live_seeds_and_keeps_fossils() -> None:
    model = tiny_model()
    fossilize(model, "r0c0")
    governor = Governor(model)
    model.germinate("r0c1", "conv_light", epoch=1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.5)
    assert governor.check(1.0, epoch=1) is None  # healthy: this state becomes the snapshot
    good_host = host_state(model)
    good_fossil = {k: v.clone() for k, v in model.slot("r0c0").seed.state_dict().items()}  # type: ignore[union-attr]
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(math.nan)
        norm = next(m for m in model.host.modules() if isinstance(m, nn.BatchNorm2d))
        norm.running_mean.fill_(7.0)  # buffers are restored too, not only parameters

    rollback = governor.check(math.nan, epoch=2)

    assert rollback is not None
    assert rollback.pruned_slots == ("r0c1",)
    assert model.slot("r0c1").stage is Stage.PRUNED and model.slot("r0c1").seed is None
    assert model.slot("r0c0").stage is Stage.FOSSILIZED
    assert_same_state(host_state(model), good_host)
    fossil_now = model.slot("r0c0").seed.state_dict()  # type: ignore[union-attr]
    assert_same_state(dict(fossil_now), good_fossil)


def test_rollback_without_a_healthy_epoch_restores_the_initial_state() -> None:
    model = tiny_model()
    initial = host_state(model)
    governor = Governor(model)
    with torch.no_grad():
        for parameter in model.host.parameters():
            parameter.mul_(3.0)
    assert governor.check(math.inf, epoch=1) is not None
    assert_same_state(host_state(model), initial)


def test_momentum_reset_after_rollback_lets_a_fossilized_seed_train_on() -> None:
    """A NaN epoch leaves NaN momentum in every optimizer, fossilized seeds' included; the reset must clear all."""
    model = tiny_model()
    fossilize(model, "r0c0")
    trainer = HostAndSeedTrainer(model, OptimizerConfig(), IsolationMonitor())
    governor = Governor(model)
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(8, 1, 8, 8, generator=generator)
    targets = torch.randint(0, 3, (8,), generator=generator)
    trainer.train_batch(inputs, targets)
    assert governor.check(trainer.take_epoch_loss().item(), epoch=1) is None

    trainer.train_batch(inputs * math.nan, targets)  # every gradient and momentum buffer becomes NaN
    loss = trainer.take_epoch_loss().item()
    assert governor.check(loss, epoch=2) is not None
    trainer.reset_host_momentum()

    trainer.train_batch(inputs, targets)
    assert math.isfinite(trainer.take_epoch_loss().item())
    assert all(torch.isfinite(p).all() for p in model.parameters())


# ---------------------------------------------------------------- in a real episode


@pytest.fixture(scope="module")
def digits() -> Task:
    return load_task("digits", max_train_samples=200)


def test_nan_epoch_in_an_episode_is_rolled_back_and_the_episode_finishes(
        digits: Task, monkeypatch: pytest.MonkeyPatch) -> None:
    episode = MorphogenesisEpisode(digits, EpisodeConfig(max_epochs=5), slots=["r0c1"])
    episode.reset()
    episode.step(Action(Op.GERMINATE, "r0c1", "conv_light"))
    episode.step(Action())
    assert episode.model is not None and episode.model.slot("r0c1").stage is Stage.TRAINING
    good_host = host_state(episode.model)

    real = episode.trainer.objective
    episode.trainer.objective = dataclasses.replace(
        real, loss=lambda logits, targets: training.task_loss(logits, targets) * math.nan)
    result = episode.step(Action())
    episode.trainer.objective = real

    assert result.rollback is not None and result.rollback.reason == "non-finite training loss"
    assert result.snapshot.rolled_back
    rollbacks = [e for e in episode.history if isinstance(e, events.GovernorRollback)]
    assert len(rollbacks) == 1 and rollbacks[0].epoch == 3 and rollbacks[0].pruned_slots == ("r0c1",)
    assert episode.model.slot("r0c1").seed is None
    assert episode.model.slot("r0c1").stage is Stage.EMBARGOED  # pruned, then the epoch's clock moved it on
    assert_same_state(host_state(episode.model), good_host)
    assert not episode.trainer.host_optimizer.state, "host momentum must be forgotten after a rollback"
    assert math.isfinite(result.snapshot.val_loss)

    losses = []
    while not episode.done:
        result = episode.step(Action())
        assert result.rollback is None
        assert result.snapshot.train_loss is not None
        losses.append(result.snapshot.train_loss)
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)
    assert isinstance(episode.history[-1], events.EpisodeCompleted)

    # The NaN epoch was the seed's (pruned by the rollback), so the seeds' learning rate is backed off.
    assert episode.trainer.seed_lr_scale == 0.5
    assert episode.trainer.host_optimizer.param_groups[0]["lr"] == 0.01


# ---------------------------------------------------------------- validation, back-off, giving up


def test_validation_loss_far_above_its_window_rolls_back() -> None:
    governor = Governor(tiny_model())
    governor.observe_validation(2.3, 10.0)  # the untrained model: ln(10)
    # 5 x the largest healthy validation loss (2.3) is 11.5: 11.5 passes, 11.6 does not.
    assert governor.check(1.0, epoch=1, val_loss=11.5, val_accuracy=20.0) is None
    rollback = governor.check(1.0, epoch=2, val_loss=100.0, val_accuracy=20.0)
    assert rollback is not None and rollback.reason == "validation loss 100 above 57.5"
    assert rollback.loss == 100.0 and rollback.threshold == pytest.approx(57.5)
    assert list(governor.validation_losses) == [2.3, 11.5], "a divergent validation loss must not enter the window"
    assert governor.check(1.0, epoch=3, val_loss=math.nan, val_accuracy=20.0) is not None


def test_accuracy_back_at_chance_after_being_above_it_rolls_back() -> None:
    governor = Governor(tiny_model(), chance_accuracy=10.0)
    # Never above 2 x chance yet: a model still at chance is not diverging, it has not learnt.
    assert governor.check(1.0, epoch=1, val_loss=2.0, val_accuracy=10.0) is None
    assert governor.check(1.0, epoch=2, val_loss=2.0, val_accuracy=20.0) is None  # reached 2 x chance
    assert governor.check(1.0, epoch=3, val_loss=2.0, val_accuracy=12.1) is None  # above 1.2 x chance
    rollback = governor.check(1.0, epoch=4, val_loss=2.0, val_accuracy=12.0)
    assert rollback is not None
    assert rollback.reason == "validation accuracy 12% fell to chance (10%) after reaching 20%"
    assert Governor(tiny_model()).check(1.0, epoch=1, val_loss=2.0, val_accuracy=0.0) is None, \
        "without a chance level the accuracy rule is off"


def test_rollbacks_back_off_what_diverged_and_give_up_after_n_in_a_row() -> None:
    model = tiny_model()
    governor = Governor(model, GovernorConfig(max_consecutive_rollbacks=3))
    model.germinate("r0c1", "conv_light", epoch=0)
    first = governor.check(math.nan, epoch=1)
    assert first is not None and first.backed_off == "seeds" and first.in_a_row == 1 and not first.gave_up
    second = governor.check(math.nan, epoch=2)  # no live seed left: the host is what diverged
    assert second is not None and second.backed_off == "host" and second.in_a_row == 2 and not second.gave_up
    assert governor.check(1.0, epoch=3) is None  # a healthy epoch ends the streak
    assert [governor.check(math.nan, epoch=e).in_a_row for e in (4, 5)] == [1, 2]  # type: ignore[union-attr]
    last = governor.check(math.nan, epoch=6)
    assert last is not None and last.in_a_row == 3 and last.gave_up


def test_back_off_halves_the_host_or_every_seed_learning_rate() -> None:
    model = tiny_model()
    trainer = HostAndSeedTrainer(model, OptimizerConfig(host_lr=0.1, seed_lr=0.2), IsolationMonitor())
    trainer.back_off("host", 0.5)
    assert trainer.host_optimizer.param_groups[0]["lr"] == pytest.approx(0.05)
    model.germinate("r0c1", "conv_light", epoch=0)
    trainer.back_off("seeds", 0.5)
    trainer.train_batch(torch.randn(4, 1, 8, 8), torch.randint(0, 3, (4,)))  # creates the seed's optimizer
    assert trainer.seed_optimizers["r0c1"][1].param_groups[0]["lr"] == pytest.approx(0.1)
    assert trainer.host_optimizer.param_groups[0]["lr"] == pytest.approx(0.05)


def test_moderately_diverging_host_is_caught_by_validation_and_backed_off(digits: Task) -> None:
    """host_lr = 5: the training loss stays under the ceiling, the validation loss explodes."""
    config = EpisodeConfig(max_epochs=3, optimizer=OptimizerConfig(host_lr=5.0),
                           governor=GovernorConfig(max_consecutive_rollbacks=10))
    episode = MorphogenesisEpisode(digits, config, slots=["r0c1"])
    episode.reset()
    result = episode.step(Action())
    assert result.rollback is not None and result.rollback.backed_off == "host"
    assert episode.trainer.host_optimizer.param_groups[0]["lr"] == pytest.approx(2.5)


def test_episode_that_keeps_diverging_raises_divergence_error(digits: Task) -> None:
    config = EpisodeConfig(max_epochs=10, optimizer=OptimizerConfig(host_lr=1e4),
                           governor=GovernorConfig(max_consecutive_rollbacks=2))
    episode = MorphogenesisEpisode(digits, config, slots=["r0c1"])
    episode.reset()
    assert episode.step(Action()).rollback is not None
    with pytest.raises(DivergenceError, match=r"^env 0 epoch 2: training diverged 2 epochs in a row despite rollbacks"):
        episode.step(Action())
    rollbacks = [e for e in episode.history if isinstance(e, events.GovernorRollback)]
    assert len(rollbacks) == 2, "the last rollback is recorded before the episode stops"


@pytest.mark.parametrize(("overrides", "message"), [
    ({"validation_loss_factor": 1.0}, "validation_loss_factor"),
    ({"at_chance_factor": 2.0}, "at_chance_factor"),
    ({"backoff": 0.0}, "backoff"),
    ({"max_consecutive_rollbacks": 0}, "max_consecutive_rollbacks"),
])
def test_new_settings_are_validated(overrides: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GovernorConfig(**overrides)  # type: ignore[arg-type]
