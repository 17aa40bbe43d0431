"""A PyTorch Lightning callback that grows the model of a `LightningModule` (the `lightning` extra).

The module's `training_step` returns `grower.training_step(inputs, targets)` and its optimizer holds
`grower.model.host_parameters()`; the callback makes the two other calls of `morphogen.Grower` at the
right moments: `after_backward` after every backward pass (with the precision plugin's `GradScaler`
under 16-bit mixed precision), `end_epoch` at the end of every training epoch, whose figures it logs
as `growth/score`, `growth/loss` and `growth/parameters`. Train for the grower's number of epochs.
Lightning's checkpoints carry the grower's state (`Grower.state_dict`), so `trainer.fit(..., ckpt_path=...)`
goes on growing where the checkpoint was taken, at the end of an epoch.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

from morphogen.grower import EpochReport, Grower


class GrowthCallback(pl.Callback):
    """Drives a `Grower` from Lightning's hooks; `reports` keeps every epoch's `EpochReport`."""

    def __init__(self, grower: Grower) -> None:
        super().__init__()
        self.grower = grower
        self.reports: list[EpochReport] = []

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
