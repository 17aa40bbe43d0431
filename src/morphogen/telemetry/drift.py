"""Exponential moving averages of named scalars, and how far a new value drifts from its average.

The average is bias-corrected (Kingma & Ba, 2015, "Adam", §3): it starts at 0, so after n updates
the raw average is divided by 1 - momentum**n. Without that correction the first values would look
like huge drifts from an average still close to 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def drift_ratio(value: float, average: float) -> float:
    """value / average, with 0/0 = 1 (no drift) and x/0 = inf for x > 0."""
    if average == 0.0:
        return 1.0 if value == 0.0 else math.inf
    return value / average


class EMATracker:
    """Bias-corrected exponential moving average of one or many named scalars (plain Python floats).

    `update(value, key)` returns the drift ratio of `value` against the average of the values seen
    *before* it, then folds it in. The first value of a key has nothing to compare with: its ratio
    is NaN (unmeasured, which fails every `>` test). A non-finite value is reported (its ratio is
    inf or NaN) but not folded in, so one NaN cannot poison the average for good.
    """

    def __init__(self, momentum: float) -> None:
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1); got {momentum}")
        self.momentum = momentum
        self._raw: dict[str, float] = {}
        self._counts: dict[str, int] = {}

    def count(self, key: str = "") -> int:
        """Number of finite values folded into the average of `key`."""
        return self._counts.get(key, 0)

    def average(self, key: str = "") -> float:
        """Bias-corrected average of `key`; NaN before its first finite value."""
        count = self._counts.get(key, 0)
        if count == 0:
            return math.nan
        return self._raw[key] / (1.0 - self.momentum**count)

    def update(self, value: float, key: str = "") -> float:
        """Drift ratio of `value` against the current average of `key` (NaN if none), then fold it in."""
        average = self.average(key)
        ratio = math.nan if math.isnan(average) else drift_ratio(value, average)
        if math.isfinite(value):
            self._raw[key] = self.momentum * self._raw.get(key, 0.0) + (1.0 - self.momentum) * value
            self._counts[key] = self._counts.get(key, 0) + 1
        return ratio

    def forget(self, prefix: str) -> None:
        """Drop the averages of every key starting with `prefix` (their series start over)."""
        for key in [key for key in self._raw if key.startswith(prefix)]:
            del self._raw[key]
            self._counts.pop(key, None)

    def state_dict(self) -> dict[str, Any]:
        """Averages and counts per key (momentum is configuration, not state)."""
        return {"raw": dict(self._raw), "counts": dict(self._counts)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what `state_dict` returned."""
        raw, counts = dict(state["raw"]), dict(state["counts"])
        if set(raw) != set(counts):
            raise ValueError(f"EMATracker state has averages for {sorted(raw)} but counts for {sorted(counts)}")
        self._raw = {str(key): float(value) for key, value in raw.items()}
        self._counts = {str(key): int(value) for key, value in counts.items()}
