"""Test support for tests/core: drive a slot to a chosen stage through its public lifecycle calls.

`EASY_CONFIG` opens every gate as soon as its signal is measured and snaps alpha ramps (blend_epochs
0), so a test can reach any seed stage in a few calls without training anything.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor

from morphogen.core.lifecycle import GateConfig, GateMode, Stage
from morphogen.core.model import MorphogeneticModel
from morphogen.core.slot import SeedSlot, SlotConfig

EASY_CONFIG = SlotConfig(
    blend_epochs=0,
    gates=GateConfig(mode=GateMode.PERMISSIVE, min_training_epochs=0, auto_advance=frozenset()),
)

_FORWARD_PATH = (Stage.GERMINATED, Stage.TRAINING, Stage.BLENDING, Stage.HOLDING, Stage.FOSSILIZED)


def drive_to(slot: SeedSlot, stage: Stage, *, alpha: float = 1.0) -> None:
    """Advance a germinated seed (slot built with `EASY_CONFIG`) to `stage`; BLENDING ends at `alpha`."""
    assert slot.config == EASY_CONFIG, "drive_to needs a slot built with EASY_CONFIG"
    assert slot.stage in _FORWARD_PATH and stage in _FORWARD_PATH
    while slot.stage is not stage:
        # Measured afresh before each move: entering BLENDING forgets the shadow contribution.
        slot.record_signals(gradient_health=1.0, contribution=2.0)
        assert slot.advance(0).passed
    if stage is Stage.BLENDING and alpha != slot.alpha.alpha:
        assert alpha > 0.0, "a ramp that ends at 0 prunes the seed"
        slot.set_alpha_target(alpha, 0, 0)
    assert slot.stage is stage


@torch.no_grad()
def perturb_seed(slot: SeedSlot, generator: torch.Generator, scale: float = 0.3) -> None:
    """Add random noise to every seed (and blend gate) parameter, so the seed really changes its input."""
    for parameter in slot.seed_parameters():
        noise = torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype)
        parameter.add_(scale * noise.to(parameter.device))


def configuration_output(model: MorphogeneticModel, row: list[float], x: Tensor) -> Tensor:
    """One alpha configuration by a plain forward of a copy: blended seeds at the row's alpha, a TRAINING seed
    with a non-zero alpha blended in at that alpha (what `counterfactual_forward` must give for that row)."""
    copied = copy.deepcopy(model)
    for slot, alpha in zip(copied.slots(), row, strict=True):
        if slot.stage is Stage.TRAINING and alpha != 0.0:
            drive_to(slot, Stage.BLENDING)
        if slot.stage in (Stage.BLENDING, Stage.HOLDING, Stage.FOSSILIZED):
            slot.alpha_value.fill_(alpha)  # what the forward reads
    with torch.no_grad():
        return copied(x)
