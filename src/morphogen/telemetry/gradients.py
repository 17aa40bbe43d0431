"""Gradient statistics per parameter group: global L2 norm, vanishing and exploding tensor counts.

Rules (docs/architecture.md#telemetry):
- Norms are per-tensor (`torch._foreach_norm`) and computed in float32, or float64 for float64
  gradients, so float16/bfloat16 gradients do not overflow the way a sum of squares in their own
  dtype does. No temporary tensor the size of all gradients is built (no `torch.cat` of gradients):
  only the vector of per-tensor norms, one entry per tensor, is combined.
- A group may live on several devices. `_foreach_norm` runs once per (device, dtype) bucket, and the
  per-tensor norms are moved to ONE device before they are combined.
- Nothing here synchronizes with the host: every result is a tensor on the device. Converting it to
  a Python number is the caller's single, visible sync (see `core/isolation.py`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

DEFAULT_VANISHING_THRESHOLD = 1e-7
"""A tensor whose gradient L2 norm is below this receives effectively no learning signal."""

DEFAULT_EXPLODING_THRESHOLD = 10.0
"""A tensor whose gradient L2 norm is above this (or non-finite) counts as exploding. With the default
SGD learning rate 0.01 such a tensor moves by more than 0.1 in L2 per step, far beyond the small,
steady updates of healthy training; PPO clips its whole gradient at 5.0 for the same reason."""

VANISHING_WEIGHT = 0.5
"""Weight of the vanishing fraction in `health_score`: a vanishing tensor stalls, an exploding one
diverges, so vanishing costs half as much health."""

RATIO_HOST_FLOOR = 1e-12
"""Floor on the host's per-parameter gradient norm in `gradient_ratio`, so that a host with no
gradient (frozen) gives a very large finite ratio instead of a division by zero."""


class GroupGradientStats(NamedTuple):
    """Gradient statistics of one parameter group, as device tensors (reading them synchronizes)."""

    norm: Tensor
    """Global L2 norm over every gradient of the group, 0-dim float32."""
    vanishing: Tensor
    """Number of tensors whose gradient norm is below the vanishing threshold, 0-dim int64."""
    exploding: Tensor
    """Number of tensors whose gradient norm is above the exploding threshold or non-finite, 0-dim int64."""
    n_tensors: int
    """Number of tensors that had a gradient (parameters whose `.grad` is None are skipped)."""
    n_parameters: int
    """Number of scalar entries over those gradients."""
    clip_norm: Tensor | None = None
    """`norm` where it is, bit for bit, the total norm `torch.nn.utils.clip_grad_norm_` computes of the same
    gradients (all float32 on the result's device), so that clipping can reuse it (`clip_gradients`); None
    where it is not (other dtypes, several devices), and clipping computes its own."""


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """Dtype the per-tensor norms are computed in: float64 stays float64, anything else is float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def per_tensor_gradient_norms(grads: Iterable[Tensor], device: torch.device) -> Tensor:
    """L2 norm of each gradient as a 1-D float32 tensor on `device`, in bucket order.

    Gradients are bucketed by (device, dtype) because `_foreach_norm` needs one device per call
    (given a mixed list it silently returns wrong values on CPU); each bucket's norms are stacked on
    their own device and moved to `device` as one small vector.
    """
    return _bucketed_norms(_buckets(grads), device)


def _buckets(grads: Iterable[Tensor]) -> dict[tuple[torch.device, torch.dtype], list[Tensor]]:
    """The gradients by (device, dtype), each bucket in the order given."""
    buckets: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
    for grad in grads:
        buckets.setdefault((grad.device, grad.dtype), []).append(grad)
    return buckets


def _bucketed_norms(buckets: dict[tuple[torch.device, torch.dtype], list[Tensor]], device: torch.device) -> Tensor:
    """`per_tensor_gradient_norms` of gradients already bucketed."""
    if not buckets:
        return torch.zeros(0, dtype=torch.float32, device=device)
    vectors = []
    for (_, dtype), bucket in buckets.items():
        norms = torch._foreach_norm(bucket, 2, dtype=_accumulation_dtype(dtype))
        vectors.append(torch.stack(norms).to(device=device, dtype=torch.float32))
    return vectors[0] if len(vectors) == 1 else torch.cat(vectors)  # (n_tensors,)


@torch.no_grad()
def group_gradient_stats(
    params: Iterable[Tensor],
    *,
    device: torch.device | str | None = None,
    vanishing_threshold: float = DEFAULT_VANISHING_THRESHOLD,
    exploding_threshold: float = DEFAULT_EXPLODING_THRESHOLD,
) -> GroupGradientStats:
    """Global gradient norm and vanishing/exploding tensor counts of one parameter group.

    Parameters whose `.grad` is None are skipped. The result lives on `device`, or on the first
    gradient's device when `device` is None (CPU when no parameter has a gradient). No host sync.
    """
    if not 0.0 <= vanishing_threshold < exploding_threshold:
        raise ValueError(
            "need 0 <= vanishing_threshold < exploding_threshold; got "
            f"vanishing_threshold={vanishing_threshold}, exploding_threshold={exploding_threshold}"
        )
    grads = [param.grad for param in params if param.grad is not None]
    if device is None:
        device = grads[0].device if grads else torch.device("cpu")
    target = torch.device(device)
    buckets = _buckets(grads)
    norms = _bucketed_norms(buckets, target)  # (n_tensors,)
    norm = torch.linalg.vector_norm(norms)
    # `clip_grad_norm_` runs the same `_foreach_norm` and vector norm in the gradients' own dtype: for one bucket of
    # float32 gradients on `target` that is this very computation.
    same_as_clipping = len(buckets) == 1 and next(iter(buckets)) == (target, torch.float32)
    return GroupGradientStats(
        norm=norm,
        vanishing=(norms < vanishing_threshold).sum(),
        # Written as "not <=" so that a NaN norm counts as exploding.
        exploding=torch.logical_not(norms <= exploding_threshold).sum(),
        n_tensors=len(grads),
        n_parameters=sum(grad.numel() for grad in grads),
        clip_norm=norm if same_as_clipping else None,
    )


def clip_gradients(params: Sequence[Tensor], max_norm: float, total_norm: Tensor | None = None) -> None:
    """`torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)`, with the gradients' total norm given where
    it is already known (`GroupGradientStats.clip_norm`): the same scaled gradients, one norm computation fewer."""
    if total_norm is None:
        torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
    else:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total_norm, foreach=True)


def global_gradient_norm(params: Iterable[Tensor]) -> Tensor:
    """Global L2 norm over the gradients of `params` (not divided by anything), 0-dim float32.

    Equals `torch.nn.utils.get_total_norm` of the same gradients, but never overflows in float16.
    """
    return group_gradient_stats(params).norm


def health_score(vanishing_fraction: float, exploding_fraction: float) -> float:
    """Gradient health in [0, 1] from the fractions of vanishing and exploding tensors.

    health = clamp(1 - exploding_fraction - VANISHING_WEIGHT * vanishing_fraction, 0, 1), so 1.0 is
    healthy, 30% exploding tensors reach the 0.7 blending gate, and so do 60% vanishing ones.
    """
    for name, value in (
        ("vanishing_fraction", vanishing_fraction),
        ("exploding_fraction", exploding_fraction),
    ):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must be a fraction in [0, 1]; got {value}")
    return min(1.0, max(0.0, 1.0 - exploding_fraction - VANISHING_WEIGHT * vanishing_fraction))


def gradient_ratio(seed_norm: float, seed_parameters: int, host_norm: float, host_parameters: int) -> float:
    """Seed-to-host gradient ratio, each norm normalized by the square root of its parameter count.

    ratio = (seed_norm / sqrt(seed_parameters)) / max(host_norm / sqrt(host_parameters), RATIO_HOST_FLOOR).
    The sqrt normalization makes a small seed comparable to a large host (a norm grows like the
    square root of the number of entries). A group with no parameters has a per-parameter norm of 0;
    the floor keeps a host without gradient from dividing by zero (the ratio is then very large).
    A NaN norm (non-finite gradients) gives a NaN ratio, which fails every `>=` gate.
    """
    for name, value in (("seed_norm", seed_norm), ("host_norm", host_norm)):
        if value < 0.0:
            raise ValueError(f"{name} must be a non-negative gradient norm; got {value}")
    for name, count in (("seed_parameters", seed_parameters), ("host_parameters", host_parameters)):
        if count < 0:
            raise ValueError(f"{name} must be a non-negative parameter count; got {count}")
    seed_scale = seed_norm / math.sqrt(seed_parameters) if seed_parameters > 0 else 0.0
    host_scale = host_norm / math.sqrt(host_parameters) if host_parameters > 0 else 0.0
    return seed_scale / max(host_scale, RATIO_HOST_FLOOR)
