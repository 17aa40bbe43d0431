"""Gates of a language model and a classifier: judged by validation loss in nats, not by accuracy points."""

from __future__ import annotations

import math

import pytest

from morphogen.core.lifecycle import (
    Criterion,
    GateConfig,
    GateMode,
    SeedLifecycle,
    SeedSignals,
    Stage,
    criterion_for,
    evaluate_gate,
)

LOSS_GATES = GateConfig(mode=GateMode.STRICT, criterion=Criterion.LOSS)


def _in(stage: Stage, epochs: int = 10) -> SeedLifecycle:
    return SeedLifecycle(stage=stage, epochs_in_stage=epochs, seed_age=epochs)


def _healthy(**measured: float) -> SeedSignals:
    return SeedSignals(gradient_health=1.0, gradient_ratio=1.0, **measured)  # type: ignore[arg-type]


def test_cross_entropy_tasks_are_judged_by_loss_and_a_task_with_its_own_loss_by_its_score() -> None:
    assert criterion_for("language_model") is Criterion.LOSS
    assert criterion_for("classification") is Criterion.LOSS
    # A user's own loss may be on any scale: thresholds in nats would mean nothing there.
    assert criterion_for("custom") is Criterion.SCORE
    assert GateConfig().criterion is None and GateConfig().judged_by is Criterion.SCORE
    assert GateConfig().judging("language_model").judged_by is Criterion.LOSS
    assert GateConfig().judging("classification").judged_by is Criterion.LOSS
    assert GateConfig().judging("custom").judged_by is Criterion.SCORE
    # A criterion the user chose is kept whatever the task.
    assert GateConfig(criterion=Criterion.SCORE).judging("language_model").judged_by is Criterion.SCORE
    assert GateConfig(criterion=Criterion.SCORE).judging("classification").judged_by is Criterion.SCORE


def test_documented_loss_thresholds() -> None:
    assert GateConfig().loss_min_improvement == 0.005
    assert GateConfig().loss_min_contribution == 0.01


@pytest.mark.parametrize(
    ("loss_contribution", "passes", "reason"),
    [
        (0.02, True, "healthy"),
        (0.005, True, "healthy"),  # exactly the threshold passes
        (0.004, False, "would add +0.0040 nats < 0.005"),
        (-0.03, False, "would add -0.0300 nats"),
        (None, False, "not measured"),
        (math.nan, False, "not measured"),
    ],
)
def test_blending_gate_judges_the_shadow_loss_in_nats(loss_contribution: float | None, passes: bool,
                                                      reason: str) -> None:
    # A 0.5-point accuracy step is out of reach for this seed (+0.1 points), yet it lowers the loss.
    signals = _healthy(contribution=0.1, loss_contribution=loss_contribution)  # type: ignore[arg-type]
    result = evaluate_gate(Stage.BLENDING, _in(Stage.TRAINING), signals, LOSS_GATES)
    assert result.passed is passes
    assert reason in result.reason


def test_the_score_criterion_ignores_the_loss() -> None:
    signals = _healthy(contribution=0.1, loss_contribution=0.5)
    result = evaluate_gate(Stage.BLENDING, _in(Stage.TRAINING), signals, GateConfig(criterion=Criterion.SCORE))
    assert not result.passed and "+0.10 points < 0.5" in result.reason


@pytest.mark.parametrize(
    ("loss_contribution", "mode", "passes"),
    [
        (0.05, GateMode.STRICT, True),
        (0.009, GateMode.STRICT, False),
        (-0.2, GateMode.STRICT, False),
        (-0.2, GateMode.PERMISSIVE, True),  # permissive asks only that it was measured and healthy
        (None, GateMode.PERMISSIVE, False),
    ],
)
def test_fossilize_gate_judges_the_loss_removed(loss_contribution: float | None, mode: GateMode,
                                                passes: bool) -> None:
    config = GateConfig(mode=mode, criterion=Criterion.LOSS)
    signals = _healthy(contribution=5.0, loss_contribution=loss_contribution)  # type: ignore[arg-type]
    result = evaluate_gate(Stage.FOSSILIZED, _in(Stage.HOLDING), signals, config)
    assert result.passed is passes, result.reason
    if passes:
        assert "nats" in result.reason


@pytest.mark.parametrize("field", ["loss_min_improvement", "loss_min_contribution"])
def test_loss_thresholds_must_be_finite(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        GateConfig(**{field: math.inf})
