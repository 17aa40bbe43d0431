"""Where events go: sinks, the `Telemetry` hub that filters by level, and a reader for JSON lines.

Rules (docs/architecture.md#telemetry): a sink that fails with OSError, TypeError or ValueError never stops training.
The hub logs the first failure of each sink with its traceback (a full disk: one line without it),
counts the rest, and reports the count when it closes. Any other exception is a bug and propagates.

The hub filters by the *effective* level: the configured one, raised to debug for
`escalation_epochs` epochs after `report_anomalies()` (see `escalation.py`). Callers drive the
escalation clock with `end_epoch()` once per epoch (once per vector step when envs run in lockstep).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

from morphogen.run_directory import (
    EVENTS_FILENAME,
    MAX_LINE_BYTES,
    STORAGE_EXHAUSTED,
    TENSORBOARD_DIRNAME,
    append_line,
    open_for_append,
    open_regular_file,
    read_line,
)
from morphogen.telemetry.anomalies import Anomaly
from morphogen.telemetry.config import TelemetryConfig
from morphogen.telemetry.escalation import TelemetryLevelController
from morphogen.telemetry.events import ALL_ENVS, LEVELS, AnomalyDetected, Event, LayerStatistics, event_from_dict
from morphogen.telemetry.tensorboard import TensorBoardSink

logger = logging.getLogger(__name__)

_SINK_ERRORS = (OSError, TypeError, ValueError)


@runtime_checkable
class Sink(Protocol):
    """Anything that can record events and be closed."""

    def write(self, event: Event) -> None: ...

    def close(self) -> None: ...


class JsonLinesSink:
    """Appends one JSON object per event to a file, each line with one unbuffered write.

    Each record is `event.to_dict()` with a "time" key (wall-clock seconds since the epoch) first.
    The parent directory is created if missing. A line that cannot be written whole (a full disk) is
    undone and raises OSError: the file never ends in a torn fragment, and nothing that failed is kept
    in memory to be written later, out of order.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._descriptor: int | None = open_for_append(self.path)  # never through a symbolic link

    def write(self, event: Event) -> None:
        """Write `event` as one line, at once visible to readers (the live dashboard)."""
        if self._descriptor is None:
            raise ValueError(f"{self!r} is closed")
        record = {"time": time.time(), **event.to_dict()}
        # allow_nan=False: records are strict JSON (to_dict already wrote non-finite floats as tokens).
        append_line(self._descriptor, (json.dumps(record, allow_nan=False) + "\n").encode("utf-8"))

    def close(self) -> None:
        """Close the file; closing twice is harmless."""
        if self._descriptor is not None:
            descriptor, self._descriptor = self._descriptor, None
            os.close(descriptor)

    def __repr__(self) -> str:
        return f"JsonLinesSink({str(self.path)!r})"


class MemorySink:
    """Keeps events in a list (for notebooks, tests and callers that read a run while it goes)."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.closed = False

    def write(self, event: Event) -> None:
        self.events.append(event)

    def close(self) -> None:
        self.closed = True


class Telemetry:
    """Filters events by level and fans them out to sinks; a failing sink never stops training.

    Levels: `off` writes nothing, `minimal` writes only events whose `min_level` is "minimal"
    (epoch and episode summaries, rollbacks, rounds, anomalies, level changes), `normal` adds every
    other event except the debug-only ones (`min_level = "debug"`), which `debug` adds.
    Give either `level` (other settings default) or a whole `config`, not both.
    With `run_dir` and no `sinks`, events go to `run_dir/events.jsonl`; given `sinks`, only to them.
    `config.tensorboard` adds a `TensorBoardSink` writing to `run_dir/tb` in both cases.
    """

    def __init__(
        self,
        run_dir: Path | str | None,
        *,
        level: str | None = None,
        config: TelemetryConfig | None = None,
        sinks: Sequence[Sink] | None = None,
    ) -> None:
        if level is not None and config is not None:
            raise ValueError("give the telemetry level either as `level` or inside `config`, not both")
        if config is None:
            config = TelemetryConfig() if level is None else TelemetryConfig(level=level)
        self.config = config
        self._levels = TelemetryLevelController(config.level, config.escalation_epochs)
        self._closed = False
        self.run_dir = None if run_dir is None else Path(run_dir)
        tensorboard = config.tensorboard and config.level != "off"
        if tensorboard and self.run_dir is None:
            raise ValueError("TensorBoard logging writes into RUN_DIR/tb: give a run_dir, or set tensorboard=False")
        self._sinks = self._default_sinks() if sinks is None else list(sinks)
        if tensorboard:
            assert self.run_dir is not None
            try:
                self._sinks.append(TensorBoardSink(self.run_dir / TENSORBOARD_DIRNAME))
            except BaseException:
                for sink in self._sinks if sinks is None else ():  # the events file opened above
                    sink.close()
                raise
        self._failures = [0] * len(self._sinks)

    def _default_sinks(self) -> list[Sink]:
        if self.run_dir is not None and self.config.level != "off":
            return [JsonLinesSink(self.run_dir / EVENTS_FILENAME)]
        return []

    @property
    def level(self) -> str:
        """The effective telemetry level (one of LEVELS): debug while escalated, else the configured one."""
        return self._levels.level

    @property
    def configured_level(self) -> str:
        """The level the run was configured with, whatever the escalation."""
        return self._levels.configured_level

    @property
    def sinks(self) -> tuple[Sink, ...]:
        """The sinks events are written to."""
        return tuple(self._sinks)

    @property
    def layer_statistics_enabled(self) -> bool:
        """Whether to compute per-layer statistics now: effective level debug and `debug_layer_stats` on."""
        return self.config.debug_layer_stats and self.enabled(LayerStatistics)

    def enabled(self, event_type: type[Event]) -> bool:
        """Whether events of this type are written at the effective level; lets callers skip building them."""
        return LEVELS.index(self.level) >= LEVELS.index(event_type.min_level)

    def report_anomalies(self, anomalies: Sequence[Anomaly], *, epoch: int, env_id: int = ALL_ENVS) -> None:
        """Log one line per anomaly, emit an `AnomalyDetected` for each, and escalate to debug if any.

        The lines go to the `morphogen.telemetry` logger at WARNING (printed on stderr unless the
        application configured logging otherwise), at every level including `off`.
        """
        for anomaly in anomalies:
            logger.warning("%s", anomaly.line())
            self.emit(
                AnomalyDetected(
                    epoch=epoch, env_id=env_id, anomaly=anomaly.kind, message=anomaly.message, advice=anomaly.advice
                )
            )
        if anomalies:
            kinds = ", ".join(sorted({anomaly.kind for anomaly in anomalies}))
            change = self._levels.escalate(epoch=epoch, env_id=env_id, reason=f"anomaly: {kinds}")
            if change is not None:
                self.emit(change)

    def end_epoch(self, epoch: int) -> None:
        """Count one epoch of escalation down; emits the return to the configured level when it is due."""
        change = self._levels.end_epoch(epoch=epoch)
        if change is not None:
            self.emit(change)

    def state_dict(self) -> dict[str, Any]:
        """Escalation state, for resuming a run."""
        return {"levels": self._levels.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what `state_dict` returned."""
        self._levels.load_state_dict(state["levels"])

    def emit(self, event: Event) -> None:
        """Write `event` to every sink if its level is enabled; sink failures are logged, not raised."""
        if self._closed:
            raise RuntimeError(f"Telemetry was closed; cannot emit {event.kind} (emit before close())")
        if self.enabled(type(event)):
            self.write(event)

    def write(self, event: Event) -> None:
        """Write `event`, which another `Telemetry` already judged by its level (an episode's events kept until the
        episode is over, `morphogen eval`), to every sink; sink failures are logged, not raised."""
        if self._closed:
            raise RuntimeError(f"Telemetry was closed; cannot write {event.kind} (write before close())")
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
        error = sys.exc_info()[1]
        if self._failures[index] == 1 and isinstance(error, OSError) and error.errno in STORAGE_EXHAUSTED:
            # Storage ran out (the machine, not a bug): one line, no traceback.
            logger.error("telemetry sink %r %s: %s; training continues, later failures of this sink are only "
                         "counted", self._sinks[index], what, error.strerror or error)
        elif self._failures[index] == 1:
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
    """Every event in a JSON lines file, in order, read one line at a time (a file may be anyone's).

    A last line without its newline is a record still being written and is skipped; any other line
    that does not parse, or is longer than `MAX_LINE_BYTES` (telemetry writes a few kB at most),
    raises ValueError with its line number. A path that is not a regular file (a FIFO, a device)
    raises OSError instead of blocking.
    """
    events = []
    with open_regular_file(path) as handle:
        number = 0
        while (line := read_line(handle, MAX_LINE_BYTES)).complete:
            number += 1
            if line.text is None:
                raise ValueError(f"{path}:{number}: line longer than {MAX_LINE_BYTES:,} bytes; telemetry "
                                 "writes none this long, so this is not an events file")
            try:
                event = _event_of_line(line.text)
            except ValueError as error:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
                raise ValueError(f"{path}:{number}: {error}") from error
            if event is not None:
                events.append(event)
    return events


def _event_of_line(text: bytes) -> Event | None:
    """The event of one JSON line; None for a blank line; ValueError saying why it is not one."""
    line = text.decode("utf-8")
    if not line.strip():
        return None
    try:
        record = json.loads(line)
        if not isinstance(record, dict):
            raise ValueError(f"expected a JSON object, got {type(record).__name__}")
        return event_from_dict(record)
    except (TypeError, OverflowError, RecursionError) as error:  # wrong field types, huge ints, deep nesting
        raise ValueError(f"unreadable record: {type(error).__name__}") from None
