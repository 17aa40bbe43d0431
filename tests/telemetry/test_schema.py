"""The checked-in JSON Schema of events: up to date with the event classes, and strict about records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from morphogen.telemetry import schema
from morphogen.telemetry.events import SCHEMA_VERSION, event_types
from morphogen.telemetry.schema import SCHEMA_PATH, events_json_schema, schema_text


def test_checked_in_schema_equals_the_generated_one() -> None:
    # Fails after an event changes until `python -m morphogen.telemetry.schema` is run again.
    assert SCHEMA_PATH.read_text(encoding="utf-8") == schema_text()


def test_schema_is_a_valid_draft_2020_12_schema_covering_every_event() -> None:
    generated = events_json_schema()
    jsonschema.Draft202012Validator.check_schema(generated)
    names = {event_type.__name__ for event_type in event_types().values()}
    assert {reference["$ref"].rsplit("/", 1)[1] for reference in generated["oneOf"]} == names
    assert {"SlotState", "LayerStats"} <= set(generated["$defs"])


def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(events_json_schema())


def _stage_transition(**changes: Any) -> dict[str, Any]:
    record = {
        "time": 1.5,
        "event": "stage_transition",
        "schema_version": SCHEMA_VERSION,
        "epoch": 3,
        "env_id": 0,
        "slot": "r0c0",
        "blueprint": "norm",
        "from_stage": "TRAINING",
        "to_stage": "BLENDING",
        "reason": "gate passed",
    }
    return record | changes


@pytest.mark.parametrize(
    "record",
    [
        _stage_transition(epoch=3.5),
        _stage_transition(epoch=True),
        _stage_transition(schema_version=SCHEMA_VERSION + 1),
        _stage_transition(event="no_such_event"),
        _stage_transition(surprise=1),
        {key: value for key, value in _stage_transition().items() if key != "reason"},
    ],
    ids=["float_for_int", "bool_for_int", "other_version", "unknown_kind", "unknown_key", "missing_field"],
)
def test_bad_records_are_rejected(record: dict[str, Any]) -> None:
    assert _validator().is_valid(_stage_transition())
    assert not _validator().is_valid(record)


def test_pairs_and_optionals_are_typed() -> None:
    reward = {"event": "reward_computed", "schema_version": SCHEMA_VERSION, "epoch": 1, "env_id": 0, "total": 0.5}
    assert _validator().is_valid(reward | {"components": [["rent", -0.5]]})
    assert not _validator().is_valid(reward | {"components": [["rent", -0.5, 1.0]]})
    assert not _validator().is_valid(reward | {"components": [["rent"]]})
    assert not _validator().is_valid(reward | {"components": [[1.0, "rent"]]})
    action = {
        "event": "action_taken",
        "schema_version": SCHEMA_VERSION,
        "epoch": 1,
        "env_id": 0,
        "op": "WAIT",
        "blueprint": None,
        "succeeded": True,
        "reason": "",
    }
    assert _validator().is_valid(action | {"slot": None})
    assert not _validator().is_valid(action | {"slot": 3})


def test_main_writes_and_checks_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "events.schema.json"
    monkeypatch.setattr(schema, "SCHEMA_PATH", target)
    assert schema.main(["--check"]) == 1
    assert schema.main([]) == 0
    assert json.loads(target.read_text(encoding="utf-8")) == events_json_schema()
    assert schema.main(["--check"]) == 0
