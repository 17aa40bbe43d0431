"""What `morphogen run --resume` goes on from: each training of a run (grown, no growth, from scratch) saved after
every epoch into its own directory's `resume.pt`; and the file both share with `morphogen eval --resume`
(`write_resume_state`, `read_resume_state`, `cut_events`), which saves after every episode.

A training's file holds where its episode stands (`env.play.play_state`: the model, the seeds' optimizers, the
controller's memory, torch's global generator, the seconds played), the run's config as JSON text (a resumed run
must be the same run), which controller played it and how many bytes of the training's `events.jsonl` had been
written. Resuming cuts `events.jsonl` back to that size, so that the epoch replayed after a kill is not counted
twice and a line torn by the kill is gone. Files are written atomically and read with `weights_only=True`, with a
checksum: a damaged or foreign file is refused in one line. The files go once the run has written its summary
and model.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_map_only

from morphogen.control.checkpoint import CheckpointError
from morphogen.control.integrity import checksum_matches, read_torch_file, write_checksummed
from morphogen.run_directory import RESUME_FILENAME, truncate_file

#: The version of what `write_resume_state` writes; a file of another is refused.
RUN_STATE_FORMAT = 1
_REQUIRED_KEYS = ("controller_name", "episode", "controller", "torch_rng", "seconds", "telemetry", "timer",
                  "detector")


def write_resume_state(path: Path, state: dict[str, Any], *, kind: str, config: str, events: Path | None) -> None:
    """Write `state` to `path` (atomically, with a checksum) as a resume state of `kind`, with the `config` text of
    the command that saved it and the size of its `events` file (None: it writes none)."""
    payload: dict[str, Any] = {
        "format": RUN_STATE_FORMAT, "kind": kind, "config": config,
        "events_bytes": events.stat().st_size if events is not None and events.is_file() else 0, **state}
    # One copy of a GPU model's tensors to the host, which the checksum and torch.save then both read (each would
    # copy them again); on the CPU `.cpu()` returns the tensor itself.
    payload = tree_map_only(torch.Tensor, lambda tensor: tensor.detach().cpu(), payload)
    write_checksummed(payload, path)


def read_resume_state(path: Path, *, kind: str, config: str, required: tuple[str, ...]) -> dict[str, Any] | None:
    """The resume state of `kind` saved at `path` (None when there is none), checked: a regular file, its format,
    kind and checksum, the `required` keys, and that it was saved by the same command (`config` text)."""
    if not os.path.lexists(path):
        return None
    if path.is_symlink() or not path.is_file():
        raise CheckpointError(f"{path} is not a regular file; morphogen writes its resume state as one")
    state = read_torch_file(path, what="resume state", error=CheckpointError)
    if not isinstance(state, dict) or state.get("format") != RUN_STATE_FORMAT or state.get("kind") != kind:
        raise CheckpointError(f"{path} is not the resume state of a morphogen {kind} of format {RUN_STATE_FORMAT}")
    if not checksum_matches(state):
        raise CheckpointError(f"{path} is damaged: its contents do not match the checksum saved with them")
    missing = [key for key in ("config", "events_bytes", *required) if key not in state]
    if missing:
        raise CheckpointError(f"{path} lacks {', '.join(missing)}")
    if state["config"] != config:
        raise CheckpointError(f"{path} was saved with another config than the one resuming it (was config.json "
                              "changed?); a resumed command keeps the config it started with")
    return state


def save_training_state(directory: Path, state: dict[str, Any], *, config: str, controller: str,
                        events: Path | None) -> None:
    """Write `directory/resume.pt`: `state` (an `env.play.play_state`) with the run's `config` text, the
    `controller`'s name and the size of `events` (None: the training writes none)."""
    write_resume_state(directory / RESUME_FILENAME, {"controller_name": controller, **state}, kind="run",
                       config=config, events=events)


def load_training_state(directory: Path, *, config: str, controller: str) -> dict[str, Any] | None:
    """The state saved in `directory/resume.pt` (None when there is none), checked: its format and checksum, and
    that it was saved by the same run (`config` text) played by the same `controller`."""
    path = directory / RESUME_FILENAME
    state = read_resume_state(path, kind="run", config=config, required=_REQUIRED_KEYS)
    if state is None:
        return None
    _check_kinds(state, path)
    if state["controller_name"] != controller:
        raise CheckpointError(f"{path} was played by the {state['controller_name']} controller, not the {controller}: "
                              + ("resume it with the same --policy (grow: policy=...)" if state["controller_name"] ==
                                 "policy" else "resume it without --policy (grow: without policy=...)"))
    return state


def _check_kinds(state: dict[str, Any], path: Path) -> None:
    """`CheckpointError` unless the generator, episode and seconds of `state` are of their kinds."""
    generator, seconds = state["torch_rng"], state["seconds"]
    if not (isinstance(generator, torch.Tensor) and generator.dtype == torch.uint8 and generator.dim() == 1) or \
            not isinstance(state["episode"], dict) or not isinstance(seconds, float) or not seconds >= 0.0:
        raise CheckpointError(f"{path} is not the resume state of a morphogen run: its generator, episode or seconds "
                              "are of the wrong kind")


def cut_events(events: Path, state: dict[str, Any] | None) -> int:
    """Cut `events` back to what had been written when `state` was saved (to nothing without a state: the command
    then starts over); returns the bytes removed. A file shorter than the state saw is refused."""
    saved = 0 if state is None else state["events_bytes"]
    if not isinstance(saved, int) or saved < 0:
        raise CheckpointError(f"a resume state of {events.parent} gives no valid events size")
    if not events.is_file():
        if saved:
            raise CheckpointError(f"{events} is missing; the resume state saw {saved:,} bytes of it")
        return 0
    size = events.stat().st_size
    if size < saved:
        raise CheckpointError(f"{events} holds {size:,} bytes, fewer than the {saved:,} its resume state saw; "
                              "it was changed since")
    if size > saved:
        truncate_file(events, saved)  # never through a symbolic link
    return size - saved


def remove_resume_state(path: Path) -> None:
    """Remove the resume state at `path` (a finished command does not need it); a missing one is fine."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
