"""One training batch of a morphogenetic model: host and every live seed, each with its own optimizer.

A TRAINING seed learns in closed loop (docs/architecture.md#shadow-pass): its gradient comes from the
loss of the network with its output blended in at alpha 1 (the shadow pass), restricted to its own
parameters, while the host and blended seeds learn from the real model's loss.

Gradients are clipped per group (host, then each seed) so a young seed's large gradients cannot eat
the host's step budget, and vice versa. Nothing here synchronizes: the loss is accumulated on the
device and read once per epoch by the episode.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from morphogen.config import build_config
from morphogen.core.flops import Shape
from morphogen.core.isolation import IsolationMonitor
from morphogen.core.model import MorphogeneticModel, shadow_rows
from morphogen.data import DEFAULT_OPTIMIZERS
from morphogen.env.compute import note_batch
from morphogen.env.evaluation import Objective, task_loss
from morphogen.limits import check_finite

OPTIMIZER_NAMES: tuple[str, ...] = ("sgd", "adamw")
"""Optimizers the host and seeds can train with: torch's `SGD` (with momentum) or `AdamW`."""


@dataclass(frozen=True)
class OptimizerConfig:
    """Optimizer of the host and of each seed: one kind for both, each its own settings.

    The defaults are the SGD the image tasks train with. A task may choose another default
    (`morphogen.data.DEFAULT_OPTIMIZERS`, resolved by `task_optimizer_config`): `text` trains its
    transformer with AdamW, under which SGD at lr 0.01 leaves it far from fitting.
    """

    #: "sgd" (momentum, coupled L2 weight decay) or "adamw" (Adam with decoupled weight decay).
    name: str = "sgd"
    host_lr: float = 0.01
    #: SGD momentum of the host (AdamW uses `betas`).
    host_momentum: float = 0.9
    #: L2 penalty (SGD) or decoupled decay (AdamW) of the host's parameters.
    host_weight_decay: float = 5e-4
    seed_lr: float = 0.01
    #: SGD momentum of each seed (AdamW uses `betas`).
    seed_momentum: float = 0.9
    seed_weight_decay: float = 0.0
    #: AdamW's coefficients of the running averages of the gradient and of its square (host and seeds).
    betas: tuple[float, float] = (0.9, 0.999)
    #: AdamW's term added to the denominator for numerical stability.
    eps: float = 1e-8
    #: Max global L2 gradient norm, applied to the host and to each seed separately.
    clip_norm: float = 5.0

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZER_NAMES:
            raise ValueError(f"name must be one of {', '.join(OPTIMIZER_NAMES)}, got {self.name!r}")
        for name in ("host_lr", "seed_lr", "clip_norm", "host_weight_decay", "seed_weight_decay", "eps"):
            check_finite(name, getattr(self, name))
        for name in ("host_lr", "seed_lr", "clip_norm", "eps"):
            if not getattr(self, name) > 0:  # NaN fails too
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("host_weight_decay", "seed_weight_decay"):
            if not getattr(self, name) >= 0:  # torch's optimizers raise on a negative decay when the episode starts
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("host_momentum", "seed_momentum"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if len(self.betas) != 2 or not all(0.0 <= beta < 1.0 for beta in self.betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {list(self.betas)}")

    def build(self, parameters: Iterable[nn.Parameter], *, seed: bool, lr_scale: float = 1.0) -> torch.optim.Optimizer:
        """The optimizer of the host's (`seed=False`) or one seed's (`seed=True`) parameters, its learning
        rate multiplied by `lr_scale` (the governor's back-offs so far)."""
        lr = (self.seed_lr if seed else self.host_lr) * lr_scale
        weight_decay = self.seed_weight_decay if seed else self.host_weight_decay
        if self.name == "adamw":
            return torch.optim.AdamW(parameters, lr=lr, betas=self.betas, eps=self.eps,
                                     weight_decay=weight_decay, foreach=True)
        return torch.optim.SGD(parameters, lr=lr, momentum=self.seed_momentum if seed else self.host_momentum,
                               weight_decay=weight_decay, foreach=True)


def task_optimizer_config(task: str, table: Mapping[str, Any] | None = None) -> OptimizerConfig:
    """Task `task`'s default optimizer with the keys of `table` (an `[episode.optimizer]` table) over it.

    A table that names another optimizer than the task's default (`name = "sgd"` on `text`) starts from
    `OptimizerConfig`'s own defaults instead, so that no AdamW learning rate leaks into SGD. Bad keys and
    values raise `ConfigError` naming `episode.optimizer.KEY`.
    """
    defaults = dict(DEFAULT_OPTIMIZERS.get(task, {}))
    given = dict(table or {})
    if "name" in given and given["name"] != defaults.get("name", OptimizerConfig.name):
        defaults = {}
    return build_config(OptimizerConfig, {**defaults, **given}, "episode.optimizer")


class ModelTrainer:
    """Owns the host optimizer, one optimizer per live seed, and the per-epoch loss accumulator."""

    def __init__(self, model: MorphogeneticModel, config: OptimizerConfig, monitor: IsolationMonitor,
                 objective: Objective | None = None, shadow_fraction: float = 1.0) -> None:
        self.model, self.config, self.monitor = model, config, monitor
        #: Fraction of each batch the TRAINING seeds' shadow pass runs on (`EpisodeConfig.shadow_fraction`).
        self.shadow_fraction = shadow_fraction
        #: The task's loss (cross-entropy unless the task brings its own).
        self.objective = objective or Objective(task_loss, None, custom=False)
        self.host_optimizer = config.build(model.host_parameters(), seed=False)
        self.seed_optimizers: dict[str, tuple[nn.Module, torch.optim.Optimizer]] = {}
        #: Product of the governor's back-offs of the seeds' learning rate in this episode.
        self.seed_lr_scale = 1.0
        self._loss_sum: Tensor | None = None
        self.batches = 0
        #: (input shape, dtype) -> batches trained since the last `take_batch_shapes`: what the epoch's FLOPs
        #: are charged for.
        self.batch_shapes: Counter[tuple[Shape, torch.dtype]] = Counter()

    def sync_seed_optimizers(self) -> dict[str, list[nn.Parameter]]:
        """Create optimizers for new seeds, drop those of removed ones; return the running seeds' params."""
        running: dict[str, list[nn.Parameter]] = {}
        for slot in self.model.slots():
            kept = self.seed_optimizers.get(slot.slot_id)
            if slot.seed is None:
                if kept is not None:
                    del self.seed_optimizers[slot.slot_id]
                continue
            if kept is None or kept[0] is not slot.seed:
                optimizer = self.config.build(slot.seed_parameters(), seed=True, lr_scale=self.seed_lr_scale)
                self.seed_optimizers[slot.slot_id] = (slot.seed, optimizer)
            if slot.is_running:
                running[slot.slot_id] = [p for p in slot.seed_parameters() if p.requires_grad]
        return running

    def train_batch(self, inputs: Tensor, targets: Tensor) -> None:
        """Forward, backward, per-group clip and optimizer steps on one batch."""
        model = self.model
        model.train()
        note_batch(self.batch_shapes, inputs)
        running = self.sync_seed_optimizers()
        model.zero_grad(set_to_none=True)
        output, shadow = model.forward_with_shadow(inputs, shadow_rows(inputs.shape[0], self.shadow_fraction))
        loss = self.objective.checked_loss(output, targets)
        loss.backward()
        if shadow is not None and shadow.parameters:
            self.objective.shadow_loss(shadow.outputs, targets[:shadow.rows]).backward(inputs=list(shadow.parameters))
        host_parameters = model.host_parameters()
        self.monitor.accumulate(host_parameters, running)
        nn.utils.clip_grad_norm_(host_parameters, self.config.clip_norm, foreach=True)
        self.host_optimizer.step()
        for slot_id, parameters in running.items():
            if parameters:
                nn.utils.clip_grad_norm_(parameters, self.config.clip_norm, foreach=True)
                self.seed_optimizers[slot_id][1].step()
        detached = loss.detach()
        self._loss_sum = detached.clone() if self._loss_sum is None else self._loss_sum.add_(detached)
        self.batches += 1

    def add_epoch_losses(self, loss_sum: Tensor, batches: int) -> None:
        """Add the summed training loss of `batches` batches trained elsewhere (the batched envs of a vector)."""
        detached = loss_sum.detach()
        self._loss_sum = detached.clone() if self._loss_sum is None else self._loss_sum.add_(detached)
        self.batches += batches

    def take_epoch_loss(self) -> Tensor:
        """Mean training loss of the batches since the last call, as a device tensor (no sync)."""
        if self._loss_sum is None or self.batches == 0:
            raise RuntimeError("no batch was trained this epoch")
        mean = self._loss_sum / self.batches
        self._loss_sum, self.batches = None, 0
        return mean

    def take_batch_shapes(self) -> Counter[tuple[Shape, torch.dtype]]:
        """The shapes of the batches trained since the last call (and forget them)."""
        shapes, self.batch_shapes = self.batch_shapes, Counter()
        return shapes

    def back_off(self, what: str, factor: float) -> None:
        """Multiply the learning rate of the host (`what="host"`) or of every seed (`"seeds"`, also those
        germinated later) by `factor`: the governor's response to a divergence it rolled back."""
        if what == "host":
            for group in self.host_optimizer.param_groups:
                group["lr"] *= factor
            return
        assert what == "seeds", what
        self.seed_lr_scale *= factor
        for _, optimizer in self.seed_optimizers.values():
            for group in optimizer.param_groups:
                group["lr"] *= factor

    def reset_host_momentum(self) -> None:
        """Forget the momentum of the host and of every kept seed (after a rollback it points the way that
        diverged, and after a non-finite epoch it is NaN: a fossilized seed would poison every later step).

        All optimizer state goes: SGD's momentum buffers, AdamW's running averages and step counts (AdamW
        then restarts with its bias correction, as on the first step)."""
        self.host_optimizer.state.clear()
        for _, optimizer in self.seed_optimizers.values():
            optimizer.state.clear()
