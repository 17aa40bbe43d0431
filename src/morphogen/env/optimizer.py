"""How the host and each seed are optimized: `OptimizerConfig` (the `[episode.optimizer]` table) and each
task's default (`task_optimizer_config`).

Its own module, apart from the training step (`env/training.py`), because commands resolve it while they
read their config, before any episode exists.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from morphogen.config import build_config
from morphogen.data.catalog import DEFAULT_OPTIMIZERS, TASK_NAMES, TOPOLOGY_OPTIMIZERS
from morphogen.limits import check_finite

OPTIMIZER_NAMES: tuple[str, ...] = ("sgd", "adamw")
"""Optimizers the host and seeds can train with: torch's `SGD` (with momentum) or `AdamW`."""

SCHEDULES: tuple[str, ...] = ("constant", "cosine")
"""How the learning rates of host and seeds change over an episode (`OptimizerConfig.schedule`)."""


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
    #: Optimizer steps over which a new seed's learning rate is re-warmed: it rises linearly from
    #: seed_lr / N to seed_lr over its first N steps (0: no warm-up). Every seed's optimizer state starts
    #: empty, and Adam's first steps on empty moments move each weight by about the learning rate whatever its
    #: gradient; growth work (bert2BERT, LiGO, Gstack) re-warms the rate of new layers for that reason.
    seed_warmup_steps: int = 0
    #: How the learning rates of host and seeds change over the episode: "constant", or "cosine": in epoch e
    #: (from 0) of E the host's rate is the configured one times (1 + cos(pi * e / E)) / 2, the full rate in the
    #: first epoch and near zero in the last; a seed germinated in epoch g follows the same curve over the E - g
    #: epochs left (full rate at birth: under the host's decayed rate a late seed learned too little; from its
    #: birth, mnist1d grew +4.10 points over no growth instead of +2.80, 5 seeds). SGD at a constant rate
    #: leaves a batch-norm ResNet's validation accuracy swinging by several points from one epoch to the next
    #: until the end (benchmarks/your_model.py), so the accuracy it ends at says little; a decay lets it settle.
    schedule: str = "constant"

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
        if self.seed_warmup_steps < 0:
            raise ValueError(f"seed_warmup_steps must be >= 0, got {self.seed_warmup_steps}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")

    @property
    def label(self) -> str:
        """The optimizer's name as people write it: "SGD" or "AdamW"."""
        return "AdamW" if self.name == "adamw" else "SGD"

    @property
    def summary(self) -> str:
        """The optimizer in a few words, as a run's first line shows it: "AdamW lr 0.005", "SGD lr 0.01 cosine"."""
        schedule = "" if self.schedule == "constant" else f" {self.schedule}"
        return f"{self.label} lr {self.host_lr:g}{schedule}"

    def schedule_factor(self, epoch: int, epochs: int) -> float:
        """What the learning rates are multiplied by in epoch `epoch` (from 0) of `epochs` under `schedule`."""
        if self.schedule == "constant":
            return 1.0
        if not 0 <= epoch < epochs:
            raise ValueError(f"epoch {epoch} is not one of the episode's {epochs} epochs")
        return (1.0 + math.cos(math.pi * epoch / epochs)) / 2.0  # > 0 for every epoch of the episode

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


def warmup_factor(step: int, warmup_steps: int) -> float:
    """The fraction of its learning rate a seed steps with on its `step`-th step (1-based): linear to 1."""
    if warmup_steps <= 0:
        return 1.0
    return min(1.0, step / warmup_steps)


def task_optimizer_config(task: str, table: Mapping[str, Any] | None = None,
                          path: str = "episode.optimizer", *, topology: str = "") -> OptimizerConfig:
    """Task `task`'s default optimizer with the keys of `table` (an `[episode.optimizer]` table) over it; a task
    without one of its own (a user's) takes that of its host's `topology` (AdamW for a transformer).

    A table that names another optimizer than the task's default (`name = "sgd"` on `text`) starts from
    `OptimizerConfig`'s own defaults instead, so that no AdamW learning rate leaks into SGD. Bad keys and
    values raise `ConfigError` naming `PATH.KEY` (`path`: where the table sits in the config).
    """
    defaults = dict(DEFAULT_OPTIMIZERS.get(task, {} if task in TASK_NAMES else TOPOLOGY_OPTIMIZERS.get(topology, {})))
    given = dict(table or {})
    if "name" in given and given["name"] != defaults.get("name", OptimizerConfig.name):
        defaults = {}
    return build_config(OptimizerConfig, {**defaults, **given}, path)


def resolved_optimizer_table(table: object, task: str, path: str = "episode.optimizer", *,
                             topology: str = "") -> dict[str, Any] | None:
    """An optimizer `table` laid over `task`'s default optimizer (`task_optimizer_config`), as the plain values a
    config records; None where `table` is not a table (left for `build_config` to report)."""
    if not isinstance(table, Mapping):
        return None
    return dataclasses.asdict(task_optimizer_config(task, table, path, topology=topology))  # bad key: ConfigError
