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
events (a resumed run), it counts them first, so the steps continue where they stopped, and opens each
writer with `purge_step` at the step after the last one the events file holds: TensorBoard then hides the
points an earlier file wrote from that step on (the epochs a kill cut short, which the resumed run replays);
a run whose `tb` directory exists but of which the events file holds nothing (cut whole) purges from step 0.

Needs the optional `tensorboard` package: `pip install 'morphogen[tensorboard]'`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple, TypeGuard

from morphogen.run_directory import EVENTS_FILENAME, MAX_LINE_BYTES, open_regular_file, own_directory, read_line
from morphogen.telemetry.events import ALL_ENVS, EpisodeCompleted, Event

TRAINER_RUN = "trainer"
"""TensorBoard run (subdirectory of `tb`) of the events that are not about one env."""

FLUSH_SECONDS = 10
"""How often the writers flush to disk, so a live `tensorboard --logdir` sees recent points."""



def env_run_name(env_id: int) -> str:
    """The TensorBoard run (subdirectory of `tb`) an env's events are written to."""
    return TRAINER_RUN if env_id == ALL_ENVS else f"env{env_id}"


class LoggedSteps(NamedTuple):
    """What a run directory's events file already holds, counted as the sink counts steps."""

    epoch_offsets: dict[int, int]
    """Env id -> epochs of its completed episodes."""
    last_steps: dict[str, int]
    """TensorBoard run -> the last step an event of it was written at."""


def logged_steps(events_file: Path) -> LoggedSteps:
    """The steps the events in `events_file` (JSON lines) were written at; empty when there is none.

    A last line still being written, and a damaged line (the file may come from another machine), are skipped.
    """
    offsets: dict[int, int] = {}
    last: dict[str, int] = {}
    try:
        handle = open_regular_file(events_file)
    except OSError:
        return LoggedSteps(offsets, last)
    with handle:
        while (line := read_line(handle, MAX_LINE_BYTES)).complete:
            try:
                record = json.loads(line.text) if line.text is not None else None
            except (ValueError, RecursionError):
                continue
            written = _written_at(record, offsets)
            if written is None:
                continue
            env_id, step = written
            run = env_run_name(env_id)
            last[run] = max(last.get(run, 0), step)
            if isinstance(record, dict) and record.get("event") == EpisodeCompleted.kind and env_id != ALL_ENVS:
                offsets[env_id] = step  # the next episode's epochs continue from here
    return LoggedSteps(offsets, last)


def _written_at(record: object, offsets: dict[int, int]) -> tuple[int, int] | None:
    """(env id, step) the sink writes the event `record` (a parsed JSON line) at; None for a record of no env or
    step."""
    if not isinstance(record, dict):
        return None
    env_id, epoch, round_number = record.get("env_id"), record.get("epoch"), record.get("round")
    if not _is_count(env_id) and not (env_id == ALL_ENVS and isinstance(env_id, int) and not isinstance(env_id, bool)):
        return None
    if _is_count(round_number):
        return env_id, round_number
    return (env_id, offsets.get(env_id, 0) + epoch) if _is_count(epoch) else None


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
        logged = logged_steps(self.log_dir.parent / EVENTS_FILENAME)
        self._epoch_offsets = logged.epoch_offsets
        # A resumed run replays from the step after the last one its (cut) events file holds: TensorBoard hides the
        # points a run's earlier files hold from that step on, those of the epochs the kill cut short.
        self._purge_steps = {run: step + 1 for run, step in logged.last_steps.items()}

    def step_of(self, event: Event) -> int:
        """The TensorBoard step `event` is written at."""
        round_number = getattr(event, "round", None)
        if isinstance(round_number, int):
            return round_number
        return self._epoch_offsets.get(event.env_id, 0) + event.epoch

    def _writer(self, env_id: int) -> Any:
        run = env_run_name(env_id)
        if run not in self._writers:
            purge = self._purge_steps.get(run)
            if purge is None and (self.log_dir / run).is_dir():
                # Points of a run the events file no longer holds at all (cut whole: a run started again from
                # nothing, as `train --resume` of one that saved no checkpoint): hide them all.
                purge = 0
            directory = own_directory(self.log_dir / run)
            self._writers[run] = self._writer_class(log_dir=str(directory), flush_secs=FLUSH_SECONDS,
                                                    purge_step=purge)
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
