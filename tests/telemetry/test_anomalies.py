"""AnomalyDetector: each kind fired by a crafted input and not by a healthy one; hysteresis; state."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from morphogen.telemetry.anomalies import ANOMALY_KINDS, Anomaly, AnomalyDetector, PPODiagnostics
from morphogen.telemetry.config import TelemetryConfig
from morphogen.telemetry.lstm_health import LSTMHealthReport

HEALTHY_LSTM = LSTMHealthReport(
    hidden_rms_mean=0.3, hidden_rms_max=0.6, cell_rms_mean=1.0, cell_rms_max=2.0, non_finite=0,
    exploding=False, vanishing=False,
)  # fmt: skip
MAX_ENTROPY = (("op", math.log(6)), ("slot", math.log(3)), ("blueprint", 0.0))
HEALTHY = PPODiagnostics(
    ratio_max=1.3,
    ratio_min=0.75,
    value_std=0.8,
    return_std=1.0,
    entropy_per_head=(("op", 1.2), ("slot", 0.9), ("blueprint", 0.0)),
    max_entropy_per_head=MAX_ENTROPY,
    approx_kl=0.01,
    target_kl=0.015,
    grad_norm=1.0,
    lstm=HEALTHY_LSTM,
)


def _kinds(anomalies: list[Anomaly]) -> list[str]:
    return [anomaly.kind for anomaly in anomalies]


def _warmed_up_detector() -> AnomalyDetector:
    detector = AnomalyDetector()
    for _ in range(5):
        assert detector.check(HEALTHY) == []
    return detector


def _lstm(**changes: Any) -> LSTMHealthReport:
    return dataclasses.replace(HEALTHY_LSTM, **changes)


CRAFTED: dict[str, dict[str, Any]] = {
    "non_finite": {"value_std": math.nan},
    "ratio_explosion": {"ratio_max": 10.5},
    "ratio_collapse": {"ratio_min": 0.05},
    "value_collapse": {"value_std": 0.005},
    "entropy_collapse": {"entropy_per_head": (("op", 0.04 * math.log(6)), ("slot", 0.9), ("blueprint", 0.0))},
    "kl_spike": {"approx_kl": 0.0601},
    "gradient_drift": {"grad_norm": 5.5},
    "lstm_explosion": {"lstm": _lstm(cell_rms_max=12.0, exploding=True)},
    "lstm_vanishing": {"lstm": _lstm(hidden_rms_max=1e-5, vanishing=True)},
    "lstm_non_finite": {"lstm": _lstm(non_finite=4, cell_rms_max=math.nan)},
}


def test_every_kind_has_a_crafted_input() -> None:
    assert set(CRAFTED) == set(ANOMALY_KINDS)


def test_healthy_diagnostics_raise_nothing() -> None:
    detector = _warmed_up_detector()
    assert detector.check(HEALTHY, gradient_norms={"host": 0.5}) == []


@pytest.mark.parametrize("kind", ANOMALY_KINDS)
def test_each_kind_is_raised_by_its_crafted_input_alone(kind: str) -> None:
    detector = _warmed_up_detector()
    anomalies = detector.check(dataclasses.replace(HEALTHY, **CRAFTED[kind]))
    assert _kinds(anomalies) == [kind]
    (anomaly,) = anomalies
    assert anomaly.message and anomaly.advice
    line = anomaly.line()
    assert "\n" not in line and line.startswith(f"anomaly {kind}: ") and anomaly.advice in line


@pytest.mark.parametrize(
    ("changes", "fires"),
    [
        ({"ratio_max": 10.0}, False),  # the thresholds themselves are not anomalies
        ({"ratio_min": 0.1}, False),
        ({"approx_kl": 0.06}, False),  # exactly 4 x 0.015
        ({"approx_kl": 1.0, "target_kl": None}, False),  # no target: KL is not judged
        ({"value_std": 0.0, "return_std": 0.0005}, False),  # returns do not vary: not a value collapse
        ({"value_std": 0.0, "return_std": 0.5}, True),
        ({"value_std": 0.0101, "return_std": 1.0}, False),
    ],
)
def test_boundaries(changes: dict[str, Any], fires: bool) -> None:
    anomalies = _warmed_up_detector().check(dataclasses.replace(HEALTHY, **changes))
    assert bool(anomalies) is fires


def test_non_finite_values_are_named_and_judged_by_no_other_detector() -> None:
    diagnostics = dataclasses.replace(
        HEALTHY, ratio_max=math.inf, approx_kl=math.nan, entropy_per_head=(("op", math.nan), ("slot", 0.9))
    )
    (anomaly,) = _warmed_up_detector().check(diagnostics)
    assert anomaly.kind == "non_finite"
    assert "ratio_max" in anomaly.message and "approx_kl" in anomaly.message and "entropy/op" in anomaly.message


def test_non_finite_gradient_norm_is_reported_and_does_not_poison_the_average() -> None:
    detector = _warmed_up_detector()
    assert _kinds(detector.check(gradient_norms={"policy": math.nan})) == ["non_finite"]
    assert detector.check(HEALTHY) == []


def test_gradient_drift_per_key_after_warmup() -> None:
    detector = AnomalyDetector(TelemetryConfig(gradient_drift_warmup=3))
    # Not judged while fewer than 3 norms were seen: a jump on the 3rd norm passes.
    assert detector.check(gradient_norms={"host": 1.0}) == []
    assert detector.check(gradient_norms={"host": 1.0}) == []
    assert detector.check(gradient_norms={"host": 50.0}) == []
    detector = AnomalyDetector(TelemetryConfig(gradient_drift_warmup=3))
    for _ in range(3):
        assert detector.check(gradient_norms={"host": 1.0, "seed/r0c0": 0.1}) == []
    anomalies = detector.check(gradient_norms={"host": 5.01, "seed/r0c0": 0.1})
    assert _kinds(anomalies) == ["gradient_drift"] and "host" in anomalies[0].message
    # Downward drift is not an anomaly.
    assert detector.check(gradient_norms={"host": 1e-6, "seed/r0c0": 0.1}) == []


def test_entropy_collapse_hysteresis() -> None:
    detector = AnomalyDetector(TelemetryConfig(entropy_collapse_low=0.05, entropy_collapse_high=0.10))
    maximum = math.log(6)

    def check(fraction: float) -> list[str]:
        entropy = (("op", fraction * maximum), ("slot", 0.9))
        return _kinds(detector.check(dataclasses.replace(HEALTHY, entropy_per_head=entropy)))

    assert check(0.04) == ["entropy_collapse"]
    assert check(0.03) == []  # still collapsed: reported once
    assert check(0.07) == []  # between the thresholds: neither re-reported nor cleared
    assert check(0.099) == []
    assert check(0.04) == []  # not cleared by then: a new collapse is not reported again
    assert check(0.11) == []  # above the high threshold: cleared
    assert check(0.07) == []  # between the thresholds from above: not collapsed
    assert check(0.049) == ["entropy_collapse"]


def test_heads_without_entropy_to_lose_are_skipped() -> None:
    detector = _warmed_up_detector()
    diagnostics = dataclasses.replace(
        HEALTHY,
        entropy_per_head=(("op", 1.2), ("blend_epochs", 0.0), ("blueprint", 0.0)),
        max_entropy_per_head=(("op", math.log(6)), ("blueprint", 0.0)),
    )
    assert detector.check(diagnostics) == []


def test_lstm_non_finite_hides_explosion_and_lstm_alone_is_checked() -> None:
    report = _lstm(non_finite=2, exploding=True)
    assert _kinds(_warmed_up_detector().check(dataclasses.replace(HEALTHY, lstm=report))) == ["lstm_non_finite"]
    assert _warmed_up_detector().check(dataclasses.replace(HEALTHY, lstm=None)) == []


def test_lstm_health_of_the_detector_uses_its_config() -> None:
    detector = AnomalyDetector(TelemetryConfig(lstm_explosion_threshold=2.0, lstm_vanishing_threshold=0.1))
    assert detector.lstm_health.explosion_threshold == 2.0
    assert detector.lstm_health.vanishing_threshold == 0.1


def test_state_round_trip_keeps_hysteresis_and_averages() -> None:
    detector = _warmed_up_detector()
    collapsed = dataclasses.replace(HEALTHY, **CRAFTED["entropy_collapse"])
    assert _kinds(detector.check(collapsed)) == ["entropy_collapse"]
    restored = AnomalyDetector()
    restored.load_state_dict(detector.state_dict())
    assert restored.check(collapsed) == []  # still collapsed: not reported again
    assert _kinds(AnomalyDetector().check(collapsed)) == ["entropy_collapse"]  # where a fresh one reports it
    drifting = dataclasses.replace(HEALTHY, grad_norm=5.5)
    assert _kinds(restored.check(drifting)) == ["gradient_drift"]
    # A fresh detector has no average yet and cannot judge the drift.
    assert AnomalyDetector().check(drifting) == []
