"""Which device a session trains on: the `device` / `devices` settings resolved against this machine."""

from __future__ import annotations

from collections.abc import Sequence

from morphogen.config import ConfigError
from morphogen.limits import short_repr


def resolve_device(name: str, key: str = "device") -> str:
    """The torch device string for a `device` setting; a device this machine lacks is a `ConfigError`
    whose message starts with `key` (the setting that named it)."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed: torch.device | None = torch.device(name)
    except RuntimeError:
        parsed = None
    if parsed is None or parsed.type not in ("cpu", "cuda", "mps"):  # meta, xla, ... hold no data to train on
        raise ConfigError(f"{key}: {short_repr(name)} is not a device morphogen trains on; "
                          "use cpu, cuda, cuda:N, mps or auto")
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{key}: {name!r} requested but CUDA is not available here; use --{key} cpu")
    if parsed.type == "cuda" and parsed.index is not None and parsed.index >= torch.cuda.device_count():
        raise ConfigError(f"{key}: {name!r} requested but this machine has {torch.cuda.device_count()} CUDA "
                          f"device(s): cuda:0 .. cuda:{torch.cuda.device_count() - 1}")
    if parsed.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{key}: {name!r} requested but MPS is not available here; use --{key} cpu")
    return name


def resolve_devices(names: Sequence[str]) -> list[str]:
    """`resolve_device` of each name of a `devices` list; a bad one is a `ConfigError` naming it."""
    return [resolve_device(name, key="devices") for name in names]
