"""FLOPs of a morphogenetic model's training step and validation batch, counted once per plan and input spec.

What a batch costs depends only on what each slot runs (`MorphogeneticModel.execution_plan()`), which
seeds learn, and the shapes and dtypes of one sample's inputs (`InputSpec.per_sample`: one tensor, or each
tensor of a tuple, list or dict of them), never on the values: so each (plan, sample spec) is counted once,
with `torch.utils.flop_counter.FlopCounterMode`, and the count is cached. Every operation it counts (matrix
products, convolutions, attention) is linear in the batch: a count on a batch of 2 samples gives the FLOPs of
one sample, which scale to every batch. The first count is also made on 4 samples: a model whose two counts
are not in proportion (an operation that runs once per call, not per sample) is counted at each batch's own
spec instead. Counts run on a CPU copy of the model with zero tensors (`zero_copy`: the real values are
never copied) and zero inputs (`InputSpec.zeros`); the `meta` device would need no memory but runs about 25
times slower, so it only serves a model that cannot run on the CPU copy. Callers multiply a count by the
batches they ran. Nothing here touches the real model's parameters, buffers, gradients or torch's global random
generators (a count of a model with dropout runs under `torch.random.fork_rng`), and nothing runs per step.

A training step is split into what the model's output path costs (`StepFlops.main`: forward and backward
of the host and the blended seeds, as a model without TRAINING seeds would train) and what the shadow pass
adds (`StepFlops.shadow`: the layers after each TRAINING slot run again with that seed in, forward, and
backward into the seeds' parameters). A validation batch is split into the model's own forward
(`ValidationFlops.main`) and what the other counterfactual configurations add.

The backward is counted from a sum of the outputs: its FLOPs do not depend on the loss function, which
`FlopCounterMode` does not count anyway.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Hashable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from morphogen.core.lifecycle import IllegalTransitionError
from morphogen.core.model import MorphogeneticModel
from morphogen.inputs import Inputs, InputSpec

#: `(model copy, inputs) -> (FLOPs, FLOPs)`: the two counts `FlopCounter` makes on one copy.
CountOnCopy = Callable[[MorphogeneticModel, Inputs], tuple[int, int]]
#: `(spec of the batch to count, rows of its shadow pass or None) -> (FLOPs, FLOPs)`: what `_scaled` scales.
CountOfSpec = Callable[[InputSpec, int | None], tuple[int, int]]


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


#: The batch sizes a count per sample is made from (2, not 1: a batch norm over features needs two samples).
COUNT_SAMPLES = (2, 4)


def zero_copy(model: nn.Module) -> nn.Module:
    """A deep copy of `model` on the CPU whose parameters and buffers are zeros of the same shapes and dtypes.

    The real tensors are never read: the copy's memo maps each of them to its twin. Shared (tied) tensors stay
    shared.
    """
    memo: dict[int, object] = {}
    for parameter in model.parameters():
        memo[id(parameter)] = nn.Parameter(torch.zeros(parameter.shape, dtype=parameter.dtype),
                                           requires_grad=parameter.requires_grad)
    for buffer in model.buffers():
        memo[id(buffer)] = torch.zeros(buffer.shape, dtype=buffer.dtype)
    return copy.deepcopy(model, memo)


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


def _recurrent_layer_flops(input_shape: torch.Size, input_weights: torch.Size, hidden_weights: torch.Size,
                           *args: object, **kwargs: object) -> int:
    """One oneDNN recurrent layer's forward, in one direction: its input and hidden matrix products at every step
    of every sequence (`input_shape`'s rows: steps x batch, in either layout), 2 FLOPs per multiply-add."""
    rows = input_shape.numel() // input_shape[-1]
    return 2 * rows * (input_weights.numel() + hidden_weights.numel())


def _recurrent_layer_backward_flops(input_shape: torch.Size, input_weights: torch.Size, hidden_weights: torch.Size,
                                    *args: object, **kwargs: object) -> int:
    """Its backward: the gradients of the inputs and of the weights, each as many FLOPs as the forward."""
    return 2 * _recurrent_layer_flops(input_shape, input_weights, hidden_weights)


#: Operations `FlopCounterMode` does not count on its own. torch's `nn.LSTM` runs on the CPU as oneDNN's fused
#: layer, which it counts as 0 (on the meta device the same LSTM decomposes into counted matrix products).
UNCOUNTED_FORMULAS = {torch.ops.aten.mkldnn_rnn_layer: _recurrent_layer_flops,
                      torch.ops.aten.mkldnn_rnn_layer_backward: _recurrent_layer_backward_flops}


def flop_counter_mode() -> FlopCounterMode:
    """A silent `FlopCounterMode` that also counts `UNCOUNTED_FORMULAS`."""
    return FlopCounterMode(display=False, custom_mapping=UNCOUNTED_FORMULAS)


def _count(run: Callable[..., None], *args: object) -> int:
    """FLOPs that `run(*args)` performs, as `FlopCounterMode` counts them (with `UNCOUNTED_FORMULAS`)."""
    with flop_counter_mode() as counter:
        run(*args)
    return int(counter.get_total_flops())


def _plain_step(model: MorphogeneticModel, x: Inputs) -> None:
    """Forward and backward of the model's output path alone (TRAINING seeds are the identity there)."""
    torch.autograd.backward(model(x).sum())


def _shadow_step(model: MorphogeneticModel, x: Inputs, rows: int | None) -> None:
    """A whole training step: the output path and the shadow pass (on `rows` samples), each with its backward."""
    output, shadow = model.forward_with_shadow(x, rows)
    torch.autograd.backward(output.sum())
    if shadow is not None and shadow.parameters:
        torch.autograd.backward(shadow.outputs.sum(), inputs=list(shadow.parameters))


def _probe(model: MorphogeneticModel, x: Inputs) -> None:
    model.growth_signals(x, lambda output: output.sum())


@torch.no_grad()
def _forward(model: MorphogeneticModel, x: Inputs) -> None:
    """The model's forward with every slot as it is."""
    model(x)


@torch.no_grad()
def _host_alone(model: MorphogeneticModel, x: Inputs) -> None:
    model.host(x)


# no_grad, not inference_mode (validation's own mode), for the same count: under inference_mode FlopCounterMode's
# module hooks fail on a parameter passed to a module, as a parametrization (weight_norm, spectral_norm) does.
@torch.no_grad()
def _validation_batch(model: MorphogeneticModel, x: Inputs, alphas: Sequence[Sequence[float]]) -> None:
    model.counterfactual_forward(x, alphas)


class FlopCounter:
    """Cached FLOP counts of one host architecture's training steps and validation batches.

    Keys are the model's execution plan, which seeds' parameters learn, and the shapes and dtypes of one
    sample's inputs (`InputSpec.per_sample`; with the pattern of the alpha configurations for validation):
    counts are made the first time a key is seen, on a zero copy of the model, and scaled to every batch size
    (module docstring). One counter serves every model built from the same host; `counts_made` says how many
    copies it counted on.
    """

    def __init__(self) -> None:
        self._per_sample: dict[Hashable, tuple[int, int]] = {}
        self._costs: dict[Hashable, SeedCost] = {}
        #: What `seed_cost` could not install where, by the same key: the error it raised.
        self._refusals: dict[Hashable, ValueError] = {}
        #: Whether the model's counts are proportional to the batch (checked on the first count).
        self._proportional: bool | None = None
        self.counts_made = 0

    def training_step(self, model: MorphogeneticModel, spec: InputSpec, shadow_rows: int | None = None) -> StepFlops:
        """FLOPs of one training batch of inputs `spec` in the model's present plan, the shadow pass on its first
        `shadow_rows` samples (None: all)."""
        rows = spec.rows if shadow_rows is None else shadow_rows

        def count(counted: InputSpec, counted_rows: int | None) -> tuple[int, int]:
            main, total = self._on_copy(model, counted, lambda copy, x: (
                _count(_plain_step, copy, x), _count(_shadow_step, copy, x, counted_rows)))
            return main, total - main

        main, shadow = self._scaled(("training", plan_key(model), shadow_rows is None), spec, rows, count)
        return StepFlops(main, shadow)

    def validation_batch(self, model: MorphogeneticModel, alphas: Sequence[Sequence[float]],
                         spec: InputSpec) -> ValidationFlops:
        """FLOPs of one validation batch of inputs `spec` evaluated under the alpha configurations `alphas`
        (row 0 the model's own, as `env.counterfactual` plans them)."""
        table = tuple(tuple(float(value) for value in row) for row in alphas)

        def count(counted: InputSpec, _: int | None) -> tuple[int, int]:
            main, total = self._on_copy(model, counted, lambda copy, x: (
                _count(_validation_batch, copy, x, table[:1]), _count(_validation_batch, copy, x, table)))
            return main, total - main

        key = ("validation", plan_key(model), alpha_pattern(table))
        return ValidationFlops(*self._scaled(key, spec, spec.rows, count))

    def probe(self, model: MorphogeneticModel, spec: InputSpec) -> int:
        """FLOPs of `MorphogeneticModel.growth_signals` on a batch of inputs `spec`: a forward and the input
        gradients."""
        def count(counted: InputSpec, _: int | None) -> tuple[int, int]:
            return self._on_copy(model, counted, lambda copy, x: (_count(_probe, copy, x), 0))

        return self._scaled(("probe", plan_key(model)), spec, spec.rows, count)[0]

    def seed_cost(self, model: MorphogeneticModel, slot_id: str, blueprint: str, spec: InputSpec) -> SeedCost:
        """What `blueprint` installed in the empty slot `slot_id` would add: its parameters and forward FLOPs per
        batch of inputs `spec`, also relative to the host's (the host alone, without any seed)."""
        key = (slot_id, blueprint, spec.per_sample)
        refusal = self._refusals.get(key)
        if refusal is not None:  # it cannot go there: refused as at the first try, without another copy
            raise refusal.with_traceback(None)  # a fresh traceback, not one that grows with every refusal
        cached = self._costs.get(key)
        if cached is None:
            self.counts_made += 1
            copied = zero_copy(model)
            assert isinstance(copied, MorphogeneticModel)
            copied.compile_forward(None)
            copied.eval()
            x = spec.with_rows(COUNT_SAMPLES[0]).zeros()
            host = _count(_host_alone, copied, x)
            before = _count(_forward, copied, x)
            try:
                with _generators_kept(model):  # building the seed draws nothing from the training's RNG
                    slot = copied.install(slot_id, blueprint)
            except ValueError as error:
                # No layers to widen, no layer to copy: the host decides that, so it lasts. An occupied slot does not.
                if not isinstance(error, IllegalTransitionError):
                    self._refusals[key] = error
                raise
            seed = _count(_forward, copied, x) - before
            parameters, host_parameters = slot.seed_parameter_count(), copied.host_param_count()
            cached = self._costs[key] = SeedCost(parameters, seed // COUNT_SAMPLES[0], parameters / host_parameters,
                                                 seed / max(host, 1))
        return SeedCost(cached.parameters, cached.flops * spec.rows, cached.relative_parameters,
                        cached.relative_flops)

    def _scaled(self, key: tuple[Hashable, ...], spec: InputSpec, rows: int, count: CountOfSpec) -> tuple[int, int]:
        """Two counts for a batch of inputs `spec`, the second over `rows` of its samples (`count(spec, rows)`
        counts them): from the counts per sample, made once per sample spec, or counted at this batch's own spec
        when the model's FLOPs are not proportional to its batch."""
        per_sample = self._per_sample.get((*key, spec.per_sample))
        if per_sample is not None:
            return per_sample[0] * spec.rows, per_sample[1] * rows
        exact = self._per_sample.get((*key, spec, rows))
        if exact is not None:
            return exact
        small = count(spec.with_rows(COUNT_SAMPLES[0]), None)
        if self._proportional is None:  # checked once, on the first count: the host's layers decide it
            large = count(spec.with_rows(COUNT_SAMPLES[1]), None)
            ratio = COUNT_SAMPLES[1] // COUNT_SAMPLES[0]
            self._proportional = all(b == ratio * a for a, b in zip(small, large, strict=True))
        if self._proportional and all(a % COUNT_SAMPLES[0] == 0 for a in small):
            self._per_sample[(*key, spec.per_sample)] = (small[0] // COUNT_SAMPLES[0], small[1] // COUNT_SAMPLES[0])
            return self._scaled(key, spec, rows, count)
        exact = self._per_sample[(*key, spec, rows)] = count(spec, rows)
        return exact

    def _on_copy(self, model: MorphogeneticModel, spec: InputSpec, count: CountOnCopy) -> tuple[int, int]:
        """Run `count(copy, inputs)` on a zero copy of `model` in training mode, inputs of `spec` (zeros); on a
        meta copy when the model cannot run on the CPU copy."""
        self.counts_made += 1
        with _generators_kept(model):
            try:
                return _counted(zero_copy(model), spec.zeros(), count)
            except (RuntimeError, NotImplementedError):
                return _counted(meta_copy(model), spec.zeros("meta"), count)


def _generators_kept(model: nn.Module) -> AbstractContextManager[None]:
    """torch's global generators as they were once the block ends: the CPU's, and each CUDA device's that `model`
    lives on. A count runs the copy in training mode, where dropout draws from them; a count is made the first
    time a plan is seen, so its draws would fall at other moments in a resumed process than in one never stopped."""
    devices = {tensor.device for tensor in (*model.parameters(), *model.buffers()) if tensor.device.type == "cuda"}
    return torch.random.fork_rng(devices=sorted(devices, key=str))


def _counted(model: nn.Module, x: Inputs, count: CountOnCopy) -> tuple[int, int]:
    assert isinstance(model, MorphogeneticModel)
    model.compile_forward(None)  # a compiled forward would count nothing it did not trace
    model.train()
    return count(model, x)


class SeedCost(NamedTuple):
    """What a blueprint would add to a model in a slot: its parameters and forward FLOPs, also relative to the host's
    (the features a controller can compare blueprints by, whatever the host)."""

    parameters: int
    flops: int
    """Forward FLOPs it adds per batch of the inputs it was counted at."""
    relative_parameters: float
    relative_flops: float


def alpha_pattern(table: Sequence[Sequence[float]]) -> Hashable:
    """What a validation batch's FLOPs depend on in an alpha table: per slot, which configurations are 0 and
    which share a value (a TRAINING seed runs where one is not 0; the batch expands at the first slot whose
    values differ), not the values themselves, which change every epoch of a ramp."""
    columns = list(zip(*table, strict=True)) if table else []
    return len(table), tuple(tuple((value == 0.0, column.index(value)) for value in column) for column in columns)


def plan_key(model: MorphogeneticModel) -> Hashable:
    """What a batch's FLOPs depend on besides its inputs: the execution plan, and which running seeds learn
    (a seed ramping down is frozen: no weight gradient)."""
    learning = tuple(slot.is_running and any(p.requires_grad for p in slot.seed_parameters()) for slot in model.slots())
    return model.execution_plan(), learning
