"""A PyTorch Lightning callback that grows the model of a `LightningModule` (the `lightning` extra).

The module's `training_step` returns `grower.training_step(inputs, targets)` and its optimizer holds
`grower.model.host_parameters()`. The callback hands that optimizer to the grower when `fit` starts (a
divergence rolled back then clears its state and backs off its rate, as `Grower(optimizer=...)` does) and
makes the two other calls of `morphogen.Grower` at the right moments: `after_backward` after every backward
pass (with the precision plugin's `GradScaler` under 16-bit mixed precision), `end_epoch` at the end of every
training epoch, whose figures it logs as `growth/score`, `growth/loss` and `growth/parameters`. Train for the
grower's number of epochs. With `every_n_steps=N` a growth period is N optimizer steps instead of an epoch
(training by `max_steps`, an endless data stream): `end_epoch` comes after every N-th step, and the trainer runs for
the grower's epochs times N steps.
Lightning's checkpoints carry the grower's state (`Grower.state_dict`), so `trainer.fit(..., ckpt_path=...)`
goes on growing where the checkpoint was taken, at the end of a period. A `ModelCheckpoint` that would save inside
one (`every_n_train_steps` not a multiple of the period, `train_time_interval`, after a validation Lightning runs
before the epoch ends, at an epoch's end when periods are steps, at a validation's end where a monitored metric is
not logged yet, or where an error stops training) is refused when training starts, in one line that names the
setting to use instead.
"""

from __future__ import annotations

from typing import Any

import torch

from morphogen.grower import EpochReport, Grower

try:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.utilities.model_helpers import is_overridden
except ImportError as error:  # said with the extra to install, as the onnx export says its own
    raise ImportError("morphogen.lightning needs PyTorch Lightning: pip install 'morphogen[lightning]'") from error


class GrowthCallback(pl.Callback):
    """Drives a `Grower` from Lightning's hooks; `reports` keeps every epoch's `EpochReport`."""

    def __init__(self, grower: Grower, *, every_n_steps: int | None = None) -> None:
        """`every_n_steps`: a growth period (the grower's epoch) is that many optimizer steps; None: one epoch."""
        super().__init__()
        if every_n_steps is not None and (isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int)
                                          or every_n_steps < 1):
            raise ValueError(f"GrowthCallback: every_n_steps must be a whole number >= 1 (or None: one period an "
                             f"epoch), got {every_n_steps!r}")
        self.grower = grower
        self.every_n_steps = every_n_steps
        self.reports: list[EpochReport] = []
        # The optimizer step the last period ended at: with gradient accumulation several batches end at one step.
        self._period_ended_at = 0

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Hand the grower the optimizer `configure_optimizers` built (it runs after the Grower is built), so that a
        rollback clears its state and backs off its rate as for `Grower(optimizer=...)`."""
        if not isinstance(trainer, pl.Trainer):  # `pytorch_lightning`'s, which is another package's classes
            package = type(trainer).__module__.split(".")[0]
            raise TypeError(f"GrowthCallback is a callback of the lightning package (lightning.pytorch), given to a "
                            f"{package} Trainer, whose modules and checkpoints it cannot read: build the Trainer and "
                            "the LightningModule from lightning.pytorch (import lightning.pytorch as pl)")
        self.grower.use_optimizer(_host_optimizer(self.grower, trainer.optimizers))

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Refuse, before the first batch, a trainer set to train longer than the grower has periods left (not at the
        first batch after the growth's last period), and a `ModelCheckpoint` that would save in the middle of an epoch
        (where a grower's state cannot be saved): known here, once Lightning has restored a checkpoint's epoch and
        step (after `on_fit_start`) and set up the validation data."""
        snapshot = self.grower.snapshot
        longer = _longer_than_the_growth(trainer, snapshot.max_epochs, snapshot.epoch, self.every_n_steps)
        if longer is not None:
            raise ValueError(f"GrowthCallback: {longer}; after the growth's last period the grower refuses another "
                             "training_step (train grower.model on as any module after it)")
        has_validation = is_overridden("validation_step", pl_module)
        for checkpoint in trainer.checkpoint_callbacks:
            problem = _mid_period_saving(checkpoint, trainer, has_validation, self.every_n_steps)
            if problem is not None:
                where, instead = problem
                between = "epochs" if self.every_n_steps is None else f"periods of every_n_steps={self.every_n_steps}"
                raise ValueError(f"GrowthCallback: {where}, where a grower cannot be saved (its state is whole only "
                                 f"between {between}); use {instead}")

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        scaler: Any = getattr(trainer.precision_plugin, "scaler", None)
        self.grower.after_backward(scaler)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        """With `every_n_steps`, end a growth period after every N-th optimizer step (before a `ModelCheckpoint` of
        that step saves: Lightning runs checkpoint callbacks last)."""
        step = trainer.global_step
        if self.every_n_steps is None or step == self._period_ended_at or step % self.every_n_steps:
            return
        self._period_ended_at = step
        self._end_period(pl_module)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.every_n_steps is None:
            self._end_period(pl_module)

    def _end_period(self, pl_module: pl.LightningModule) -> None:
        report = self.grower.end_epoch()
        self.reports.append(report)
        pl_module.log_dict({"growth/score": report.score, "growth/loss": report.loss,
                            "growth/parameters": float(report.parameters)})

    def state_dict(self) -> dict[str, Any]:
        """The grower's state, which Lightning writes into its checkpoints (taken at the end of a period)."""
        return {"grower": self.grower.state_dict(), "period_ended_at": self._period_ended_at}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Go on from a checkpoint's grower state (`trainer.fit(..., ckpt_path=...)`)."""
        self.grower.load_state_dict(state_dict["grower"])
        ended_at = state_dict.get("period_ended_at", 0)  # absent from checkpoints of a callback of periods of epochs
        self._period_ended_at = ended_at if isinstance(ended_at, int) and not isinstance(ended_at, bool) else 0


def _longer_than_the_growth(trainer: pl.Trainer, periods: int, played: int, every_n_steps: int | None) -> str | None:
    """How `trainer`, from the epoch and step it stands at, would train past the grower's `periods` growth periods,
    `played` of them already (a grower resumed, by a checkpoint or `load_state_dict`), or None. Lightning's default
    `max_epochs` is 1000. With `every_n_steps` the periods are steps: `max_steps` bounds them, when it is set."""
    max_steps, max_epochs = trainer.max_steps, trainer.max_epochs
    left = periods - played
    played_note = f" ({played} of them played)" if played else ""
    if every_n_steps is not None:
        most = trainer.global_step + left * every_n_steps
        if max_steps is not None and max_steps > most:
            return (f"Trainer(max_steps={max_steps}) trains past the grower's {periods} periods of every_n_steps="
                    f"{every_n_steps}{played_note}: give Trainer(max_steps={most})")
        return None
    if max_steps not in (None, -1):  # the steps may end training first; the epochs cannot be told in advance
        return None
    most = trainer.current_epoch + left
    if max_epochs is None or max_epochs == -1 or max_epochs > most:
        trains = "without end" if max_epochs in (None, -1) else f"{max_epochs} epochs"
        return (f"the Trainer trains {trains} (max_epochs={max_epochs}; Lightning's default is 1000), past the "
                f"grower's {periods}{played_note}: give Trainer(max_epochs={most})")
    return None


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


def _mid_period_saving(checkpoint: object, trainer: pl.Trainer, has_validation: bool,
                       every_n_steps: int | None) -> tuple[str, str] | None:
    """Where `checkpoint` would save inside a growth period (an epoch, or `every_n_steps` optimizer steps) and what
    to use instead; None where it saves only where one ends (or is no `ModelCheckpoint`)."""
    if not isinstance(checkpoint, ModelCheckpoint):
        return None
    if getattr(checkpoint, "save_on_exception", False):  # Lightning 2.6 and later
        return ("ModelCheckpoint(save_on_exception=True) saves wherever an error stops training",
                "a ModelCheckpoint without save_on_exception (resume from its last checkpoint)")
    if every_n_steps is None:
        return _mid_epoch_saving(checkpoint, trainer, has_validation)
    return _mid_steps_saving(checkpoint, trainer, has_validation, every_n_steps)


def _mid_epoch_saving(checkpoint: ModelCheckpoint, trainer: pl.Trainer,
                      has_validation: bool) -> tuple[str, str] | None:
    """Where `checkpoint` would save inside a training epoch and what to use instead; None where it saves at an
    epoch's end. Reads the callback's own settings, which it keeps private."""
    at_epoch_end = "ModelCheckpoint(every_n_epochs=N), which saves at an epoch's end"
    steps: Any = getattr(checkpoint, "_every_n_train_steps", 0)
    if steps:
        return f"ModelCheckpoint(every_n_train_steps={steps}) saves in the middle of an epoch", at_epoch_end
    interval: Any = getattr(checkpoint, "_train_time_interval", None)
    if interval is not None:
        return f"ModelCheckpoint(train_time_interval={interval}) saves in the middle of an epoch", at_epoch_end
    if has_validation and not _saves_at_epoch_end(checkpoint, trainer):
        return ("ModelCheckpoint saves after validation, which Lightning runs inside the training epoch here (as "
                "check_val_every_n_epoch, val_check_interval or save_on_train_epoch_end=False have it)",
                "ModelCheckpoint(save_on_train_epoch_end=True)")
    return None


def _mid_steps_saving(checkpoint: ModelCheckpoint, trainer: pl.Trainer, has_validation: bool,
                      every_n_steps: int) -> tuple[str, str] | None:
    """Where `checkpoint` would save inside a growth period of `every_n_steps` optimizer steps, and what to use
    instead; None where it saves only at steps that end one."""
    at_period_end = f"ModelCheckpoint(every_n_train_steps=k*{every_n_steps}), which saves where a period ends"
    steps: Any = getattr(checkpoint, "_every_n_train_steps", 0)
    interval: Any = getattr(checkpoint, "_train_time_interval", None)
    epochs: Any = getattr(checkpoint, "_every_n_epochs", 0)
    if steps and steps % every_n_steps:
        return (f"ModelCheckpoint(every_n_train_steps={steps}) saves at steps that are not a multiple of "
                f"every_n_steps={every_n_steps}", at_period_end)
    if interval is not None:
        return f"ModelCheckpoint(train_time_interval={interval}) saves at any step", at_period_end
    if epochs:
        return (f"ModelCheckpoint(every_n_epochs={epochs}) saves at an epoch's end (or after a validation), which is "
                "not where a period of steps ends", at_period_end)
    # A step's save whose monitored metric is not logged yet (before the first validation) is put off to the end of
    # the next validation, unless the callback saves at epochs' ends; that validation may fall inside a period.
    if checkpoint.monitor is not None and has_validation and not _saves_at_epoch_end(checkpoint, trainer):
        return (f"ModelCheckpoint(monitor={checkpoint.monitor!r}) puts off a step's save to the end of the next "
                "validation while the metric is not logged, and Lightning validates inside a period here",
                f"ModelCheckpoint(every_n_train_steps=k*{every_n_steps}, save_on_train_epoch_end=True)")
    return None


def _saves_at_epoch_end(checkpoint: ModelCheckpoint, trainer: pl.Trainer) -> bool:
    """Whether `checkpoint` saves at a training epoch's end rather than after validation (Lightning's private rule)."""
    decides: Any = getattr(checkpoint, "_should_save_on_train_epoch_end", lambda trainer: True)
    return bool(decides(trainer))
