"""Seed lifecycle: a hypothesis state machine over a SeedSlot, the gates, and the embargo clock.

The state machine keeps its own model of what each call must do (docs/architecture.md#lifecycle,
#alpha-and-blends) and checks the slot against it after every step: a call either makes legal transitions
or raises and changes nothing.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from morphogen.core.alpha import AlphaCurve, AlphaMode
from morphogen.core.blend import BlendKind
from morphogen.core.blueprints import BlueprintKind, UnknownBlueprintError, blueprint_names, get_blueprint
from morphogen.core.lifecycle import (
    LEGAL_TRANSITIONS,
    PRUNABLE_STAGES,
    RUNNING_STAGES,
    SEED_STAGES,
    GateConfig,
    GateMode,
    IllegalTransitionError,
    SeedLifecycle,
    Stage,
)
from morphogen.core.slot import SeedSlot, SlotConfig

S = Stage
EMPTY_STAGES = frozenset({S.DORMANT, S.PRUNED, S.EMBARGOED, S.RESETTING})
CNN_BLUEPRINTS = tuple(name for name in blueprint_names("cnn")  # a lone slot has no layers around it to widen,
                       if get_blueprint("cnn", name).kind is BlueprintKind.DEEPEN  # nor a layer before it to copy
                       and not get_blueprint("cnn", name).copies_layer_before)


def test_transition_table_is_the_design_table() -> None:
    assert {
        S.DORMANT: {S.GERMINATED},
        S.GERMINATED: {S.TRAINING, S.PRUNED},
        S.TRAINING: {S.BLENDING, S.PRUNED},
        S.BLENDING: {S.HOLDING, S.PRUNED},
        S.HOLDING: {S.FOSSILIZED, S.BLENDING, S.PRUNED},
        S.FOSSILIZED: set(),
        S.PRUNED: {S.EMBARGOED},
        S.EMBARGOED: {S.RESETTING},
        S.RESETTING: {S.DORMANT},
    } == LEGAL_TRANSITIONS
    assert set(Stage) == SEED_STAGES | EMPTY_STAGES and not SEED_STAGES & EMPTY_STAGES
    assert {S.GERMINATED, S.TRAINING, S.BLENDING, S.HOLDING} == PRUNABLE_STAGES


# ---------------------------------------------------------------------------- the model of the spec
@dataclasses.dataclass
class ExpectedSignals:
    """What the slot's signals must be, tracked independently of the slot."""

    accuracy: float | None = None
    stage_start_accuracy: float | None = None
    gradient_health: float | None = None
    gradient_ratio: float | None = None
    contribution: float | None = None


def spec_gate(target: Stage, slot: SeedSlot, signals: ExpectedSignals, config: GateConfig,
              epochs_in_stage: int) -> bool:
    """The gates of docs/architecture.md#lifecycle, written from its list (not from the implementation)."""
    strict = config.mode is GateMode.STRICT
    if target is S.TRAINING:
        return slot.stage is S.GERMINATED
    if target is S.BLENDING:
        health, ratio = signals.gradient_health, signals.gradient_ratio
        if epochs_in_stage < config.min_training_epochs or health is None or health < config.min_gradient_health:
            return False
        if not strict:
            return True
        # Strict mode reads the seed's shadow contribution: what blending it in would add.
        shadow = signals.contribution
        if shadow is None or shadow < config.strict_min_improvement:
            return False
        return ratio is not None and ratio >= config.strict_min_gradient_ratio
    if target is S.HOLDING:
        return slot.alpha.alpha == 1.0 and not slot.alpha.ramping
    assert target is S.FOSSILIZED
    contribution, health = signals.contribution, signals.gradient_health
    if contribution is None or health is None or health < config.min_gradient_health:
        return False
    return not strict or contribution >= config.strict_min_contribution


def snapshot(slot: SeedSlot) -> dict[str, Any]:
    """Everything a refused call must leave untouched (modules compare by identity)."""
    return {
        "lifecycle": slot.lifecycle.state_dict(),
        "alpha": slot.alpha.state_dict(),
        "alpha_value": slot.alpha_value.item(),
        "signals": dataclasses.asdict(slot.signals),
        "blueprint": (slot.blueprint, dict(slot.blueprint_options), slot.blend_kind, slot.blend_epochs),
        "modules": (slot.seed, slot.blend),
        "trainable": [p.requires_grad for p in slot.seed_parameters()],
        "records": len(slot.transitions),
    }


signal_values = st.one_of(st.none(), st.sampled_from([0.0, 0.05, 0.5, 0.69, 0.7, 0.9, 1.0]), st.floats(0.0, 1.0))
accuracy_values = st.one_of(st.none(), st.floats(0.0, 100.0))
contribution_values = st.one_of(st.none(), st.sampled_from([-2.0, 0.0, 0.99, 1.0, 3.0]), st.floats(-5.0, 5.0))


class SlotLifecycleMachine(RuleBasedStateMachine):
    """Random lifecycle calls on one slot, each checked against the spec model above."""

    @initialize(
        mode=st.sampled_from(GateMode),
        min_training_epochs=st.integers(0, 3),
        auto_advance=st.sets(st.sampled_from([S.TRAINING, S.BLENDING, S.HOLDING])),
        blend_epochs=st.integers(0, 3),
        embargo_epochs=st.sampled_from([0, 1, 2]),
    )
    def build(self, mode: GateMode, min_training_epochs: int, auto_advance: set[Stage], blend_epochs: int,
              embargo_epochs: int) -> None:
        gates = GateConfig(mode=mode, min_training_epochs=min_training_epochs, auto_advance=frozenset(auto_advance))
        self.config = SlotConfig(blend_epochs=blend_epochs, embargo_epochs=embargo_epochs, gates=gates)
        self.slot = SeedSlot("r0c0", 8, "cnn", self.config)
        self.expected = ExpectedSignals()
        self.epoch = 0
        self.was_fossilized = False

    # ------------------------------------------------------------------ helpers
    def call(self, action: Any, *errors: type[Exception]) -> tuple[Any, Exception | None, Stage]:
        """Run `action`; a refusal must raise one of `errors` and change nothing, a success legal moves."""
        before = snapshot(self.slot)
        stage_before = self.slot.stage
        try:
            result = action()
        except (IllegalTransitionError, ValueError) as error:
            assert isinstance(error, errors), f"unexpected {type(error).__name__}: {error}"
            assert snapshot(self.slot) == before
            return None, error, stage_before
        self.follow_transitions(stage_before)
        return result, None, stage_before

    def follow_transitions(self, stage_before: Stage) -> None:
        """Check the transition records chain legally and update the expected signals as each move does."""
        stage = stage_before
        for record in self.slot.drain_transitions():
            assert record.from_stage is stage
            assert record.to_stage in LEGAL_TRANSITIONS[stage], f"{stage.name} -> {record.to_stage.name}"
            stage = record.to_stage
            self.expected.stage_start_accuracy = self.expected.accuracy
            if stage in (S.GERMINATED, S.PRUNED):  # a new seed, or none: its measurements start over
                self.expected.gradient_health = self.expected.gradient_ratio = self.expected.contribution = None
            if stage is S.BLENDING and record.from_stage is S.TRAINING:  # the shadow is no longer what counts
                self.expected.contribution = None
        assert stage is self.slot.stage

    def gate(self, target: Stage, epochs_in_stage: int | None = None) -> bool:
        epochs = self.slot.lifecycle.epochs_in_stage if epochs_in_stage is None else epochs_in_stage
        return spec_gate(target, self.slot, self.expected, self.config.gates, epochs)

    # ------------------------------------------------------------------ rules
    @rule(blueprint=st.sampled_from([*CNN_BLUEPRINTS, "lora", "no_such_seed"]),
          blend=st.one_of(st.none(), st.sampled_from(BlendKind)),
          blend_epochs=st.one_of(st.none(), st.integers(-1, 3)))
    def germinate(self, blueprint: str, blend: BlendKind | None, blend_epochs: int | None) -> None:
        errors: list[type[Exception]] = []
        if self.slot.stage is not S.DORMANT:
            errors.append(IllegalTransitionError)
        if blueprint not in CNN_BLUEPRINTS:
            errors.append(UnknownBlueprintError)
        if blend_epochs is not None and blend_epochs < 0:
            errors.append(ValueError)
        _, error, _ = self.call(lambda: self.slot.germinate(blueprint, self.epoch, blend=blend,
                                                            blend_epochs=blend_epochs), *errors)
        assert (error is None) == (not errors)
        if error is None:
            assert self.slot.stage is S.GERMINATED and self.slot.blueprint == blueprint
            assert self.slot.lifecycle.seed_age == 0 and self.slot.alpha.alpha == 0.0
            assert self.slot.blend_kind is (blend or self.config.blend)
            assert self.slot.blend_epochs == (self.config.blend_epochs if blend_epochs is None else blend_epochs)

    @rule()
    def advance(self) -> None:
        stage = self.slot.stage
        target = {S.GERMINATED: S.TRAINING, S.TRAINING: S.BLENDING, S.BLENDING: S.HOLDING,
                  S.HOLDING: S.FOSSILIZED}.get(stage)
        expected_pass = target is not None and self.gate(target)
        result, error, _ = self.call(lambda: self.slot.advance(self.epoch), IllegalTransitionError)
        assert (error is not None) == (target is None)
        if error is None:
            assert result.passed == expected_pass, result.reason
            if not expected_pass:
                assert self.slot.stage is stage
            elif target is S.BLENDING:
                # A zero-epoch ramp is over at once: HOLDING follows if configured.
                snapped = self.slot.blend_epochs == 0 and S.HOLDING in self.config.gates.auto_advance
                assert self.slot.stage is (S.HOLDING if snapped else S.BLENDING)
            else:
                assert self.slot.stage is target

    @rule()
    def fossilize(self) -> None:
        holding = self.slot.stage is S.HOLDING
        expected_pass = holding and self.gate(S.FOSSILIZED)
        result, error, _ = self.call(lambda: self.slot.fossilize(self.epoch), IllegalTransitionError)
        assert (error is None) == holding
        if error is None:
            assert result.passed == expected_pass, result.reason
            assert self.slot.stage is (S.FOSSILIZED if expected_pass else S.HOLDING)

    @rule(draw=st.integers(0, 3))
    def prune(self, draw: int) -> None:
        if draw:  # prune one time in four, so that seeds live long enough to reach the later stages
            return
        prunable = self.slot.stage in (S.GERMINATED, S.TRAINING, S.BLENDING, S.HOLDING)
        _, error, _ = self.call(lambda: self.slot.prune(self.epoch), IllegalTransitionError)
        assert (error is None) == prunable
        if error is None:
            assert self.slot.stage is S.PRUNED and self.slot.alpha.alpha == 0.0
            assert self.slot.lifecycle.embargo_remaining == self.config.embargo_epochs

    @rule(alpha_target=st.one_of(st.sampled_from([0.0, 0.3, 1.0]), st.floats(-0.5, 1.5)),
          steps=st.integers(-1, 4), curve=st.one_of(st.none(), st.sampled_from(AlphaCurve)))
    def set_alpha_target(self, alpha_target: float, steps: int, curve: AlphaCurve | None) -> None:
        target = alpha_target
        stage, alpha = self.slot.stage, self.slot.alpha.alpha
        allowed = stage in (S.BLENDING, S.HOLDING) and not self.slot.alpha.ramping
        valid = 0.0 <= target <= 1.0 and steps >= 0
        errors = [IllegalTransitionError] if not allowed else [ValueError] if not valid else []
        _, error, _ = self.call(lambda: self.slot.set_alpha_target(target, steps, self.epoch, curve), *errors)
        assert (error is None) == (allowed and valid)
        if error is not None:
            return
        if stage is S.HOLDING and target == 1.0:
            assert self.slot.stage is S.HOLDING
            return
        snapped = steps == 0 or target == alpha
        if snapped and target == 0.0:
            assert self.slot.stage is S.PRUNED
        elif snapped:
            assert self.slot.alpha.alpha == target and not self.slot.alpha.ramping
            at_one = target == 1.0 and S.HOLDING in self.config.gates.auto_advance
            assert self.slot.stage is (S.HOLDING if at_one else S.BLENDING)
        else:
            assert self.slot.stage is S.BLENDING
            assert self.slot.alpha.mode is (AlphaMode.UP if target > alpha else AlphaMode.DOWN)

    @rule(accuracy=accuracy_values, gradient_health=signal_values, gradient_ratio=signal_values,
          contribution=contribution_values)
    def record_signals(self, accuracy: float | None, gradient_health: float | None, gradient_ratio: float | None,
                       contribution: float | None) -> None:
        before = snapshot(self.slot)
        self.slot.record_signals(accuracy=accuracy, gradient_health=gradient_health, gradient_ratio=gradient_ratio,
                                 contribution=contribution)
        expected = self.expected
        if accuracy is not None:
            expected.accuracy = accuracy
            if expected.stage_start_accuracy is None:
                expected.stage_start_accuracy = accuracy
        expected.gradient_health = expected.gradient_health if gradient_health is None else gradient_health
        expected.gradient_ratio = expected.gradient_ratio if gradient_ratio is None else gradient_ratio
        expected.contribution = expected.contribution if contribution is None else contribution
        after = snapshot(self.slot)
        assert {k: v for k, v in after.items() if k != "signals"} == {k: v for k, v in before.items() if k != "signals"}

    @rule()
    def good_epoch(self) -> None:
        """A healthy, improving epoch followed by the clock tick and an ADVANCE: drives seeds deep into life."""
        gained = 1.0 + (self.expected.accuracy or 0.0)
        self.record_signals(accuracy=gained, gradient_health=1.0, gradient_ratio=1.0, contribution=2.0)
        self.step_epoch()
        if self.slot.stage in (S.GERMINATED, S.TRAINING, S.BLENDING):  # fossilizing stays a rare, separate rule
            self.advance()

    @rule()
    def step_epoch(self) -> None:
        slot, stage = self.slot, self.slot.stage
        lifecycle, alpha = slot.lifecycle, slot.alpha
        age, epochs, remaining = lifecycle.seed_age, lifecycle.epochs_in_stage, lifecycle.embargo_remaining
        ramping, target, steps_left = alpha.ramping, alpha.target, alpha.steps_total - alpha.steps_done
        auto = self.config.gates.auto_advance
        blending_gate = stage is S.TRAINING and self.gate(S.BLENDING, epochs + 1)
        self.epoch += 1
        self.call(lambda: slot.step_epoch(self.epoch))

        assert lifecycle.seed_age == (age + 1 if stage in SEED_STAGES else age)
        moved = slot.stage is not stage
        assert lifecycle.epochs_in_stage == (0 if moved else epochs + 1)
        if stage is S.GERMINATED:
            assert slot.stage is (S.TRAINING if S.TRAINING in auto else S.GERMINATED)
        elif stage is S.TRAINING:
            assert slot.stage in ((S.BLENDING, S.HOLDING) if blending_gate and S.BLENDING in auto else (S.TRAINING,))
        elif stage is S.BLENDING and ramping and steps_left == 1:
            if target == 0.0:
                assert slot.stage is S.PRUNED
            else:
                assert slot.alpha.alpha == target and not slot.alpha.ramping
                at_one = target == 1.0 and S.HOLDING in auto
                assert slot.stage is (S.HOLDING if at_one else S.BLENDING)
        elif stage is S.PRUNED:
            assert slot.stage is (S.RESETTING if self.config.embargo_epochs == 0 else S.EMBARGOED)
        elif stage is S.EMBARGOED:
            assert slot.stage is (S.RESETTING if remaining == 1 else S.EMBARGOED)
            assert lifecycle.embargo_remaining == remaining - 1
        elif stage is S.RESETTING:
            assert slot.stage is S.DORMANT
        else:
            assert slot.stage is stage

    @rule()
    def auto_advance(self) -> None:
        stage = self.slot.stage
        auto = self.config.gates.auto_advance
        blending_gate = stage is S.TRAINING and self.gate(S.BLENDING)
        self.call(lambda: self.slot.auto_advance(self.epoch))
        if stage is S.GERMINATED and S.TRAINING in auto:
            assert self.slot.stage is S.TRAINING
        elif blending_gate and S.BLENDING in auto:
            assert self.slot.stage in (S.BLENDING, S.HOLDING)
        else:
            assert self.slot.stage is stage

    @rule()
    def forward(self) -> None:
        h = torch.randn(2, 8, 4, 4)
        with torch.no_grad():
            output = self.slot(h)
        if self.slot.stage not in RUNNING_STAGES or self.slot.stage is S.TRAINING:
            assert output is h
        elif self.slot.alpha.alpha == 0.0:
            assert torch.equal(output, h)

    # ------------------------------------------------------------------ invariants
    @invariant()
    def seed_presence_matches_stage(self) -> None:
        if self.slot.stage in SEED_STAGES:
            assert self.slot.seed is not None and self.slot.blend is not None
        else:
            assert self.slot.stage in EMPTY_STAGES
            assert self.slot.seed is None and self.slot.blend is None and self.slot.seed_parameters() == []

    @invariant()
    def fossilized_is_terminal(self) -> None:
        if self.was_fossilized:
            assert self.slot.stage is S.FOSSILIZED
        self.was_fossilized = self.slot.stage is S.FOSSILIZED

    @invariant()
    def alpha_matches_stage(self) -> None:
        slot, alpha = self.slot, self.slot.alpha
        assert 0.0 <= alpha.alpha <= 1.0
        assert slot.alpha_value.item() == pytest.approx(alpha.alpha, abs=1e-7)
        if slot.stage is not S.BLENDING:
            assert not alpha.ramping
        if slot.stage in (S.HOLDING, S.FOSSILIZED):
            assert alpha.alpha == 1.0
        if slot.stage not in (S.BLENDING, S.HOLDING, S.FOSSILIZED):
            assert alpha.alpha == 0.0
        if slot.stage is S.BLENDING and S.HOLDING in self.config.gates.auto_advance:
            assert alpha.ramping or alpha.alpha != 1.0  # a finished ramp to 1 moves on to HOLDING
        frozen = alpha.mode is AlphaMode.DOWN
        assert all(p.requires_grad is not frozen for p in slot.seed_parameters())

    @invariant()
    def clocks_are_consistent(self) -> None:
        lifecycle = self.slot.lifecycle
        if lifecycle.stage is S.EMBARGOED:
            assert 1 <= lifecycle.embargo_remaining <= self.config.embargo_epochs
        if lifecycle.history:
            assert lifecycle.history[-1][1] == lifecycle.stage.value
        assert lifecycle.epochs_in_stage >= 0 and lifecycle.seed_age >= 0

    @invariant()
    def signals_match_the_model(self) -> None:
        if self.slot.stage not in SEED_STAGES:
            return
        signals, expected = self.slot.signals, self.expected
        assert signals.accuracy == expected.accuracy
        assert signals.accuracy_at_stage_start == expected.stage_start_accuracy
        assert signals.gradient_health == expected.gradient_health
        assert signals.gradient_ratio == expected.gradient_ratio
        assert signals.contribution == expected.contribution


SlotLifecycleMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=50, deadline=None)
test_slot_lifecycle_state_machine = SlotLifecycleMachine.TestCase


# ---------------------------------------------------------------------------- plain unit tests
def _slot(**gate_options: Any) -> SeedSlot:
    gates = GateConfig(**({"auto_advance": frozenset()} | gate_options))
    return SeedSlot("r0c0", 8, "cnn", SlotConfig(gates=gates))


def test_embargo_then_resetting_then_dormant_with_default_five_epochs() -> None:
    slot = SeedSlot("r0c0", 8, "cnn")
    assert slot.config.embargo_epochs == 5
    slot.germinate("conv_small", epoch=0)
    slot.prune(epoch=0)
    assert slot.stage is S.PRUNED and slot.seed is None
    stages = []
    for epoch in range(1, 9):
        slot.step_epoch(epoch)
        stages.append(slot.stage)
        if slot.stage is not S.DORMANT:
            with pytest.raises(IllegalTransitionError, match="DORMANT"):
                slot.germinate("conv_small", epoch=epoch)
    assert stages == [S.EMBARGOED] * 5 + [S.RESETTING, S.DORMANT, S.DORMANT]
    slot.germinate("conv_small", epoch=9)
    assert slot.stage is S.GERMINATED
    path = [(record.from_stage, record.to_stage) for record in slot.drain_transitions()]
    assert path == [(S.DORMANT, S.GERMINATED), (S.GERMINATED, S.PRUNED), (S.PRUNED, S.EMBARGOED),
                    (S.EMBARGOED, S.RESETTING), (S.RESETTING, S.DORMANT), (S.DORMANT, S.GERMINATED)]


@pytest.mark.parametrize(("embargo_epochs", "embargoed_epochs"), [(0, 0), (1, 1), (3, 3)])
def test_embargo_lasts_embargo_epochs(embargo_epochs: int, embargoed_epochs: int) -> None:
    slot = SeedSlot("r0c0", 8, "cnn", SlotConfig(embargo_epochs=embargo_epochs))
    slot.germinate("conv_small")
    slot.prune(0)
    stages = []
    for epoch in range(1, embargo_epochs + 4):
        slot.step_epoch(epoch)
        stages.append(slot.stage)
    assert stages.count(S.EMBARGOED) == embargoed_epochs
    assert stages.count(S.RESETTING) == 1
    assert stages[-1] is S.DORMANT


def _training_slot(mode: GateMode, epochs: int = 10) -> SeedSlot:
    slot = _slot(mode=mode)
    slot.germinate("conv_light")
    assert slot.advance(0).passed
    slot.record_signals(accuracy=50.0)
    for epoch in range(epochs):
        slot.step_epoch(epoch)
    return slot


@pytest.mark.parametrize(
    ("signals", "strict_passes", "permissive_passes", "reason"),
    [
        ({"gradient_health": 0.9, "gradient_ratio": 0.2, "contribution": 1.0}, True, True, "healthy"),
        ({"gradient_health": 0.9, "gradient_ratio": 0.2, "contribution": 0.2}, False, True, "would add +0.20"),
        ({"gradient_health": 0.9, "gradient_ratio": 0.2}, False, True, "shadow contribution"),
        ({"gradient_health": 0.9, "gradient_ratio": 0.2, "contribution": math.nan}, False, True, "not measured"),
        ({"gradient_health": 0.9, "gradient_ratio": 0.05, "contribution": 1.0}, False, True, "ratio"),
        ({"gradient_health": 0.9, "contribution": 1.0}, False, True, "ratio not measured"),
        ({"gradient_ratio": 0.2, "contribution": 1.0}, False, False, "health not measured"),
        ({"gradient_health": 0.5, "gradient_ratio": 0.2, "contribution": 1.0}, False, False, "health 0.50 below"),
        ({"gradient_health": math.nan, "gradient_ratio": 0.2, "contribution": 1.0}, False, False, "health nan below"),
    ],
)
def test_blending_gate_strict_and_permissive(signals: dict[str, float], strict_passes: bool,
                                             permissive_passes: bool, reason: str) -> None:
    for mode, passes in ((GateMode.STRICT, strict_passes), (GateMode.PERMISSIVE, permissive_passes)):
        slot = _training_slot(mode)
        slot.record_signals(**signals)
        result = slot.gate(S.BLENDING)
        assert result.passed == passes, (mode, result.reason)
        if not passes:
            assert reason in result.reason


def test_blending_gate_needs_min_training_epochs() -> None:
    assert GateConfig().min_training_epochs == 5
    slot = _training_slot(GateMode.PERMISSIVE, epochs=4)
    slot.record_signals(gradient_health=1.0)
    result = slot.advance(4)
    assert not result.passed and "4 of 5" in result.reason and result.score == pytest.approx(0.8)
    assert slot.stage is S.TRAINING
    slot.step_epoch(5)
    assert slot.advance(5).passed and slot.stage is S.BLENDING


def _holding_slot(mode: GateMode) -> SeedSlot:
    slot = _slot(mode=mode, min_training_epochs=0)
    slot.germinate("conv_light", blend_epochs=0)
    slot.record_signals(gradient_health=1.0, gradient_ratio=1.0, accuracy=40.0)
    slot.advance(0)
    slot.record_signals(contribution=10.0)  # the shadow: what blending it in would add
    assert slot.advance(0).passed
    assert slot.advance(0).passed
    assert slot.stage is S.HOLDING
    return slot


@pytest.mark.parametrize(
    ("signals", "strict_passes", "permissive_passes"),
    [
        ({"contribution": 2.0}, True, True),
        ({"contribution": 0.5}, False, True),
        ({"contribution": -1.0}, False, True),
        ({}, False, False),
        ({"contribution": math.nan}, False, False),
        ({"contribution": 2.0, "gradient_health": 0.1}, False, False),
    ],
)
def test_fossilize_gate_strict_and_permissive(signals: dict[str, float], strict_passes: bool,
                                              permissive_passes: bool) -> None:
    for mode, passes in ((GateMode.STRICT, strict_passes), (GateMode.PERMISSIVE, permissive_passes)):
        slot = _holding_slot(mode)
        slot.record_signals(**signals)
        assert slot.fossilize(1).passed == passes
        assert slot.stage is (S.FOSSILIZED if passes else S.HOLDING)


def test_fossilize_gate_fails_when_health_was_never_measured() -> None:
    slot = _holding_slot(GateMode.PERMISSIVE)
    slot.signals.gradient_health = None
    slot.record_signals(contribution=3.0)
    result = slot.fossilize(1)
    assert not result.passed and "health not measured" in result.reason


def test_fossilizing_is_never_automatic_and_is_terminal() -> None:
    slot = _holding_slot(GateMode.PERMISSIVE)
    slot.record_signals(contribution=5.0)
    for epoch in range(5):
        slot.step_epoch(epoch)
        slot.auto_advance(epoch)
    assert slot.stage is S.HOLDING
    assert slot.fossilize(5).passed
    for call in (lambda: slot.prune(6), lambda: slot.advance(6), lambda: slot.fossilize(6),
                 lambda: slot.set_alpha_target(0.0, 2, 6), lambda: slot.germinate("conv_small")):
        with pytest.raises(IllegalTransitionError):
            call()
    assert slot.stage is S.FOSSILIZED


def test_holding_gate_waits_for_the_ramp() -> None:
    slot = _slot(mode=GateMode.PERMISSIVE, min_training_epochs=0)
    slot.germinate("conv_light", blend_epochs=3)
    slot.record_signals(gradient_health=1.0)
    slot.advance(0)
    assert slot.advance(0).passed and slot.stage is S.BLENDING
    for epoch in range(2):
        result = slot.advance(epoch)
        assert not result.passed and "still running" in result.reason
        slot.step_epoch(epoch)
    slot.step_epoch(2)
    assert slot.alpha.alpha == 1.0 and slot.advance(3).passed and slot.stage is S.HOLDING


def test_zero_epoch_blend_enters_holding_when_configured() -> None:
    gates = GateConfig(mode=GateMode.PERMISSIVE, min_training_epochs=0, auto_advance=frozenset({S.HOLDING}))
    slot = SeedSlot("r0c0", 8, "cnn", SlotConfig(blend_epochs=0, gates=gates))
    slot.germinate("conv_light")
    slot.record_signals(gradient_health=1.0)
    slot.advance(0)
    assert slot.advance(0).passed
    assert slot.stage is S.HOLDING and slot.alpha.alpha == 1.0


def test_ramp_down_to_zero_prunes() -> None:
    slot = _holding_slot(GateMode.PERMISSIVE)
    slot.set_alpha_target(0.0, 2, epoch=1)
    assert slot.stage is S.BLENDING and slot.alpha.mode is AlphaMode.DOWN
    slot.step_epoch(2)
    assert slot.stage is S.BLENDING and slot.alpha.alpha == 0.5
    slot.step_epoch(3)
    assert slot.stage is S.PRUNED and slot.seed is None


@pytest.mark.parametrize("stage", [S.FOSSILIZED, S.DORMANT, S.PRUNED, S.EMBARGOED, S.RESETTING])
def test_gate_config_auto_advance_accepts_only_forward_stages(stage: Stage) -> None:
    with pytest.raises(ValueError, match="FOSSILIZED" if stage is S.FOSSILIZED else "accepts"):
        GateConfig(auto_advance=frozenset({S.TRAINING, stage}))


@pytest.mark.parametrize(("options", "field"), [({"min_training_epochs": -1}, "min_training_epochs"),
                                                ({"min_gradient_health": 1.5}, "min_gradient_health")])
def test_gate_config_rejects_bad_values(options: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        GateConfig(**options)


@pytest.mark.parametrize("field", ["embargo_epochs", "blend_epochs"])
def test_slot_config_rejects_negative_epochs(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SlotConfig(**{field: -1})


def test_lifecycle_transition_refusal_changes_nothing() -> None:
    lifecycle = SeedLifecycle()
    lifecycle.transition(S.GERMINATED, epoch=3)
    before = lifecycle.state_dict()
    with pytest.raises(IllegalTransitionError, match="GERMINATED to HOLDING; allowed: PRUNED, TRAINING"):
        lifecycle.transition(S.HOLDING, epoch=4)
    assert lifecycle.state_dict() == before
    lifecycle.transition(S.TRAINING, 4)
    lifecycle.transition(S.BLENDING, 5)
    lifecycle.transition(S.HOLDING, 6)
    lifecycle.transition(S.FOSSILIZED, 7)
    with pytest.raises(IllegalTransitionError, match="none \\(terminal\\)"):
        lifecycle.transition(S.PRUNED, 8)


def test_lifecycle_state_dict_round_trip() -> None:
    lifecycle = SeedLifecycle(epochs_in_stage=4, seed_age=9, embargo_remaining=2)
    lifecycle.transition(S.GERMINATED, 1)
    lifecycle.transition(S.PRUNED, 2)
    assert SeedLifecycle.from_state_dict(lifecycle.state_dict()) == lifecycle
    broken = lifecycle.state_dict() | {"seed_age": "9"}
    with pytest.raises(TypeError, match="seed_age"):
        SeedLifecycle.from_state_dict(broken)
