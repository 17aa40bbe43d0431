"""The LightningModule of the tests that drive a `Grower` under a real `lightning.Trainer` (the lightning extra)."""

from __future__ import annotations

import lightning.pytorch as pl
import torch

from morphogen import Grower


class GrowingModule(pl.LightningModule):
    """Trains the grower's model: its step is the grower's, its optimizer holds the host's parameters."""

    def __init__(self, grower: Grower) -> None:
        super().__init__()
        self.grower = grower
        self.model = grower.model

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_index: int) -> torch.Tensor:
        return self.grower.training_step(*batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.model.host_parameters(), lr=1e-2)
