"""Training checkpoints: written atomically, read with `weights_only=True`, checked before use.

A checkpoint holds the policy, the optimizer, the normalizers, the RNG states, the round counter and
the resolved config (as JSON text), plus the policy's width. The policy's inputs and outputs do not
depend on the task or the host (`control/growth_policy.py`), so a checkpoint acts on any of them.

Format 5 is that transferable policy reading growth signals (each blueprint's measured signal in each empty
slot, `env/observation.py`) and the heuristic's advice (`control/advice.py`). Format 4 policies read no advice,
format 3 ones no growth signals either; checkpoints of formats 1 and 2 held a policy tied to one task and slot
layout. All are refused with one line saying so.

Integrity: `save_checkpoint` refuses a state holding NaN or infinity (a diverged policy is never written
as the latest checkpoint; the trainer undoes such an update before saving) and stores a SHA-256
`checksum` of everything else (`control/integrity.py`). `load_checkpoint` recomputes it and scans for
NaN/Inf again, so a damaged or tampered file is refused with one line naming it, by `train --resume`,
`eval` and `run --policy` alike. A full disk raises `DiskFullError` (see `morphogen.run_directory`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

from morphogen.control.integrity import checksum_matches, non_finite_entries, read_torch_file, write_checksummed
from morphogen.limits import MAX_HIDDEN_SIZE, MAX_ROUNDS, check_count
from morphogen.run_directory import CHECKPOINT_NAME

#: The checkpoint format written and read (`format_version` in the file).
FORMAT_VERSION = 5
#: Everything resuming (`PPOTrainer.load_state_dict`) or acting (`agent_from_checkpoint`) reads.
REQUIRED_KEYS = ("hidden_size", "round", "config", "policy", "optimizer", "observation_normalizer",
                 "reward_normalizer", "value_normalizer", "rng", "anomaly_detector", "telemetry",
                 "policy_rollbacks_in_a_row", "imitated")


#: The kind of each entry of `REQUIRED_KEYS` as `save_checkpoint` writes it (`load_checkpoint` refuses others).
REQUIRED_KINDS: dict[str, type] = {
    "hidden_size": int, "round": int, "config": str, "policy": dict, "optimizer": dict,
    "observation_normalizer": dict, "reward_normalizer": dict, "value_normalizer": dict, "rng": dict,
    "anomaly_detector": dict, "telemetry": dict, "policy_rollbacks_in_a_row": int, "imitated": bool}
assert set(REQUIRED_KINDS) == set(REQUIRED_KEYS), "every required entry has its kind"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used here: missing, truncated, or built for another layout."""


def checkpoint_path(run_or_file: str | Path) -> Path:
    """A run directory's checkpoint, or the file itself."""
    path = Path(run_or_file)
    return path / CHECKPOINT_NAME if path.is_dir() else path


def _list_entries(entries: list[str], limit: int = 3) -> str:
    more = f" and {len(entries) - limit} more" if len(entries) > limit else ""
    return ", ".join(entries[:limit]) + more


def _canonical(value: Any) -> Any:
    """A copy of the containers of `value` with every string interned, tensors shared.

    Pickle memoizes objects by identity, so the same contents pickle to different bytes when one state
    shares a string object where another holds two equal copies (a state restored from a checkpoint
    does). Rebuilding containers and interning strings makes equal states give equal files.
    """
    if isinstance(value, dict):
        return {_canonical(key): _canonical(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_canonical(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_canonical(item) for item in value)
    if isinstance(value, str):
        return sys.intern(value)
    return value


def save_checkpoint(state: dict[str, Any], path: str | Path) -> None:
    """Write `state` (checked finite, with its checksum) to `path` atomically.

    The bytes go to a temporary file in the same directory, are fsynced and renamed over `path`: a crash
    or an exception at any point leaves either the previous checkpoint or the new one, whole, and no
    temporary file (a SIGKILL inside the write can leave one; the next command on the run removes it).
    Raises `CheckpointError` for a state with NaN/Inf (the previous checkpoint stays the latest) and
    `DiskFullError` when the disk has no room. The file gets the permissions of the user's umask.
    """
    path = Path(path)
    bad = non_finite_entries(state)
    if bad:
        raise CheckpointError(f"refusing to save {path}: non-finite values in {_list_entries(bad)}; the previous "
                              "checkpoint stays the latest")
    write_checksummed(_canonical({"format_version": FORMAT_VERSION, **state}), path)


def load_checkpoint(run_or_file: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint (tensors and plain values only: `weights_only=True`), verify checksum and finiteness."""
    path = checkpoint_path(run_or_file)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path} (expected a run directory with {CHECKPOINT_NAME})")
    state = read_torch_file(path, what="checkpoint", error=CheckpointError, map_location=map_location)
    version = state.get("format_version") if isinstance(state, dict) else None
    if version in (1, 2):
        raise CheckpointError(f"checkpoint {path} is of format {version}, from an earlier morphogen whose policy was "
                              "tied to one task and slot layout; train a new one (morphogen train) or use "
                              "--policy default")
    if version in (3, 4):
        unread = "growth signals" if version == 3 else "advice from the heuristic"
        raise CheckpointError(f"checkpoint {path} is of format {version}, from an earlier morphogen whose policy read "
                              f"no {unread}; train a new one (morphogen train) or use --policy default")
    if not isinstance(state, dict) or version != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path} is not a morphogen checkpoint of format {FORMAT_VERSION}")
    if not checksum_matches(state):
        raise CheckpointError(f"checkpoint {path} is damaged: its contents do not match the checksum saved "
                              "with them (a disk or copy error?); use an intact copy of the run")
    missing = [key for key in REQUIRED_KEYS if key not in state]
    if missing:
        raise CheckpointError(f"checkpoint {path} lacks {', '.join(missing)}")
    _check_kinds(state, path)
    bad = non_finite_entries(state)
    if bad:
        raise CheckpointError(f"checkpoint {path} holds non-finite values in {_list_entries(bad)}; "
                              "it cannot be resumed or acted with")
    return state


def _check_kinds(state: dict[str, Any], path: Path) -> None:
    """`CheckpointError` unless every entry of `state` that is read is of the kind `save_checkpoint` writes: the
    file is untrusted (its checksum guards against damage, not against a file written by other code)."""
    wrong = [f"{key} is not {kind.__name__}" for key, kind in REQUIRED_KINDS.items()
             if not isinstance(state[key], kind) or (kind is int and isinstance(state[key], bool))]
    if not wrong:
        try:  # counts that size what is built (the policy's width) or where it goes on, before a width of millions
            check_count("hidden_size", state["hidden_size"], MAX_HIDDEN_SIZE)
            check_count("round", state["round"], MAX_ROUNDS, lower=0)
        except ValueError as error:
            wrong.append(str(error))
        try:
            config = json.loads(state["config"])
        except (json.JSONDecodeError, RecursionError):
            config = None
        if not isinstance(config, dict):
            wrong.append("config is not the JSON text of a config table")
    if wrong:
        raise CheckpointError(f"checkpoint {path} is not one morphogen wrote: {'; '.join(wrong)}")


def check_layout(state: dict[str, Any], expected: dict[str, Any], source: str | Path) -> None:
    """Raise `CheckpointError` naming the first layout field where `state` differs from `expected`."""
    for key, value in expected.items():
        saved = state.get(key)
        if isinstance(value, tuple):
            saved = tuple(saved) if isinstance(saved, (list, tuple)) else saved
        if saved != value:
            raise CheckpointError(
                f"checkpoint {source} was built for {key}={saved!r}, but this run has {key}={value!r}")
