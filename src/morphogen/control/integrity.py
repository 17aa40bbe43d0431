"""Checks that a training state is whole and finite: a checksum over everything, and a NaN/Inf scan.

`state_checksum(state)` hashes (SHA-256) every leaf of a nested checkpoint state in order: each
tensor's dtype, shape and bytes, and the `repr` of every plain value, each under its key path. It is
written into the checkpoint and recomputed on load, so a flipped byte anywhere (one weight turned
into 1.29e29 by a bad disk or copy) is refused instead of acted on.

`non_finite_entries(state)` names the floating-point tensors and floats holding NaN or infinity. It
synchronizes once per device (all tensors of a device are judged in one reduction), not once per
tensor.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Mapping
from typing import Any

import torch


def _leaves(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    """(key path, leaf) pairs of nested dicts, lists and tuples, in their order."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from _leaves(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _leaves(item, f"{path}[{index}]")
    else:
        yield path, value


def state_checksum(state: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of every key path, tensor (dtype, shape, bytes) and plain value of `state`."""
    digest = hashlib.sha256()
    for path, leaf in _leaves(state, ""):
        digest.update(path.encode("utf-8", "surrogatepass") + b"\0")
        if isinstance(leaf, torch.Tensor):
            flat = leaf.detach().to("cpu").contiguous().reshape(-1)  # (numel,) in memory order
            digest.update(f"tensor {leaf.dtype} {tuple(leaf.shape)}\0".encode())
            digest.update(flat.view(torch.uint8).numpy().tobytes())
        else:
            digest.update(f"{type(leaf).__name__} {leaf!r}\0".encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def non_finite_entries(state: Mapping[str, Any]) -> list[str]:
    """Key paths of floating-point tensors and floats in `state` that hold NaN or infinity."""
    found = [path for path, leaf in _leaves(state, "") if isinstance(leaf, float) and not math.isfinite(leaf)]
    by_device: dict[torch.device, list[tuple[str, torch.Tensor]]] = {}
    for path, leaf in _leaves(state, ""):
        if isinstance(leaf, torch.Tensor) and (leaf.is_floating_point() or leaf.is_complex()) and leaf.numel():
            by_device.setdefault(leaf.device, []).append((path, leaf))
    for tensors in by_device.values():
        finite = torch.stack([tensor.detach().isfinite().all() for _, tensor in tensors]).tolist()  # one sync
        found.extend(path for (path, _), ok in zip(tensors, finite, strict=True) if not ok)
    return found
