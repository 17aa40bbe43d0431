"""Per-layer statistics of a module's parameters and gradients, for debug-level telemetry.

Rules:
- One host sync per call: every statistic of every tensor is computed on its device, the rows are moved
  to one device (stacking rows from several devices would fail) and stacked, and a single `.tolist()`
  brings them to the host. Nothing is checked per parameter with `.item()`, which would be one sync per
  parameter.
- Norms come from `torch._foreach_norm` per (device, dtype) bucket, in float32 (float64 stays float64),
  so half-precision tensors do not overflow (a sum of squares in their own dtype would). The other
  statistics loop over the tensors in Python, converting one tensor at a time: no copy of all parameters
  is built.
- `layer_statistics` is wrapped in `torch.compiler.disable` (docs/architecture.md#compiled-code): its
  loop over parameters would otherwise be unrolled into a compiled graph (one graph per model shape,
  recompiled when a seed is added). Called from compiled code, it causes a graph break and runs eagerly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ParamSpec, TypeVar, cast

import torch
from torch import Tensor, nn

from morphogen.telemetry.events import LayerStatistics, LayerStats

_Parameters = ParamSpec("_Parameters")
_Result = TypeVar("_Result")


def _excluded_from_compilation(function: Callable[_Parameters, _Result]) -> Callable[_Parameters, _Result]:
    """`torch.compiler.disable`, keeping the signature for type checkers (torch's decorator is untyped)."""
    disabled = torch.compiler.disable(function)  # type: ignore[no-untyped-call]
    return cast(Callable[_Parameters, _Result], disabled)


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _norms(tensors: list[Tensor], device: torch.device) -> list[Tensor]:
    """L2 norm of each tensor (0-dim, on `device`), via `_foreach_norm` per (device, dtype) bucket."""
    buckets: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for index, tensor in enumerate(tensors):
        buckets.setdefault((tensor.device, tensor.dtype), []).append(index)
    norms: dict[int, Tensor] = {}
    for (_, dtype), indices in buckets.items():
        bucket_norms = torch._foreach_norm([tensors[i] for i in indices], 2, dtype=_accumulation_dtype(dtype))
        for index, norm in zip(indices, bucket_norms, strict=True):
            norms[index] = norm.to(device=device, dtype=torch.float64)
    return [norms[index] for index in range(len(tensors))]


def _row(tensor: Tensor, norm: Tensor, device: torch.device) -> Tensor:
    """[norm, mean, std, min, max, zeros, nan, inf] of one tensor as float64 on `device`. No sync."""
    if tensor.numel() == 0:
        nan = torch.full((), float("nan"), dtype=torch.float64, device=device)
        zero = torch.zeros((), dtype=torch.float64, device=device)
        return torch.stack([zero, nan, nan, nan, nan, zero, zero, zero])
    values = tensor.detach().to(_accumulation_dtype(tensor.dtype))  # one tensor's copy at a time
    moments = torch.stack([values.mean(), values.std(correction=0), values.amin(), values.amax()])
    # Counts stay int64 until the float64 row, which holds them exactly up to 2**53.
    counts = torch.stack([(values == 0).sum(), values.isnan().sum(), values.isinf().sum()])
    return torch.cat(
        [norm.reshape(1), moments.to(device=device, dtype=torch.float64), counts.to(device=device, dtype=torch.float64)]
    )  # (8,)


@_excluded_from_compilation
@torch.no_grad()
def layer_statistics(module: nn.Module, *, gradients: bool = True) -> tuple[LayerStats, ...]:
    """Statistics of every parameter of `module` and, with `gradients`, of every existing `.grad`.

    Synchronizes with the device once. Excluded from `torch.compile` graphs (`torch.compiler.disable`):
    called from compiled code it runs eagerly after a graph break. Rows are parameters first, then
    gradients, each in `named_parameters()` order; parameters without a gradient have no gradient row.
    """
    named: list[tuple[str, str, Tensor]] = [(name, "parameter", param) for name, param in module.named_parameters()]
    if gradients:
        named += [(name, "gradient", p.grad) for name, p in module.named_parameters() if p.grad is not None]
    if not named:
        return ()
    tensors = [tensor for _, _, tensor in named]
    device = tensors[0].device
    norms = _norms(tensors, device)
    table = torch.stack([_row(tensor, norm, device) for tensor, norm in zip(tensors, norms, strict=True)])
    rows = table.tolist()  # the one host sync: (n_tensors, 8) statistics in one transfer
    return tuple(
        LayerStats(
            name=name,
            source=source,
            numel=tensor.numel(),
            norm=norm,
            mean=mean,
            std=std,
            min=minimum,
            max=maximum,
            zeros=int(zeros),
            nan=int(nan),
            inf=int(inf),
        )
        for (name, source, tensor), (norm, mean, std, minimum, maximum, zeros, nan, inf) in zip(
            named, rows, strict=True
        )
    )


def layer_statistics_event(
    module: nn.Module, *, name: str, epoch: int, env_id: int, gradients: bool = True
) -> LayerStatistics:
    """`layer_statistics(module)` as a `LayerStatistics` event naming the module (e.g. "host")."""
    return LayerStatistics(
        epoch=epoch, env_id=env_id, module=name, layers=layer_statistics(module, gradients=gradients)
    )
