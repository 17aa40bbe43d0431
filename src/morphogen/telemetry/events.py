"""Typed, versioned telemetry events.

Every event is a frozen dataclass with the fields `epoch` and `env_id` first, a `kind` naming it in
JSON, and a `min_level`: the lowest telemetry level that writes it. `to_dict()` gives a JSON-able
dict, `event_from_dict()` rebuilds the typed event from one (the sink adds a wall-clock "time").
`scalars()` maps an event to the metric names shared by JSON lines, TensorBoard and the UI:
`episode/`, `growth/`, `ppo/`, `health/`, `time/`.

Per-round events (`PPOUpdateCompleted`, `RoundCompleted`) carry a `round` field; every event that
is not about one env (per-round events, phase times, anomalies and level changes found by the
trainer) uses `env_id = ALL_ENVS`. For those, `epoch` is the number of host epochs each env has run
since training began (the clock the escalation of telemetry levels counts in).

Records are strict JSON (RFC 8259 has no NaN or Infinity): a float field holding NaN, +inf or -inf
is written as the string "NaN", "Infinity" or "-Infinity" (`NON_FINITE_TOKENS`) and read back as the
float.

Adding a field with a default keeps `SCHEMA_VERSION`; renaming, removing or retyping one bumps it.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from morphogen.limits import short_repr

SCHEMA_VERSION = 2
"""Version of the event schema written in every record as "schema_version"; the only one `event_from_dict` reads."""

NON_FINITE_TOKENS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
"""How a non-finite float field is written in a record (strict JSON has no token for them)."""

LEVELS = ("off", "minimal", "normal", "debug")
"""Telemetry levels, from quietest to most verbose."""

ALL_ENVS = -1
"""`env_id` of events that are not about one env (PPO updates, rounds, trainer-wide anomalies)."""

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


@dataclass(frozen=True)
class AnomalyDetected(Event):
    """A monitor saw something wrong: what (`kind`, `message`) and what a user can do (`advice`)."""

    kind: ClassVar[str] = "anomaly_detected"
    min_level: ClassVar[str] = "minimal"

    anomaly: str
    """Which detector fired, e.g. "ratio_explosion" (see `telemetry.anomalies.ANOMALY_KINDS`)."""
    message: str
    advice: str

    def scalars(self) -> dict[str, float]:
        return {f"health/anomaly/{self.anomaly}": 1.0}


@dataclass(frozen=True)
class TelemetryLevelChanged(Event):
    """The effective telemetry level changed: raised to debug after an anomaly, or back after it."""

    kind: ClassVar[str] = "telemetry_level_changed"
    min_level: ClassVar[str] = "minimal"

    from_level: str
    to_level: str
    reason: str

    def scalars(self) -> dict[str, float]:
        return {"health/telemetry_level": float(LEVELS.index(self.to_level))}


@dataclass(frozen=True)
class PPOUpdateCompleted(Event):
    """One PPO update (one round): losses, per-head entropy and the detached diagnostics."""

    kind: ClassVar[str] = "ppo_update_completed"

    round: int
    policy_loss: float
    value_loss: float
    entropy_loss: float
    entropy_per_head: tuple[tuple[str, float], ...]
    approx_kl: float
    clip_fraction: float
    explained_variance: float
    grad_norm: float
    """Global L2 norm of the policy gradient before clipping, averaged over the minibatches."""
    epochs_completed: int
    """PPO epochs run over the rollout (fewer than configured when the KL early stop fired)."""
    early_stopped: bool

    def scalars(self) -> dict[str, float]:
        values = {
            "ppo/policy_loss": self.policy_loss,
            "ppo/value_loss": self.value_loss,
            "ppo/entropy_loss": self.entropy_loss,
            "ppo/approx_kl": self.approx_kl,
            "ppo/clip_fraction": self.clip_fraction,
            "ppo/explained_variance": self.explained_variance,
            "ppo/grad_norm": self.grad_norm,
            "ppo/epochs_completed": float(self.epochs_completed),
            "ppo/early_stopped": float(self.early_stopped),
        }
        values.update({f"ppo/entropy/{head}": entropy for head, entropy in self.entropy_per_head})
        return values


@dataclass(frozen=True)
class RoundCompleted(Event):
    """A training round ended: the means over its episodes and its wall-clock duration."""

    kind: ClassVar[str] = "round_completed"
    min_level: ClassVar[str] = "minimal"

    round: int
    mean_return: float
    mean_final_accuracy: float
    mean_parameters_added: float
    seconds: float

    def scalars(self) -> dict[str, float]:
        return {
            "episode/mean_return": self.mean_return,
            "episode/mean_final_accuracy": self.mean_final_accuracy,
            "growth/mean_parameters_added": self.mean_parameters_added,
            "time/round": self.seconds,
        }


@dataclass(frozen=True)
class ImitationCompleted(Event):
    """The imitation warm start of `train --imitate-rounds` ended: how well the policy reproduces the heuristic it
    watched (`control/imitation.py`). It follows the watched episodes' events, which belong to no PPO round, and
    precedes the checkpoint saved after the fit."""

    kind: ClassVar[str] = "imitation_completed"
    min_level: ClassVar[str] = "minimal"

    rounds: int
    episodes: int
    action_loss_before: float
    action_loss_after: float
    match_probability: float
    agreement: float
    value_loss: float


PHASES = ("train", "validate", "act", "update")
"""The phases of the training loop, in the order every table of phase times lists them (others follow)."""


@dataclass(frozen=True)
class PhaseTimes(Event):
    """Wall-clock seconds spent in each phase (train, validate, act, update) since the last such event."""

    kind: ClassVar[str] = "phase_times"

    phases: tuple[tuple[str, float], ...]

    def scalars(self) -> dict[str, float]:
        return {f"time/{phase}": seconds for phase, seconds in self.phases}


@dataclass(frozen=True)
class RankTimes(Event):
    """Wall seconds of each rank of a distributed round (tuple index = rank), to spot a straggler.

    Ranks step their envs in lockstep, so a slow rank shows twice: its `collect_seconds` minus
    `collect_wait_seconds` (its own work) is the largest, and the other ranks' `collect_wait_seconds`
    (time inside the per-step all-gathers, waiting for it) grow. `all_reduce_seconds` is the time inside
    the update's gradient, advantage and KL all-reduces.
    """

    kind: ClassVar[str] = "rank_times"
    min_level: ClassVar[str] = "minimal"  # one per round, like `RoundCompleted`: a straggler shows at any level

    round: int
    collect_seconds: tuple[float, ...]
    collect_wait_seconds: tuple[float, ...]
    update_seconds: tuple[float, ...]
    all_reduce_seconds: tuple[float, ...]

    def scalars(self) -> dict[str, float]:
        values: dict[str, float] = {}
        for rank, (collect, wait, reduce) in enumerate(
                zip(self.collect_seconds, self.collect_wait_seconds, self.all_reduce_seconds, strict=True)):
            values.update({f"time/rank{rank}/collect": collect, f"time/rank{rank}/collect_wait": wait,
                           f"time/rank{rank}/all_reduce": reduce})
        return values


@dataclass(frozen=True)
class GradientHealthMeasured(Event):
    """Host and per-seed gradient health over one epoch (from the isolation monitor's report)."""

    kind: ClassVar[str] = "gradient_health_measured"

    host_norm: float
    """Mean over the epoch's batches of the host's global gradient L2 norm."""
    seeds: tuple[tuple[str, float, float, float], ...]
    """Per measured seed: (slot, gradient norm, health in [0, 1], seed/host gradient ratio)."""

    def scalars(self) -> dict[str, float]:
        values = {"health/host_gradient_norm": self.host_norm}
        for slot, norm, health, ratio in self.seeds:
            values[f"health/seed_gradient_norm/{slot}"] = norm
            values[f"health/seed_health/{slot}"] = health
            values[f"health/seed_gradient_ratio/{slot}"] = ratio
        return values


@dataclass(frozen=True)
class LSTMHealthMeasured(Event):
    """Size of the policy LSTM's hidden (h) and cell (c) states, as root mean square per sample."""

    kind: ClassVar[str] = "lstm_health_measured"

    hidden_rms_mean: float
    hidden_rms_max: float
    cell_rms_mean: float
    cell_rms_max: float
    non_finite: int
    """Number of NaN or infinite entries over h and c."""

    def scalars(self) -> dict[str, float]:
        return {
            "health/lstm_hidden_rms_mean": self.hidden_rms_mean,
            "health/lstm_hidden_rms_max": self.hidden_rms_max,
            "health/lstm_cell_rms_mean": self.cell_rms_mean,
            "health/lstm_cell_rms_max": self.cell_rms_max,
            "health/lstm_non_finite": float(self.non_finite),
        }


@dataclass(frozen=True)
class LayerStats:
    """Statistics of one parameter tensor or of its gradient (not an event by itself)."""

    name: str
    """Parameter name as in `module.named_parameters()`."""
    source: str
    """"parameter" or "gradient"."""
    numel: int
    norm: float
    mean: float
    std: float
    """Population standard deviation (no Bessel correction, so a single entry gives 0)."""
    min: float
    max: float
    zeros: int
    nan: int
    inf: int


@dataclass(frozen=True)
class LayerStatistics(Event):
    """Per-layer statistics of a module's parameters (and gradients); written at debug level only."""

    kind: ClassVar[str] = "layer_statistics"
    min_level: ClassVar[str] = "debug"

    module: str
    """Which module was measured, e.g. "host" or "policy"."""
    layers: tuple[LayerStats, ...]

    def scalars(self) -> dict[str, float]:
        values = {}
        for layer in self.layers:
            prefix = f"health/layers/{self.module}/{layer.source}/{layer.name}"
            values.update(
                {
                    f"{prefix}/norm": layer.norm,
                    f"{prefix}/mean": layer.mean,
                    f"{prefix}/std": layer.std,
                    f"{prefix}/min": layer.min,
                    f"{prefix}/max": layer.max,
                    f"{prefix}/zeros": float(layer.zeros),
                    f"{prefix}/nan": float(layer.nan),
                    f"{prefix}/inf": float(layer.inf),
                }
            )
        return values


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
    """Dataclasses to dicts, tuples to lists, non-finite floats to their token, recursively; others unchanged."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: _to_json(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [_to_json(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
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


_FIELDS_AND_HINTS: dict[type[Any], tuple[dict[str, dataclasses.Field[Any]], dict[str, Any]]] = {}


def _fields_and_hints(annotation: type[Any]) -> tuple[dict[str, dataclasses.Field[Any]], dict[str, Any]]:
    """A dataclass's fields by name and its resolved type hints, computed once per class
    (`typing.get_type_hints` evaluates every annotation string: it was 2/3 of the time to read events)."""
    if annotation not in _FIELDS_AND_HINTS:
        fields = {field.name: field for field in dataclasses.fields(annotation)}
        _FIELDS_AND_HINTS[annotation] = fields, typing.get_type_hints(annotation)
    return _FIELDS_AND_HINTS[annotation]


def _dataclass_from_json(value: Any, annotation: type[Any], path: str) -> Any:
    if not isinstance(value, Mapping):
        raise ValueError(f"{path}: expected an object for {annotation.__name__}, got {short_repr(value)}")
    fields, hints = _fields_and_hints(annotation)
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise ValueError(f"{path}: unknown fields {short_repr(unknown)}; {annotation.__name__} has {sorted(fields)}")
    arguments = {}
    for name, field in fields.items():
        if name in value:
            arguments[name] = _from_json(value[name], hints[name], f"{path}.{name}")
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise ValueError(f"{path}: missing required field {name!r}")
    return annotation(**arguments)


def _tuple_from_json(value: Any, arguments: tuple[Any, ...], path: str) -> tuple[Any, ...]:
    if not isinstance(value, list | tuple):
        raise ValueError(f"{path}: expected a list, got {short_repr(value)}")
    if len(arguments) == 2 and arguments[1] is Ellipsis:
        return tuple(_from_json(item, arguments[0], f"{path}[{i}]") for i, item in enumerate(value))
    if len(value) != len(arguments):
        raise ValueError(f"{path}: expected {len(arguments)} items, got {len(value)}")
    return tuple(
        _from_json(item, argument, f"{path}[{i}]")
        for i, (item, argument) in enumerate(zip(value, arguments, strict=True))
    )


#: The largest magnitude of an integer field: morphogen writes counts and epochs that fit in 64 bits, and a larger
#: one in an untrusted file would overflow whatever reads it as a float (a chart's axis, a mean).
MAX_INTEGER = 2**63 - 1


def _bounded_integer(value: Any) -> bool:
    """An int within `MAX_INTEGER` (bool is a subclass of int in Python, so it is rejected explicitly)."""
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) <= MAX_INTEGER


def _scalar_from_json(value: Any, annotation: Any, path: str) -> Any:
    if annotation is float and (isinstance(value, float) or _bounded_integer(value)):
        return float(value)
    if annotation is float and isinstance(value, str) and value in NON_FINITE_TOKENS:
        return NON_FINITE_TOKENS[value]
    if annotation is int and _bounded_integer(value):
        return value
    if annotation in (bool, str) and isinstance(value, annotation):
        return value
    raise ValueError(f"{path}: expected {getattr(annotation, '__name__', annotation)}, got {short_repr(value)}")
