"""Training checkpoints: written atomically, read with `weights_only=True`, checked before use.

A checkpoint holds the policy, the optimizer, the normalizers, the RNG states, the round counter and
the resolved config (as JSON text), plus the layout it was built for (task, slot ids, observation and
action sizes, episode length) so that a mismatched checkpoint is refused with a clear message
before anything of a run is overwritten.
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path
from typing import Any

import torch

CHECKPOINT_NAME = "checkpoint.pt"
FORMAT_VERSION = 1
LAYOUT_KEYS = ("task", "slot_ids", "observation_size", "action_sizes", "hidden_size")
#: Everything resuming (`PPOTrainer.load_state_dict`) or acting (`agent_from_checkpoint`) reads.
REQUIRED_KEYS = (*LAYOUT_KEYS, "episode_length", "round", "config", "policy", "optimizer",
                 "observation_normalizer", "reward_normalizer", "value_normalizer", "rng")
_TERMINAL_ESCAPES = re.compile(r"\x1b\[[0-9;]*m")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used here: missing, truncated, or built for another layout."""


def checkpoint_path(run_or_file: str | Path) -> Path:
    """A run directory's checkpoint, or the file itself."""
    path = Path(run_or_file)
    return path / CHECKPOINT_NAME if path.is_dir() else path


def save_checkpoint(state: dict[str, Any], path: str | Path) -> None:
    """Write `state` to `path` atomically: temporary file in the same directory, fsync, rename, fsync dir.

    A crash or an exception at any point leaves either the previous checkpoint or the new one, whole,
    and no temporary file. The file gets the permissions of the user's umask, like the run's other files.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with temporary.open("xb") as handle:
            torch.save({"format_version": FORMAT_VERSION, **state}, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
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
    except Exception as error:  # torch.load raises many types on bad bytes; all mean "not a usable file"
        raise CheckpointError(_load_failure(path, error)) from None
    if not isinstance(state, dict) or state.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path} is not a morphogen checkpoint of format {FORMAT_VERSION}")
    missing = [key for key in REQUIRED_KEYS if key not in state]
    if missing:
        raise CheckpointError(f"checkpoint {path} lacks {', '.join(missing)}")
    return state


def _load_failure(path: Path, error: Exception) -> str:
    """One line saying why `torch.load` could not read `path` (torch's own messages span many lines)."""
    text = _TERMINAL_ESCAPES.sub("", str(error))
    refused = re.search(r"Unsupported global: GLOBAL (\S+)", text)
    if refused:
        return (f"checkpoint {path} was refused: it holds a {refused.group(1)} object, but a checkpoint holds only "
                "tensors and plain values (loading other objects could run code)")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if "WeightsUnpickler error" in text or isinstance(error, KeyError) or not lines:
        detail = "not a file written by torch.save"
    else:
        detail = lines[0].split(". ")[0].rstrip(".")  # torch's first sentence says what failed
    return f"checkpoint {path} is unreadable (truncated or corrupt?): {detail}"


def check_layout(state: dict[str, Any], expected: dict[str, Any], source: str | Path) -> None:
    """Raise `CheckpointError` naming the first layout field where `state` differs from `expected`."""
    for key, value in expected.items():
        saved = state.get(key)
        if isinstance(value, tuple):
            saved = tuple(saved) if isinstance(saved, (list, tuple)) else saved
        if saved != value:
            raise CheckpointError(
                f"checkpoint {source} was built for {key}={saved!r}, but this run has {key}={value!r}")
