"""Feature encoding: an `EpisodeSnapshot` -> what the growth policy sees, the same way on every task and host.

An observation has three parts, whose sizes do not depend on the task, the host, its number of slots or
the episode's length, so that one policy acts on any of them:

- `globals` ``[GLOBAL_SIZE]``: the episode as a whole (progress as a fraction, accuracy and loss
  history, how many slots are in each stage, the last action, parameters added, the advised op);
- `slots` ``[n_slots, SLOT_SIZE]``: one row per slot, the same features for every slot (its stage,
  alpha, contributions, gradient health, its seed's kind and size, where it sits in the host, whether the
  advice names it);
- `blueprints` ``[n_slots, n_blueprints, BLUEPRINT_SIZE]``: for each slot, each blueprint a GERMINATE
  may name, described by its kind and the parameters and forward FLOPs it would add there (relative to
  the host's), not by its index in a registry, so blueprints registered by a user are described like the
  built-in ones; and, where the episode measured them (`env/growth_signals.py`), the growth signal the
  blueprint would act on there (the slot's depth signal, or its width signal for new channels) and that
  signal per relative FLOP: the heuristic's score for choosing where and how to grow; and whether the advice
  names it there.

*Advice* is an `Action` the caller passes along with the snapshot: what the rule-based controller would do
now (`control/advice.py`). Its op is marked in the globals (after `advice_given`), its slot in that slot's
row, its blueprint in that slot's blueprint rows (a GROW's in every slot's). Without advice every such
feature is 0 (the Gymnasium env passes none unless given an `advisor`).

Rules of the encoding (docs/architecture.md#controller):

- Scales mean the same on every task. Accuracies are read against the task's chance level:
  ``score = (accuracy - chance) / (100 - chance)``, so 0 is guessing and 1 is perfect on any number of
  classes (a task with its own metric has no chance level: its score is the metric / 100).
  Contributions and gains are divided by the same ``100 - chance``. Losses are read against the
  validation loss of the untrained model: ``log(loss / initial loss)``, 0 at the start and negative as
  training improves. Growth signals (first-order loss changes) are read against the current validation
  loss, as ``log1p(signal / |loss|)``. Epochs are fractions of the episode, parameter counts ``log1p`` of their ratio to
  the host's, slot widths and resolutions fractions of the host's.
- Every value that may be unmeasured is written as two features: the value (or `UNMEASURED` when
  it is None) followed by a ``*_measured`` flag (1.0 measured, 0.0 not). An unknown therefore never
  looks like a measured 0.
- The last `HISTORY_LENGTH` scores and losses are right-aligned (``[-1]`` is the newest, the current
  epoch's), padded in front with `UNMEASURED`, and followed by a count of the real entries over
  `HISTORY_LENGTH`.
- Heavy-tailed magnitudes (gradient norms and ratios) are ``log1p`` of the value clipped to
  `MAGNITUDE_CEILING`; a non-finite magnitude is written as the ceiling (a measurement of "too
  large", not an absence of one). Loss ratios are clipped to ±`LOG_RATIO_LIMIT`.
- Slots appear in the snapshot's order (the model's, which is the slot head's). Nothing depends on
  that order beyond the row a slot lands in: the policy treats slots as a set.
- Pure Python/NumPy on plain numbers: nothing here touches a tensor or synchronizes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple, Protocol

import numpy as np

from morphogen.core.blueprints import BlueprintKind, get_blueprint
from morphogen.core.lifecycle import Stage
from morphogen.env.actions import Action, ActionSpace, Op
from morphogen.env.growth_signals import MIN_RELATIVE_FLOPS
from morphogen.env.snapshot import HISTORY_LENGTH, EpisodeSnapshot, SlotSnapshot

__all__ = [
    "ADVICE_COLUMNS",
    "ADVICE_OP_COLUMNS",
    "BLUEPRINT_FEATURES",
    "BLUEPRINT_KINDS",
    "BLUEPRINT_SIZE",
    "GLOBAL_FEATURES",
    "GLOBAL_SIZE",
    "HISTORY_LENGTH",
    "LOG_RATIO_LIMIT",
    "MAGNITUDE_CEILING",
    "SLOT_FEATURES",
    "SLOT_SIZE",
    "UNMEASURED",
    "Advisor",
    "EncodedObservation",
    "blueprint_kind",
    "encode_observation",
    "feature_bounds",
    "log_magnitude",
]

#: Written in place of a value that was not measured; always followed by its ``*_measured`` flag = 0.
UNMEASURED = -1.0
#: Losses, gradient norms and ratios are clipped here before ``log1p`` (log1p(1e6) ~ 13.8).
MAGNITUDE_CEILING = 1e6
#: ``log(loss / initial loss)`` is clipped to ±this (a diverged loss reads as +this).
LOG_RATIO_LIMIT = 10.0

#: What a blueprint does to the host, as the policy sees it: deepen (a residual block of the slot's width),
#: widen (an inverted residual wider than the slot, new channels, or a wide branch), adapter (a low-rank
#: update), attention, norm, block (a whole host block), other (a user's blueprint of unknown kind).
BLUEPRINT_KINDS = ("deepen", "widen", "adapter", "attention", "norm", "block", "other")
_BUILT_IN_KINDS = {
    "norm": "norm", "attention": "attention", "depthwise": "deepen", "bottleneck": "deepen", "conv_small": "deepen",
    "conv_light": "deepen", "conv_heavy": "deepen", "widen_x2": "widen", "widen_x4": "widen", "widen_x8": "widen",
    "lora": "adapter", "lora_large": "adapter", "mlp_small": "deepen", "mlp": "deepen",
    "wider": "widen", "wider_half": "widen", "branch_wide": "widen", "block": "block", "block_copy": "block",
}


def blueprint_kind(name: str) -> str:
    """The kind of a blueprint (one of `BLUEPRINT_KINDS`): a built-in's own, "other" for a user's."""
    return _BUILT_IN_KINDS.get(name, "other")


def _history_names(series: str) -> list[str]:
    return [*(f"{series}[{offset}]" for offset in range(-HISTORY_LENGTH, 0)), f"{series}_count"]


GLOBAL_FEATURES: tuple[str, ...] = (
    "epoch_fraction", "score", "loss_ratio", "train_loss_ratio", "train_loss_ratio_measured",
    *_history_names("score_history"), *_history_names("loss_ratio_history"),
    "score_delta", "score_delta_measured",
    *(f"stage_fraction/{stage.value}" for stage in Stage),
    *(f"last_op/{op.name}" for op in Op),
    "last_action_succeeded", "added_parameters", "gain_over_all_off", "gain_over_all_off_measured", "rolled_back",
    "slot_share", "advice_given", *(f"advice/{op.name}" for op in Op),
)
"""Names of the `globals` features, in order."""
SLOT_FEATURES: tuple[str, ...] = (
    *(f"stage/{stage.value}" for stage in Stage),
    "alpha", "alpha_target", "alpha_progress", "alpha_ramping",
    *(name for optional in ("contribution", "contribution_trend", "gradient_norm", "gradient_health",
                            "gradient_ratio") for name in (optional, f"{optional}_measured")),
    "epochs_in_stage", "seed_age", "seed_parameters", "width_fraction", "resolution_fraction", "depth_fraction",
    *(f"seed_kind/{kind}" for kind in BLUEPRINT_KINDS), "advised",
)
"""Names of the features of each row of `slots`, in order."""
BLUEPRINT_FEATURES: tuple[str, ...] = (*(f"kind/{kind}" for kind in BLUEPRINT_KINDS), "parameters", "flops",
                                        "flops_measured", "growth_signal", "growth_signal_per_flop",
                                        "growth_signal_measured", "advised")
"""Names of the features of each blueprint of a slot, in order."""
GLOBAL_SIZE, SLOT_SIZE, BLUEPRINT_SIZE = len(GLOBAL_FEATURES), len(SLOT_FEATURES), len(BLUEPRINT_FEATURES)

_UNIT = (0.0, 1.0)
_LOG_RATIO = (-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
#: A `log_magnitude`, or `UNMEASURED` in its place.
_OPTIONAL_MAGNITUDE = (UNMEASURED, math.log1p(MAGNITUDE_CEILING))
_COUNT = (0.0, math.inf)
_UNBOUNDED = (-math.inf, math.inf)
#: Flags, one-hots and fractions in [0, 1], by name prefix (one-hots) or exact name.
_UNIT_PREFIXES = ("stage_fraction/", "last_op/", "advice/", "stage/", "seed_kind/", "kind/")
_UNIT_NAMES = frozenset({
    "epoch_fraction", "score_history_count", "loss_ratio_history_count", "last_action_succeeded", "rolled_back",
    "slot_share", "advice_given", "alpha", "alpha_target", "alpha_progress", "alpha_ramping", "width_fraction",
    "resolution_fraction", "depth_fraction", "advised",
})
_BOUNDS_BY_NAME = {
    "loss_ratio": _LOG_RATIO, "train_loss_ratio": _LOG_RATIO,  # clipped; UNMEASURED (-1) lies inside
    "gradient_norm": _OPTIONAL_MAGNITUDE, "gradient_ratio": _OPTIONAL_MAGNITUDE,
    "growth_signal": _OPTIONAL_MAGNITUDE, "growth_signal_per_flop": _OPTIONAL_MAGNITUDE,
    "gradient_health": (UNMEASURED, 1.0),
    "flops": (UNMEASURED, math.inf),
    "added_parameters": _COUNT, "seed_parameters": _COUNT, "parameters": _COUNT,
    "epochs_in_stage": _COUNT, "seed_age": _COUNT,
}


def feature_bounds(name: str) -> tuple[float, float]:
    """(low, high) that feature `name` (of `GLOBAL_FEATURES`, `SLOT_FEATURES` or `BLUEPRINT_FEATURES`) never
    leaves. Scores, contributions and gains are unbounded: a task with its own metric gives them no range."""
    if name.endswith("_measured") or name in _UNIT_NAMES or name.startswith(_UNIT_PREFIXES):
        return _UNIT
    if name.startswith("loss_ratio_history["):
        return _LOG_RATIO
    return _BOUNDS_BY_NAME.get(name, _UNBOUNDED)
#: The advice's features among the globals (`advice_given`, then the advised op one-hot): 0/1 flags that a policy
#: reads as they are, unstandardized, so an op it never saw advised (GROW on a transformer, for a policy trained
#: on convolutional hosts) reads 1 as every other op does.
ADVICE_COLUMNS = slice(GLOBAL_FEATURES.index("advice_given"), GLOBAL_FEATURES.index("advice_given") + 1 + len(Op))
#: The advised op one-hot among the globals, in `Op` order.
ADVICE_OP_COLUMNS = slice(ADVICE_COLUMNS.start + 1, ADVICE_COLUMNS.stop)


class Advisor(Protocol):
    """Whatever proposes the advice an observation carries, one episode at a time (`control/advice.py`'s
    `HeuristicAdvisor`): `advise` before each step, `taken` with the action the episode then took."""

    def reset(self) -> None: ...

    def advise(self, snapshot: EpisodeSnapshot, masks: Sequence[np.ndarray], space: ActionSpace) -> Action: ...

    def taken(self, action: Action) -> None: ...


class EncodedObservation(NamedTuple):
    """What the policy sees for one env at one step (float32 arrays)."""

    #: [GLOBAL_SIZE], laid out as `GLOBAL_FEATURES`.
    globals: np.ndarray
    #: [n_slots, SLOT_SIZE], one row per slot in the snapshot's order, laid out as `SLOT_FEATURES`.
    slots: np.ndarray
    #: [n_slots, n_blueprints, BLUEPRINT_SIZE], laid out as `BLUEPRINT_FEATURES`.
    blueprints: np.ndarray


def log_magnitude(value: float) -> float:
    """``log1p`` of a non-negative magnitude clipped to `MAGNITUDE_CEILING`; NaN/inf map to the ceiling."""
    if not math.isfinite(value):
        value = MAGNITUDE_CEILING
    return math.log1p(min(max(value, 0.0), MAGNITUDE_CEILING))


def loss_ratio(loss: float, initial: float | None) -> float:
    """``log(loss / initial)`` clipped to ±`LOG_RATIO_LIMIT`; a relative difference where either is <= 0
    (a user's loss may be negative); 0 without an initial loss; a non-finite loss reads as the limit."""
    if not math.isfinite(loss):
        return LOG_RATIO_LIMIT
    if initial is None or not math.isfinite(initial):
        return 0.0
    positive = loss > 0.0 and initial > 0.0
    ratio = math.log(loss) - math.log(initial) if positive else (loss - initial) / max(abs(initial), 1e-8)
    return min(max(ratio, -LOG_RATIO_LIMIT), LOG_RATIO_LIMIT)


class _Scale(NamedTuple):
    """How accuracy points become scores: ``(points - chance) / span``."""

    chance: float
    span: float

    def score(self, accuracy: float) -> float:
        return (accuracy - self.chance) / self.span


def _scale(snapshot: EpisodeSnapshot) -> _Scale:
    chance = snapshot.chance_accuracy
    if chance is None or not 0.0 <= chance < 100.0:
        return _Scale(0.0, 100.0)
    return _Scale(chance, 100.0 - chance)


def encode_observation(snapshot: EpisodeSnapshot, advice: Action | None = None) -> EncodedObservation:
    """The policy's view of `snapshot`, with `advice` (what the rule-based controller would do now; None: no
    advice, `advice_given` 0) marked in the globals, the slot and the blueprint it names; raises ValueError naming
    the features a broken snapshot made non-finite."""
    scale = _scale(snapshot)
    global_values = np.asarray(_global_values(snapshot, scale) + _advice_values(advice), dtype=np.float32)
    slot_rows = np.asarray([[*_slot_values(slot, snapshot, scale), _advises_slot(advice, slot.slot_id)]
                            for slot in snapshot.slots], dtype=np.float32).reshape(len(snapshot.slots), SLOT_SIZE)
    blueprint_rows = _blueprint_values(snapshot)
    if advice is not None and advice.slot is not None and advice.blueprint in snapshot.blueprints:
        rows = [row for row, slot in enumerate(snapshot.slots) if slot.slot_id == advice.slot]
        blueprint_rows[rows, snapshot.blueprints.index(advice.blueprint), -1] = 1.0
    elif advice is not None and advice.op is Op.GROW and advice.blueprint in snapshot.blueprints:
        blueprint_rows[:, snapshot.blueprints.index(advice.blueprint), -1] = 1.0  # GROW fills every empty slot
    for name, names, values in (("globals", GLOBAL_FEATURES, global_values),
                                ("slots", SLOT_FEATURES, slot_rows.reshape(-1, SLOT_SIZE))):
        finite_columns = np.asarray(np.isfinite(values).reshape(-1, len(names)).all(axis=0), dtype=bool)
        finite = [bool(finite_columns[index]) for index in range(len(names))]
        if not all(finite):
            bad = [feature for feature, ok in zip(names, finite, strict=True) if not ok]
            raise ValueError(f"non-finite {name} features {bad}: the snapshot carries NaN/inf where a finite "
                             "measurement (or None for 'not measured') is expected")
    return EncodedObservation(global_values, slot_rows, blueprint_rows)


def _global_values(snapshot: EpisodeSnapshot, scale: _Scale) -> list[float]:
    initial = snapshot.initial_val_loss
    values = [
        snapshot.progress,
        scale.score(snapshot.val_accuracy),
        loss_ratio(snapshot.val_loss, initial),
        *_optional(None if snapshot.train_loss is None else loss_ratio(snapshot.train_loss, initial)),
    ]
    accuracies = snapshot.accuracy_history[-HISTORY_LENGTH:]
    values += _right_aligned([scale.score(accuracy) for accuracy in accuracies])
    values += _right_aligned([loss_ratio(loss, initial) for loss in snapshot.loss_history[-HISTORY_LENGTH:]])
    values += _optional((accuracies[-1] - accuracies[-2]) / scale.span if len(accuracies) >= 2 else None)
    n_slots = max(len(snapshot.slots), 1)
    counts = snapshot.stage_counts()
    values += [counts[stage] / n_slots for stage in Stage]
    last_op = _checked_op(snapshot.last_op)
    values += [1.0 if op is last_op else 0.0 for op in Op]
    values.append(1.0 if snapshot.last_action_succeeded else 0.0)
    values.append(math.log1p(max(snapshot.added_parameters, 0) / max(snapshot.host_parameters, 1)))
    all_off = snapshot.accuracy_all_off
    values += _optional(None if all_off is None else (snapshot.val_accuracy - all_off) / scale.span)
    values.append(1.0 if snapshot.rolled_back else 0.0)
    values.append(1.0 / n_slots)
    return values


def _advice_values(advice: Action | None) -> list[float]:
    """`advice_given`, then the advised op one-hot (all zero without advice)."""
    return [0.0 if advice is None else 1.0, *(1.0 if advice is not None and op is advice.op else 0.0 for op in Op)]


def _advises_slot(advice: Action | None, slot_id: str) -> float:
    """1.0 where the advice names slot `slot_id`, else 0.0."""
    return 1.0 if advice is not None and advice.slot == slot_id else 0.0


def _slot_values(slot: SlotSnapshot, snapshot: EpisodeSnapshot, scale: _Scale) -> list[float]:
    epochs = max(snapshot.max_epochs, 1)
    values = [1.0 if stage is slot.stage else 0.0 for stage in Stage]
    values += [slot.alpha, slot.alpha_target, slot.alpha_progress, 1.0 if slot.alpha_ramping else 0.0]
    contribution = slot.contribution
    trend = None
    if contribution is not None and slot.previous_contribution is not None:
        trend = (contribution - slot.previous_contribution) / scale.span
    values += _optional(None if contribution is None else contribution / scale.span)
    values += _optional(trend)
    values += _optional(None if slot.gradient_norm is None else log_magnitude(slot.gradient_norm))
    values += _optional(slot.gradient_health)
    values += _optional(None if slot.gradient_ratio is None else log_magnitude(slot.gradient_ratio))
    values += [slot.epochs_in_stage / epochs, slot.seed_age / epochs,
               math.log1p(max(slot.seed_parameters, 0) / max(snapshot.host_parameters, 1)),
               slot.width_fraction, slot.resolution_fraction, slot.depth_fraction]
    values += _kind_one_hot(None if slot.blueprint is None else blueprint_kind(slot.blueprint))
    return values


def _blueprint_values(snapshot: EpisodeSnapshot) -> np.ndarray:
    """[n_slots, n_blueprints, BLUEPRINT_SIZE]: each blueprint's kind, the parameters and FLOPs it adds in each
    slot relative to the host's (FLOPs unmeasured when the snapshot counted none), and the growth signal it
    would act on there, alone and per relative FLOP (unmeasured where the episode measured no signals, and where
    the blueprint cannot go: it would add no parameters)."""
    n_slots, n_blueprints = len(snapshot.slots), len(snapshot.blueprints)
    table = np.zeros((n_slots, n_blueprints, BLUEPRINT_SIZE), dtype=np.float32)
    if n_blueprints == 0:
        return table
    kinds = np.asarray([_kind_one_hot(blueprint_kind(name)) for name in snapshot.blueprints], dtype=np.float32)
    table[:, :, :len(BLUEPRINT_KINDS)] = kinds
    column = len(BLUEPRINT_KINDS)
    parameters = _per_slot(snapshot.blueprint_parameters, "blueprint_parameters", n_slots, n_blueprints)
    table[:, :, column] = np.log1p(parameters / max(snapshot.host_parameters, 1))
    relative_flops = None
    if snapshot.host_flops > 0 and snapshot.blueprint_flops:
        relative_flops = _per_slot(snapshot.blueprint_flops, "blueprint_flops", n_slots, n_blueprints) \
            / snapshot.host_flops
        table[:, :, column + 1] = np.log1p(relative_flops)
        table[:, :, column + 2] = 1.0
    else:
        table[:, :, column + 1] = UNMEASURED
    table[:, :, column + 3:column + 5] = UNMEASURED
    signals = _relative_signals(snapshot)
    if signals is None:
        return table
    widens = [_adds_channels(snapshot.topology, name) for name in snapshot.blueprints]
    for row, (depth, width) in enumerate(signals):
        for index, new_channels in enumerate(widens):
            signal = width if new_channels else depth
            if signal is None or parameters[row, index] == 0:  # no signal where the blueprint cannot go
                continue
            table[row, index, column + 3] = log_magnitude(signal)
            if relative_flops is not None:
                per_flop = signal / max(float(relative_flops[row, index]), MIN_RELATIVE_FLOPS)
                table[row, index, column + 4] = log_magnitude(per_flop)
            table[row, index, column + 5] = 1.0
    return table


def _relative_signals(snapshot: EpisodeSnapshot) -> list[tuple[float | None, float | None]] | None:
    """Each slot's (depth, width) growth signals over |validation loss|; None when no slot has any, or the loss
    is not a finite non-zero number to read them against."""
    loss = abs(snapshot.val_loss)
    if not (math.isfinite(loss) and loss > 0.0) or all(slot.depth_signal is None for slot in snapshot.slots):
        return None
    return [(None if slot.depth_signal is None else slot.depth_signal / loss,
             None if slot.width_signal is None else slot.width_signal / loss) for slot in snapshot.slots]


def _adds_channels(topology: str, name: str) -> bool:
    """Whether `name` grows new channels of the layers around a slot (read by the width signal), not a module
    that adds its output at the slot (the depth signal); an unknown name counts as the latter."""
    try:
        return get_blueprint(topology, name).kind is BlueprintKind.WIDEN
    except ValueError:  # an unknown blueprint (UnknownBlueprintError) or topology
        return False


def _per_slot(table: tuple[tuple[int, ...], ...], name: str, n_slots: int, n_blueprints: int) -> np.ndarray:
    """`table` as float64 [n_slots, n_blueprints]; raises ValueError unless it has one row per slot."""
    if len(table) != n_slots or any(len(row) != n_blueprints for row in table):
        raise ValueError(f"{name} must have one row of {n_blueprints} counts per slot ({n_slots}); "
                         f"got {[len(row) for row in table]}")
    return np.asarray(table, dtype=np.float64)


def _kind_one_hot(kind: str | None) -> list[float]:
    return [1.0 if kind == name else 0.0 for name in BLUEPRINT_KINDS]


def _optional(value: float | None) -> list[float]:
    """(value, 1.0) when measured, (`UNMEASURED`, 0.0) when not."""
    return [UNMEASURED, 0.0] if value is None else [value, 1.0]


def _right_aligned(series: Sequence[float]) -> list[float]:
    """The last `HISTORY_LENGTH` values, padded in front with `UNMEASURED`, then count / HISTORY_LENGTH."""
    padding = [UNMEASURED] * (HISTORY_LENGTH - len(series))
    return [*padding, *series, len(series) / HISTORY_LENGTH]


def _checked_op(index: int) -> Op:
    try:
        return Op(index)
    except ValueError:
        raise ValueError(f"snapshot.last_op={index} is not an op index; valid: "
                         f"{', '.join(f'{op.value}={op.name}' for op in Op)}") from None
