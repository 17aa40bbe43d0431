"""Reading a run directory as telemetry wrote it: events with their wall-clock times, read whole or tailed.

A run directory holds `config.json` (the resolved config), `events.jsonl` (one JSON object per event,
each with the sink's "time"), `summary.json` after a `run` finished, and `baseline/events.jsonl` (the
no-growth episode of a `run`). Readers here never import the model, env or controller, so they work on
a run copied from another machine, and on a run that is still being written: `EventTail` returns only
complete lines and picks up where it stopped.

A copied run directory is untrusted input. Every reader here is bounded and tolerant:

- a line that is not one event record (torn, not JSON, nested too deep, an unknown kind, a field of
  the wrong type, a "time" that is not a finite number) is skipped and counted (`skipped`), never
  fatal; the record is checked against the event's schema (`event_from_dict`), so what is returned is
  typed;
- a line longer than `MAX_LINE_BYTES` is skipped without being parsed, and at most `MAX_EVENTS`
  events are kept per file (the rest are counted as skipped), so memory stays below roughly
  `MAX_EVENTS` events plus one line whatever the file holds;
- `config.json` and `summary.json` over `MAX_JSON_BYTES`, unparsable or not an object read as
  missing (`unreadable` names them).

Rounds: events carry no round number of their own (only per-round events do), but the trainer writes
a `RoundCompleted` after the episodes of each round, so an event belongs to round 1 + the number of
`RoundCompleted` events before it (`round_of_events`). That holds across `--resume` too, because a
resumed run appends after the last completed round.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from morphogen.run_directory import BASELINE_DIRNAME, CONFIG_FILENAME, EVENTS_FILENAME, SUMMARY_FILENAME
from morphogen.telemetry.events import Event, RoundCompleted, event_from_dict

MAX_LINE_BYTES = 1_048_576
"""Longest events line read (1 MiB; the longest event telemetry writes is a few kB)."""
MAX_EVENTS = 2_000_000
"""Events kept per events file (a 100-round, 64-env training run writes about 200,000)."""
MAX_JSON_BYTES = 4_194_304
"""Largest `config.json` or `summary.json` read (4 MiB; telemetry writes a few kB)."""


class RunDirectoryError(ValueError):
    """A path that is not a readable morphogen run directory."""


@dataclass(frozen=True)
class TimedEvent:
    """An event and the wall-clock time (seconds since the epoch) its sink wrote it at."""

    time: float
    event: Event


def parse_line(line: str | bytes) -> TimedEvent:
    """One JSON line of `events.jsonl` as a `TimedEvent`; ValueError saying why if it is not one."""
    try:
        record = json.loads(line)
    except RecursionError:
        raise ValueError("nested too deep") from None
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    time = summary_number(record, "time")
    if time is None:
        raise ValueError("'time' is not a finite number")
    try:
        return TimedEvent(time, event_from_dict(record))
    except (TypeError, OverflowError, RecursionError) as error:  # an integer past float range, too deep
        raise ValueError(f"unreadable record: {type(error).__name__}") from None


class EventTail:
    """Reads the complete lines appended to an events file since the last call, skipping bad ones.

    A last line without its newline is a record still being written: it is left for the next call,
    unless `final` (a finished run), where it is skipped. A file that does not exist yet reads as
    empty (a run that has not written its first event). `skipped` counts the lines that were not
    events, and the events past `MAX_EVENTS`.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.skipped = 0
        self._offset = 0
        self._kept = 0

    def read_new(self, final: bool = False) -> list[TimedEvent]:
        """The events of every complete line added since the previous call, in order."""
        if not self.path.is_file():
            return []
        events = []
        with self.path.open("rb") as file:
            file.seek(self._offset)
            while line := self._next_line(file, final):
                if line is _TOO_LONG:
                    self.skipped += 1
                    continue
                event = self._parse(line)
                if event is not None:
                    events.append(event)
        return events

    def _next_line(self, file: Any, final: bool) -> bytes | None:
        """The next whole line (`_TOO_LONG` for one past the limit, skipped to its end), None at the end."""
        line = file.readline(MAX_LINE_BYTES + 1)
        if line.endswith(b"\n"):
            self._offset += len(line)
            return bytes(line)
        if len(line) <= MAX_LINE_BYTES:  # the end of the file: nothing, or a line still being written
            if line and final:
                self._offset += len(line)
                self.skipped += 1
            return None
        consumed = len(line)
        while not line.endswith(b"\n"):
            line = file.readline(MAX_LINE_BYTES)
            if not line:
                return None  # the long line is still being written: read it again when it has its end
            consumed += len(line)
        self._offset += consumed
        return _TOO_LONG

    def _parse(self, line: bytes) -> TimedEvent | None:
        if not line.strip():
            return None
        try:
            event = parse_line(line)
        except ValueError:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
            self.skipped += 1
            return None
        if self._kept >= MAX_EVENTS:
            self.skipped += 1
            return None
        self._kept += 1
        return event


_TOO_LONG = b"\0too long\0"
"""What `EventTail._next_line` returns for a line past `MAX_LINE_BYTES` (never a real line: no newline)."""


@dataclass
class RunFiles:
    """What a run directory holds, read once; `skipped` lines of its events files were not events, and
    the files named in `unreadable` were damaged and read as missing."""

    path: Path
    config: dict[str, Any]
    events: list[TimedEvent]
    baseline_events: list[TimedEvent] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    skipped: int = 0
    unreadable: tuple[str, ...] = ()

    @property
    def history(self) -> list[Event]:
        return [timed.event for timed in self.events]

    @property
    def is_training(self) -> bool:
        """Whether this is a `morphogen train` run (its config has rounds, or it wrote rounds)."""
        return "rounds" in self.config or any(isinstance(t.event, RoundCompleted) for t in self.events)

    def damage_note(self) -> str | None:
        """One line saying what was skipped or unreadable, or None for an intact run."""
        parts = [f"{self.skipped:,} line{'s' if self.skipped != 1 else ''} skipped"] if self.skipped else []
        parts += [f"{name} unreadable" for name in self.unreadable]
        return ", ".join(parts) or None


def read_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`; None if it is missing, too large, unparsable or not an object."""
    try:
        with path.open("rb") as file:
            text = file.read(MAX_JSON_BYTES + 1)
        if len(text) > MAX_JSON_BYTES:
            return None
        value = json.loads(text)
    except (OSError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def summary_number(table: object, key: str) -> float | None:
    """`table[key]` if `table` is a dict holding a finite number there (summary.json is untrusted), else None."""
    value = table.get(key) if isinstance(table, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer past the float range
        return None
    return number if math.isfinite(number) else None


def check_run_dir(run_dir: str | Path) -> Path:
    """`run_dir` as a Path if it is a directory with an events file; else `RunDirectoryError` saying why."""
    path = Path(run_dir)
    if not path.is_dir():
        raise RunDirectoryError(f"{path} is not a directory (expected a run directory under runs/)")
    if not (path / EVENTS_FILENAME).is_file():
        raise RunDirectoryError(f"{path} has no {EVENTS_FILENAME} (was the run made with --telemetry off?)")
    return path


def load_run_files(run_dir: str | Path) -> RunFiles:
    """Config, events (with times), baseline events and summary of a run directory, skipping damage."""
    path = check_run_dir(run_dir)
    events, baseline = EventTail(path / EVENTS_FILENAME), EventTail(path / BASELINE_DIRNAME / EVENTS_FILENAME)
    try:
        timed, baseline_timed = events.read_new(final=True), baseline.read_new(final=True)
    except OSError as error:
        raise RunDirectoryError(f"{path}: cannot read its events: {error.strerror or error}") from None
    objects = {name: read_json_object(path / name) for name in (CONFIG_FILENAME, SUMMARY_FILENAME)}
    unreadable = tuple(name for name, value in objects.items() if value is None and (path / name).exists())
    return RunFiles(path=path, config=objects[CONFIG_FILENAME] or {}, events=timed, baseline_events=baseline_timed,
                    summary=objects[SUMMARY_FILENAME], skipped=events.skipped + baseline.skipped,
                    unreadable=unreadable)


def round_of_events(history: Iterable[Event]) -> Iterator[tuple[int, Event]]:
    """(round, event) for every event: 1 + the rounds completed before it (see the module docstring).

    A `RoundCompleted` itself, and the other per-round events, belong to the round they report.
    """
    completed = 0
    for event in history:
        reported = getattr(event, "round", None)
        yield (reported if isinstance(reported, int) else completed + 1), event
        if isinstance(event, RoundCompleted):
            completed = event.round


def config_value(config: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
    """`config["a"]["b"]` for "a.b", or `default` when a key is missing."""
    value: Any = config
    for key in dotted.split("."):
        if not isinstance(value, Mapping) or key not in value:
            return default
        value = value[key]
    return value


def task_label(config: Mapping[str, Any]) -> str | None:
    """The task a run's config names for people: its own name (`task_name`, which a user's task carries)
    before the name or import path it was loaded by (`task`); None when neither is a string."""
    for key in ("task_name", "task"):
        value = config.get(key)
        if isinstance(value, str) and value:
            return value
    return None
