"""A sink writing every event's scalars to TensorBoard, under the same names as the JSON lines.

Runs: each env writes into its own TensorBoard run, `tb/env<N>`, and events that are not about one env
(PPO updates, rounds, trainer-wide anomalies) into `tb/trainer`. The tag names are the shared metric
names in every run, so TensorBoard overlays the envs on one chart per metric instead of mixing several
envs' points at the same step of one curve (which it shows as a zigzag and thins out).

Steps: events with a `round` field (PPO updates, rounds) are written at step `round`. Every other
event is written at the env's cumulative epoch: its `epoch` plus the epochs of that env's earlier
episodes (counted from its `EpisodeCompleted` events), so curves keep growing across the episodes
of a training run instead of restarting at 1. In a single `morphogen run` that is simply the epoch.
When the sink opens a `tb` directory inside a run directory whose `events.jsonl` already holds
episodes (a resumed training run), it counts them first, so the steps continue where they stopped.

Needs the optional `tensorboard` package: `pip install 'morphogen[tensorboard]'`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeGuard

from morphogen.run_directory import EVENTS_FILENAME, MAX_LINE_BYTES, open_regular_file, own_directory, read_line
from morphogen.telemetry.events import ALL_ENVS, EpisodeCompleted, Event

TRAINER_RUN = "trainer"
"""TensorBoard run (subdirectory of `tb`) of the events that are not about one env."""

FLUSH_SECONDS = 10
"""How often the writers flush to disk, so a live `tensorboard --logdir` sees recent points."""



def env_run_name(env_id: int) -> str:
    """The TensorBoard run (subdirectory of `tb`) an env's events are written to."""
    return TRAINER_RUN if env_id == ALL_ENVS else f"env{env_id}"


def completed_epochs(events_file: Path) -> dict[int, int]:
    """Env id -> epochs of its episodes completed in `events_file` (JSON lines); {} when there is none.

    Only `episode_completed` records are read; a last line still being written, and a damaged line
    (the file may come from another machine), are skipped.
    """
    try:
        handle = open_regular_file(events_file)
    except OSError:
        return {}
    offsets: dict[int, int] = {}
    kind = f'"{EpisodeCompleted.kind}"'.encode()
    with handle:
        while (line := read_line(handle, MAX_LINE_BYTES)).complete:
            if line.text is None or kind not in line.text:
                continue
            try:
                record = json.loads(line.text)
            except (ValueError, RecursionError):
                continue
            if not isinstance(record, dict) or record.get("event") != EpisodeCompleted.kind:
                continue
            env_id, epoch = record.get("env_id"), record.get("epoch")
            if _is_count(env_id) and _is_count(epoch):
                offsets[env_id] = offsets.get(env_id, 0) + epoch
    return offsets


def _is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


class TensorBoardSink:
    """Writes `event.scalars()` with `SummaryWriter.add_scalar`, one writer per env (see module docstring)."""

    def __init__(self, log_dir: Path | str) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as error:
            raise ImportError(
                "TensorBoard logging needs the tensorboard package: pip install 'morphogen[tensorboard]' "
                "(or run without --tensorboard)"
            ) from error
        self.log_dir = own_directory(log_dir)  # never through a link planted in a copied run
        self._writer_class: Any = SummaryWriter
        self._writers: dict[str, Any] = {}
        self._epoch_offsets = completed_epochs(self.log_dir.parent / EVENTS_FILENAME)

    def step_of(self, event: Event) -> int:
        """The TensorBoard step `event` is written at."""
        round_number = getattr(event, "round", None)
        if isinstance(round_number, int):
            return round_number
        return self._epoch_offsets.get(event.env_id, 0) + event.epoch

    def _writer(self, env_id: int) -> Any:
        run = env_run_name(env_id)
        if run not in self._writers:
            directory = own_directory(self.log_dir / run)
            self._writers[run] = self._writer_class(log_dir=str(directory), flush_secs=FLUSH_SECONDS)
        return self._writers[run]

    def write(self, event: Event) -> None:
        """Add each scalar of `event` at its step; an `EpisodeCompleted` then advances its env's offset."""
        scalars = event.scalars()
        step = self.step_of(event)
        if scalars:
            writer = self._writer(event.env_id)
            for name, value in scalars.items():
                writer.add_scalar(name, value, step)
        if isinstance(event, EpisodeCompleted):
            self._epoch_offsets[event.env_id] = step

    def close(self) -> None:
        """Flush and close every run's event file; closing twice is harmless."""
        for writer in self._writers.values():
            writer.close()

    def __repr__(self) -> str:
        return f"TensorBoardSink({str(self.log_dir)!r})"
