"""The effective telemetry level: the configured one, raised to debug for a while after an anomaly.

Escalation lasts `escalation_epochs` calls of `end_epoch()` after the latest anomaly (an anomaly
during an escalation restarts the count). At `off` nothing is written, so there is nothing to
escalate; at `debug` the level is already the highest. Each change of the effective level comes
back as a `TelemetryLevelChanged` event for the caller to emit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from morphogen.telemetry.events import ALL_ENVS, LEVELS, TelemetryLevelChanged

ESCALATED_LEVEL = "debug"
"""Level written while escalated."""


class TelemetryLevelController:
    """Tracks the effective level; `escalate()` on an anomaly, `end_epoch()` once per epoch."""

    def __init__(self, level: str, escalation_epochs: int) -> None:
        if level not in LEVELS:
            raise ValueError(f"telemetry level must be one of {', '.join(LEVELS)}; got {level!r}")
        if escalation_epochs < 0:
            raise ValueError(f"escalation_epochs must be >= 0 (0 turns escalation off); got {escalation_epochs}")
        self.configured_level = level
        self.escalation_epochs = escalation_epochs
        self._epochs_left = 0

    @property
    def level(self) -> str:
        """The effective level: debug while escalated, else the configured one."""
        return ESCALATED_LEVEL if self._epochs_left > 0 else self.configured_level

    def escalate(self, *, epoch: int, reason: str, env_id: int = ALL_ENVS) -> TelemetryLevelChanged | None:
        """Raise the level to debug for `escalation_epochs` epochs; the event if the level changed."""
        if self.escalation_epochs == 0 or self.configured_level in ("off", ESCALATED_LEVEL):
            return None
        was_escalated = self._epochs_left > 0
        self._epochs_left = self.escalation_epochs
        if was_escalated:
            return None
        return TelemetryLevelChanged(
            epoch=epoch, env_id=env_id, from_level=self.configured_level, to_level=ESCALATED_LEVEL, reason=reason
        )

    def end_epoch(self, *, epoch: int, env_id: int = ALL_ENVS) -> TelemetryLevelChanged | None:
        """Count one epoch of escalation down; the event if the level returned to the configured one."""
        if self._epochs_left == 0:
            return None
        self._epochs_left -= 1
        if self._epochs_left > 0:
            return None
        return TelemetryLevelChanged(
            epoch=epoch,
            env_id=env_id,
            from_level=ESCALATED_LEVEL,
            to_level=self.configured_level,
            reason=f"no anomaly for {self.escalation_epochs} epochs",
        )

    def state_dict(self) -> dict[str, Any]:
        """Epochs of escalation left (the levels themselves are configuration)."""
        return {"epochs_left": self._epochs_left}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what `state_dict` returned."""
        epochs_left = int(state["epochs_left"])
        if not 0 <= epochs_left <= self.escalation_epochs:
            raise ValueError(f"epochs_left must be in [0, {self.escalation_epochs}]; got {epochs_left}")
        self._epochs_left = epochs_left
