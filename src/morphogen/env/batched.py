"""Train the envs of a vector whose architectures are identical in one vmapped call.

Why `torch.func` (stacked parameters + `functional_call` + `vmap`) and not hand-written grouped
convolutions: it covers every host and blueprint (convolutions, batch/group/layer norm, attention, the
blend gates) without a second implementation of each layer, and PyTorch's batching rules already turn
a convolution with per-env weights into one grouped convolution and a linear layer into one batched
matmul. The model code stays the single definition of the forward pass, shadow pass included.

One group = the envs whose models have the same `architecture_signature` (same host, same parameter
and buffer shapes, same seed blueprint in the same stage in each slot). Envs with no live seed, which
is every env at the start of an episode and most envs for most of it, always form one group. Per
group and epoch (`StackedEnvs`):
- At the start of the epoch, every env's trainable parameters are copied into ONE flat matrix
  `(N, P)`: the host's tensors, then each blended seed's, then each TRAINING seed's (what each env's
  optimizers step). Their SGD momentum buffers go into a matrix of the same layout; every other
  tensor the forward reads (batch-norm running statistics, the slots' alpha, frozen parameters) into
  stacked `(N, ...)` tensors. Learning rate, momentum and weight decay are read from each env's own
  optimizers, so a governor's back-off of one env's learning rate is honoured.
- Per batch: `vmap(functional_call)` runs the N forward passes (with a TRAINING seed, its shadow pass
  too) as one; `autograd.grad` of the sum of the per-env losses gives each env its own gradient (no
  parameter is shared between envs, so the sum separates). The isolation monitor's statistics, the
  per-env clipping of each group (host, each seed) and the SGD step with momentum and weight decay
  are a handful of whole-matrix operations, with the same formulas as `HostAndSeedTrainer` (`clip_grad_norm_`
  and `torch.optim.SGD`, dampening 0, no Nesterov).
- At the end of the epoch, before validation reads the models and before any action can change an
  architecture, `write_back` copies parameters, momentum buffers, buffers, the last batch's clipped
  gradients, the epoch's loss sum and the monitor's statistics into each env: afterwards every env is
  in the state `HostAndSeedTrainer.train_batch` would have left it in.

Batch norm: each env has its own stacked running statistics; under vmap the train-mode statistics are
computed per env (per env and channel), and the in-place running-statistics update writes each env's
own row. The shadow pass's evaluation-mode norms read each env's row.

Hot path (per batch and group): no host sync, no loop over envs, no per-parameter optimizer or norm
call: Python work is one `split` plus one view per parameter tensor (the names `functional_call` is
given), whatever the number of envs. Per epoch: one copy in and one copy out per (env, tensor).

Optimizers: the stacked step is SGD's. `training_groups` never stacks an env whose optimizer is another one
(`OptimizerConfig.name = "adamw"`, the `text` task's default): such envs are trained alone, on the
per-env path, so `batch_identical` changes nothing for them.

Coverage: CNN and 1D-CNN hosts and their blueprints batch natively. A transformer's causal attention
(`scaled_dot_product_attention`) has no CPU batching rule in torch 2.13: vmap then runs it env by env
(correct, no gain there, and torch warns once).

Equality with the per-env path: same math, not the same float summation order (a grouped convolution
reduces in another order than N separate ones; per-tensor norms are sums of squares instead of
`_foreach_norm`). Results agree to float32 rounding, about 1e-6 relative per batch, not bitwise.

CUDA (docs/architecture.md#devices-and-cuda-streams): a group runs on the stream of its first env. That
stream waits for the producing stream before reading the batch, and the batch tensors are
`record_stream`ed on it; stacking waits for the current stream, whose work (validation, rollbacks) last
wrote the envs' tensors. The vector's one synchronize per phase then covers the group's work and its
write-back.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from morphogen.core.isolation import SeedAccumulation
from morphogen.core.lifecycle import Stage
from morphogen.core.model import MorphogeneticModel, ShadowOutput, shadow_rows
from morphogen.env.compute import note_batch
from morphogen.env.episode import MorphogenesisEpisode
from morphogen.env.evaluation import Objective, task_loss
from morphogen.inputs import Inputs, InputSpec, rows, tensors

HOST_GROUP = "host"
#: Added to a group's gradient norm before dividing, as `torch.nn.utils.clip_grad_norm_` does.
CLIP_EPSILON = 1e-6
#: The built-in objective (cross-entropy): `VectorEpisodes` batches envs of built-in tasks only.
_BUILT_IN = Objective(task_loss, None, custom=False)


def architecture_signature(model: MorphogeneticModel) -> Hashable:
    """What two models must share to be trained in one vmapped call.

    The names, shapes, dtypes, devices and trainability of every parameter and buffer, and per slot the
    seed's stage, blueprint, options, blend and input detachment (what the forward does with it). A slot
    without a seed counts as empty whatever its stage (dormant, embargoed, resetting: all identity).
    """
    slots = tuple(
        (slot.slot_id, None if slot.seed is None else
         (slot.stage, slot.blueprint, repr(sorted(slot.blueprint_options.items())), slot.blend_kind,
          slot.detach_input))
        for slot in model.slots())
    parameters = tuple((name, tuple(p.shape), p.dtype, p.device, p.requires_grad)
                       for name, p in model.named_parameters())
    buffers = tuple((name, tuple(b.shape), b.dtype, b.device) for name, b in model.named_buffers())
    return type(model.host), slots, parameters, buffers


def group_by_architecture(episodes: Sequence[MorphogenesisEpisode]) -> list[list[int]]:
    """Indices of `episodes` grouped by `architecture_signature`, in order of first appearance."""
    groups: dict[Hashable, list[int]] = {}
    for index, episode in enumerate(episodes):
        assert episode.model is not None, "call reset() first"
        groups.setdefault(architecture_signature(episode.model), []).append(index)
    return list(groups.values())


class _TrainingForward(nn.Module):
    """`forward_with_shadow` as a module's `forward`, so that `functional_call` can run it."""

    def __init__(self, model: MorphogeneticModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Inputs, shadow_fraction: float) -> tuple[Tensor, ShadowOutput | None]:
        return self.model.forward_with_shadow(x, shadow_rows(rows(x), shadow_fraction))


@dataclass(frozen=True)
class FlatLayout:
    """Where each trainable parameter tensor of a group's models lives in the flat `(N, P)` matrix."""

    names: tuple[str, ...]
    """Parameter names (as in `model.named_parameters()`), in column order."""
    shapes: tuple[torch.Size, ...]
    sizes: tuple[int, ...]
    groups: tuple[str, ...]
    """Clipping groups: "host", then slot ids; a tensor's group is `groups[tensor_groups[t]]`."""
    tensor_groups: tuple[int, ...]
    shadow_start: int
    """First column of the TRAINING seeds' parameters, which learn from the shadow loss only (P: none)."""

    @property
    def width(self) -> int:
        """P, the number of trainable scalars per env."""
        return sum(self.sizes)

    def group_tensor_counts(self) -> list[int]:
        return [self.tensor_groups.count(group) for group in range(len(self.groups))]

    def group_sizes(self) -> list[int]:
        sizes = [0] * len(self.groups)
        for group, size in zip(self.tensor_groups, self.sizes, strict=True):
            sizes[group] += size
        return sizes


def trainable_groups(model: MorphogeneticModel,
                     running: dict[str, list[nn.Parameter]]) -> list[tuple[str, list[nn.Parameter], bool]]:
    """(group, parameters, learns from the shadow loss) in flat order: host, blended seeds, TRAINING seeds.

    `running` is `HostAndSeedTrainer.sync_seed_optimizers()`: the trainable parameters of each running seed.
    A running seed with nothing trainable (ramping down, frozen) is not a group: nothing steps it.
    """
    main: list[tuple[str, list[nn.Parameter], bool]] = [(HOST_GROUP, model.host_parameters(), False)]
    shadow: list[tuple[str, list[nn.Parameter], bool]] = []
    for slot_id, parameters in running.items():
        if not parameters:
            continue
        if model.slot(slot_id).stage is Stage.TRAINING:
            shadow.append((slot_id, parameters, True))
        else:
            main.append((slot_id, parameters, False))
    return main + shadow


def flat_layout(model: MorphogeneticModel, groups: list[tuple[str, list[nn.Parameter], bool]]) -> FlatLayout:
    """The columns of the flat matrix of `model`'s trainable tensors, in the order of `trainable_groups`."""
    names_by_id = {id(p): name for name, p in model.named_parameters()}
    names, group_of_tensor, shadow_start, width = [], [], None, 0
    for group_index, (_, parameters, shadow) in enumerate(groups):
        if shadow and shadow_start is None:
            shadow_start = width
        for parameter in parameters:
            names.append(names_by_id[id(parameter)])
            group_of_tensor.append(group_index)
            width += parameter.numel()
    named = dict(model.named_parameters())
    return FlatLayout(
        names=tuple(names), shapes=tuple(named[name].shape for name in names),
        sizes=tuple(named[name].numel() for name in names), groups=tuple(group for group, _, _ in groups),
        tensor_groups=tuple(group_of_tensor), shadow_start=width if shadow_start is None else shadow_start)


class StackedEnvs:
    """N envs of one architecture, their trainable state stacked for the batches of one epoch.

    Build it at the start of an epoch, call `step` once per batch, then `write_back` once.
    """

    def __init__(self, episodes: Sequence[MorphogenesisEpisode]) -> None:
        if not episodes:
            raise ValueError("a stacked group needs at least one env")
        self.episodes = list(episodes)
        models = [self._model(episode) for episode in self.episodes]
        # Every env's trainer creates the optimizers of seeds germinated since its last batch; the envs share
        # one architecture signature, so the template's running seeds stand for all of them.
        running = [episode.trainer.sync_seed_optimizers() for episode in self.episodes]
        template = models[0]
        self.template = template
        self.forward_module = _TrainingForward(template)
        groups = trainable_groups(template, running[0])
        self._main_groups = {group for group, _, shadow in groups if not shadow}
        self.layout = flat_layout(template, groups)
        self.optimizers = [self._optimizers(episode) for episode in self.episodes]
        self._stack(models)

    @staticmethod
    def _model(episode: MorphogenesisEpisode) -> MorphogeneticModel:
        assert episode.model is not None, "call reset() first"
        return episode.model

    def _optimizers(self, episode: MorphogenesisEpisode) -> list[torch.optim.Optimizer]:
        trainer = episode.trainer
        return [trainer.host_optimizer if group == HOST_GROUP else trainer.seed_optimizers[group][1]
                for group in self.layout.groups]

    @torch.no_grad()
    def _stack(self, models: Sequence[MorphogeneticModel]) -> None:
        layout, n = self.layout, len(models)
        reference = next(models[0].host.parameters())
        device, dtype = reference.device, reference.dtype
        named = [dict(model.named_parameters()) for model in models]
        trainable = set(layout.names)
        self.flat, self.momentum = self._stack_trainable(named)  # (N, P) each
        # Everything else the forward reads: buffers (updated in place by batch norm) and frozen parameters.
        self.state: dict[str, Tensor] = {
            name: torch.stack([parameters[name].detach() for parameters in named])  # (N, ...), a copy
            for name in named[0] if name not in trainable}
        buffers = [dict(model.named_buffers()) for model in models]
        self.buffer_names = tuple(buffers[0])
        for name in self.buffer_names:
            self.state[name] = torch.stack([own[name] for own in buffers])  # (N, ...), a copy
        settings = self._optimizer_settings(dtype, device)  # (N, G, 3)
        sizes = torch.tensor(layout.sizes, device=device)
        self.tensor_of_column = torch.repeat_interleave(torch.arange(len(layout.sizes), device=device), sizes)
        self.tensor_groups = torch.tensor(layout.tensor_groups, device=device)  # (T,)
        self.group_of_column = self.tensor_groups[self.tensor_of_column]  # (P,)
        per_column = settings[:, self.group_of_column]  # (N, P, 3)
        self.negative_lr = -per_column[..., 0]
        self.momentum_factor = per_column[..., 1].contiguous()
        self.weight_decay = per_column[..., 2].contiguous()
        self.loss_sum = torch.zeros(n, dtype=dtype, device=device)  # the loss's dtype, as HostAndSeedTrainer sums it
        #: Per env and group, summed over batches: gradient norm, vanishing count, exploding count.
        self.gradient_sums = torch.zeros(n, len(layout.groups), 3, dtype=torch.float32, device=device)
        self.last_gradient: Tensor | None = None
        self.batches = 0
        #: Shapes of the batches stepped this epoch, handed to each env's trainer for its FLOP charge.
        self.batch_shapes: Counter[InputSpec] = Counter()
        monitor = self.episodes[0].monitor
        self.vanishing_threshold = monitor.vanishing_threshold
        self.exploding_threshold = monitor.exploding_threshold
        self.clip_norm = self.episodes[0].trainer.config.clip_norm
        self.shadow_fraction = self.episodes[0].trainer.shadow_fraction  # one episode config per vector
        # Fixed for the epoch, so that a batch builds nothing but the views of the flat matrix.
        main_tensors = sum(1 for group in layout.tensor_groups if layout.groups[group] in self._main_groups)
        self.leaf_sizes = (list(layout.sizes[:main_tensors]), list(layout.sizes[main_tensors:]))
        self.call_names = tuple(f"model.{name}" for name in layout.names)  # names inside `_TrainingForward`
        self.call_state = {f"model.{name}": value for name, value in self.state.items()}
        self.template.train()  # validation restores the mode it found, so it holds for the whole epoch

    def _stack_trainable(self, named: Sequence[dict[str, nn.Parameter]]) -> tuple[Tensor, Tensor]:
        """(N, P) matrices of every env's trainable parameters and of their SGD momentum (0 where none yet)."""
        n, columns, momentum_columns = len(named), [], []
        for name, group in zip(self.layout.names, self.layout.tensor_groups, strict=True):
            parameters = [parameters[name] for parameters in named]
            columns.append(torch.stack([p.detach() for p in parameters]).reshape(n, -1))  # (N, size)
            buffers = [self.optimizers[env][group].state.get(p, {}).get("momentum_buffer")
                       for env, p in enumerate(parameters)]
            momentum_columns.append(torch.stack([torch.zeros_like(p) if b is None else b
                                                 for p, b in zip(parameters, buffers, strict=True)]).reshape(n, -1))
        return torch.cat(columns, dim=1), torch.cat(momentum_columns, dim=1)  # (N, P), (N, P)

    def _optimizer_settings(self, dtype: torch.dtype, device: torch.device) -> Tensor:
        """(N, G, 3): learning rate, momentum and weight decay of each env's optimizer of each group, read
        now (after any back-off) from the optimizers themselves."""
        rows = []
        for optimizers in self.optimizers:
            row = []
            for optimizer in optimizers:
                settings = optimizer.param_groups[0]
                assert isinstance(optimizer, torch.optim.SGD) and len(optimizer.param_groups) == 1 \
                    and settings["dampening"] == 0 and not settings["nesterov"] and not settings["maximize"], \
                    "the batched step implements HostAndSeedTrainer's plain SGD only"
                row.append([settings["lr"], settings["momentum"], settings["weight_decay"]])
            rows.append(row)
        return torch.tensor(rows, dtype=dtype, device=device)

    # ---------------------------------------------------------------- the hot path
    def _env_losses(self, trainable: dict[str, Tensor], state: dict[str, Tensor], inputs: Inputs,
                    targets: Tensor) -> tuple[Tensor, ...]:
        """One env's task loss (and shadow loss when a TRAINING seed learns), run under vmap."""
        output, shadow = functional_call(self.forward_module, {**trainable, **state}, (inputs, self.shadow_fraction))
        main = task_loss(output, targets)
        if self.layout.shadow_start == self.layout.width:
            return (main,)
        assert shadow is not None
        return main, _BUILT_IN.shadow_loss(shadow.outputs, targets[:shadow.rows])

    def step(self, inputs: Inputs, targets: Tensor) -> None:
        """Forward, backward, per-env per-group clip and SGD step of every env in the group on one batch."""
        n = self.flat.shape[0]
        split = self.layout.shadow_start
        leaves = [self.flat[:, :split].detach().requires_grad_()]  # (N, P_main), shares storage with flat
        if split < self.layout.width:
            leaves.append(self.flat[:, split:].detach().requires_grad_())  # (N, P_shadow)
        pieces = [piece for leaf, sizes in zip(leaves, self.leaf_sizes, strict=False)
                  for piece in torch.split(leaf, sizes, 1)]  # (N, size) each
        trainable = {name: piece.view(n, *shape)  # (N, *shape)
                     for name, piece, shape in zip(self.call_names, pieces, self.layout.shapes, strict=True)}
        state = self.call_state
        losses = vmap(self._env_losses, in_dims=(0, 0, None, None))(trainable, state, inputs, targets)
        gradients = [torch.autograd.grad(loss.sum(), leaf, retain_graph=index + 1 < len(leaves))[0]
                     for index, (loss, leaf) in enumerate(zip(losses, leaves, strict=True))]
        gradient = gradients[0] if len(gradients) == 1 else torch.cat(gradients, dim=1)  # (N, P)
        self._update(gradient, losses[0].detach())
        note_batch(self.batch_shapes, inputs)

    @torch.no_grad()
    def _update(self, gradient: Tensor, losses: Tensor) -> None:
        """Monitor statistics, per-group clipping and SGD, as `HostAndSeedTrainer.train_batch` does per env."""
        n, tensor_count, groups = gradient.shape[0], len(self.layout.sizes), len(self.layout.groups)
        accumulate = torch.float64 if gradient.dtype == torch.float64 else torch.float32
        squares = gradient.to(accumulate).square()  # (N, P)
        tensor_squares = squares.new_zeros(n, tensor_count).index_add_(1, self.tensor_of_column, squares)  # (N, T)
        tensor_norms = tensor_squares.sqrt()
        group_norms = tensor_squares.new_zeros(n, groups).index_add_(1, self.tensor_groups, tensor_squares).sqrt()
        flags = torch.stack([tensor_norms < self.vanishing_threshold,
                             torch.logical_not(tensor_norms <= self.exploding_threshold)], dim=2)  # (N, T, 2)
        counts = flags.new_zeros(n, groups, 2, dtype=accumulate).index_add_(1, self.tensor_groups,
                                                                          flags.to(accumulate))  # (N, G, 2)
        self.gradient_sums += torch.cat([group_norms.unsqueeze(2), counts], dim=2).float()  # (N, G, 3)
        coefficients = (self.clip_norm / (group_norms + CLIP_EPSILON)).clamp(max=1.0).to(gradient.dtype)  # (N, G)
        gradient.mul_(coefficients[:, self.group_of_column])  # (N, P)
        step = gradient + self.weight_decay * self.flat
        self.momentum.mul_(self.momentum_factor).add_(step)
        self.flat.addcmul_(self.momentum, self.negative_lr)
        self.loss_sum += losses
        self.last_gradient = gradient
        self.batches += 1

    # ---------------------------------------------------------------- back to the envs
    @torch.no_grad()
    def write_back(self) -> None:
        """Copy each env's parameters, momentum, buffers, last gradients, loss and gradient statistics back.

        Afterwards each env's model, optimizers, `HostAndSeedTrainer` loss accumulator and isolation monitor are
        as if it had trained the epoch's batches alone. A group that trained no batch changes nothing.
        """
        if self.batches == 0:
            return
        layout = self.layout
        assert self.last_gradient is not None
        tensor_counts, group_sizes = layout.group_tensor_counts(), layout.group_sizes()
        for env, episode in enumerate(self.episodes):
            model = self._model(episode)
            named = dict(model.named_parameters())
            model.zero_grad(set_to_none=True)
            sizes = list(layout.sizes)
            rows = zip(torch.split(self.flat[env], sizes), torch.split(self.momentum[env], sizes),
                       torch.split(self.last_gradient[env], sizes), strict=True)
            for (value, momentum, gradient), name, shape, group in zip(rows, layout.names, layout.shapes,
                                                                       layout.tensor_groups, strict=True):
                parameter = named[name]
                parameter.copy_(value.view(shape))
                parameter.grad = gradient.view(shape).clone()  # the last clipped gradient, as train_batch leaves it
                optimizer = self.optimizers[env][group]
                if optimizer.param_groups[0]["momentum"] != 0:
                    state = optimizer.state[parameter]
                    kept = state.get("momentum_buffer")
                    if kept is None:
                        state["momentum_buffer"] = momentum.view(shape).clone()
                    else:
                        kept.copy_(momentum.view(shape))
            buffers = dict(model.named_buffers())
            for name in self.buffer_names:
                buffers[name].copy_(self.state[name][env])
            episode.trainer.add_epoch_losses(self.loss_sum[env], self.batches)
            episode.trainer.batch_shapes.update(self.batch_shapes)
            seeds = {layout.groups[group]: SeedAccumulation(self.gradient_sums[env, group], tensor_counts[group],
                                                            group_sizes[group])
                     for group in range(1, len(layout.groups))}
            ordered = {slot_id: seeds[slot_id] for slot_id in model.slot_ids if slot_id in seeds}  # slot order
            episode.monitor.add_accumulated(self.gradient_sums[env, 0, 0], group_sizes[0], self.batches, ordered)
        self.batches = 0
        self.batch_shapes.clear()


@dataclass(frozen=True)
class TrainingGroups:
    """How one epoch of a vector is trained: stacked groups, and the envs trained alone."""

    groups: tuple[tuple[int, ...], ...]
    """Env indices trained together, one vmapped call per group and batch."""
    alone: tuple[int, ...]
    """Env indices whose architecture no other env shares: trained by their own `HostAndSeedTrainer`."""


def training_groups(episodes: Sequence[MorphogenesisEpisode], min_group_size: int = 2) -> TrainingGroups:
    """Group envs by architecture; groups smaller than `min_group_size`, envs whose optimizer is not SGD and envs
    with a seed whose learning rate is being re-warmed are trained alone."""
    if min_group_size < 1:
        raise ValueError(f"min_group_size must be >= 1, got {min_group_size}")
    # Only SGD envs at constant rates can be stacked; another env leaves its group and trains alone.
    grouped = [[index for index in group if _stackable(episodes[index])]
               for group in group_by_architecture(episodes)]
    stackable = [group for group in grouped if len(group) >= min_group_size and _one_dtype(episodes[group[0]])]
    groups = tuple(tuple(group) for group in stackable)
    stacked = {index for group in stackable for index in group}
    alone = tuple(index for index in range(len(episodes)) if index not in stacked)
    return TrainingGroups(groups, alone)


def _stackable(episode: MorphogenesisEpisode) -> bool:
    """Whether the env trains with SGD at rates fixed for the epoch, what the stacked step implements: an env
    on another optimizer (AdamW), or with a seed whose learning rate is re-warmed step by step
    (`OptimizerConfig.seed_warmup_steps`), is trained alone by its own `HostAndSeedTrainer`."""
    trainer = episode.trainer
    trainer.sync_seed_optimizers()  # a seed germinated by this epoch's action gets its optimizer (and warm-up) now
    return trainer.config.name == "sgd" and not trainer.warming_up()


def _one_dtype(episode: MorphogenesisEpisode) -> bool:
    """Whether every parameter of the env's model has one dtype (the flat matrix holds one)."""
    assert episode.model is not None
    return len({parameter.dtype for parameter in episode.model.parameters()}) == 1


TrainEnvsOnBatch = Callable[[Inputs, Tensor, Sequence[int]], None]
"""Trains the envs at the given indices on one batch (inputs, targets), one after another."""
#: The batch on every device an env runs on (`DevicePlacement.copy_batch`).
BatchPerDevice = Callable[[Inputs, Tensor], Mapping[torch.device, tuple[Inputs, Tensor]]]


def train_epoch_batched(episodes: Sequence[MorphogenesisEpisode], batches: Iterable[tuple[Inputs, Tensor]],
                        train_alone: TrainEnvsOnBatch, streams: Sequence[torch.cuda.Stream | None] | None = None,
                        *, min_group_size: int = 2, copy_batch: BatchPerDevice | None = None) -> TrainingGroups:
    """Train every env one epoch on the shared `batches`: identical architectures stacked, the rest alone.

    `train_alone(inputs, targets, indices)` trains the envs at `indices` one after another on a batch
    (the vector's per-env path). `streams` are the envs' CUDA streams (None on other devices). Each
    group's time lands in its first env's "train" phase. With envs on several devices, `copy_batch` gives
    the batch on each of them (a group's envs share one device: it is part of their signature).
    """
    grouping = training_groups(episodes, min_group_size)
    group_streams = [None if streams is None else streams[group[0]] for group in grouping.groups]
    stacked = []
    for group, stream in zip(grouping.groups, group_streams, strict=True):
        with _on_stream(stream, episodes[group[0]]):
            stacked.append(StackedEnvs([episodes[index] for index in group]))
    for index, (inputs, targets) in enumerate(batches):
        on_device = None if copy_batch is None or not grouping.groups else copy_batch(inputs, targets)
        for group, stream, envs in zip(grouping.groups, group_streams, stacked, strict=True):
            first = episodes[group[0]]
            group_inputs, group_targets = (inputs, targets) if on_device is None else on_device[first.device]
            with first.timer.phase("train"), _on_stream(stream, first, *tensors(group_inputs), group_targets):
                if index == 0 and first.epoch == 0:  # the episode's first batch: checked once, as a lone env's is
                    _step_first_batch(envs, first, group_inputs, group_targets)
                else:
                    envs.step(group_inputs, group_targets)
        if grouping.alone:
            train_alone(inputs, targets, grouping.alone)
    for group, stream, envs in zip(grouping.groups, group_streams, stacked, strict=True):
        with episodes[group[0]].timer.phase("train"), _on_stream(stream, episodes[group[0]]):
            envs.write_back()
    return grouping


def _step_first_batch(envs: StackedEnvs, first: MorphogenesisEpisode, inputs: Inputs, targets: Tensor) -> None:
    """A group's step on its episodes' first batch, with the first batch's class check and failure message that
    `MorphogenesisEpisode` gives an env trained alone (the envs share the batch and the task: checked once)."""
    first.refuse_first_training_classes(targets)
    try:
        envs.step(inputs, targets)
    except (RuntimeError, ValueError, TypeError, IndexError, KeyError) as error:
        raise first.first_batch_failure(inputs, targets, error) from None


def _on_stream(stream: torch.cuda.Stream | None, episode: MorphogenesisEpisode,
               *used: Tensor) -> torch.cuda.StreamContext | nullcontext[None]:
    """Enter `stream` after it waited for the current stream; `used` tensors are recorded on it."""
    if stream is None:
        return nullcontext()
    stream.wait_stream(torch.cuda.current_stream(episode.device))
    for tensor in used:
        tensor.record_stream(stream)
    return torch.cuda.stream(stream)
