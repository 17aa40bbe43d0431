"""Growth signals for a controller that chooses where and how to grow by measurement, not by a fixed order.

When a seed could be germinated (an empty slot, no seed GERMINATED or TRAINING), an episode whose controller
names candidate blueprints (`Controller.growth_candidates`) measures, on one fixed batch of training data:
- each empty slot's growth signals (`MorphogeneticModel.growth_signals`): what the loss could gain at the slot's
  activation, where a deepening seed adds its output, and at the next layer's output, where a widening seed
  adds its channels' contribution;
- what each candidate would cost there (`FlopCounter.seed_cost`: parameters and forward FLOPs, also relative to
  the host's), counted once per (slot, blueprint) on the meta device.
The probe is one forward and one input-gradient backward of the batch in eval mode (`probe_samples` samples): its
FLOPs are charged to the episode (`ComputeAccount.probe`), and it touches no parameter, buffer or generator of
the training.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from morphogen.core.flops import FlopCounter, SeedCost
from morphogen.core.lifecycle import Stage
from morphogen.core.model import MorphogeneticModel
from morphogen.core.width import NoWidthSiteError
from morphogen.env.evaluation import Objective
from morphogen.inputs import Inputs, InputSpec

#: Relative FLOPs below which a blueprint counts as this cheap when a signal is divided by its cost: FlopCounterMode
#: does not count norms and element-wise scaling, so a norm seed would otherwise cost nothing and win every
#: comparison.
MIN_RELATIVE_FLOPS = 0.01
#: What a controller's `growth_candidates(epoch)` returns: the blueprints it would compare at that epoch.
CandidateSource = Callable[[int], Sequence[str]]


@dataclass(frozen=True)
class SlotGrowth:
    """An empty slot's growth signals and its candidates' costs (plain numbers)."""

    depth: float
    width: float | None
    costs: tuple[tuple[str, SeedCost], ...]


def could_germinate(model: MorphogeneticModel) -> bool:
    """An empty slot exists, and no seed is GERMINATED or TRAINING (what a GERMINATE action needs)."""
    stages = [slot.stage for slot in model.slots()]
    return Stage.DORMANT in stages and Stage.GERMINATED not in stages and Stage.TRAINING not in stages


def measure_growth(model: MorphogeneticModel, batch: tuple[Inputs, Tensor], objective: Objective,
                   counter: FlopCounter, candidates: Sequence[str]) -> tuple[dict[str, SlotGrowth], int]:
    """Signals and candidate costs of every empty slot, and the probe's FLOPs; one host sync (the signals)."""
    inputs, targets = batch
    signals = model.growth_signals(inputs, lambda output: objective.checked_loss(output, targets))
    values = torch.stack([value for signal in signals.values() for value in signal if value is not None]).tolist()
    spec = InputSpec.of(inputs)
    measured: dict[str, SlotGrowth] = {}
    for slot_id, signal in signals.items():
        depth = values.pop(0)
        width = None if signal.width is None else values.pop(0)
        costs = []
        for blueprint in candidates:
            try:
                costs.append((blueprint, counter.seed_cost(model, slot_id, blueprint, spec)))
            except (NoWidthSiteError, ValueError):  # a widening candidate where the slot has no layers to widen
                continue
        measured[slot_id] = SlotGrowth(depth, width, tuple(costs))
    return measured, counter.probe(model, spec)
