"""Reading a run directory as telemetry wrote it: events with their wall-clock times, read whole or tailed.

A run directory holds `config.json` (the resolved config), `events.jsonl` (one JSON object per event,
each with the sink's "time"), `summary.json` after a `run` finished, and `baseline/events.jsonl` (the
no-growth episode of a `run`). Readers here never import the model, env or controller, so they work on
a run copied from another machine, and on a run that is still being written: `EventTail` returns only
complete lines and picks up where it stopped.

Rounds: events carry no round number of their own (only per-round events do), but the trainer writes
a `RoundCompleted` after the episodes of each round, so an event belongs to round 1 + the number of
`RoundCompleted` events before it (`round_of_events`). That holds across `--resume` too, because a
resumed run appends after the last completed round.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from morphogen.run_directory import BASELINE_DIRNAME, CONFIG_FILENAME, EVENTS_FILENAME, SUMMARY_FILENAME
from morphogen.telemetry.events import Event, RoundCompleted, event_from_dict


class RunDirectoryError(ValueError):
    """A path that is not a readable morphogen run directory."""


@dataclass(frozen=True)
class TimedEvent:
    """An event and the wall-clock time (seconds since the epoch) its sink wrote it at."""

    time: float
    event: Event


def parse_line(line: str, where: str) -> TimedEvent:
    """One JSON line of `events.jsonl` as a `TimedEvent`; ValueError naming `where` if it is not one."""
    try:
        record = json.loads(line)
        if not isinstance(record, dict):
            raise ValueError(f"expected a JSON object, got {type(record).__name__}")
        return TimedEvent(float(record.get("time", 0.0)), event_from_dict(record))
    except ValueError as error:  # json.JSONDecodeError is a ValueError
        raise ValueError(f"{where}: {error}") from error


class EventTail:
    """Reads the complete lines appended to an events file since the last call.

    A last line without its newline is a record still being written: it is left for the next call.
    A file that does not exist yet reads as empty (a run that has not written its first event).
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._offset = 0
        self._line_number = 0

    def read_new(self) -> list[TimedEvent]:
        """The events of every complete line added since the previous call, in order."""
        if not self.path.is_file():
            return []
        with self.path.open("rb") as file:
            file.seek(self._offset)
            chunk = file.read()
        end = chunk.rfind(b"\n") + 1
        if end == 0:
            return []
        self._offset += end
        events = []
        for line in chunk[:end].decode("utf-8").split("\n")[:-1]:
            self._line_number += 1
            if line.strip():
                events.append(parse_line(line, f"{self.path}:{self._line_number}"))
        return events


def read_timed_events(path: Path | str) -> list[TimedEvent]:
    """Every complete event of an events file with its time (empty when the file does not exist)."""
    return EventTail(path).read_new()


@dataclass
class RunFiles:
    """What a run directory holds, read once."""

    path: Path
    config: dict[str, Any]
    events: list[TimedEvent]
    baseline_events: list[TimedEvent] = field(default_factory=list)
    summary: dict[str, Any] | None = None

    @property
    def history(self) -> list[Event]:
        return [timed.event for timed in self.events]

    @property
    def is_training(self) -> bool:
        """Whether this is a `morphogen train` run (its config has rounds, or it wrote rounds)."""
        return "rounds" in self.config or any(isinstance(t.event, RoundCompleted) for t in self.events)


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    value = json.loads(path.read_text(encoding="utf-8"))
    return value if isinstance(value, dict) else None


def check_run_dir(run_dir: str | Path) -> Path:
    """`run_dir` as a Path if it is a directory with an events file; else `RunDirectoryError` saying why."""
    path = Path(run_dir)
    if not path.is_dir():
        raise RunDirectoryError(f"{path} is not a directory (expected a run directory under runs/)")
    if not (path / EVENTS_FILENAME).is_file():
        raise RunDirectoryError(f"{path} has no {EVENTS_FILENAME} (was the run made with --telemetry off?)")
    return path


def load_run_files(run_dir: str | Path) -> RunFiles:
    """Config, events (with times), baseline events and summary of a run directory."""
    path = check_run_dir(run_dir)
    try:
        return RunFiles(
            path=path,
            config=_read_json(path / CONFIG_FILENAME) or {},
            events=read_timed_events(path / EVENTS_FILENAME),
            baseline_events=read_timed_events(path / BASELINE_DIRNAME / EVENTS_FILENAME),
            summary=_read_json(path / SUMMARY_FILENAME),
        )
    except (ValueError, OSError) as error:
        raise RunDirectoryError(f"{path}: {str(error).splitlines()[0]}") from None


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
