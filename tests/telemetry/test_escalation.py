"""Escalation: debug for N epochs after an anomaly, then back, both changes emitted; hub integration."""

from __future__ import annotations

import logging

import pytest

from morphogen.telemetry.anomalies import Anomaly
from morphogen.telemetry.config import TelemetryConfig
from morphogen.telemetry.escalation import TelemetryLevelController
from morphogen.telemetry.events import ALL_ENVS, AnomalyDetected, LayerStatistics, StageTransition
from morphogen.telemetry.events import TelemetryLevelChanged as LevelChanged
from morphogen.telemetry.sinks import MemorySink, Telemetry

SPIKE = Anomaly("kl_spike", "approximate KL 0.2 > 4 x target 0.015", "lower the learning rate")
DEBUG_ONLY = LayerStatistics(epoch=0, env_id=0, module="host", layers=())
NORMAL = StageTransition(0, 0, "r0c0", "norm", "TRAINING", "BLENDING", "gate passed")



def test_controller_escalates_for_n_epochs_then_returns() -> None:
    controller = TelemetryLevelController("normal", escalation_epochs=3)
    assert controller.level == "normal" and controller.end_epoch(epoch=1) is None
    up = controller.escalate(epoch=2, reason="anomaly: kl_spike")
    assert up == LevelChanged(2, ALL_ENVS, from_level="normal", to_level="debug", reason="anomaly: kl_spike")
    assert controller.level == "debug"
    assert controller.end_epoch(epoch=3) is None and controller.end_epoch(epoch=4) is None
    assert controller.level == "debug" and controller.state_dict() == {"epochs_left": 1}
    down = controller.end_epoch(epoch=5)
    assert down is not None and (down.from_level, down.to_level, down.epoch) == ("debug", "normal", 5)
    assert "3 epochs" in down.reason
    assert controller.level == "normal"


def test_new_anomaly_during_escalation_restarts_the_count_without_an_event() -> None:
    controller = TelemetryLevelController("minimal", escalation_epochs=2)
    assert controller.escalate(epoch=0, reason="a") is not None
    assert controller.end_epoch(epoch=1) is None
    assert controller.escalate(epoch=1, reason="b") is None
    assert controller.end_epoch(epoch=2) is None
    change = controller.end_epoch(epoch=3)
    assert change is not None and change.to_level == "minimal"


@pytest.mark.parametrize(("level", "epochs"), [("off", 5), ("debug", 5), ("normal", 0)])
def test_no_escalation_at_off_debug_or_zero_epochs(level: str, epochs: int) -> None:
    controller = TelemetryLevelController(level, escalation_epochs=epochs)
    assert controller.escalate(epoch=0, reason="x") is None
    assert controller.level == level and controller.end_epoch(epoch=1) is None


def test_controller_state_round_trip_and_validation() -> None:
    controller = TelemetryLevelController("normal", escalation_epochs=5)
    controller.escalate(epoch=0, reason="x")
    controller.end_epoch(epoch=1)
    restored = TelemetryLevelController("normal", escalation_epochs=5)
    restored.load_state_dict(controller.state_dict())
    assert restored.level == "debug" and restored.state_dict() == {"epochs_left": 4}
    with pytest.raises(ValueError, match=r"epochs_left must be in \[0, 5\]"):
        restored.load_state_dict({"epochs_left": 6})
    with pytest.raises(ValueError, match="escalation_epochs must be >= 0"):
        TelemetryLevelController("normal", escalation_epochs=-1)


def test_hub_escalates_emits_both_changes_and_filters_by_the_effective_level(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = MemorySink()
    telemetry = Telemetry(None, config=TelemetryConfig(level="normal", escalation_epochs=2), sinks=[sink])
    telemetry.emit(DEBUG_ONLY)
    assert sink.events == []
    with caplog.at_level(logging.WARNING, logger="morphogen.telemetry"):
        telemetry.report_anomalies([SPIKE], epoch=10)
    assert [record.getMessage() for record in caplog.records] == [SPIKE.line()]
    assert sink.events == [
        AnomalyDetected(10, ALL_ENVS, "kl_spike", SPIKE.message, SPIKE.advice),
        LevelChanged(10, ALL_ENVS, "normal", "debug", "anomaly: kl_spike"),
    ]
    assert telemetry.level == "debug" and telemetry.configured_level == "normal"
    telemetry.emit(DEBUG_ONLY)
    telemetry.end_epoch(11)
    telemetry.emit(DEBUG_ONLY)
    telemetry.end_epoch(12)
    assert telemetry.level == "normal"
    telemetry.emit(DEBUG_ONLY)
    telemetry.emit(NORMAL)
    assert sink.events[2:] == [
        DEBUG_ONLY,
        DEBUG_ONLY,
        LevelChanged(12, ALL_ENVS, "debug", "normal", "no anomaly for 2 epochs"),
        NORMAL,
    ]


def test_hub_state_round_trip_and_no_anomalies_change_nothing() -> None:
    telemetry = Telemetry(None, config=TelemetryConfig(escalation_epochs=3), sinks=[MemorySink()])
    telemetry.report_anomalies([], epoch=0)
    assert telemetry.level == "normal"
    telemetry.report_anomalies([SPIKE, SPIKE], epoch=1, env_id=2)
    resumed = Telemetry(None, config=TelemetryConfig(escalation_epochs=3), sinks=[MemorySink()])
    resumed.load_state_dict(telemetry.state_dict())
    assert resumed.level == "debug"


def test_anomaly_lines_are_logged_even_at_off(caplog: pytest.LogCaptureFixture) -> None:
    sink = MemorySink()
    telemetry = Telemetry(None, level="off", sinks=[sink])
    with caplog.at_level(logging.WARNING, logger="morphogen.telemetry"):
        telemetry.report_anomalies([SPIKE], epoch=0)
    assert len(caplog.records) == 1 and sink.events == [] and telemetry.level == "off"
