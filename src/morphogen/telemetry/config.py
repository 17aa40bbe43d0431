"""Telemetry settings: level, escalation, TensorBoard, profiling, and the anomaly detectors' thresholds.

Every field is read somewhere in `morphogen.telemetry` (no dead flags: docs/architecture.md#telemetry);
the docstring of each field says where. Values are checked when the config is built; an error names the
field, the bad value and what is accepted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from morphogen.telemetry.events import LEVELS


@dataclass(frozen=True)
class TelemetryConfig:
    """How much telemetry a run records, where it goes, and when the monitors call something an anomaly."""

    level: str = "normal"
    """One of off, minimal, normal, debug: which events the `Telemetry` hub writes (each event type
    has a `min_level`); the phase timer runs at normal and debug only."""
    escalation_epochs: int = 5
    """After an anomaly the hub writes at debug level for this many epochs, then returns to `level`.
    0 turns escalation off."""
    tensorboard: bool = False
    """Also write every event's scalars to TensorBoard in RUN_DIR/tb (needs the `tensorboard` package)."""
    profile: bool = False
    """Record a `torch.profiler` trace into RUN_DIR/profile over the window of steps set below."""
    profile_wait: int = 1
    """Profiler steps skipped before the trace window (the first steps include one-off setup)."""
    profile_warmup: int = 1
    """Profiler steps traced but discarded, so the profiler's own start-up cost is not recorded."""
    profile_active: int = 3
    """Profiler steps recorded into the trace."""
    ratio_explosion: float = 10.0
    """PPO ratio explosion: the largest new/old probability ratio of a PPO update exceeds this."""
    ratio_collapse: float = 0.1
    """PPO ratio collapse: the smallest new/old probability ratio of a PPO update falls below this."""
    value_collapse_ratio: float = 0.01
    """Value collapse: the std of the value predictions is below this fraction of the std of the returns."""
    value_collapse_min_return_std: float = 1e-3
    """Value collapse is judged only when returns vary: their std must exceed this."""
    entropy_collapse_low: float = 0.05
    """A policy head's entropy collapses when it falls below this fraction of the head's maximum entropy."""
    entropy_collapse_high: float = 0.10
    """A collapsed head counts as recovered only above this fraction (hysteresis: no flapping)."""
    kl_spike_factor: float = 4.0
    """KL spike: the approximate KL of a PPO update exceeds this multiple of the target KL."""
    gradient_drift_factor: float = 5.0
    """Gradient drift: a gradient norm exceeds this multiple of its exponential moving average."""
    gradient_drift_warmup: int = 3
    """Gradient drift is judged only once the moving average has seen this many norms."""
    ema_momentum: float = 0.9
    """Momentum of the gradient-norm moving averages: average = momentum * average + (1 - momentum) * norm."""
    lstm_explosion_threshold: float = 10.0
    """LSTM explosion: the root mean square of some sample's hidden or cell state exceeds this."""
    lstm_vanishing_threshold: float = 1e-3
    """LSTM vanishing: the root mean square of every sample's hidden state is below this."""
    debug_layer_stats: bool = True
    """At debug level (configured or escalated), record per-layer parameter and gradient statistics.
    False keeps the other debug events but skips these, which loop over every parameter tensor."""

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"level must be one of {', '.join(LEVELS)}; got {self.level!r}")
        for name in ("tensorboard", "profile", "debug_layer_stats"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be true or false; got {getattr(self, name)!r}")
        self._check_ints()
        self._check_floats()

    def _check_ints(self) -> None:
        minimums = {
            "escalation_epochs": 0,
            "profile_wait": 0,
            "profile_warmup": 0,
            "profile_active": 1,
            "gradient_drift_warmup": 1,
        }
        for name, minimum in minimums.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise ValueError(f"{name} must be an integer >= {minimum}; got {value!r}")

    def _check_floats(self) -> None:
        # (lower, upper, lower inclusive?, upper inclusive?) per field.
        ranges = {
            "ratio_explosion": (1.0, math.inf, False, False),
            "ratio_collapse": (0.0, 1.0, False, False),
            "value_collapse_ratio": (0.0, 1.0, False, False),
            "value_collapse_min_return_std": (0.0, math.inf, False, False),
            "entropy_collapse_low": (0.0, 1.0, False, False),
            "entropy_collapse_high": (0.0, 1.0, False, True),
            "kl_spike_factor": (0.0, math.inf, False, False),
            "gradient_drift_factor": (1.0, math.inf, False, False),
            "ema_momentum": (0.0, 1.0, True, False),
            "lstm_explosion_threshold": (0.0, math.inf, False, False),
            "lstm_vanishing_threshold": (0.0, math.inf, True, False),
        }
        for name, (lower, upper, lower_inclusive, upper_inclusive) in ranges.items():
            value = getattr(self, name)
            above = isinstance(value, int | float) and (value >= lower if lower_inclusive else value > lower)
            below = isinstance(value, int | float) and (value <= upper if upper_inclusive else value < upper)
            if isinstance(value, bool) or not (above and below):
                interval = f"{'[' if lower_inclusive else '('}{lower}, {upper}{']' if upper_inclusive else ')'}"
                raise ValueError(f"{name} must be a number in {interval}; got {value!r}")
        if self.entropy_collapse_low >= self.entropy_collapse_high:
            raise ValueError(
                "entropy_collapse_low must be below entropy_collapse_high (the gap is the hysteresis); got "
                f"entropy_collapse_low={self.entropy_collapse_low}, entropy_collapse_high={self.entropy_collapse_high}"
            )
        if self.lstm_vanishing_threshold >= self.lstm_explosion_threshold:
            raise ValueError(
                "lstm_vanishing_threshold must be below lstm_explosion_threshold; got "
                f"{self.lstm_vanishing_threshold} and {self.lstm_explosion_threshold}"
            )
