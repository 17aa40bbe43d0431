"""Where events go: sinks, the `Telemetry` hub that filters by level, and a reader for JSON lines.

Rules (DESIGN §9.9): a sink that fails with OSError, TypeError or ValueError never stops training.
The hub logs the first failure of each sink with its traceback, counts the rest, and reports the
count when it closes. Any other exception is a bug and propagates.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Protocol, runtime_checkable

from morphogen.telemetry.events import LEVELS, Event, event_from_dict

logger = logging.getLogger(__name__)

EVENTS_FILENAME = "events.jsonl"
"""Name of the JSON lines file the hub writes in a run directory."""

_SINK_ERRORS = (OSError, TypeError, ValueError)


@runtime_checkable
class Sink(Protocol):
    """Anything that can record events and be closed."""

    def write(self, event: Event) -> None: ...

    def close(self) -> None: ...


class JsonLinesSink:
    """Appends one JSON object per event to a file, flushed after every line.

    Each record is `event.to_dict()` with a "time" key (wall-clock seconds since the epoch) first.
    The parent directory is created if missing.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] = self.path.open("a", encoding="utf-8")

    def write(self, event: Event) -> None:
        """Write `event` as one line and flush, so readers (the live dashboard) see it at once."""
        record = {"time": time.time(), **event.to_dict()}
        # One write call per line keeps a concurrent reader from seeing half a record, except the last.
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        """Close the file; closing twice is harmless."""
        self._file.close()

    def __repr__(self) -> str:
        return f"JsonLinesSink({str(self.path)!r})"


class Telemetry:
    """Filters events by level and fans them out to sinks; a failing sink never stops training.

    Levels: `off` writes nothing, `minimal` writes only events whose `min_level` is "minimal"
    (EpochCompleted, EpisodeCompleted, GovernorRollback), `normal` and `debug` write every event
    (debug-only events, when they exist, set `min_level = "debug"`).
    With `run_dir` and no `sinks`, events go to `run_dir/events.jsonl`; given `sinks`, only to them.
    """

    def __init__(
        self, run_dir: Path | str | None, *, level: str = "normal", sinks: Sequence[Sink] | None = None
    ) -> None:
        if level not in LEVELS:
            raise ValueError(f"telemetry level must be one of {', '.join(LEVELS)}; got {level!r}")
        self._level = level
        self._closed = False
        self.run_dir = None if run_dir is None else Path(run_dir)
        self._sinks: list[Sink]
        if sinks is not None:
            self._sinks = list(sinks)
        elif self.run_dir is not None and level != "off":
            self._sinks = [JsonLinesSink(self.run_dir / EVENTS_FILENAME)]
        else:
            self._sinks = []
        self._failures = [0] * len(self._sinks)

    @property
    def level(self) -> str:
        """The current telemetry level (one of LEVELS)."""
        return self._level

    @property
    def sinks(self) -> tuple[Sink, ...]:
        """The sinks events are written to."""
        return tuple(self._sinks)

    def enabled(self, event_type: type[Event]) -> bool:
        """Whether events of this type are written at the current level; lets callers skip building them."""
        return LEVELS.index(self._level) >= LEVELS.index(event_type.min_level)

    def emit(self, event: Event) -> None:
        """Write `event` to every sink if its level is enabled; sink failures are logged, not raised."""
        if self._closed:
            raise RuntimeError(f"Telemetry was closed; cannot emit {event.kind} (emit before close())")
        if not self.enabled(type(event)):
            return
        for index, sink in enumerate(self._sinks):
            try:
                sink.write(event)
            except _SINK_ERRORS:
                self._record_failure(index, f"failed to write a {event.kind} event")

    def close(self) -> None:
        """Close every sink (failures are logged) and report sinks that failed; idempotent."""
        if self._closed:
            return
        self._closed = True
        for index, sink in enumerate(self._sinks):
            try:
                sink.close()
            except _SINK_ERRORS:
                self._record_failure(index, "failed to close")
            if self._failures[index] > 1:
                logger.warning("telemetry sink %r failed %d times in this run", sink, self._failures[index])

    def _record_failure(self, index: int, what: str) -> None:
        """Log the first failure of a sink with its traceback (call from an except block); count the rest."""
        self._failures[index] += 1
        if self._failures[index] == 1:
            logger.exception(
                "telemetry sink %r %s; training continues, later failures of this sink are only counted",
                self._sinks[index],
                what,
            )

    def __enter__(self) -> Telemetry:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def read_events(path: Path | str) -> list[Event]:
    """Every event in a JSON lines file, in order.

    A last line without its newline is a record still being written and is skipped; any other line
    that does not parse raises ValueError with its line number.
    """
    text = Path(path).read_text(encoding="utf-8")
    lines = text.split("\n")
    # After split, the final element is "" for a complete file, or a partial record mid-write.
    events = []
    for number, line in enumerate(lines[:-1], start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError(f"expected a JSON object, got {type(record).__name__}")
            events.append(event_from_dict(record))
        except ValueError as error:  # json.JSONDecodeError is a ValueError
            raise ValueError(f"{path}:{number}: {error}") from error
    return events
