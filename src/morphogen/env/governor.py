"""Governor: roll the model back to its last good state when training diverges.

After every healthy epoch it copies the host's and the seeds' state into buffers it reuses. An epoch
is divergent when any of these holds:
- its training loss is non-finite, more than `sigma` standard deviations above its recent window, or
  above its ceiling: `absolute_ceiling`, or `initial_loss_factor` times the untrained model's validation
  loss where that is larger (so a regression in raw units, whose loss starts at 1e4, is not divergent
  from its first epoch);
- its validation loss is non-finite or above `validation_loss_factor` times the largest recent healthy
  validation loss (the untrained model's loss, given to `observe_validation` when an episode starts,
  is the first of them, so a host that blows up in its very first epoch is caught too);
- its validation accuracy fell to chance (at most `at_chance_factor` x chance) after a healthy epoch
  had reached `above_chance_factor` x chance.
The training loss alone misses moderate divergence: at `host_lr = 5` it stays modest while the
validation loss reaches 1e4 and the accuracy sits at chance.

A rollback restores the host and fossilized seeds from the snapshot, prunes every live seed, records
why, and names what to *back off*: the learning rate of what diverged is to be multiplied by
`backoff` (the seeds' when live seeds were pruned, since they are the newest change to the model; the
host's otherwise), so that the same divergence is not replayed epoch after epoch. The rollback that
makes `max_consecutive_rollbacks` in a row is marked `gave_up`: the episode then stops with
`DivergenceError`, since nothing more can be learnt from it. Nothing else of the run is lost.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from morphogen.core.lifecycle import Stage
from morphogen.core.model import MorphogeneticModel


@dataclass(frozen=True)
class GovernorConfig:
    """When the governor rolls back, and how it backs off."""

    #: Standard deviations above the recent loss window that count as divergence.
    sigma: float = 6.0
    #: Number of recent healthy epoch losses the window keeps.
    window: int = 10
    #: Healthy epochs needed before the sigma rule applies (the first epochs move fast).
    min_history: int = 3
    #: A training loss above this is divergence whatever the window says ...
    absolute_ceiling: float = 50.0
    #: ... or above this multiple of the untrained model's validation loss, where that is the larger.
    initial_loss_factor: float = 20.0
    #: A validation loss above this multiple of the largest recent healthy one is divergence.
    validation_loss_factor: float = 5.0
    #: Validation accuracy at or below this multiple of chance counts as "at chance" ...
    at_chance_factor: float = 1.2
    #: ... which is divergence once a healthy epoch has reached this multiple of chance.
    above_chance_factor: float = 2.0
    #: Learning-rate multiplier applied to what diverged after each rollback.
    backoff: float = 0.5
    #: Rollbacks in a row after which the episode stops with `DivergenceError`.
    max_consecutive_rollbacks: int = 5

    def __post_init__(self) -> None:
        if not self.sigma > 0:  # written this way so that NaN fails too
            raise ValueError(f"governor sigma must be > 0, got {self.sigma}")
        if self.window < 2 or self.min_history < 2 or self.min_history > self.window:
            raise ValueError(f"need 2 <= min_history <= window, got min_history={self.min_history}, "
                             f"window={self.window}")
        if not self.absolute_ceiling > 0:
            raise ValueError(f"absolute_ceiling must be > 0, got {self.absolute_ceiling}")
        if not 1 <= self.initial_loss_factor < math.inf:
            raise ValueError(f"initial_loss_factor must be >= 1 and finite, got {self.initial_loss_factor}")
        if not self.validation_loss_factor > 1:
            raise ValueError(f"validation_loss_factor must be > 1, got {self.validation_loss_factor}")
        if not 1 <= self.at_chance_factor < self.above_chance_factor:
            raise ValueError("need 1 <= at_chance_factor < above_chance_factor, got at_chance_factor="
                             f"{self.at_chance_factor}, above_chance_factor={self.above_chance_factor}")
        if not 0 < self.backoff <= 1:
            raise ValueError(f"backoff must be in (0, 1], got {self.backoff}")
        if not 1 <= self.max_consecutive_rollbacks <= 1000:
            raise ValueError(f"max_consecutive_rollbacks must be in [1, 1000], got {self.max_consecutive_rollbacks}")


class DivergenceError(RuntimeError):
    """Training kept diverging after every rollback and back-off; the run stops (the message says why)."""


@dataclass(frozen=True)
class Rollback:
    """What the governor did and why."""

    reason: str
    #: The number judged divergent (a training or validation loss, or an accuracy) ...
    loss: float
    #: ... and the limit it broke.
    threshold: float
    pruned_slots: tuple[str, ...]
    #: Whose learning rate to multiply by `GovernorConfig.backoff`: "seeds" or "host".
    backed_off: str = "host"
    #: Rollbacks in a row, this one included.
    in_a_row: int = 1
    #: True once `in_a_row` reached `max_consecutive_rollbacks`: the episode must stop.
    gave_up: bool = False


class Governor:
    """Keeps the last good state of a model and restores it when training diverges."""

    def __init__(self, model: MorphogeneticModel, config: GovernorConfig | None = None, *,
                 chance_accuracy: float | None = None) -> None:
        """`chance_accuracy` (in %, e.g. 10.0 for 10 classes) enables the at-chance rule; None disables it."""
        self.model = model
        self.config = config or GovernorConfig()
        self.chance_accuracy = chance_accuracy
        self.losses: deque[float] = deque(maxlen=self.config.window)
        self.validation_losses: deque[float] = deque(maxlen=self.config.window)
        self.best_accuracy = -math.inf
        #: The untrained model's validation loss (the first `observe_validation`), which scales the ceiling.
        self.initial_validation_loss: float | None = None
        self._snapshot: dict[str, Tensor] = {}
        self.rollbacks = 0
        self.in_a_row = 0
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

    def state_dict(self) -> dict[str, Any]:
        """The windows of losses it judges by, its counters and the last good state (tensors shared, not copied)."""
        return {"losses": list(self.losses), "validation_losses": list(self.validation_losses),
                "best_accuracy": self.best_accuracy, "rollbacks": self.rollbacks, "in_a_row": self.in_a_row,
                "initial_validation_loss": self.initial_validation_loss, "last_good": dict(self._snapshot)}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` gave; the last good state is copied onto the host's device."""
        self.losses = deque((float(x) for x in state["losses"]), maxlen=self.config.window)
        self.validation_losses = deque((float(x) for x in state["validation_losses"]), maxlen=self.config.window)
        self.best_accuracy = float(state["best_accuracy"])
        self.rollbacks, self.in_a_row = int(state["rollbacks"]), int(state["in_a_row"])
        # A state saved before the ceiling scaled with the task has none: its first window entry stands in.
        initial = state.get("initial_validation_loss", self.validation_losses[0] if self.validation_losses else None)
        self.initial_validation_loss = None if initial is None else float(initial)
        # Its keys are those of the model when it was taken, which may hold other seeds than the model now.
        device = next(self.model.host.parameters()).device
        self._snapshot = {str(key): value.detach().to(device).clone() for key, value in state["last_good"].items()}

    def ceiling(self) -> float:
        """The training loss above which any epoch is divergent, in the units of the task's loss."""
        initial = self.initial_validation_loss
        scaled = self.config.initial_loss_factor * initial if initial is not None else -math.inf
        return max(self.config.absolute_ceiling, scaled)

    def threshold(self) -> float:
        """The training loss above which the current window calls an epoch divergent."""
        if len(self.losses) < self.config.min_history:
            return self.ceiling()
        mean = statistics.fmean(self.losses)
        spread = statistics.pstdev(self.losses)
        # A floor on the spread keeps a perfectly flat window from flagging tiny wiggles.
        spread = max(spread, 0.05 * abs(mean), 1e-3)
        return min(mean + self.config.sigma * spread, self.ceiling())

    def observe_validation(self, loss: float, accuracy: float) -> None:
        """Add a healthy validation result to the window (the untrained model's, when an episode starts)."""
        if math.isfinite(loss):
            self.validation_losses.append(loss)
            if self.initial_validation_loss is None:
                self.initial_validation_loss = loss
        if math.isfinite(accuracy):
            self.best_accuracy = max(self.best_accuracy, accuracy)

    def check(self, loss: float, epoch: int, *, val_loss: float | None = None,
              val_accuracy: float | None = None) -> Rollback | None:
        """Judge an epoch; roll back and return what was done, or snapshot and return None.

        `loss` is the epoch's mean training loss; `val_loss` and `val_accuracy` (in %), when given, are
        the validation of the model the epoch produced.
        """
        threshold = self.threshold()
        if not (math.isfinite(loss) and loss <= threshold):
            reason = "non-finite training loss" if not math.isfinite(loss) else (
                f"training loss {loss:.3g} above threshold {threshold:.3g}")
            return self._roll_back(reason, loss, threshold, epoch)
        divergence = self._judge_validation(val_loss, val_accuracy)
        if divergence is not None:
            return self._roll_back(*divergence, epoch)
        self.losses.append(loss)
        if val_loss is not None and val_accuracy is not None:
            self.observe_validation(val_loss, val_accuracy)
        self.in_a_row = 0
        self.take_snapshot()
        return None

    def _judge_validation(self, val_loss: float | None,
                          val_accuracy: float | None) -> tuple[str, float, float] | None:
        """(reason, value, limit) when the validation result is divergent, else None."""
        config = self.config
        if val_loss is not None:
            limit = config.validation_loss_factor * max(self.validation_losses, default=math.inf)
            if not math.isfinite(val_loss):
                return "non-finite validation loss", val_loss, limit
            if val_loss > limit:
                return f"validation loss {val_loss:.3g} above {limit:.3g}", val_loss, limit
        chance = self.chance_accuracy
        reached = chance is not None and self.best_accuracy >= config.above_chance_factor * chance
        if val_accuracy is not None and chance is not None and reached:
            limit = config.at_chance_factor * chance
            if not val_accuracy > limit:  # NaN too
                return (f"validation accuracy {val_accuracy:.3g}% fell to chance ({chance:.3g}%) after reaching "
                        f"{self.best_accuracy:.3g}%"), val_accuracy, limit
        return None

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
        self.in_a_row += 1
        return Rollback(reason, loss, threshold, tuple(pruned), backed_off="seeds" if pruned else "host",
                        in_a_row=self.in_a_row, gave_up=self.in_a_row >= self.config.max_consecutive_rollbacks)
