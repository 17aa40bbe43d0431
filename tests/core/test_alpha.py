"""Alpha curves and the AlphaController: exact end points, monotone ramps, oracles, state round trip."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from morphogen.core.alpha import (
    AlphaController,
    AlphaCurve,
    AlphaMode,
    cosine_curve,
    curve_value,
    linear_curve,
    sigmoid_curve,
)

STEEPNESSES = (0.01, 0.5, 1.0, 4.0, 12.0, 50.0, 2000.0)
CURVE_CASES = [(AlphaCurve.LINEAR, 12.0), (AlphaCurve.COSINE, 12.0)] + [(AlphaCurve.SIGMOID, k) for k in STEEPNESSES]
GRID = [i / 400 for i in range(401)]


@pytest.mark.parametrize(("curve", "steepness"), CURVE_CASES)
def test_curve_starts_at_exactly_zero_and_ends_at_exactly_one(curve: AlphaCurve, steepness: float) -> None:
    assert curve_value(curve, 0.0, steepness) == 0.0
    assert curve_value(curve, 1.0, steepness) == 1.0


@pytest.mark.parametrize(("curve", "steepness"), CURVE_CASES)
def test_curve_is_monotone_and_within_unit_interval(curve: AlphaCurve, steepness: float) -> None:
    values = [curve_value(curve, t, steepness) for t in GRID]
    assert all(0.0 <= v <= 1.0 for v in values)
    assert all(later >= earlier for earlier, later in itertools.pairwise(values))


@pytest.mark.parametrize(("curve", "steepness"), CURVE_CASES)
def test_curve_clamps_progress_outside_unit_interval(curve: AlphaCurve, steepness: float) -> None:
    assert curve_value(curve, -0.5, steepness) == 0.0
    assert curve_value(curve, 1.5, steepness) == 1.0


def test_curve_oracles() -> None:
    assert linear_curve(0.3) == 0.3
    # cos(pi/2) = 0 and cos(pi/4) = sqrt(2)/2
    assert cosine_curve(0.5) == pytest.approx(0.5, abs=1e-15)
    assert cosine_curve(0.25) == pytest.approx((1.0 - math.sqrt(2.0) / 2.0) / 2.0, abs=1e-15)
    # Sigmoid, k = 4, t = 0.25: logistic(4 (t - 1/2)) = 1 / (1 + e), logistic(-2) = 1 / (1 + e^2) and
    # logistic(2) = 1 - 1 / (1 + e^2), so the rescaled value is (1/(1+e) - 1/(1+e^2)) / (1 - 2/(1+e^2)).
    expected = (1.0 / (1.0 + math.e) - 1.0 / (1.0 + math.e**2)) / (1.0 - 2.0 / (1.0 + math.e**2))
    assert sigmoid_curve(0.25, steepness=4.0) == pytest.approx(expected, abs=1e-14)
    assert expected == pytest.approx(0.196611933, abs=1e-9)
    # Symmetric about the middle.
    for k in STEEPNESSES:
        assert sigmoid_curve(0.5, k) == pytest.approx(0.5, abs=1e-12)
        assert sigmoid_curve(0.2, k) == pytest.approx(1.0 - sigmoid_curve(0.8, k), abs=1e-12)


def test_sigmoid_tends_to_linear_for_small_steepness_and_to_a_step_for_large() -> None:
    assert sigmoid_curve(0.3, 1e-6) == pytest.approx(0.3, abs=1e-9)
    assert sigmoid_curve(0.4, 2000.0) == pytest.approx(0.0, abs=1e-12)
    assert sigmoid_curve(0.6, 2000.0) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("steepness", [0.0, -1.0, math.nan])
def test_sigmoid_rejects_non_positive_steepness(steepness: float) -> None:
    with pytest.raises(ValueError, match="steepness"):
        sigmoid_curve(0.5, steepness)


def _controller_at(alpha: float) -> AlphaController:
    controller = AlphaController()
    controller.retarget(alpha, 0)
    return controller


@settings(max_examples=200, deadline=None)
@given(
    start=st.floats(0.0, 1.0),
    target=st.floats(0.0, 1.0),
    steps=st.integers(1, 30),
    curve=st.sampled_from(AlphaCurve),
    steepness=st.floats(0.05, 100.0),
)
def test_ramp_stays_between_start_and_target_and_lands_exactly(
    start: float, target: float, steps: int, curve: AlphaCurve, steepness: float
) -> None:
    controller = _controller_at(start)
    controller.retarget(target, steps, curve, steepness)
    if target == start:
        assert controller.mode is AlphaMode.HOLD and controller.alpha == target
        return
    assert controller.mode is (AlphaMode.UP if target > start else AlphaMode.DOWN)
    low, high = min(start, target), max(start, target)
    previous = controller.alpha
    for tick in range(1, steps + 1):
        finished = controller.tick()
        assert finished == (tick == steps)
        assert low <= controller.alpha <= high
        # monotone in the ramp's direction
        assert (controller.alpha - previous) * (target - start) >= 0.0
        previous = controller.alpha
    assert controller.alpha == target
    assert controller.mode is AlphaMode.HOLD
    assert not controller.tick()
    assert controller.alpha == target


def test_linear_ramp_values() -> None:
    controller = _controller_at(0.2)
    controller.retarget(0.6, 4, AlphaCurve.LINEAR)
    seen = []
    for _ in range(4):
        controller.tick()
        seen.append(controller.alpha)
    assert seen == pytest.approx([0.3, 0.4, 0.5, 0.6], abs=1e-15)
    assert seen[-1] == 0.6


def test_cosine_ramp_half_way() -> None:
    controller = AlphaController()
    controller.retarget(1.0, 2, AlphaCurve.COSINE)
    controller.tick()
    assert controller.alpha == pytest.approx(0.5, abs=1e-15)
    assert controller.progress == 0.5


def test_zero_steps_snap_to_target() -> None:
    controller = _controller_at(0.3)
    controller.retarget(0.9, 0)
    assert controller.alpha == 0.9
    assert controller.mode is AlphaMode.HOLD
    assert controller.progress == 1.0
    assert not controller.ramping


def test_retarget_only_from_hold_and_refusal_changes_nothing() -> None:
    controller = AlphaController()
    controller.retarget(1.0, 5)
    controller.tick()
    before = dataclasses.replace(controller)
    with pytest.raises(ValueError, match="HOLD"):
        controller.retarget(0.0, 2)
    assert controller == before


@pytest.mark.parametrize(
    ("target", "steps", "steepness", "message"),
    [(1.5, 2, None, "target"), (-0.1, 2, None, "target"), (math.nan, 2, None, "target"), (0.5, -1, None, "steps"),
     (0.5, 2, 0.0, "steepness"), (0.5, 2, -3.0, "steepness")],
)
def test_invalid_retarget_raises_and_changes_nothing(
    target: float, steps: int, steepness: float | None, message: str
) -> None:
    controller = _controller_at(0.25)
    before = dataclasses.replace(controller)
    with pytest.raises(ValueError, match=message):
        controller.retarget(target, steps, AlphaCurve.SIGMOID, steepness)
    assert controller == before


def test_state_dict_round_trip_mid_ramp() -> None:
    controller = _controller_at(0.1)
    controller.retarget(0.9, 6, AlphaCurve.SIGMOID, steepness=7.0)
    controller.tick()
    controller.tick()
    restored = AlphaController.from_state_dict(controller.state_dict())
    assert restored == controller
    for _ in range(4):
        assert restored.tick() == controller.tick()
        assert restored.alpha == controller.alpha
    assert restored.alpha == 0.9


def test_state_dict_holds_plain_values() -> None:
    state = AlphaController().state_dict()
    assert state["mode"] == "hold" and state["curve"] == "linear"
    assert all(isinstance(value, int | float | str) for value in state.values())


def test_from_state_dict_rejects_malformed_values() -> None:
    state = AlphaController().state_dict()
    state["steps_done"] = "3"
    with pytest.raises(TypeError, match="steps_done"):
        AlphaController.from_state_dict(state)
