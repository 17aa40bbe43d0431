"""EMATracker: bias-corrected averages worked out by hand, drift ratios, non-finite values, state round trip."""

from __future__ import annotations

import math

import pytest

from morphogen.telemetry.drift import EMATracker, drift_ratio


def test_bias_corrected_average_by_hand() -> None:
    tracker = EMATracker(momentum=0.5)
    assert math.isnan(tracker.average()) and tracker.count() == 0
    # First value: nothing to compare with.
    assert math.isnan(tracker.update(2.0))
    # raw = 0.5 * 0 + 0.5 * 2 = 1; corrected = 1 / (1 - 0.5) = 2
    assert tracker.average() == pytest.approx(2.0)
    # Drift of 4 against the average of the values before it (2): 2.0
    assert tracker.update(4.0) == pytest.approx(2.0)
    # raw = 0.5 * 1 + 0.5 * 4 = 2.5; corrected = 2.5 / (1 - 0.25) = 10/3
    assert tracker.average() == pytest.approx(10.0 / 3.0)
    assert tracker.update(5.0) == pytest.approx(5.0 / (10.0 / 3.0))
    assert tracker.count() == 3


def test_zero_momentum_tracks_the_last_value() -> None:
    tracker = EMATracker(momentum=0.0)
    tracker.update(3.0)
    assert tracker.update(12.0) == pytest.approx(4.0)
    assert tracker.average() == pytest.approx(12.0)


def test_keys_are_independent() -> None:
    tracker = EMATracker(momentum=0.9)
    tracker.update(1.0, key="host")
    assert math.isnan(tracker.update(100.0, key="seed/r0c0"))
    assert tracker.update(3.0, key="host") == pytest.approx(3.0)
    assert tracker.count("host") == 2 and tracker.count("seed/r0c0") == 1


def test_non_finite_values_are_reported_not_folded_in() -> None:
    tracker = EMATracker(momentum=0.9)
    tracker.update(2.0)
    assert math.isnan(tracker.update(math.nan))
    assert tracker.update(math.inf) == math.inf
    assert tracker.count() == 1 and tracker.average() == pytest.approx(2.0)


def test_drift_ratio_edge_cases() -> None:
    assert drift_ratio(0.0, 0.0) == 1.0
    assert drift_ratio(1.0, 0.0) == math.inf
    assert drift_ratio(3.0, 1.5) == 2.0


def test_state_round_trip() -> None:
    tracker = EMATracker(momentum=0.8)
    for value in (1.0, 2.0, 0.5):
        tracker.update(value, key="policy")
    tracker.update(7.0, key="host")
    restored = EMATracker(momentum=0.8)
    restored.load_state_dict(tracker.state_dict())
    assert restored.average("policy") == tracker.average("policy")
    assert restored.count("host") == 1
    assert restored.update(4.0, key="policy") == tracker.update(4.0, key="policy")


def test_inconsistent_state_and_bad_momentum_raise() -> None:
    with pytest.raises(ValueError, match="averages for"):
        EMATracker(0.5).load_state_dict({"raw": {"a": 1.0}, "counts": {}})
    for momentum in (-0.1, 1.0):
        with pytest.raises(ValueError, match=r"momentum must be in \[0, 1\)"):
            EMATracker(momentum)


def test_forget_restarts_only_the_series_with_the_prefix():
    tracker = EMATracker(0.9)
    for value in (1.0, 1.0, 1.0):
        tracker.update(value, "env0/host")
        tracker.update(value, "env1/host")
    tracker.forget("env0/")
    assert tracker.count("env0/host") == 0 and math.isnan(tracker.update(50.0, "env0/host"))
    assert tracker.count("env1/host") == 3 and tracker.update(50.0, "env1/host") == 50.0
