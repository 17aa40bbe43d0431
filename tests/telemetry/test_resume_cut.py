"""Resuming cuts events.jsonl back to the end of the checkpointed round: later rounds' events and a torn
last line go, everything the checkpoint saw stays byte for byte."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

from morphogen.run_directory import MAX_LINE_BYTES
from morphogen.telemetry.resume import cut_events_to_round


def line(event: str, **fields: object) -> str:
    return json.dumps({"time": 1.0, "event": event, "schema_version": 2, "epoch": 0, "env_id": 0, **fields}) + "\n"


def round_lines(number: int) -> str:
    return line("epoch_completed", round_hint=number) + line("round_completed", round=number, env_id=-1)


def test_events_after_the_checkpointed_round_and_a_torn_line_are_cut(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    kept = round_lines(1) + round_lines(2)
    path.write_text(kept + round_lines(3) + line("epoch_completed") + '{"time": 2.0, "event": "epo')
    removed = cut_events_to_round(path, 2)
    assert path.read_text() == kept
    assert removed == len((round_lines(3) + line("epoch_completed") + '{"time": 2.0, "event": "epo').encode())


def test_only_a_torn_line_is_cut_when_the_round_ended_the_file(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    kept = round_lines(1)
    path.write_text(kept + '{"time": 2.0, "eve')
    assert cut_events_to_round(path, 1) == len('{"time": 2.0, "eve')
    assert path.read_text() == kept
    assert cut_events_to_round(path, 1) == 0 and path.read_text() == kept


def test_a_file_without_the_rounds_of_the_checkpoint_is_all_newer(tmp_path: Path) -> None:
    # Rounds 1-2 ran with telemetry off; round 3 (after a resume at `normal`) was killed: all of it goes.
    path = tmp_path / "events.jsonl"
    path.write_text(line("epoch_completed") + line("epoch_completed"))
    cut_events_to_round(path, 2)
    assert path.read_text() == ""


def test_a_missing_file_stays_missing(tmp_path: Path) -> None:
    assert cut_events_to_round(tmp_path / "events.jsonl", 3) == 0
    assert not (tmp_path / "events.jsonl").exists()


def test_a_huge_line_is_stepped_over_in_bounded_memory(tmp_path: Path) -> None:
    """A copied run's events may hold a line of any length: the cut reads at most MAX_LINE_BYTES of it at once."""
    path = tmp_path / "events.jsonl"
    huge = line("epoch_completed", action="x" * (16 * MAX_LINE_BYTES))
    kept = round_lines(1) + huge + round_lines(2)
    path.write_text(kept + round_lines(3))
    tracemalloc.start()
    try:
        cut_events_to_round(path, 2)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert path.read_text() == kept
    assert peak < 4 * MAX_LINE_BYTES, f"{peak:,} bytes held for a {len(huge):,}-byte line"


def test_a_checkpoint_of_the_imitation_warm_start_keeps_the_watched_episodes(tmp_path: Path) -> None:
    """Saved once the policy watched the heuristic (round 0, imitated), the checkpoint saw those episodes, which end
    with `imitation_completed`; a run that saved nothing (a restart from round 1) keeps none of them."""
    path = tmp_path / "events.jsonl"
    watched = line("episode_completed") + line("imitation_completed", env_id=-1, rounds=1)
    newer = line("epoch_completed") + '{"time": 2.0, "ev'
    path.write_text(watched + newer)
    assert cut_events_to_round(path, 0, imitated=True) == len(newer.encode())
    assert path.read_text() == watched
    path.write_text(watched + round_lines(1) + newer)
    cut_events_to_round(path, 1, imitated=True)
    assert path.read_text() == watched + round_lines(1)
    cut_events_to_round(path, 0)
    assert path.read_text() == ""
