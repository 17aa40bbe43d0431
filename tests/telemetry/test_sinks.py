"""Sinks and the Telemetry hub: JSON lines on disk, level filtering, failing sinks, reading back."""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
import time
from pathlib import Path

import pytest

from morphogen.run_directory import EVENTS_FILENAME, MAX_LINE_BYTES
from morphogen.telemetry.events import (
    ActionTaken,
    EpisodeCompleted,
    EpochCompleted,
    Event,
    GovernorRollback,
    RewardComputed,
    SlotState,
    StageTransition,
)
from morphogen.telemetry.sinks import JsonLinesSink, MemorySink, Sink, Telemetry, read_events

EVENTS: list[Event] = [
    EpochCompleted(0, 0, 1.5, 1.25, 60.0, 1000, (SlotState("r0c0", "DORMANT", None, 0.0),), "WAIT", True),
    ActionTaken(0, 0, "GERMINATE", "r0c0", "conv_light", True, "plateau"),
    StageTransition(1, 0, "r0c0", "conv_light", "GERMINATED", "TRAINING", "auto-advance"),
    RewardComputed(1, 0, 0.5, (("rent", -0.25), ("contribution", 0.75))),
    GovernorRollback(2, 0, "non-finite loss", float("inf"), 4.0, ("r0c0",)),
    EpisodeCompleted(3, 0, 80.0, 1100, 1000, 0, 1, 2.0),
]
MINIMAL_KINDS = {"epoch_completed", "governor_rollback", "episode_completed"}


class FailingSink:
    """Raises the given exception on every write."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.attempts = 0

    def write(self, event: Event) -> None:
        self.attempts += 1
        raise self.error

    def close(self) -> None:
        pass


def test_json_lines_sink_writes_flushed_lines_with_time(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "events.jsonl"
    sink = JsonLinesSink(path)
    before = time.time()
    sink.write(EVENTS[0])
    sink.write(EVENTS[1])
    # Readable before close: every line is flushed.
    lines = path.read_text(encoding="utf-8").splitlines()
    sink.close()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert first["event"] == "epoch_completed"
    assert before <= first["time"] <= time.time()
    assert {k: v for k, v in first.items() if k != "time"} == EVENTS[0].to_dict()


def test_json_lines_sink_appends(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    for event in EVENTS[:2]:
        sink = JsonLinesSink(path)
        sink.write(event)
        sink.close()
    assert read_events(path) == EVENTS[:2]


def test_hub_writes_run_dir_events_and_reads_them_back(tmp_path: Path) -> None:
    with Telemetry(tmp_path / "run") as telemetry:
        for event in EVENTS:
            telemetry.emit(event)
    path = tmp_path / "run" / EVENTS_FILENAME
    events = read_events(path)
    # The inf loss of the rollback survives (Python's json writes and reads Infinity).
    assert events == EVENTS


@pytest.mark.parametrize(
    ("level", "expected_kinds"),
    [
        ("off", set()),
        ("minimal", MINIMAL_KINDS),
        ("normal", {event.kind for event in EVENTS}),
        ("debug", {event.kind for event in EVENTS}),
    ],
)
def test_level_filtering(level: str, expected_kinds: set[str]) -> None:
    sink = MemorySink()
    with Telemetry(None, level=level, sinks=[sink]) as telemetry:
        for event in EVENTS:
            telemetry.emit(event)
        assert telemetry.level == level
    assert [event.kind for event in sink.events] == [
        event.kind for event in EVENTS if event.kind in expected_kinds
    ]
    assert {
        event_type.kind for event_type in map(type, EVENTS) if telemetry.enabled(event_type)
    } == expected_kinds


def test_level_off_creates_no_file(tmp_path: Path) -> None:
    with Telemetry(tmp_path, level="off") as telemetry:
        telemetry.emit(EVENTS[0])
    assert not (tmp_path / EVENTS_FILENAME).exists()


def test_invalid_level_lists_choices() -> None:
    with pytest.raises(ValueError, match="off, minimal, normal, debug; got 'verbose'"):
        Telemetry(None, level="verbose")


def test_explicit_sinks_replace_the_default_file(tmp_path: Path) -> None:
    sink = MemorySink()
    with Telemetry(tmp_path, sinks=[sink]) as telemetry:
        telemetry.emit(EVENTS[0])
    assert sink.events == [EVENTS[0]] and sink.closed
    assert not (tmp_path / EVENTS_FILENAME).exists()


@pytest.mark.parametrize(
    "error", [OSError("disk full"), TypeError("not serializable"), ValueError("closed file")]
)
def test_failing_sink_is_logged_once_and_emit_goes_on(
    error: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    failing = FailingSink(error)
    healthy = MemorySink()
    sinks: list[Sink] = [failing, healthy]
    with caplog.at_level(logging.DEBUG, logger="morphogen.telemetry"):
        telemetry = Telemetry(None, sinks=sinks)
        for event in EVENTS:
            telemetry.emit(event)
        telemetry.close()
    assert failing.attempts == len(EVENTS)
    assert healthy.events == EVENTS
    errors = [record for record in caplog.records if record.levelno == logging.ERROR]
    assert len(errors) == 1
    assert errors[0].exc_info is not None and errors[0].exc_info[1] is error
    warnings = [record for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1 and f"failed {len(EVENTS)} times" in warnings[0].getMessage()


@pytest.mark.parametrize(("code", "words"), [(errno.ENOSPC, "No space left on device"),
                                             (errno.EDQUOT, "Disk quota exceeded"), (errno.EFBIG, "File too large")])
def test_full_disk_in_a_sink_is_one_line_without_traceback(code: int, words: str,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="morphogen.telemetry"):
        telemetry = Telemetry(None, sinks=[FailingSink(OSError(code, words))])
        telemetry.emit(EVENTS[0])
    (record,) = caplog.records
    assert record.exc_info is None and f"{words}; training continues" in record.getMessage()


def test_unexpected_sink_error_propagates() -> None:
    telemetry = Telemetry(None, sinks=[FailingSink(RuntimeError("bug in a sink"))])
    with pytest.raises(RuntimeError, match="bug in a sink"):
        telemetry.emit(EVENTS[0])


def test_emit_after_close_raises() -> None:
    telemetry = Telemetry(None, sinks=[MemorySink()])
    telemetry.close()
    telemetry.close()
    with pytest.raises(RuntimeError, match="closed"):
        telemetry.emit(EVENTS[0])


def test_hub_without_sinks_accepts_events() -> None:
    with Telemetry(None) as telemetry:
        telemetry.emit(EVENTS[0])
        assert telemetry.sinks == ()


def test_read_events_skips_a_partial_last_line(tmp_path: Path) -> None:
    path = tmp_path / EVENTS_FILENAME
    complete = json.dumps(EVENTS[0].to_dict()) + "\n"
    partial = json.dumps(EVENTS[1].to_dict())[:25]
    path.write_text(complete + "\n" + partial, encoding="utf-8")
    assert read_events(path) == [EVENTS[0]]


def test_read_events_skips_a_last_line_torn_inside_a_character(tmp_path: Path) -> None:
    path = tmp_path / EVENTS_FILENAME
    complete = json.dumps(EVENTS[0].to_dict()) + "\n"
    path.write_bytes(complete.encode() + '{"kind": "é'.encode()[:-1])  # killed between the two bytes of "é"
    assert read_events(path) == [EVENTS[0]]


def test_read_events_refuses_an_overlong_line_by_its_number(tmp_path: Path) -> None:
    path = tmp_path / EVENTS_FILENAME
    good = json.dumps(EVENTS[0].to_dict())
    padded = good[:-1] + " " * MAX_LINE_BYTES + "}"  # still a valid event, but no telemetry line is this long
    path.write_text(f"{good}\n{padded}\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"events\.jsonl:2: line longer than 1,048,576 bytes"):
        read_events(path)


def test_read_events_reports_deep_nesting_as_a_bad_line(tmp_path: Path) -> None:
    path = tmp_path / EVENTS_FILENAME
    path.write_text("[" * 100_000 + "]" * 100_000 + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"events\.jsonl:1: unreadable record: RecursionError"):
        read_events(path)


def test_read_events_refuses_a_fifo_instead_of_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / EVENTS_FILENAME
    os.mkfifo(fifo)
    outcome: list[BaseException] = []

    def read() -> None:
        try:
            read_events(fifo)
        except OSError as error:
            outcome.append(error)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=10)
    if reader.is_alive():  # blocked opening the FIFO: release it with a writer
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(timeout=10)
        pytest.fail("read_events blocked on a FIFO")
    assert len(outcome) == 1 and "not a regular file" in str(outcome[0])


def test_read_events_reports_the_bad_line(tmp_path: Path) -> None:
    path = tmp_path / EVENTS_FILENAME
    good = json.dumps(EVENTS[0].to_dict())
    path.write_text(f"{good}\n{{not json\n{good}\n[1, 2]\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"events\.jsonl:2:"):
        read_events(path)
    path.write_text(f"{good}\n[1, 2]\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"events\.jsonl:2: expected a JSON object"):
        read_events(path)
