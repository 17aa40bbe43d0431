"""TelemetryConfig: validation messages, and every field changes what telemetry does (no dead flags:
docs/architecture.md#telemetry)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.profiler import ProfilerAction

from morphogen.config import ConfigError, build_config
from morphogen.telemetry.anomalies import Anomaly, AnomalyDetector, PPODiagnostics
from morphogen.telemetry.config import TelemetryConfig
from morphogen.telemetry.events import StageTransition
from morphogen.telemetry.profiler import TraceProfiler
from morphogen.telemetry.sinks import MemorySink, Telemetry

HEALTHY = PPODiagnostics(
    ratio_max=1.2,
    ratio_min=0.8,
    value_std=0.5,
    return_std=1.0,
    entropy_per_head=(("op", 1.0),),
    max_entropy_per_head=(("op", 2.0),),
    approx_kl=0.01,
    target_kl=0.015,
    grad_norm=1.0,
)



def _kinds_after(config: TelemetryConfig, **changes: Any) -> list[str]:
    return [anomaly.kind for anomaly in AnomalyDetector(config).check(dataclasses.replace(HEALTHY, **changes))]


def _entropy_sequence(config: TelemetryConfig, fractions: tuple[float, ...]) -> list[str]:
    detector = AnomalyDetector(config)
    kinds: list[str] = []
    for fraction in fractions:
        diagnostics = dataclasses.replace(HEALTHY, entropy_per_head=(("op", 2.0 * fraction),))
        kinds += [anomaly.kind for anomaly in detector.check(diagnostics)]
    return kinds


def _drift_sequence(config: TelemetryConfig, norms: tuple[float, ...]) -> list[str]:
    detector = AnomalyDetector(config)
    kinds: list[str] = []
    for norm in norms:
        kinds += [anomaly.kind for anomaly in detector.check(gradient_norms={"host": norm})]
    return kinds


def _lstm_kinds(config: TelemetryConfig, hidden_value: float, cell_value: float) -> list[str]:
    detector = AnomalyDetector(config)
    report = detector.lstm_health.check(torch.full((1, 2, 4), hidden_value), torch.full((1, 2, 4), cell_value))
    return [anomaly.kind for anomaly in detector.check(dataclasses.replace(HEALTHY, lstm=report))]


def _written(config: TelemetryConfig, _: Path) -> int:
    sink = MemorySink()
    Telemetry(None, config=config, sinks=[sink]).emit(StageTransition(0, 0, "r0c0", "norm", "A", "B", ""))
    return len(sink.events)


def _level_after_three_epochs(config: TelemetryConfig, _: Path) -> str:
    telemetry = Telemetry(None, config=config, sinks=[])
    telemetry.report_anomalies([Anomaly("kl_spike", "seen", "do")], epoch=0)
    for epoch in range(1, 4):
        telemetry.end_epoch(epoch)
    return telemetry.level


def _sink_types(config: TelemetryConfig, run_dir: Path) -> list[str]:
    with Telemetry(run_dir, config=config) as telemetry:
        return [type(sink).__name__ for sink in telemetry.sinks]


def _recorded_steps(config: TelemetryConfig, run_dir: Path) -> tuple[bool, list[bool]]:
    profiler = TraceProfiler.from_config(run_dir, config)
    recorded = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)
    return profiler.enabled, [profiler.schedule(step) in recorded for step in range(8)]


def _layer_statistics_enabled(config: TelemetryConfig, _: Path) -> bool:
    return Telemetry(None, config=dataclasses.replace(config, level="debug"), sinks=[]).layer_statistics_enabled


#: Field -> (a non-default value, what telemetry does given a config); the two must differ.
BEHAVIOURS: dict[str, tuple[Any, Callable[[TelemetryConfig, Path], object]]] = {
    "level": ("minimal", _written),
    "escalation_epochs": (2, _level_after_three_epochs),
    "tensorboard": (True, _sink_types),
    "profile": (True, _recorded_steps),
    "profile_wait": (3, _recorded_steps),
    "profile_warmup": (2, _recorded_steps),
    "profile_active": (1, _recorded_steps),
    "ratio_explosion": (5.0, lambda config, _: _kinds_after(config, ratio_max=8.0)),
    "ratio_collapse": (0.3, lambda config, _: _kinds_after(config, ratio_min=0.2)),
    "value_collapse_ratio": (0.1, lambda config, _: _kinds_after(config, value_std=0.05)),
    "value_collapse_min_return_std": (0.1, lambda config, _: _kinds_after(config, value_std=0.0, return_std=0.01)),
    "entropy_collapse_low": (0.09, lambda config, _: _entropy_sequence(config, (0.08,))),
    "entropy_collapse_high": (0.2, lambda config, _: _entropy_sequence(config, (0.04, 0.12, 0.04))),
    "kl_spike_factor": (2.0, lambda config, _: _kinds_after(config, approx_kl=0.045)),
    "gradient_drift_factor": (2.0, lambda config, _: _drift_sequence(config, (1.0, 1.0, 1.0, 1.0, 3.0))),
    "gradient_drift_warmup": (1, lambda config, _: _drift_sequence(config, (1.0, 1.0, 10.0))),
    "ema_momentum": (0.0, lambda config, _: _drift_sequence(config, (1.0, 1.0, 1.0, 1.0, 0.1, 0.6))),
    "lstm_explosion_threshold": (5.0, lambda config, _: _lstm_kinds(config, 0.5, 8.0)),
    "lstm_vanishing_threshold": (1e-2, lambda config, _: _lstm_kinds(config, 5e-3, 0.1)),
    "debug_layer_stats": (False, _layer_statistics_enabled),
}


def test_every_field_has_a_behaviour_test() -> None:
    assert set(BEHAVIOURS) == {field.name for field in dataclasses.fields(TelemetryConfig)}


@pytest.mark.parametrize("name", sorted(BEHAVIOURS))
def test_field_changes_behaviour(name: str, tmp_path: Path) -> None:
    value, observe = BEHAVIOURS[name]
    default = TelemetryConfig()
    assert getattr(default, name) != value
    changed = dataclasses.replace(default, **{name: value})
    assert observe(default, tmp_path / "default") != observe(changed, tmp_path / "changed")


def test_defaults() -> None:
    config = TelemetryConfig()
    assert (config.level, config.escalation_epochs, config.tensorboard, config.profile) == ("normal", 5, False, False)
    assert (config.ratio_explosion, config.ratio_collapse) == (10.0, 0.1)
    assert config.entropy_collapse_low < config.entropy_collapse_high


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"level": "verbose"}, "level must be one of off, minimal, normal, debug; got 'verbose'"),
        ({"tensorboard": 1}, "tensorboard must be true or false; got 1"),
        ({"escalation_epochs": -1}, "escalation_epochs must be an integer >= 0; got -1"),
        ({"profile_active": 0}, "profile_active must be an integer >= 1; got 0"),
        ({"profile_wait": 1.5}, "profile_wait must be an integer >= 0; got 1.5"),
        ({"gradient_drift_warmup": True}, "gradient_drift_warmup must be an integer >= 1; got True"),
        ({"ratio_explosion": 1.0}, r"ratio_explosion must be a number in \(1.0, inf\); got 1.0"),
        ({"ratio_collapse": 0.0}, r"ratio_collapse must be a number in \(0.0, 1.0\); got 0.0"),
        ({"ema_momentum": 1.0}, r"ema_momentum must be a number in \[0.0, 1.0\); got 1.0"),
        ({"kl_spike_factor": math.nan}, "kl_spike_factor must be a number"),
        ({"entropy_collapse_high": 1.5}, r"entropy_collapse_high must be a number in \(0.0, 1.0\]"),
        ({"entropy_collapse_low": 0.2, "entropy_collapse_high": 0.1}, "the gap is the hysteresis"),
        ({"lstm_vanishing_threshold": 20.0}, "lstm_vanishing_threshold must be below lstm_explosion_threshold"),
    ],
)
def test_bad_values_name_the_field_and_the_accepted_range(changes: dict[str, Any], message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        TelemetryConfig(**changes)


def test_loads_through_build_config_with_key_paths() -> None:
    config = build_config(TelemetryConfig, {"level": "debug", "kl_spike_factor": 3})
    assert config.level == "debug" and config.kl_spike_factor == 3.0
    with pytest.raises(ConfigError, match="escalation_epoch: unknown key"):
        build_config(TelemetryConfig, {"escalation_epoch": 3})


def test_hub_takes_a_level_or_a_config_not_both() -> None:
    with pytest.raises(ValueError, match="not both"):
        Telemetry(None, level="debug", config=TelemetryConfig())
    assert Telemetry(None, level="debug").config == TelemetryConfig(level="debug")
