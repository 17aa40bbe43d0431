"""What an episode's model looks like to a controller that must work on any host: where each slot sits,
how wide it is, and what each blueprint would add there, all relative to the host.

Measured once per episode (`model_layout`): one example is run through the host's segments in
evaluation mode without gradients (batch norms read their running statistics and write nothing), so
the activation shape at every injection point, and the host's forward FLOPs per sample, are known
whatever the host (built-in or a user's `host_from_module`). Blueprint sizes are counted on the meta
device (no memory); a blueprint's forward FLOPs per sample at a slot are counted once per activation
shape on a seed run on zeros. FLOPs are what `torch.utils.flop_counter.FlopCounterMode` counts (matrix
products, convolutions, attention): a seed of norms alone costs 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import torch
from torch import Tensor
from torch.utils.flop_counter import FlopCounterMode

from morphogen.core.blueprints import blueprint_names, build_seed, parameter_count
from morphogen.core.model import MorphogeneticModel


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
    #: Forward FLOPs per sample of the host.
    host_flops: int


def _positions(activation: Tensor, topology: str) -> int:
    """Positions of one sample's activation: pixels [C, H, W], samples [C, L], tokens [T] or [T, D], 1 for [F]."""
    if topology in ("cnn", "cnn1d"):
        return int(activation[0, 0].numel())
    if topology == "transformer":
        return int(activation.shape[1])
    return 1


@cache
def _seed_parameters(topology: str, blueprint: str, width: int) -> int:
    """Parameters of a seed; blueprints are never re-registered under a name, so a count never changes."""
    return parameter_count(topology, blueprint, width)


@cache
def _seed_flops(topology: str, blueprint: str, width: int, shape: tuple[int, ...]) -> int:
    """Forward FLOPs of a seed on one activation of `shape` ([1, ...]). Its weights are drawn from a forked
    generator: counting, done once per process, must not move the global one (a resumed run would differ)."""
    with torch.random.fork_rng(devices=[]):
        seed = build_seed(topology, blueprint, width).eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        seed(torch.zeros(shape))
    return int(counter.get_total_flops())


def model_layout(model: MorphogeneticModel, example: Tensor) -> ModelLayout:
    """The layout of `model`, its slot places measured on `example` (one or more inputs of the task)."""
    host, topology = model.host, model.topology
    points = host.injection_points
    widest = max(points.values())
    shapes: dict[str, Tensor] = {}
    training = host.training
    host.eval()
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            h = example[:1]
            for index, point in enumerate(points):
                h = host.run_segment(index, h)
                shapes[point] = h
            host.run_segment(len(points), h)
    finally:
        host.train(training)
    input_positions = max(_positions(example[:1], topology), 1)
    order = list(points)
    # A user's model may take inputs of another layout than its slots (a flat vector reshaped inside): the
    # fraction is then capped at 1, the input's own resolution.
    places = {
        slot_id: SlotPlace(width_fraction=points[slot_id] / widest,
                           resolution_fraction=min(_positions(shapes[slot_id], topology) / input_positions, 1.0),
                           depth_fraction=(order.index(slot_id) + 1) / (len(order) + 1))
        for slot_id in model.slot_ids
    }
    blueprints = blueprint_names(topology)
    parameters = tuple(tuple(_seed_parameters(topology, name, points[slot_id]) for name in blueprints)
                       for slot_id in model.slot_ids)
    flops = tuple(tuple(_seed_flops(topology, name, points[slot_id], tuple(shapes[slot_id].shape))
                        for name in blueprints) for slot_id in model.slot_ids)
    return ModelLayout(places, blueprints, parameters, flops, int(counter.get_total_flops()))
