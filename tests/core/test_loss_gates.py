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


def test_cross_entropy_tasks_are_judged_by_loss_and_a_task_with_its_own_loss_by_shares_of_it() -> None:
    assert criterion_for("language_model") is Criterion.LOSS
    assert criterion_for("classification") is Criterion.LOSS
    # A user's own loss may be on any scale: thresholds in nats or points would mean nothing there.
    assert criterion_for("custom") is Criterion.RELATIVE_LOSS
    assert GateConfig().criterion is None and GateConfig().judged_by is Criterion.SCORE
    assert GateConfig().judging("language_model").judged_by is Criterion.LOSS
    assert GateConfig().judging("classification").judged_by is Criterion.LOSS
    assert GateConfig().judging("custom").judged_by is Criterion.RELATIVE_LOSS
    # A criterion the user chose is kept whatever the task.
    assert GateConfig(criterion=Criterion.SCORE).judging("language_model").judged_by is Criterion.SCORE
    assert GateConfig(criterion=Criterion.SCORE).judging("classification").judged_by is Criterion.SCORE


def test_documented_loss_thresholds() -> None:
    assert GateConfig().loss_min_improvement == 0.005
    assert GateConfig().loss_min_contribution == 0.01


@pytest.mark.parametrize(
    ("loss_contribution", "passes", "reason"),
    [
        (0.02, True, "blended in, the seed would add +0.0200 nats >= 0.005; seed/host gradient ratio 1.000 >= 0.1"),
        (0.005, True, "would add +0.0050 nats >= 0.005"),  # exactly the threshold passes
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


def test_a_passing_gate_gives_its_figure_and_threshold_as_a_refusal_does() -> None:
    # A refusal said "contribution 0.0006 nats < 0.01"; a pass said "trained long enough and healthy", no figure.
    kept = evaluate_gate(Stage.FOSSILIZED, _in(Stage.HOLDING), _healthy(loss_contribution=0.0283), LOSS_GATES)
    assert kept.passed and kept.reason == "contribution +0.0283 nats >= 0.01"
    permissive = GateConfig(mode=GateMode.PERMISSIVE, criterion=Criterion.LOSS)
    blended = evaluate_gate(Stage.BLENDING, _in(Stage.TRAINING, epochs=6), _healthy(), permissive)
    assert blended.passed and blended.reason == "trained 6 epochs >= 5, gradient health 1.00 >= 0.70"
    relative = GateConfig(mode=GateMode.STRICT, criterion=Criterion.RELATIVE_LOSS)
    shared = evaluate_gate(Stage.FOSSILIZED, _in(Stage.HOLDING), _healthy(loss=0.5, loss_contribution=0.015), relative)
    assert shared.passed and shared.reason == "the seed's ablation says it would lower the loss by 3.00% >= 2.00%"


@pytest.mark.parametrize("field", ["loss_min_improvement", "loss_min_contribution", "relative_min_improvement",
                                   "relative_min_contribution"])
def test_loss_thresholds_must_be_finite(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        GateConfig(**{field: math.inf})


RELATIVE_GATES = GateConfig(mode=GateMode.STRICT, criterion=Criterion.RELATIVE_LOSS)


@pytest.mark.parametrize("scale", [1e-6, 1.0, 1e4])
@pytest.mark.parametrize(
    ("share", "target", "passes"),
    [
        (0.08, Stage.BLENDING, True),
        (0.05, Stage.BLENDING, True),  # exactly the 5% threshold passes
        (0.03, Stage.BLENDING, False),
        (-0.1, Stage.BLENDING, False),
        (0.03, Stage.FOSSILIZED, True),
        (0.015, Stage.FOSSILIZED, False),  # keeping a seed asks for 2% of the loss
    ],
)
def test_relative_gates_judge_the_share_of_the_loss_on_any_scale(scale: float, share: float, target: Stage,
                                                                 passes: bool) -> None:
    # A regression's mean squared error in millimetres or in kilometres: the same seed, the same verdict.
    loss = 0.4 * scale
    signals = _healthy(loss=loss, loss_contribution=share * loss, contribution=-share * loss)
    stage = Stage.TRAINING if target is Stage.BLENDING else Stage.HOLDING
    result = evaluate_gate(target, _in(stage), signals, RELATIVE_GATES)
    assert result.passed is passes, result.reason
    assert passes or f"{'lower' if share > 0 else 'raise'} the loss by {abs(share):.2%} (" in result.reason
    if not passes:  # the threshold in the same words: a share of the loss, in percent
        assert result.reason.endswith(f"lower the loss by {0.05 if target is Stage.BLENDING else 0.02:.2%} or more)")


def test_a_relative_gate_says_why_a_loss_that_is_not_positive_cannot_be_judged() -> None:
    # A Gaussian negative log-likelihood can fall below zero; no share of it means anything.
    signals = _healthy(loss=-0.3, loss_contribution=0.1)
    result = evaluate_gate(Stage.BLENDING, _in(Stage.TRAINING), signals, RELATIVE_GATES)
    assert not result.passed
    assert "has no shares" in result.reason and 'criterion to "loss" or "score"' in result.reason
    unmeasured = evaluate_gate(Stage.FOSSILIZED, _in(Stage.HOLDING), _healthy(loss=0.3), RELATIVE_GATES)
    assert not unmeasured.passed and unmeasured.reason == "counterfactual contribution not measured"


def test_documented_relative_thresholds() -> None:
    assert GateConfig().relative_min_improvement == 0.05
    assert GateConfig().relative_min_contribution == 0.02


@pytest.mark.parametrize("criterion", list(Criterion))
def test_the_contribution_the_fossilize_gate_asks_is_where_it_starts_to_pass(criterion: Criterion) -> None:
    # A controller reads it (through the snapshot) to tell whether a refused seed would pass now.
    gates = GateConfig(mode=GateMode.STRICT, criterion=criterion)
    asks = gates.fossilize_contribution
    assert asks is not None and asks > 0.0

    def passes(contribution: float) -> bool:
        # At a validation loss of 1, the share of the loss removed is the loss removed.
        signals = _healthy(contribution=contribution, loss_contribution=contribution, loss=1.0)
        return evaluate_gate(Stage.FOSSILIZED, _in(Stage.HOLDING), signals, gates).passed

    assert passes(asks) and not passes(asks * 0.99)
    assert GateConfig(mode=GateMode.PERMISSIVE, criterion=criterion).fossilize_contribution is None
