"""Cutting `events.jsonl` back to what a checkpoint saw, before a resumed run appends to it.

A run killed in round k+1 (or inside the checkpoint write of round k+1) has written events that its
last checkpoint (round k) does not know of. Resuming replays that round from the checkpoint, so
without a cut `report` would count its seeds, rewards and epochs twice; and a kill in the middle of
a write (or a full disk) leaves a torn last line that the resumed run would glue its first record
onto, breaking every later read.

The cut point is the end of the last `round_completed` record whose round is <= k: the trainer
writes it as the last event of a round, before that round's checkpoint. Every complete line after
it, and any torn tail, belongs to rounds the checkpoint does not hold. If the file has no such
record, rounds 1..k wrote nothing (telemetry `off`) and everything in the file is newer: it is all
cut. A checkpoint saved after the imitation warm start (`--imitate-rounds`) also saw the watched
episodes, which end with an `imitation_completed` record: the cut never falls before it. The cut needs
no bookkeeping in the checkpoint, so a resumed checkpoint stays bit-identical to an uninterrupted one.
"""

from __future__ import annotations

import json
from pathlib import Path

from morphogen.run_directory import MAX_LINE_BYTES, open_regular_file, read_line, truncate_file

ROUND_COMPLETED = "round_completed"
IMITATION_COMPLETED = "imitation_completed"
#: What `_completed_round` reads an `imitation_completed` record as: it ends what comes before round 1.
IMITATION_ROUND = 0


def _completed_round(line: bytes, *, imitated: bool) -> int | None:
    """The round of a complete `round_completed` record (with `imitated`, `IMITATION_ROUND` for an
    `imitation_completed` one), else None."""
    if ROUND_COMPLETED.encode() not in line and not (imitated and IMITATION_COMPLETED.encode() in line):
        return None
    try:
        record = json.loads(line)
    except ValueError:  # includes UnicodeDecodeError
        return None
    if not isinstance(record, dict):
        return None
    if imitated and record.get("event") == IMITATION_COMPLETED:
        return IMITATION_ROUND
    if record.get("event") != ROUND_COMPLETED:
        return None
    value = record.get("round")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def events_end_of_round(path: str | Path, completed_round: int, *, imitated: bool = False) -> int:
    """Byte offset just after the last complete `round_completed` line of a round <= `completed_round` (with
    `imitated`, an `imitation_completed` line counts as round 0); 0 if none."""
    offset = end = 0
    with open_regular_file(path) as handle:
        while (line := read_line(handle, MAX_LINE_BYTES)).complete:  # a torn last line is never a record
            offset += line.size
            round_number = None if line.text is None else _completed_round(line.text, imitated=imitated)
            if round_number is not None and round_number <= completed_round:
                end = offset
    return end


def cut_events_to_round(path: str | Path, completed_round: int, *, imitated: bool = False) -> int:
    """Truncate the events file at `path` to what a checkpoint of `completed_round` saw (`imitated`: one saved after
    the imitation warm start, which saw its episodes too); return bytes removed.

    A missing file is left missing (0 bytes removed).
    """
    path = Path(path)
    if not path.is_file():
        return 0
    size = path.stat().st_size
    end = events_end_of_round(path, completed_round, imitated=imitated)
    if end < size:
        truncate_file(path, end)  # never through a symbolic link
    return size - end
