"""Feature encoding: an `EpisodeSnapshot` -> a flat float32 vector plus one blueprint id per slot.

Rules of the encoding (docs/architecture.md#controller):

- Every value that may be unmeasured is written as two features: the value (or `UNMEASURED` when
  it is None) followed by a ``*_measured`` flag (1.0 measured, 0.0 not). An unknown therefore never
  looks like a measured 0: a measured 0 reads ``(0.0, 1.0)``, an unknown ``(-1.0, 0.0)``.
- The last `HISTORY_LENGTH` accuracies and losses are right-aligned (``[-1]`` is the newest, which
  is the current epoch's value), padded in front with `UNMEASURED`, and followed by a count of the
  real entries over `HISTORY_LENGTH`, so the padding is always identifiable.
- Scales are kept roughly O(1): accuracies and contributions in fractions (points / 100), epochs as
  fractions of the episode, parameter counts relative to the host. Losses, gradient norms and
  gradient ratios are heavy-tailed and written as ``log1p`` of the value clipped to
  `MAGNITUDE_CEILING`; a non-finite magnitude (a diverged loss, an exploded gradient) is written as
  the ceiling, since it is a measurement of "too large", not an absence of one.
- Slots appear in the encoder's `slot_ids` order (the order of the action space's slot head), each
  block prefixed ``slot/<id>/`` in `feature_names()`. Blueprint ids go out separately as integers
  for the policy's embedding table: 0 is "no seed", 1..n_blueprints follow the registry order.
- Pure Python/NumPy on plain numbers: nothing here touches a tensor or synchronizes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from morphogen.core.blueprints import blueprint_names
from morphogen.core.lifecycle import Stage
from morphogen.env.actions import Op
from morphogen.env.snapshot import HISTORY_LENGTH, EpisodeSnapshot, SlotSnapshot

__all__ = [
    "MAGNITUDE_CEILING",
    "UNMEASURED",
    "EncodedObservation",
    "ObservationEncoder",
    "log_magnitude",
]

#: Written in place of a value that was not measured; always followed by its ``*_measured`` flag = 0.
#: Negative so that it sits outside the range of every measured non-negative feature.
UNMEASURED = -1.0
#: Losses, gradient norms and ratios are clipped here before ``log1p`` (log1p(1e6) ~ 13.8).
MAGNITUDE_CEILING = 1e6


class EncodedObservation(NamedTuple):
    """What the policy sees for one env at one step."""

    #: float32 [size], laid out as `ObservationEncoder.feature_names()`.
    features: np.ndarray
    #: int64 [n_slots]: blueprint id per slot in the encoder's slot order; 0 = no seed.
    blueprint_ids: np.ndarray


def log_magnitude(value: float) -> float:
    """``log1p`` of a non-negative magnitude clipped to `MAGNITUDE_CEILING`; NaN/inf map to the ceiling."""
    if not math.isfinite(value):
        value = MAGNITUDE_CEILING
    return math.log1p(min(max(value, 0.0), MAGNITUDE_CEILING))


class ObservationEncoder:
    """Encodes snapshots of episodes whose model has `slot_ids`, for a host of `topology`."""

    def __init__(self, slot_ids: Sequence[str], topology: str) -> None:
        self.slot_ids = tuple(slot_ids)
        if not self.slot_ids:
            raise ValueError("slot_ids is empty: pass the model's slot ids (MorphogeneticModel.slot_ids)")
        if len(set(self.slot_ids)) != len(self.slot_ids):
            raise ValueError(f"slot_ids must be unique, got {self.slot_ids}")
        self.topology = topology
        self.blueprints = blueprint_names(topology)
        self._names = tuple(self._base_names() + [
            name for slot_id in self.slot_ids for name in self._slot_names(slot_id)
        ])

    @property
    def n_slots(self) -> int:
        return len(self.slot_ids)

    @property
    def n_blueprints(self) -> int:
        """Blueprints of the topology; ids run 0 (no seed) .. n_blueprints."""
        return len(self.blueprints)

    @property
    def size(self) -> int:
        """Length of the feature vector."""
        return len(self._names)

    def feature_names(self) -> list[str]:
        """The name of every position of `EncodedObservation.features`, in order."""
        return list(self._names)

    # ---------------------------------------------------------------- names (the layout)
    # The names below and the values in `_base_values`/`_slot_values` must stay in the same order;
    # tests/env/test_observation.py checks every named position against a hand-computed value.
    @staticmethod
    def _base_names() -> list[str]:
        names = ["epoch_fraction", "val_loss", "val_accuracy", "train_loss", "train_loss_measured"]
        for series in ("accuracy_history", "loss_history"):
            names += [f"{series}[{offset}]" for offset in range(-HISTORY_LENGTH, 0)]
            names.append(f"{series}_count")
        names += ["accuracy_delta", "accuracy_delta_measured"]
        names += [f"stage_count/{stage.value}" for stage in Stage]
        names += [f"last_op/{op.name}" for op in Op]
        names += ["last_action_succeeded", "added_parameter_ratio",
                  "gain_over_all_off", "gain_over_all_off_measured", "rolled_back"]
        return names

    @staticmethod
    def _slot_names(slot_id: str) -> list[str]:
        prefix = f"slot/{slot_id}/"
        names = [f"stage/{stage.value}" for stage in Stage]
        names += ["alpha", "alpha_target", "alpha_progress", "alpha_ramping"]
        for optional in ("contribution", "contribution_trend", "gradient_norm", "gradient_health",
                         "gradient_ratio"):
            names += [optional, f"{optional}_measured"]
        names += ["epochs_in_stage", "seed_age", "seed_parameter_ratio"]
        return [prefix + name for name in names]

    # ---------------------------------------------------------------- values
    def encode(self, snapshot: EpisodeSnapshot) -> EncodedObservation:
        """Features and blueprint ids of `snapshot`; raises ValueError if its slots are not this encoder's."""
        slots = self._slots_in_order(snapshot)
        values = self._base_values(snapshot)
        for slot in slots:
            values += self._slot_values(slot, snapshot)
        assert len(values) == self.size, "feature values and feature_names() are out of step"
        features = np.asarray(values, dtype=np.float32)
        if not np.isfinite(features).all():
            bad = [name for name, ok in zip(self._names, np.isfinite(features), strict=True) if not ok]
            raise ValueError(f"non-finite observation features {bad}: the snapshot carries NaN/inf where "
                             "a finite measurement (or None for 'not measured') is expected")
        blueprint_ids = np.asarray([slot.blueprint_id for slot in slots], dtype=np.int64)
        if blueprint_ids.min() < 0 or blueprint_ids.max() > self.n_blueprints:
            raise ValueError(f"blueprint ids {blueprint_ids.tolist()} outside 0..{self.n_blueprints} for "
                             f"topology {self.topology!r}: was the snapshot made for another topology?")
        return EncodedObservation(features, blueprint_ids)

    def _slots_in_order(self, snapshot: EpisodeSnapshot) -> list[SlotSnapshot]:
        by_id = {slot.slot_id: slot for slot in snapshot.slots}
        snapshot_ids = [slot.slot_id for slot in snapshot.slots]
        if len(by_id) != len(snapshot_ids) or set(by_id) != set(self.slot_ids):
            raise ValueError(f"snapshot slots {snapshot_ids} do not match the encoder's slots "
                             f"{list(self.slot_ids)}: build the encoder from the same model's slot_ids")
        return [by_id[slot_id] for slot_id in self.slot_ids]

    def _base_values(self, snapshot: EpisodeSnapshot) -> list[float]:
        values = [
            snapshot.progress,
            log_magnitude(snapshot.val_loss),
            snapshot.val_accuracy / 100.0,
            *_optional(None if snapshot.train_loss is None else log_magnitude(snapshot.train_loss)),
        ]
        accuracies = snapshot.accuracy_history[-HISTORY_LENGTH:]
        values += _right_aligned([accuracy / 100.0 for accuracy in accuracies])
        values += _right_aligned([log_magnitude(loss) for loss in snapshot.loss_history[-HISTORY_LENGTH:]])
        delta = (accuracies[-1] - accuracies[-2]) / 100.0 if len(accuracies) >= 2 else None
        values += _optional(delta)

        counts = snapshot.stage_counts()
        values += [counts[stage] / self.n_slots for stage in Stage]
        last_op = _checked_op(snapshot.last_op)
        values += [1.0 if op is last_op else 0.0 for op in Op]
        values.append(1.0 if snapshot.last_action_succeeded else 0.0)
        values.append(snapshot.added_parameters / max(snapshot.host_parameters, 1))
        all_off = snapshot.accuracy_all_off
        values += _optional(None if all_off is None else (snapshot.val_accuracy - all_off) / 100.0)
        values.append(1.0 if snapshot.rolled_back else 0.0)
        return values

    @staticmethod
    def _slot_values(slot: SlotSnapshot, snapshot: EpisodeSnapshot) -> list[float]:
        epochs = max(snapshot.max_epochs, 1)
        values = [1.0 if stage is slot.stage else 0.0 for stage in Stage]
        values += [slot.alpha, slot.alpha_target, slot.alpha_progress, 1.0 if slot.alpha_ramping else 0.0]
        contribution = slot.contribution
        trend = None
        if contribution is not None and slot.previous_contribution is not None:
            trend = (contribution - slot.previous_contribution) / 100.0
        values += _optional(None if contribution is None else contribution / 100.0)
        values += _optional(trend)
        values += _optional(None if slot.gradient_norm is None else log_magnitude(slot.gradient_norm))
        values += _optional(slot.gradient_health)
        values += _optional(None if slot.gradient_ratio is None else log_magnitude(slot.gradient_ratio))
        values += [slot.epochs_in_stage / epochs, slot.seed_age / epochs,
                   slot.seed_parameters / max(snapshot.host_parameters, 1)]
        return values


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
