"""Alpha schedules: the blend weight of a seed ramps from `start` to `target` along a curve.

One `tick()` per epoch while a ramp runs. Alpha stays within [start, target] (or [target, start] when
ramping down) and lands exactly on the target on the last tick, whatever floating point does to the
curve in between.
"""

from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass


class AlphaMode(enum.Enum):
    HOLD = "hold"
    UP = "up"
    DOWN = "down"


class AlphaCurve(enum.Enum):
    LINEAR = "linear"
    COSINE = "cosine"
    SIGMOID = "sigmoid"


def linear_curve(t: float) -> float:
    return t


def cosine_curve(t: float) -> float:
    return (1.0 - math.cos(math.pi * t)) / 2.0


def sigmoid_curve(t: float, steepness: float = 12.0) -> float:
    """Logistic curve centred at t=0.5, rescaled so that curve(0) = 0 and curve(1) = 1 exactly."""
    if not steepness > 0:
        raise ValueError(f"sigmoid steepness must be > 0, got {steepness}")
    # logistic(z) = (1 + tanh(z / 2)) / 2, so the rescaled logistic is a ratio of tanh values: it cannot
    # overflow for any steepness (math.exp does past ~700), and tanh being odd makes both ends exact.
    edge = math.tanh(steepness / 4.0)
    return (math.tanh(steepness * (t - 0.5) / 2.0) + edge) / (2.0 * edge)


def curve_value(curve: AlphaCurve, t: float, steepness: float = 12.0) -> float:
    """Progress along `curve` at fraction `t` of the ramp, for t clamped to [0, 1]."""
    t = min(max(t, 0.0), 1.0)
    if curve is AlphaCurve.LINEAR:
        return linear_curve(t)
    if curve is AlphaCurve.COSINE:
        return cosine_curve(t)
    return sigmoid_curve(t, steepness)


@dataclass
class AlphaController:
    """State of one seed's alpha ramp (docs/architecture.md#alpha-and-blends). Retargeting is only allowed from HOLD."""

    alpha: float = 0.0
    start: float = 0.0
    target: float = 0.0
    mode: AlphaMode = AlphaMode.HOLD
    curve: AlphaCurve = AlphaCurve.LINEAR
    steepness: float = 12.0
    steps_total: int = 0
    steps_done: int = 0

    @property
    def ramping(self) -> bool:
        return self.mode is not AlphaMode.HOLD

    @property
    def progress(self) -> float:
        """Fraction of the current ramp done (1.0 when holding)."""
        return 1.0 if self.steps_total == 0 else self.steps_done / self.steps_total

    def retarget(self, target: float, steps: int, curve: AlphaCurve | None = None,
                 steepness: float | None = None) -> None:
        """Start a ramp from the current alpha to `target` over `steps` ticks; `steps == 0` snaps."""
        if self.ramping:
            raise ValueError(f"alpha is ramping {self.mode.name}; retarget only from HOLD")
        if not 0.0 <= target <= 1.0:
            raise ValueError(f"alpha target must be in [0, 1], got {target}")
        if steps < 0:
            raise ValueError(f"ramp steps must be >= 0, got {steps}")
        if steepness is not None and not steepness > 0:
            raise ValueError(f"sigmoid steepness must be > 0, got {steepness}")
        # Everything is validated above, so a refused retarget leaves the controller untouched.
        if curve is not None:
            self.curve = curve
        if steepness is not None:
            self.steepness = steepness
        self.start, self.target = self.alpha, target
        self.steps_total, self.steps_done = steps, 0
        if steps == 0 or target == self.alpha:
            self.alpha, self.steps_total = target, 0
            self.mode = AlphaMode.HOLD
            return
        self.mode = AlphaMode.UP if target > self.alpha else AlphaMode.DOWN

    def tick(self) -> bool:
        """Advance the ramp by one epoch; return True when this tick finished it."""
        if not self.ramping:
            return False
        self.steps_done += 1
        if self.steps_done >= self.steps_total:
            self.alpha = self.target
            self.mode = AlphaMode.HOLD
            return True
        fraction = curve_value(self.curve, self.steps_done / self.steps_total, self.steepness)
        value = self.start + (self.target - self.start) * fraction
        low, high = min(self.start, self.target), max(self.start, self.target)
        self.alpha = min(max(value, low), high)
        return False

    def state_dict(self) -> dict[str, object]:
        state = asdict(self)
        state["mode"] = self.mode.value
        state["curve"] = self.curve.value
        return state

    @classmethod
    def from_state_dict(cls, state: dict[str, object]) -> AlphaController:
        return cls(
            alpha=_number(state, "alpha"),
            start=_number(state, "start"),
            target=_number(state, "target"),
            mode=AlphaMode(state["mode"]),
            curve=AlphaCurve(state["curve"]),
            steepness=_number(state, "steepness"),
            steps_total=_count(state, "steps_total"),
            steps_done=_count(state, "steps_done"),
        )


def _number(state: dict[str, object], key: str) -> float:
    value = state[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"alpha state {key!r} must be a number, got {value!r}")
    return float(value)


def _count(state: dict[str, object], key: str) -> int:
    value = state[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"alpha state {key!r} must be an int, got {value!r}")
    return value
