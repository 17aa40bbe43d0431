"""Governor: roll the model back to its last good state when training diverges (DESIGN §5 step 6).

After every healthy epoch it copies the host's and the seeds' state into buffers it reuses.
A non-finite training loss, or a loss more than
`sigma` standard deviations above its recent window, or above `absolute_ceiling`, triggers a
rollback: the host and fossilized seeds get their snapshot back, every live seed is pruned, and
the reason is recorded. Nothing else of the run is lost.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

import torch
from torch import Tensor

from morphogen.core.lifecycle import Stage
from morphogen.core.model import MorphogeneticModel


@dataclass(frozen=True)
class GovernorConfig:
    """When the governor rolls back."""

    #: Standard deviations above the recent loss window that count as divergence.
    sigma: float = 6.0
    #: Number of recent healthy epoch losses the window keeps.
    window: int = 10
    #: Healthy epochs needed before the sigma rule applies (the first epochs move fast).
    min_history: int = 3
    #: A training loss above this is divergence whatever the window says.
    absolute_ceiling: float = 50.0

    def __post_init__(self) -> None:
        if not self.sigma > 0:  # written this way so that NaN fails too
            raise ValueError(f"governor sigma must be > 0, got {self.sigma}")
        if self.window < 2 or self.min_history < 2 or self.min_history > self.window:
            raise ValueError(f"need 2 <= min_history <= window, got min_history={self.min_history}, "
                             f"window={self.window}")
        if not self.absolute_ceiling > 0:
            raise ValueError(f"absolute_ceiling must be > 0, got {self.absolute_ceiling}")


@dataclass(frozen=True)
class Rollback:
    """What the governor did and why."""

    reason: str
    loss: float
    threshold: float
    pruned_slots: tuple[str, ...]


class Governor:
    """Keeps the last good state of a model and restores it when the loss diverges."""

    def __init__(self, model: MorphogeneticModel, config: GovernorConfig | None = None) -> None:
        self.model = model
        self.config = config or GovernorConfig()
        self.losses: deque[float] = deque(maxlen=self.config.window)
        self._snapshot: dict[str, Tensor] = {}
        self.rollbacks = 0
        self.take_snapshot()

    def _state_to_keep(self) -> dict[str, Tensor]:
        state = {f"host.{k}": v for k, v in self.model.host.state_dict().items()}
        # Live seeds too: one may fossilize between this snapshot and a rollback.
        for slot in self.model.slots():
            if slot.seed is not None:
                state.update({f"{slot.slot_id}.{k}": v for k, v in slot.seed.state_dict().items()})
        return state

    @torch.no_grad()
    def take_snapshot(self) -> None:
        """Copy the current good state (reusing buffers from the last snapshot where shapes match)."""
        state = self._state_to_keep()
        for key, value in state.items():
            kept = self._snapshot.get(key)
            if kept is None or kept.shape != value.shape or kept.dtype != value.dtype:
                self._snapshot[key] = value.detach().clone()
            else:
                kept.copy_(value)
        for key in set(self._snapshot) - set(state):
            del self._snapshot[key]

    def threshold(self) -> float:
        """The loss above which the current window calls an epoch divergent."""
        if len(self.losses) < self.config.min_history:
            return self.config.absolute_ceiling
        mean = statistics.fmean(self.losses)
        spread = statistics.pstdev(self.losses)
        # A floor on the spread keeps a perfectly flat window from flagging tiny wiggles.
        spread = max(spread, 0.05 * abs(mean), 1e-3)
        return min(mean + self.config.sigma * spread, self.config.absolute_ceiling)

    def check(self, loss: float, epoch: int) -> Rollback | None:
        """Judge an epoch's training loss; roll back and return what was done, or snapshot and return None."""
        threshold = self.threshold()
        if math.isfinite(loss) and loss <= threshold:
            self.losses.append(loss)
            self.take_snapshot()
            return None
        reason = "non-finite training loss" if not math.isfinite(loss) else (
            f"training loss {loss:.3g} above threshold {threshold:.3g}")
        return self._roll_back(reason, loss, threshold, epoch)

    @torch.no_grad()
    def _roll_back(self, reason: str, loss: float, threshold: float, epoch: int) -> Rollback:
        pruned = []
        for slot in self.model.slots():
            if slot.seed is not None and slot.stage is not Stage.FOSSILIZED:
                slot.prune(epoch, f"governor rollback: {reason}")
                pruned.append(slot.slot_id)
        current = self._state_to_keep()
        for key, value in current.items():
            if key in self._snapshot:
                value.copy_(self._snapshot[key])
        self.rollbacks += 1
        return Rollback(reason, loss, threshold, tuple(pruned))
