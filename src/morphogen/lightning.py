"""A PyTorch Lightning callback that grows the model of a `LightningModule` (the `lightning` extra).

The module's `training_step` returns `grower.training_step(inputs, targets)` and its optimizer holds
`grower.model.host_parameters()`. The callback hands that optimizer to the grower when `fit` starts (a
divergence rolled back then clears its state and backs off its rate, as `Grower(optimizer=...)` does) and
makes the two other calls of `morphogen.Grower` at the right moments: `after_backward` after every backward
pass (with the precision plugin's `GradScaler` under 16-bit mixed precision), `end_epoch` at the end of every
training epoch, whose figures it logs as `growth/score`, `growth/loss` and `growth/parameters`. Train for the
grower's number of epochs.
Lightning's checkpoints carry the grower's state (`Grower.state_dict`), so `trainer.fit(..., ckpt_path=...)`
goes on growing where the checkpoint was taken, at the end of an epoch. A `ModelCheckpoint` that would save inside
an epoch (`every_n_train_steps`, `train_time_interval`, or after a validation Lightning runs before the epoch ends)
is refused when training starts, in one line that names the setting to use instead.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.model_helpers import is_overridden

from morphogen.grower import EpochReport, Grower


class GrowthCallback(pl.Callback):
    """Drives a `Grower` from Lightning's hooks; `reports` keeps every epoch's `EpochReport`."""

    def __init__(self, grower: Grower) -> None:
        super().__init__()
        self.grower = grower
        self.reports: list[EpochReport] = []

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Hand the grower the optimizer `configure_optimizers` built (it runs after the Grower is built), so that a
        rollback clears its state and backs off its rate as for `Grower(optimizer=...)`."""
        self.grower.use_optimizer(_host_optimizer(self.grower, trainer.optimizers))

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Refuse, before the first batch, a `ModelCheckpoint` that would save in the middle of an epoch (where a
        grower's state cannot be saved): known here, once Lightning has set up the validation data."""
        has_validation = is_overridden("validation_step", pl_module)
        for checkpoint in trainer.checkpoint_callbacks:
            problem = _mid_epoch_saving(checkpoint, trainer, has_validation)
            if problem is not None:
                where, instead = problem
                raise ValueError(f"GrowthCallback: {where}, where a grower cannot be saved (its state is whole only "
                                 f"between epochs); use {instead}")

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        scaler: Any = getattr(trainer.precision_plugin, "scaler", None)
        self.grower.after_backward(scaler)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        report = self.grower.end_epoch()
        self.reports.append(report)
        pl_module.log_dict({"growth/score": report.score, "growth/loss": report.loss,
                            "growth/parameters": float(report.parameters)})

    def state_dict(self) -> dict[str, Any]:
        """The grower's state, which Lightning writes into its checkpoints (taken at the end of an epoch)."""
        return {"grower": self.grower.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Go on from a checkpoint's grower state (`trainer.fit(..., ckpt_path=...)`)."""
        self.grower.load_state_dict(state_dict["grower"])


def _host_optimizer(grower: Grower, optimizers: list[torch.optim.Optimizer]) -> torch.optim.Optimizer:
    """The trainer's optimizer that a rollback resets: the grower's own `optimizer=` where it is one of them, else
    the one that holds the host's parameters. Raises `ValueError` where that is not one optimizer."""
    if grower.optimizer is not None:
        if not any(optimizer is grower.optimizer for optimizer in optimizers):
            raise ValueError("GrowthCallback: the Grower's optimizer= is not one the trainer steps: return it from "
                             "configure_optimizers, or build the Grower without optimizer= (the callback then takes "
                             "the trainer's)")
        return grower.optimizer
    host = {id(parameter) for parameter in grower.model.host_parameters()}
    holding = [optimizer for optimizer in optimizers
               if any(id(p) in host for group in optimizer.param_groups for p in group["params"])]
    if len(holding) != 1:
        held = "none of the trainer's optimizers holds" if not holding else f"{len(holding)} optimizers hold"
        raise ValueError(f"GrowthCallback: {held} the host's parameters, and a rollback resets the one that does: "
                         "optimize grower.model.host_parameters() in one optimizer, or give that one as "
                         "Grower(optimizer=...) and return it from configure_optimizers")
    return holding[0]


def _mid_epoch_saving(checkpoint: object, trainer: pl.Trainer, has_validation: bool) -> tuple[str, str] | None:
    """Where `checkpoint` would save inside a training epoch and what to use instead; None where it saves at an
    epoch's end (or is no `ModelCheckpoint`). Reads the callback's own settings, which it keeps private."""
    if not isinstance(checkpoint, ModelCheckpoint):
        return None
    at_epoch_end = "ModelCheckpoint(every_n_epochs=N), which saves at an epoch's end"
    steps: Any = getattr(checkpoint, "_every_n_train_steps", 0)
    if steps:
        return f"ModelCheckpoint(every_n_train_steps={steps}) saves in the middle of an epoch", at_epoch_end
    interval: Any = getattr(checkpoint, "_train_time_interval", None)
    if interval is not None:
        return f"ModelCheckpoint(train_time_interval={interval}) saves in the middle of an epoch", at_epoch_end
    saves_at_epoch_end: Any = getattr(checkpoint, "_should_save_on_train_epoch_end", lambda trainer: True)(trainer)
    if has_validation and not saves_at_epoch_end:
        return ("ModelCheckpoint saves after validation, which Lightning runs inside the training epoch here (as "
                "check_val_every_n_epoch, val_check_interval or save_on_train_epoch_end=False have it)",
                "ModelCheckpoint(save_on_train_epoch_end=True)")
    return None
