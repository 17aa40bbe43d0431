"""Training checkpoints: written atomically, read with `weights_only=True`, checked before use.

A checkpoint holds the policy, the optimizer, the normalizers, the RNG states, the round counter and
the resolved config (as JSON text), plus the layout it was built for (task, slot ids, observation and
action sizes, episode length) so that a mismatched checkpoint is refused with a clear message
before anything of a run is overwritten.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch

CHECKPOINT_NAME = "checkpoint.pt"
FORMAT_VERSION = 1
LAYOUT_KEYS = ("task", "slot_ids", "observation_size", "action_sizes", "hidden_size")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used here: missing, truncated, or built for another layout."""


def checkpoint_path(run_or_file: str | Path) -> Path:
    """A run directory's checkpoint, or the file itself."""
    path = Path(run_or_file)
    return path / CHECKPOINT_NAME if path.is_dir() else path


def save_checkpoint(state: dict[str, Any], path: str | Path) -> None:
    """Write `state` to `path` atomically: temporary file in the same directory, fsync, rename, fsync dir."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            torch.save({"format_version": FORMAT_VERSION, **state}, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def load_checkpoint(run_or_file: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint (tensors and plain values only: `weights_only=True`)."""
    path = checkpoint_path(run_or_file)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path} (expected a run directory with {CHECKPOINT_NAME})")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError, zipfile.BadZipFile) as error:
        detail = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise CheckpointError(f"checkpoint {path} is unreadable (truncated or corrupt?): {detail}") from None
    if not isinstance(state, dict) or state.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path} is not a morphogen checkpoint of format {FORMAT_VERSION}")
    missing = [key for key in (*LAYOUT_KEYS, "policy", "round", "config") if key not in state]
    if missing:
        raise CheckpointError(f"checkpoint {path} lacks {', '.join(missing)}")
    return state


def check_layout(state: dict[str, Any], expected: dict[str, Any], source: str | Path) -> None:
    """Raise `CheckpointError` naming the first layout field where `state` differs from `expected`."""
    for key, value in expected.items():
        saved = state.get(key)
        if isinstance(value, tuple):
            saved = tuple(saved) if isinstance(saved, (list, tuple)) else saved
        if saved != value:
            raise CheckpointError(
                f"checkpoint {source} was built for {key}={saved!r}, but this run has {key}={value!r}")
