"""events.jsonl is strict JSON: NaN and infinities are written as documented string tokens and read back
as floats; version-1 files (bare NaN) are still read."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jsonschema

from morphogen.telemetry.events import GovernorRollback
from morphogen.telemetry.schema import events_json_schema
from morphogen.telemetry.sinks import JsonLinesSink, read_events


def strict_loads(line: str) -> dict[str, object]:
    def refuse(token: str) -> None:
        raise ValueError(f"bare {token} is not JSON")

    record = json.loads(line, parse_constant=refuse)
    assert isinstance(record, dict)
    return record


def test_non_finite_floats_are_tokens_that_strict_readers_accept_and_the_schema_documents(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    sink = JsonLinesSink(path)
    sink.write(GovernorRollback(epoch=3, env_id=0, reason="non-finite training loss", loss=math.nan,
                                threshold=math.inf, pruned_slots=()))
    sink.write(GovernorRollback(epoch=4, env_id=0, reason="x", loss=-math.inf, threshold=2.5, pruned_slots=("r0c1",)))
    sink.close()
    records = [strict_loads(line) for line in path.read_text().splitlines()]
    assert (records[0]["loss"], records[0]["threshold"]) == ("NaN", "Infinity")
    assert (records[1]["loss"], records[1]["threshold"]) == ("-Infinity", 2.5)
    schema = events_json_schema()
    for record in records:
        jsonschema.validate(record, schema)
    first, second = read_events(path)
    assert isinstance(first, GovernorRollback) and isinstance(second, GovernorRollback)
    assert math.isnan(first.loss) and first.threshold == math.inf and second.loss == -math.inf
