"""What an episode's model looks like to a controller that must work on any host: where each slot sits,
how wide it is, and what each blueprint would add there, all relative to the host.

Measured once per episode (`model_layout`): one example is run through the host's segments in
evaluation mode without gradients (batch norms read their running statistics and write nothing), so
the activation shape at every injection point, and the host's forward FLOPs per sample, are known
whatever the host (built-in or a user's `host_from_module`). What each blueprint adds in each slot
(parameters, forward FLOPs per sample) is `FlopCounter.seed_cost`'s count, the one the heuristic compares
blueprints by. FLOPs are what `torch.utils.flop_counter.FlopCounterMode` counts (matrix products,
convolutions, attention): a seed of norms alone costs 0.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import Tensor

from morphogen.core.blueprints import blueprint_names
from morphogen.core.flops import FlopCounter, SeedCost, flop_counter_mode
from morphogen.core.model import MorphogeneticModel
from morphogen.inputs import Inputs, InputSpec, take_rows, tensors


@dataclass(frozen=True)
class SlotPlace:
    """Where a slot sits in its host, in fractions that mean the same on every host."""

    #: The slot's channels (or d_model) over those of the host's widest injection point.
    width_fraction: float
    #: Positions (pixels, samples, tokens) of the activation at the slot over those of the input.
    resolution_fraction: float
    #: (index of its injection point + 1) / (injection points + 1).
    depth_fraction: float


@dataclass(frozen=True)
class ModelLayout:
    """Every slot's place, and the parameters each blueprint would add in each slot."""

    places: dict[str, SlotPlace]
    blueprints: tuple[str, ...]
    #: `blueprint_parameters[slot][blueprint]`: slots in the model's order, blueprints in `blueprints` order.
    blueprint_parameters: tuple[tuple[int, ...], ...]
    #: Forward FLOPs per sample of each blueprint in each slot, laid out as `blueprint_parameters`.
    blueprint_flops: tuple[tuple[int, ...], ...]
    #: Forward FLOPs per sample of the host (0: not counted, when no blueprint is described).
    host_flops: int


def _positions(activation: Tensor, topology: str) -> int:
    """Positions of one sample's activation: pixels [C, H, W], samples [C, L], tokens [T] or [T, D], 1 for [F]."""
    if topology in ("cnn", "cnn1d"):
        return int(activation[0, 0].numel())
    if topology == "transformer":
        return int(activation.shape[1])
    return 1


def model_layout(model: MorphogeneticModel, example: Inputs, counter: FlopCounter | None = None, *,
                 with_costs: bool = True) -> ModelLayout:
    """The layout of `model`, its slot places measured on `example` (one or more inputs of the task: a tensor, or
    a tuple, list or dict of tensors).

    Blueprint costs come from `counter` (`FlopCounter.seed_cost`, which keeps them across an env's episodes;
    a new one when None). A blueprint that cannot go into a slot (a widening one where no layers surround
    it, a copy of a layer this host lacks) adds nothing there: GERMINATE of it is refused. Without
    `with_costs` (a controller that reads no blueprint descriptions) no blueprint is described.
    """
    counter = FlopCounter() if counter is None else counter
    host, topology = model.host, model.topology
    points = host.injection_points
    widest = max(points.values())
    shapes: dict[str, Tensor] = {}
    first = take_rows(example, slice(0, 1))
    training = host.training
    host.eval()
    # The host's FLOPs only matter beside the blueprints' (counting is not free: the first count costs ~0.2 s).
    host_counter = flop_counter_mode() if with_costs else None
    try:
        with torch.no_grad(), host_counter or contextlib.nullcontext():
            h = host.run_segment(0, first)  # the first segment takes the model's inputs, structured or not
            for index, point in enumerate(points):
                shapes[point] = h
                h = host.run_segment(index + 1, h)
    finally:
        host.train(training)
    input_positions = max(_positions(tensors(first)[0], topology), 1)  # the first input (a model's tokens)
    order = list(points)
    # A user's model may take inputs of another layout than its slots (a flat vector reshaped inside): the
    # fraction is then capped at 1, the input's own resolution.
    places = {
        slot_id: SlotPlace(width_fraction=points[slot_id] / widest,
                           resolution_fraction=min(_positions(shapes[slot_id], topology) / input_positions, 1.0),
                           depth_fraction=(order.index(slot_id) + 1) / (len(order) + 1))
        for slot_id in model.slot_ids
    }
    blueprints = blueprint_names(topology) if with_costs else ()
    spec = InputSpec.of(first)
    costs = [[_seed_cost(counter, model, slot_id, name, spec) for name in blueprints]
             for slot_id in model.slot_ids]
    parameters = tuple(tuple(cost.parameters for cost in row) for row in costs)
    flops = tuple(tuple(cost.flops for cost in row) for row in costs)
    host_flops = 0 if host_counter is None else int(host_counter.get_total_flops())
    return ModelLayout(places, blueprints, parameters, flops, host_flops)


def _seed_cost(counter: FlopCounter, model: MorphogeneticModel, slot_id: str, blueprint: str,
               spec: InputSpec) -> SeedCost:
    """What `blueprint` adds in `slot_id` for one sample (`spec` of one row), or nothing where it cannot go there."""
    try:
        return counter.seed_cost(model, slot_id, blueprint, spec)
    except ValueError:  # NoWidthSiteError, or block_copy with no block before the slot
        return SeedCost(0, 0, 0.0, 0.0)
