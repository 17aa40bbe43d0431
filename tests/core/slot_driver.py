"""Test support for tests/core: drive a slot to a chosen stage through its public lifecycle calls.

`EASY_CONFIG` opens every gate as soon as its signal is measured and snaps alpha ramps (blend_epochs
0), so a test can reach any seed stage in a few calls without training anything.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch
from torch import Tensor

from morphogen.core.hosts import SegmentedHost
from morphogen.core.lifecycle import GateConfig, GateMode, Stage
from morphogen.core.model import MorphogeneticModel
from morphogen.core.module_host import host_from_module
from morphogen.core.plain import grown_network
from morphogen.core.slot import SeedSlot, SlotConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "own"))
from models import ResNet

#: The first block of each stage of `resnet_host`'s ResNet: where its slots are (two of the three blocks strided).
RESNET_BLOCKS = ["layer1.0", "layer2.0", "layer3.0"]

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


def resnet_host() -> tuple[SegmentedHost, Tensor]:
    """A user's CIFAR-layout ResNet (width 4, one block per stage) cut after each block, in eval mode, and a batch."""
    torch.manual_seed(0)
    host = host_from_module(ResNet(width=4), RESNET_BLOCKS, example_input=torch.randn(2, 3, 12, 12))
    return host.eval(), torch.randn(3, 3, 12, 12, generator=torch.Generator().manual_seed(1))


def place_seed(model: MorphogeneticModel, slot_id: str, blueprint: str, stage: Stage, seed: int,
               alpha: float = 1.0) -> None:
    """Germinate `blueprint` in `slot_id` (a model built with `EASY_CONFIG`), perturb it with `seed` so that it
    changes its input, and drive it to `stage` (BLENDING at `alpha`)."""
    slot = model.germinate(slot_id, blueprint)
    perturb_seed(slot, torch.Generator().manual_seed(seed))
    drive_to(slot, stage, alpha=alpha)


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


def assert_passes_match_plain_forwards(model: MorphogeneticModel, x: Tensor) -> None:
    """For a three-slot model whose middle seed is TRAINING: `counterfactual_forward` gives every configuration's
    plain forward, and the shadow pass (eval mode: batch norms read their running statistics, as the shadow pass
    always does) computes the TRAINING seed's configuration of the same network."""
    rows = [[1.0, 0.0, 0.5], [0.0, 0.0, 0.5], [1.0, 1.0, 0.5], [1.0, 0.0, 0.0], [0.3, 0.7, 1.0]]
    with torch.no_grad():
        outputs = model.counterfactual_forward(x, rows)
    for k, row in enumerate(rows):
        torch.testing.assert_close(outputs[k], configuration_output(model, row, x), rtol=1e-5, atol=1e-5, msg=str(row))
    output, shadow = model.forward_with_shadow(x)
    assert shadow is not None and shadow.slot_ids == (model.slot_ids[1],)
    torch.testing.assert_close(output, outputs[0])
    torch.testing.assert_close(shadow.outputs[0], outputs[2], rtol=1e-5, atol=1e-5)


def assert_plain_network_matches(model: MorphogeneticModel, x: Tensor) -> None:
    """`grown_network(model)` computes what the model computes, holds the host's and the kept seeds' parameters,
    and exports with `torch.export` to a program that computes it too."""
    model.eval()
    network = grown_network(model)
    with torch.no_grad():
        torch.testing.assert_close(network(x), model(x), rtol=0, atol=1e-6)
    kept = sum(model.slot(slot_id).seed_parameter_count() for slot_id in model.slot_ids)
    assert sum(p.numel() for p in network.parameters()) == model.host_param_count() + kept
    exported = torch.export.export(network, (x,))
    torch.testing.assert_close(exported.module()(x), model(x), rtol=0, atol=1e-6)


def assert_identity_at_birth_until_perturbed(host: SegmentedHost, x: Tensor, blueprint: str) -> None:
    """In each slot of `host` alone, a seed of `blueprint` leaves the output as it was through every stage, and
    changes it once its weights are perturbed (so the first check could fail)."""
    with torch.no_grad():
        bare = host(x)
    for slot_id in host.slot_ids:
        model = MorphogeneticModel(host, [slot_id], config=EASY_CONFIG)
        slot = model.germinate(slot_id, blueprint)
        assert slot.seed_parameter_count() > 0
        for stage in (Stage.TRAINING, Stage.BLENDING, Stage.HOLDING, Stage.FOSSILIZED):
            drive_to(slot, stage)
            with torch.no_grad():
                torch.testing.assert_close(model(x), bare, rtol=0, atol=1e-6, msg=f"{slot_id} {stage.name}")
        perturb_seed(slot, torch.Generator().manual_seed(2))
        with torch.no_grad():
            assert not torch.allclose(model(x), bare, atol=1e-4), slot_id
