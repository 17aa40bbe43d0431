"""Gradient health of the host against each seed over an epoch: the signals of the lifecycle gates.

Rules:
- `accumulate()` runs every batch, after backward and before the optimizer step (clipping may come
  before or after; call it where the gradients you want judged are). It never synchronizes: norms
  and counts are added into small tensors on one device, the *accumulation device* (the `device`
  argument, else the device of the first gradient seen). Per-tensor norms of a group that lives on
  another device are moved there as one small vector, never one tensor per parameter. It returns
  each group's total norm where clipping would compute the same one (`ClipNorms`), so that a trainer
  clipping after it does not compute it twice.
- `collect()` returns those accumulators as device tensors, still without a sync.
- `materialize()` is the ONE host sync per epoch: a single transfer of every accumulator, after
  which the accumulators are reset.
- A seed is *measured* in a batch when at least one of its parameters has a gradient. A seed never
  measured during the epoch is absent from the report: unmeasured is not zero, and gates must fail
  on it. The host is measured every batch; a host without any gradient counts as a zero norm.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from morphogen.telemetry.gradients import (
    DEFAULT_EXPLODING_THRESHOLD,
    DEFAULT_VANISHING_THRESHOLD,
    GroupGradientStats,
    gradient_ratio,
    group_gradient_stats,
    health_score,
)


@dataclass(frozen=True)
class SeedGradientHealth:
    """Gradient health of one seed over an epoch."""

    gradient_norm: float
    """Mean over the measured batches of the seed's global gradient L2 norm."""
    health: float
    """`health_score(vanishing_fraction, exploding_fraction)`: 1.0 healthy, 0.0 worst."""
    gradient_ratio: float
    """`gradient_ratio(seed norm, seed parameters, host norm, host parameters)`: sqrt-normalized norms."""
    vanishing_fraction: float
    """Fraction of (tensor, batch) measurements whose gradient norm was below the vanishing threshold."""
    exploding_fraction: float
    """Fraction of (tensor, batch) measurements whose gradient norm was above the exploding threshold."""


@dataclass(frozen=True)
class IsolationReport:
    """Host and per-seed gradient health over the batches accumulated since the last report."""

    host_gradient_norm: float
    """Mean over batches of the host's global gradient L2 norm; NaN when no batch was accumulated."""
    batches: int
    """Number of `accumulate` calls (batches) the report covers."""
    seeds: Mapping[str, SeedGradientHealth]
    """Health per seed measured in at least one batch; seeds never measured are absent."""


class IsolationTotals(NamedTuple):
    """The monitor's accumulators as device tensors (reading them synchronizes)."""

    host_norm_sum: Tensor
    """Sum over batches of the host's global gradient norm, 0-dim float32."""
    seed_sums: Mapping[str, Tensor]
    """Per seed, float32 [sum of norms, vanishing count, exploding count] over its measured batches."""
    batches: int


class ClipNorms(NamedTuple):
    """One batch's total gradient norm of the host and of each measured seed, where it is the one
    `torch.nn.utils.clip_grad_norm_` would compute (`GroupGradientStats.clip_norm`), for `clip_gradients`."""

    host: Tensor | None
    seeds: Mapping[str, Tensor | None]


class SeedAccumulation(NamedTuple):
    """One seed's gradient statistics summed over several batches elsewhere (see `add_accumulated`)."""

    sums: Tensor
    """float32 (3,): sum over the batches of the seed's global gradient norm, vanishing count, exploding count."""
    tensors: int
    """Parameter tensors with a gradient in each batch."""
    parameters: int
    """Scalar entries over those tensors."""


@dataclass
class _SeedTally:
    """Host-side counters of one seed, known without reading the device."""

    sums: Tensor  # (3,) float32: norm sum, vanishing count, exploding count
    batches: int = 0
    tensors: int = 0
    parameters: int = 0


class IsolationMonitor:
    """Accumulates host and per-seed gradient statistics every batch; reports them once per epoch.

    Counts are accumulated in float32, exact up to 2**24 (tensor, batch) measurements per epoch.
    """

    def __init__(
        self,
        *,
        device: torch.device | str | None = None,
        vanishing_threshold: float = DEFAULT_VANISHING_THRESHOLD,
        exploding_threshold: float = DEFAULT_EXPLODING_THRESHOLD,
    ) -> None:
        if not 0.0 <= vanishing_threshold < exploding_threshold:
            raise ValueError(
                "need 0 <= vanishing_threshold < exploding_threshold; got "
                f"vanishing_threshold={vanishing_threshold}, exploding_threshold={exploding_threshold}"
            )
        self.vanishing_threshold = vanishing_threshold
        self.exploding_threshold = exploding_threshold
        self._device: torch.device | None = None if device is None else torch.device(device)
        self._reset()

    @property
    def device(self) -> torch.device | None:
        """The accumulation device; None until given or until the first gradient is seen."""
        return self._device

    def _reset(self) -> None:
        self._host_norm_sum: Tensor | None = None
        self._host_parameters = 0
        self._batches = 0
        self._seeds: dict[str, _SeedTally] = {}

    @torch.no_grad()
    def accumulate(self, host_params: Iterable[Tensor], seed_params: Mapping[str, Iterable[Tensor]]) -> ClipNorms:
        """Add this batch's gradient statistics of the host and of each seed; return the groups' total norms that
        clipping these gradients may reuse (a seed without a gradient has none). No host sync."""
        host_params = list(host_params)
        seed_groups = {slot: list(params) for slot, params in seed_params.items()}
        device = self._resolve_device(host_params, seed_groups)
        host = self._stats(host_params, device)
        if self._host_norm_sum is None:
            self._host_norm_sum = torch.zeros((), dtype=torch.float32, device=device)
        self._host_norm_sum.add_(host.norm)
        self._host_parameters = host.n_parameters
        self._batches += 1
        seed_norms: dict[str, Tensor | None] = {}
        for slot, params in seed_groups.items():
            stats = self._stats(params, device)
            if stats.n_tensors == 0:
                continue  # no gradient: this seed was not measured in this batch
            seed_norms[slot] = stats.clip_norm
            tally = self._seeds.get(slot)
            if tally is None:
                tally = self._seeds[slot] = _SeedTally(torch.zeros(3, dtype=torch.float32, device=device))
            tally.sums.add_(torch.stack([stats.norm, stats.vanishing.float(), stats.exploding.float()]))
            tally.batches += 1
            tally.tensors += stats.n_tensors
            tally.parameters = stats.n_parameters
        return ClipNorms(host.clip_norm, seed_norms)

    @torch.no_grad()
    def add_accumulated(self, host_norm_sum: Tensor, host_parameters: int, batches: int,
                        seeds: Mapping[str, SeedAccumulation]) -> None:
        """Add statistics accumulated elsewhere over `batches` batches, as if `accumulate` had run on each.

        For a trainer that computes the norms of many models at once (the batched envs of a vector): it
        adds each model's sums here once per epoch instead of calling `accumulate` once per batch. Every
        seed in `seeds` counts as measured in all `batches` batches. No host sync.
        """
        if batches < 1:
            raise ValueError(f"batches must be >= 1, got {batches}")
        if self._device is None:
            self._device = host_norm_sum.device
        device = self._device
        if self._host_norm_sum is None:
            self._host_norm_sum = torch.zeros((), dtype=torch.float32, device=device)
        self._host_norm_sum.add_(host_norm_sum.to(device=device, dtype=torch.float32))
        self._host_parameters = host_parameters
        self._batches += batches
        for slot, accumulation in seeds.items():
            tally = self._seeds.get(slot)
            if tally is None:
                tally = self._seeds[slot] = _SeedTally(torch.zeros(3, dtype=torch.float32, device=device))
            tally.sums.add_(accumulation.sums.to(device=device, dtype=torch.float32))
            tally.batches += batches
            tally.tensors += accumulation.tensors * batches
            tally.parameters = accumulation.parameters

    def collect(self) -> IsolationTotals:
        """The accumulators as device tensors, without syncing or resetting."""
        device = self._device if self._device is not None else torch.device("cpu")
        host_norm_sum = self._host_norm_sum
        if host_norm_sum is None:
            host_norm_sum = torch.zeros((), dtype=torch.float32, device=device)
        seed_sums = {slot: tally.sums for slot, tally in self._seeds.items()}
        return IsolationTotals(host_norm_sum=host_norm_sum, seed_sums=seed_sums, batches=self._batches)

    def materialize(self) -> IsolationReport:
        """Convert the accumulators to a report and reset them. Synchronizes with the device, once."""
        totals = self.collect()
        slots = list(totals.seed_sums)
        flat = torch.cat([totals.host_norm_sum.reshape(1), *(totals.seed_sums[slot] for slot in slots)])
        values = flat.tolist()  # the one host sync per epoch: every accumulator in one transfer
        host_norm = values[0] / totals.batches if totals.batches else math.nan
        seeds = {}
        for index, slot in enumerate(slots):
            tally = self._seeds[slot]
            norm_sum, vanishing, exploding = values[1 + 3 * index : 4 + 3 * index]
            seed_norm = norm_sum / tally.batches
            vanishing_fraction = vanishing / tally.tensors
            exploding_fraction = exploding / tally.tensors
            seeds[slot] = SeedGradientHealth(
                gradient_norm=seed_norm,
                health=health_score(vanishing_fraction, exploding_fraction),
                gradient_ratio=gradient_ratio(seed_norm, tally.parameters, host_norm, self._host_parameters),
                vanishing_fraction=vanishing_fraction,
                exploding_fraction=exploding_fraction,
            )
        self._reset()
        return IsolationReport(host_gradient_norm=host_norm, batches=totals.batches, seeds=seeds)

    def _resolve_device(
        self, host_params: list[Tensor], seed_groups: Mapping[str, list[Tensor]]
    ) -> torch.device:
        """Fix the accumulation device on first use: the given one, else the first gradient's."""
        if self._device is None:
            for params in (host_params, *seed_groups.values()):
                grad = next((param.grad for param in params if param.grad is not None), None)
                if grad is not None:
                    self._device = grad.device
                    break
            else:
                self._device = torch.device("cpu")
        return self._device

    def _stats(self, params: list[Tensor], device: torch.device) -> GroupGradientStats:
        return group_gradient_stats(
            params,
            device=device,
            vanishing_threshold=self.vanishing_threshold,
            exploding_threshold=self.exploding_threshold,
        )
