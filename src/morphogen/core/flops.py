"""FLOPs of a morphogenetic model's training step and validation batch, counted once per plan and shape.

What a batch costs depends only on what each slot runs (`MorphogeneticModel.execution_plan()`), which seeds
learn, and the batch's shape, never on the values: so each (plan, shape) is counted once, with
`torch.utils.flop_counter.FlopCounterMode`, on a copy of the model whose tensors live on the `meta`
device (no memory, no arithmetic), and the count is cached. Callers multiply it by the batches they ran.
Nothing here touches the real model's parameters, buffers or gradients, and nothing runs per step.

A training step is split into what the model's output path costs (`StepFlops.main`: forward and backward
of the host and the blended seeds, as a model without TRAINING seeds would train) and what the shadow pass
adds (`StepFlops.shadow`: the layers after each TRAINING slot run again with that seed in, forward, and
backward into the seeds' parameters). A validation batch is split into the model's own forward
(`ValidationFlops.main`) and what the other counterfactual configurations add.

The backward is counted from a sum of the outputs: its FLOPs do not depend on the loss function, which
`FlopCounterMode` does not count anyway (it counts matrix products, convolutions and attention). A model
that cannot run on the meta device (a user's forward that reads a value) is counted on a real copy
with zero inputs instead; the count is the same.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from morphogen.core.model import MorphogeneticModel

Shape = tuple[int, ...]
#: `(model copy, inputs) -> (FLOPs, FLOPs)`: the two counts `FlopCounter` makes on one copy.
CountOnCopy = Callable[[MorphogeneticModel, Tensor], tuple[int, int]]


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one training batch."""

    main: int
    """Forward and backward of the model's output path: the host and every blended seed."""
    shadow: int
    """What the TRAINING seeds' shadow pass adds: its forward and its backward into their parameters."""

    @property
    def total(self) -> int:
        return self.main + self.shadow


@dataclass(frozen=True)
class ValidationFlops:
    """FLOPs of one validation batch evaluated under K counterfactual configurations."""

    main: int
    """The model's own forward (the one configuration every validation needs)."""
    counterfactual: int
    """What the K - 1 other configurations add."""

    @property
    def total(self) -> int:
        return self.main + self.counterfactual


def meta_copy(model: nn.Module) -> nn.Module:
    """A deep copy of `model` whose parameters and buffers are empty tensors on the meta device.

    The real tensors are never copied: the copy's memo maps each of them to its meta twin, so a model of
    any size copies in the time of its Python structure. Shared (tied) tensors stay shared.
    """
    memo: dict[int, object] = {}
    for parameter in model.parameters():
        memo[id(parameter)] = nn.Parameter(torch.empty_like(parameter, device="meta"),
                                           requires_grad=parameter.requires_grad)
    for buffer in model.buffers():
        memo[id(buffer)] = torch.empty_like(buffer, device="meta")
    return copy.deepcopy(model, memo)


def _count(run: Callable[..., None], *args: object) -> int:
    """FLOPs that `run(*args)` performs, as `FlopCounterMode` counts them."""
    with FlopCounterMode(display=False) as counter:
        run(*args)
    return int(counter.get_total_flops())


def _plain_step(model: MorphogeneticModel, x: Tensor) -> None:
    """Forward and backward of the model's output path alone (TRAINING seeds are the identity there)."""
    torch.autograd.backward(model(x).sum())


def _shadow_step(model: MorphogeneticModel, x: Tensor, rows: int | None) -> None:
    """A whole training step: the output path and the shadow pass (on `rows` samples), each with its backward."""
    output, shadow = model.forward_with_shadow(x, rows)
    torch.autograd.backward(output.sum())
    if shadow is not None and shadow.parameters:
        torch.autograd.backward(shadow.outputs.sum(), inputs=list(shadow.parameters))


def _probe(model: MorphogeneticModel, x: Tensor) -> None:
    model.growth_signals(x, lambda output: output.sum())


@torch.no_grad()
def _host_forward(model: MorphogeneticModel, x: Tensor) -> None:
    """The model's forward with every slot as it is (the host alone where no seed is blended in)."""
    model(x)


@torch.inference_mode()
def _validation_batch(model: MorphogeneticModel, x: Tensor, alphas: Sequence[Sequence[float]]) -> None:
    model.counterfactual_forward(x, alphas)


class FlopCounter:
    """Cached FLOP counts of one host architecture's training steps and validation batches.

    Keys are the model's execution plan, which seeds' parameters learn, and the batch's shape and dtype
    (with the alpha configurations for validation): a count is made the first time a key is seen, on a
    meta copy of the model. One counter serves every model built from the same host; `counts_made` says
    how many counts it ran.
    """

    def __init__(self) -> None:
        self._training: dict[Hashable, StepFlops] = {}
        self._validation: dict[Hashable, ValidationFlops] = {}
        self._costs: dict[Hashable, SeedCost] = {}
        self.counts_made = 0

    def training_step(self, model: MorphogeneticModel, shape: Shape, dtype: torch.dtype,
                      shadow_rows: int | None = None) -> StepFlops:
        """FLOPs of one training batch of `shape` (inputs of `dtype`) in the model's present plan, the shadow
        pass on its first `shadow_rows` samples (None: all)."""
        key = (plan_key(model), shape, dtype, shadow_rows)
        cached = self._training.get(key)
        if cached is None:
            main, total = self._on_copy(model, shape, dtype, lambda copy, x: (
                _count(_plain_step, copy, x), _count(_shadow_step, copy, x, shadow_rows)))
            cached = self._training[key] = StepFlops(main, total - main)
        return cached

    def validation_batch(self, model: MorphogeneticModel, alphas: Sequence[Sequence[float]], shape: Shape,
                         dtype: torch.dtype) -> ValidationFlops:
        """FLOPs of one validation batch of `shape` evaluated under the alpha configurations `alphas`
        (row 0 the model's own, as `env.counterfactual` plans them)."""
        table = tuple(tuple(float(value) for value in row) for row in alphas)
        key = (plan_key(model), table, shape, dtype)
        cached = self._validation.get(key)
        if cached is None:
            main, total = self._on_copy(model, shape, dtype, lambda copy, x: (
                _count(_validation_batch, copy, x, table[:1]), _count(_validation_batch, copy, x, table)))
            cached = self._validation[key] = ValidationFlops(main, total - main)
        return cached

    def probe(self, model: MorphogeneticModel, shape: Shape, dtype: torch.dtype) -> int:
        """FLOPs of `MorphogeneticModel.growth_signals` on a batch of `shape`: a forward and the input gradients."""
        key = ("probe", plan_key(model), shape, dtype)
        cached = self._validation.get(key)
        if cached is None:
            flops, _ = self._on_copy(model, shape, dtype, lambda copy, x: (_count(_probe, copy, x), 0))
            cached = self._validation[key] = ValidationFlops(flops, 0)
        return cached.main

    def seed_cost(self, model: MorphogeneticModel, slot_id: str, blueprint: str, shape: Shape,
                  dtype: torch.dtype) -> SeedCost:
        """What `blueprint` installed in the empty slot `slot_id` would add (forward FLOPs per batch of `shape`)."""
        key = (slot_id, blueprint, shape, dtype)
        cached = self._costs.get(key)
        if cached is None:
            self.counts_made += 1
            copied = meta_copy(model)
            assert isinstance(copied, MorphogeneticModel)
            copied.eval()
            x = torch.empty(shape, dtype=dtype, device="meta")
            host = _count(_host_forward, copied, x)
            with torch.random.fork_rng(devices=[]):  # building the seed draws nothing from the training's generator
                slot = copied.install(slot_id, blueprint)
            seed = _count(_host_forward, copied, x) - host
            parameters, host_parameters = slot.seed_parameter_count(), copied.host_param_count()
            cached = self._costs[key] = SeedCost(parameters, seed, parameters / host_parameters, seed / max(host, 1))
        return cached

    def _on_copy(self, model: MorphogeneticModel, shape: Shape, dtype: torch.dtype,
                 count: CountOnCopy) -> tuple[int, int]:
        """Run `count(copy, inputs)` on a meta copy of `model` in training mode; on a real copy when the
        model cannot run on the meta device."""
        self.counts_made += 1
        try:
            return _counted(meta_copy(model), torch.empty(shape, dtype=dtype, device="meta"), count)
        except (RuntimeError, NotImplementedError):
            reference = next(model.parameters())
            real = copy.deepcopy(model)
            return _counted(real, torch.zeros(shape, dtype=dtype, device=reference.device), count)


def _counted(model: nn.Module, x: Tensor, count: CountOnCopy) -> tuple[int, int]:
    assert isinstance(model, MorphogeneticModel)
    model.compile_forward(None)  # a compiled forward would count nothing it did not trace
    model.train()
    return count(model, x)


class SeedCost(NamedTuple):
    """What a blueprint would add to a model in a slot: its parameters and forward FLOPs, also relative to the host's
    (the features a controller can compare blueprints by, whatever the host)."""

    parameters: int
    flops: int
    """Forward FLOPs it adds per batch of the shape it was counted at."""
    relative_parameters: float
    relative_flops: float


def plan_key(model: MorphogeneticModel) -> Hashable:
    """What a batch's FLOPs depend on besides its shape: the execution plan, and which running seeds learn
    (a seed ramping down is frozen: no weight gradient)."""
    learning = tuple(slot.is_running and any(p.requires_grad for p in slot.seed_parameters()) for slot in model.slots())
    return model.execution_plan(), learning
