"""Which device a session trains on: the `device` / `devices` settings resolved against this machine, and the one
check (`unavailable`) of what this machine lacks, made by every entry taking a device before torch fails inside."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from morphogen.config import ConfigError
from morphogen.limits import short_repr

if TYPE_CHECKING:
    import torch


def resolve_device(name: str, key: str = "device", *, allow_meta: bool = False, fix: str | None = None) -> str:
    """The torch device string for a `device` setting; a device this machine lacks is a `ConfigError`
    whose message starts with `key` (the setting that named it) and ends with `fix` (default `--KEY cpu`).
    `allow_meta` also accepts `meta`, for a model rebuilt without memory rather than trained."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed: torch.device | None = torch.device(name)
    except RuntimeError:
        parsed = None
    accepted = ("cpu", "cuda", "mps", "meta") if allow_meta else ("cpu", "cuda", "mps")
    if parsed is None or parsed.type not in accepted:  # xla, ... (and meta, for training) hold no data to train on
        raise ConfigError(f"{key}: {short_repr(name)} is not a device morphogen "
                          f"{'places a model on' if allow_meta else 'trains on'}; "
                          f"use cpu, cuda, cuda:N, mps{', meta' if allow_meta else ''} or auto")
    missing = unavailable(parsed, fix or f"--{key} cpu")
    if missing is not None:
        raise ConfigError(f"{key}: {name!r} requested but {missing}")
    return name


def unavailable(target: torch.device, fix: str) -> str | None:
    """What this machine lacks to hold tensors on `target`, ending with `fix` where the fix is another device (None:
    nothing lacks). The one check of every entry that takes a device, made before torch fails deep inside a copy."""
    import torch

    if target.type == "cuda" and not torch.cuda.is_available():
        return f"CUDA is not available here (torch {torch.__version__}); use {fix}"
    count = torch.cuda.device_count() if target.type == "cuda" else 0
    if target.type == "cuda" and target.index is not None and target.index >= count:
        return f"this machine has {count} CUDA device(s): cuda:0 .. cuda:{count - 1}"
    if target.type == "mps" and not torch.backends.mps.is_available():
        return f"MPS is not available here; use {fix}"
    return None


def resolve_devices(names: Sequence[str]) -> list[str]:
    """`resolve_device` of each name of a `devices` list; a bad one is a `ConfigError` naming it."""
    return [resolve_device(name, key="devices") for name in names]
