"""Checks that a training state is whole and finite: a checksum over everything, and a NaN/Inf scan.

`state_checksum(state)` hashes (SHA-256) every leaf of a nested checkpoint state in order: each
tensor's dtype, shape and bytes, and the `repr` of every plain value, each under its key path. It is
written into the checkpoint and recomputed on load, so a flipped byte anywhere (one weight turned
into 1.29e29 by a bad disk or copy) is refused instead of acted on.

`non_finite_entries(state)` names the floating-point tensors and floats holding NaN or infinity. It
synchronizes once per device (all tensors of a device are judged in one reduction), not once per
tensor.

`write_checksummed` / `read_torch_file` / `checksum_matches` are the file side every checksummed file of a
run shares (policy checkpoints, model files, resume states): written whole or not at all, read with
`weights_only=True` (tensors and plain values; anything else could run code), refused in one line.
"""

from __future__ import annotations

import hashlib
import io
import math
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from morphogen.run_directory import write_atomic

_TERMINAL_ESCAPES = re.compile(r"\x1b\[[0-9;]*m")


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


def write_checksummed(payload: Mapping[str, Any], path: str | Path) -> None:
    """Write `payload` and a `checksum` entry over it to `path` atomically (whole or not at all, never through a
    link). `payload` must not hold a `checksum` key of its own."""
    buffer = io.BytesIO()
    torch.save({**payload, "checksum": state_checksum(payload)}, buffer)
    write_atomic(Path(path), buffer.getvalue())


def read_torch_file(path: Path, *, what: str, error: type[Exception],
                    map_location: str | torch.device = "cpu") -> Any:
    """What `torch.load(path, weights_only=True)` returns, or `error` with one line saying why the `what` at `path`
    could not be read."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as failure:  # torch.load raises many types on bad bytes; all mean "not a usable file"
        raise error(load_failure(path, failure, what)) from None


def checksum_matches(state: dict[str, Any]) -> bool:
    """Remove `state`'s `checksum` entry and say whether it is the checksum of the rest (False when it has none)."""
    return bool(state.pop("checksum", None) == state_checksum(state))


def load_failure(path: Path, error: Exception, what: str = "checkpoint") -> str:
    """One line saying why `torch.load` could not read the `what` at `path` (torch's own messages span many lines)."""
    text = _TERMINAL_ESCAPES.sub("", str(error))
    # torch words it "Unsupported global: GLOBAL x" (2.4-2.5) or "unsupported GLOBAL x whose module ..." (2.6+).
    refused = re.search(r"[Uu]nsupported global:? GLOBAL (\S+)", text)
    if refused:
        return (f"{what} {path} was refused: it holds a {refused.group(1)} object, but a {what} holds only "
                "tensors and plain values (loading other objects could run code)")
    if "Weights only load failed" in text:
        return (f"{what} {path} was refused: it holds something other than tensors and plain values "
                "(loading it could run code)")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if "WeightsUnpickler error" in text or isinstance(error, KeyError) or not lines:
        detail = "not a file written by torch.save"
    else:
        detail = lines[0].split(". ")[0].rstrip(".")  # torch's first sentence says what failed
    return f"{what} {path} is unreadable (truncated or corrupt?): {detail}"
