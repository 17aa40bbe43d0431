"""Typed, versioned telemetry events.

Every event is a frozen dataclass with the fields `epoch` and `env_id` first, a `kind` naming it in
JSON, and a `min_level`: the lowest telemetry level that writes it. `to_dict()` gives a JSON-able
dict, `event_from_dict()` rebuilds the typed event from one (the sink adds a wall-clock "time").
`scalars()` maps an event to the metric names shared by JSON lines, TensorBoard and the UI:
`episode/`, `growth/`, `ppo/`, `health/`, `time/`.

Adding a field with a default keeps `SCHEMA_VERSION`; renaming, removing or retyping one bumps it.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

SCHEMA_VERSION = 1
"""Version of the event schema written in every record as "schema_version"."""

LEVELS = ("off", "minimal", "normal", "debug")
"""Telemetry levels, from quietest to most verbose."""

_RESERVED_KEYS = frozenset({"event", "schema_version", "time"})
_EVENT_TYPES: dict[str, type[Event]] = {}


@dataclass(frozen=True)
class Event:
    """Base of all events: which epoch of which env it happened in."""

    kind: ClassVar[str]
    """Name of the event in JSON ("event" key); unique per subclass."""
    min_level: ClassVar[str] = "normal"
    """Lowest telemetry level (see LEVELS) at which this event is written."""

    epoch: int
    env_id: int

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        kind = cls.__dict__.get("kind")
        if not isinstance(kind, str):
            raise TypeError(f"event class {cls.__name__} must define `kind: ClassVar[str] = '...'`")
        if kind in _EVENT_TYPES:
            raise TypeError(f"event kind {kind!r} is already used by {_EVENT_TYPES[kind].__name__}")
        if cls.min_level not in LEVELS[1:]:
            raise TypeError(f"{cls.__name__}.min_level must be one of {LEVELS[1:]}; got {cls.min_level!r}")
        _EVENT_TYPES[kind] = cls

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict: "event", "schema_version", then every field (tuples become lists)."""
        record: dict[str, Any] = {"event": self.kind, "schema_version": SCHEMA_VERSION}
        record.update(_to_json(self))
        return record

    def scalars(self) -> dict[str, float]:
        """Numbers this event contributes to the shared metric names; empty for pure log events."""
        return {}


@dataclass(frozen=True)
class SlotState:
    """One slot as seen at the end of an epoch (not an event by itself)."""

    slot: str
    stage: str
    blueprint: str | None
    alpha: float


@dataclass(frozen=True)
class EpochCompleted(Event):
    """One host epoch finished: losses, accuracy, size, slot states, and the action taken after it."""

    kind: ClassVar[str] = "epoch_completed"
    min_level: ClassVar[str] = "minimal"

    train_loss: float
    val_loss: float
    val_accuracy: float
    param_count: int
    slots: tuple[SlotState, ...]
    action: str
    action_succeeded: bool

    def scalars(self) -> dict[str, float]:
        values = {
            "episode/train_loss": self.train_loss,
            "episode/val_loss": self.val_loss,
            "episode/val_accuracy": self.val_accuracy,
            "episode/action_succeeded": float(self.action_succeeded),
            "growth/param_count": float(self.param_count),
            "growth/seeds": float(sum(slot.blueprint is not None for slot in self.slots)),
        }
        values.update({f"growth/alpha/{slot.slot}": slot.alpha for slot in self.slots})
        return values


@dataclass(frozen=True)
class StageTransition(Event):
    """A seed moved from one lifecycle stage to another, and why."""

    kind: ClassVar[str] = "stage_transition"

    slot: str
    blueprint: str
    from_stage: str
    to_stage: str
    reason: str


@dataclass(frozen=True)
class ActionTaken(Event):
    """The controller's decision for this step and whether executing it succeeded."""

    kind: ClassVar[str] = "action_taken"

    op: str
    slot: str | None
    blueprint: str | None
    succeeded: bool
    reason: str


@dataclass(frozen=True)
class CounterfactualMeasured(Event):
    """Accuracy and loss of each counterfactual config, and each slot's contribution in accuracy points."""

    kind: ClassVar[str] = "counterfactual_measured"

    configs: tuple[str, ...]
    accuracies: tuple[float, ...]
    losses: tuple[float, ...]
    contributions: tuple[tuple[str, float], ...]

    def __post_init__(self) -> None:
        if not len(self.configs) == len(self.accuracies) == len(self.losses):
            raise ValueError(
                "configs, accuracies and losses need one entry per config; got lengths "
                f"{len(self.configs)}, {len(self.accuracies)}, {len(self.losses)}"
            )

    def scalars(self) -> dict[str, float]:
        values = {f"growth/contribution/{slot}": points for slot, points in self.contributions}
        values.update(
            {
                f"growth/counterfactual_accuracy/{config}": acc
                for config, acc in zip(self.configs, self.accuracies, strict=True)
            }
        )
        return values


@dataclass(frozen=True)
class GovernorRollback(Event):
    """The governor restored the last good state because the loss diverged."""

    kind: ClassVar[str] = "governor_rollback"
    min_level: ClassVar[str] = "minimal"

    reason: str
    loss: float
    threshold: float
    pruned_slots: tuple[str, ...]

    def scalars(self) -> dict[str, float]:
        return {
            "health/rollback": 1.0,
            "health/rollback_loss": self.loss,
            "health/rollback_threshold": self.threshold,
        }


@dataclass(frozen=True)
class RewardComputed(Event):
    """The reward of one step, with each named component reported separately."""

    kind: ClassVar[str] = "reward_computed"

    total: float
    components: tuple[tuple[str, float], ...]

    def scalars(self) -> dict[str, float]:
        values = {"episode/reward": self.total}
        values.update({f"episode/reward/{name}": value for name, value in self.components})
        return values


@dataclass(frozen=True)
class EpisodeCompleted(Event):
    """An episode ended: final accuracy, model size against the bare host, seed outcomes, return."""

    kind: ClassVar[str] = "episode_completed"
    min_level: ClassVar[str] = "minimal"

    final_accuracy: float
    param_count: int
    host_param_count: int
    fossilized: int
    pruned: int
    episode_return: float

    def scalars(self) -> dict[str, float]:
        return {
            "episode/final_accuracy": self.final_accuracy,
            "episode/return": self.episode_return,
            "growth/param_count": float(self.param_count),
            "growth/added_params": float(self.param_count - self.host_param_count),
            "growth/fossilized": float(self.fossilized),
            "growth/pruned": float(self.pruned),
        }


def event_types() -> Mapping[str, type[Event]]:
    """Every registered event class by kind (read-only view)."""
    return types.MappingProxyType(_EVENT_TYPES)


def event_from_dict(record: Mapping[str, Any]) -> Event:
    """Rebuild the typed event from a dict written by `Event.to_dict` (a "time" key is ignored).

    Raises ValueError naming the problem for an unknown kind, another schema version, a missing or
    unknown field, or a value of the wrong type.
    """
    kind = record.get("event")
    event_type = _EVENT_TYPES.get(kind) if isinstance(kind, str) else None
    if event_type is None or not isinstance(kind, str):
        raise ValueError(f"unknown event kind {kind!r}; known kinds: {', '.join(sorted(_EVENT_TYPES))}")
    version = record.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ValueError(
            f"{kind} record has schema_version {version!r}; this morphogen reads version {SCHEMA_VERSION}"
        )
    event = _from_json({k: v for k, v in record.items() if k not in _RESERVED_KEYS}, event_type, kind)
    assert isinstance(event, Event)
    return event


def _to_json(value: Any) -> Any:
    """Dataclasses to dicts and tuples to lists, recursively; other values unchanged."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: _to_json(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [_to_json(item) for item in value]
    return value


def _from_json(value: Any, annotation: Any, path: str) -> Any:
    """Convert a JSON value back to `annotation` (dataclass, tuple, optional or scalar), checking types."""
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return _dataclass_from_json(value, annotation, path)
    origin = typing.get_origin(annotation)
    arguments = typing.get_args(annotation)
    if origin is tuple:
        return _tuple_from_json(value, arguments, path)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in arguments:
            return None
        (inner,) = (argument for argument in arguments if argument is not type(None))
        return _from_json(value, inner, path)
    return _scalar_from_json(value, annotation, path)


def _dataclass_from_json(value: Any, annotation: type[Any], path: str) -> Any:
    if not isinstance(value, Mapping):
        raise ValueError(f"{path}: expected an object for {annotation.__name__}, got {value!r}")
    hints = typing.get_type_hints(annotation)
    fields = {field.name: field for field in dataclasses.fields(annotation)}
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise ValueError(f"{path}: unknown fields {unknown}; {annotation.__name__} has {sorted(fields)}")
    arguments = {}
    for name, field in fields.items():
        if name in value:
            arguments[name] = _from_json(value[name], hints[name], f"{path}.{name}")
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise ValueError(f"{path}: missing required field {name!r}")
    return annotation(**arguments)


def _tuple_from_json(value: Any, arguments: tuple[Any, ...], path: str) -> tuple[Any, ...]:
    if not isinstance(value, list | tuple):
        raise ValueError(f"{path}: expected a list, got {value!r}")
    if len(arguments) == 2 and arguments[1] is Ellipsis:
        return tuple(_from_json(item, arguments[0], f"{path}[{i}]") for i, item in enumerate(value))
    if len(value) != len(arguments):
        raise ValueError(f"{path}: expected {len(arguments)} items, got {len(value)}")
    return tuple(
        _from_json(item, argument, f"{path}[{i}]")
        for i, (item, argument) in enumerate(zip(value, arguments, strict=True))
    )


def _scalar_from_json(value: Any, annotation: Any, path: str) -> Any:
    # bool is a subclass of int in Python, so it is rejected explicitly where a number is wanted.
    if annotation is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if annotation is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if annotation in (bool, str) and isinstance(value, annotation):
        return value
    raise ValueError(f"{path}: expected {getattr(annotation, '__name__', annotation)}, got {value!r}")
