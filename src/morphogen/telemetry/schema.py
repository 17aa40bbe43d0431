"""JSON Schema of the event records, generated from the event dataclasses.

`python -m morphogen.telemetry.schema` rewrites `events.schema.json` next to this module (run it
after changing an event; a test fails while the checked-in file differs from the generated one).
`python -m morphogen.telemetry.schema --check` only reports whether it is up to date.

Each record is an object with "event" (the kind), "schema_version", an optional wall-clock "time",
and the event's fields; unknown keys are rejected. Records are strict JSON: a float field is a number
or, when the value was not finite, one of the strings "NaN", "Infinity", "-Infinity".
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any

from morphogen.telemetry.events import NON_FINITE_TOKENS, SCHEMA_VERSION, event_types

SCHEMA_PATH = Path(__file__).with_name("events.schema.json")
"""The checked-in schema file."""

_SCALAR_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string"}
_FLOAT_SCHEMA = {
    "anyOf": [{"type": "number"}, {"enum": list(NON_FINITE_TOKENS)}],
    "description": "a number; NaN and infinities are written as the strings NaN, Infinity, -Infinity",
}


def events_json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) every line of events.jsonl satisfies, built from the event classes."""
    definitions: dict[str, Any] = {}
    references = []
    for kind, event_type in sorted(event_types().items()):
        definitions[event_type.__name__] = _event_schema(kind, event_type, definitions)
        references.append({"$ref": f"#/$defs/{event_type.__name__}"})
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "morphogen telemetry event",
        "description": f"One line of events.jsonl, schema version {SCHEMA_VERSION}.",
        "oneOf": references,
        "$defs": dict(sorted(definitions.items())),
    }


def _event_schema(kind: str, event_type: type[Any], definitions: dict[str, Any]) -> dict[str, Any]:
    schema = _dataclass_schema(event_type, definitions)
    schema["properties"] = {
        "event": {"const": kind},
        "schema_version": {"const": SCHEMA_VERSION},
        "time": {"type": "number"},
        **schema["properties"],
    }
    schema["required"] = ["event", "schema_version", *schema["required"]]
    if event_type.__doc__:
        schema["description"] = event_type.__doc__.strip().splitlines()[0]
    return schema


def _dataclass_schema(cls: type[Any], definitions: dict[str, Any]) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    properties = {}
    required = []
    for field in dataclasses.fields(cls):
        properties[field.name] = _type_schema(hints[field.name], definitions)
        if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            required.append(field.name)
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def _type_schema(annotation: Any, definitions: dict[str, Any]) -> dict[str, Any]:
    """Schema of one annotation: scalars, `X | None`, `tuple[X, ...]`, fixed tuples, nested dataclasses."""
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        if annotation.__name__ not in definitions:
            definitions[annotation.__name__] = _dataclass_schema(annotation, definitions)
        return {"$ref": f"#/$defs/{annotation.__name__}"}
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is tuple and len(arguments) == 2 and arguments[1] is Ellipsis:
        return {"type": "array", "items": _type_schema(arguments[0], definitions)}
    if origin is tuple:
        return {
            "type": "array",
            "prefixItems": [_type_schema(argument, definitions) for argument in arguments],
            "items": False,
            "minItems": len(arguments),
        }
    if origin in (types.UnionType, typing.Union):
        return {"anyOf": [_type_schema(argument, definitions) for argument in arguments]}
    if annotation is type(None):
        return {"type": "null"}
    if annotation is float:
        return dict(_FLOAT_SCHEMA)
    if annotation in _SCALAR_TYPES:
        return {"type": _SCALAR_TYPES[annotation]}
    raise TypeError(f"no JSON Schema for annotation {annotation!r}; add a case to morphogen.telemetry.schema")


def schema_text() -> str:
    """The schema as the checked-in file holds it: indented JSON with a final newline."""
    return json.dumps(events_json_schema(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write (or with --check, verify) the checked-in schema file; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m morphogen.telemetry.schema", description=__doc__)
    parser.add_argument("--check", action="store_true", help="only report whether the file is up to date")
    arguments = parser.parse_args(argv)
    text = schema_text()
    if arguments.check:
        current = SCHEMA_PATH.read_text(encoding="utf-8") if SCHEMA_PATH.exists() else ""
        if current != text:
            print(f"{SCHEMA_PATH} is out of date: run python -m morphogen.telemetry.schema", file=sys.stderr)
            return 1
        print(f"{SCHEMA_PATH} is up to date")
        return 0
    SCHEMA_PATH.write_text(text, encoding="utf-8")
    print(f"wrote {SCHEMA_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
