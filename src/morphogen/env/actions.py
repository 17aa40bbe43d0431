"""The factored action space: op, slot, blueprint, blend, blend epochs, alpha target, alpha speed, alpha curve.

Masks encode only what is physically legal now (a gate may still refuse a legal move; that refusal
is reported, not masked). The op mask is [n_ops]; every other head gets an op-conditioned mask
[n_ops, n_choices], so a sampled (op, slot) pair is always a legal combination. Heads that do not
matter for an op (`HEAD_RELEVANCE`) are forced to index 0 and carry no log-probability.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from morphogen.core.alpha import AlphaCurve, AlphaMode
from morphogen.core.blend import BlendKind
from morphogen.core.blueprints import blueprint_names
from morphogen.core.lifecycle import PRUNABLE_STAGES, Stage
from morphogen.core.model import MorphogeneticModel
from morphogen.core.slot import SeedSlot


class Op(enum.IntEnum):
    WAIT = 0
    GERMINATE = 1
    SET_ALPHA_TARGET = 2
    PRUNE = 3
    FOSSILIZE = 4
    ADVANCE = 5
    GROW = 6
    """Germinate one blueprint in every empty slot at once, each seed trained with the host from the start
    (depth growth: a `block` in each slot of a host with a slot after every layer doubles its depth)."""


HEADS = ("op", "slot", "blueprint", "blend", "blend_epochs", "alpha_target", "alpha_speed", "alpha_curve")
#: Blend operator of a new seed (how its output joins the host's).
BLEND_KINDS = (BlendKind.ADD, BlendKind.MULTIPLY, BlendKind.GATE)
#: Epochs of the 0 -> 1 alpha ramp of a new seed when it starts blending (GROW: of a seed that is not the
#: identity at birth; one that is enters at alpha 1).
BLEND_EPOCHS = (3, 5, 8)
ALPHA_TARGETS = (0.0, 0.3, 0.6, 1.0)
#: Epochs of a SET_ALPHA_TARGET ramp (0 snaps).
ALPHA_SPEEDS = (0, 1, 3, 5)
ALPHA_CURVES = (AlphaCurve.LINEAR, AlphaCurve.COSINE, AlphaCurve.SIGMOID)

#: The values of every head whose choices do not depend on the model (all but `slot` and `blueprint`).
FIXED_CHOICES: dict[str, tuple[object, ...]] = {
    "op": tuple(Op), "blend": BLEND_KINDS, "blend_epochs": BLEND_EPOCHS, "alpha_target": ALPHA_TARGETS,
    "alpha_speed": ALPHA_SPEEDS, "alpha_curve": ALPHA_CURVES,
}

_RELEVANT_HEADS: dict[Op, frozenset[str]] = {
    Op.WAIT: frozenset(),
    Op.GERMINATE: frozenset({"slot", "blueprint", "blend", "blend_epochs"}),
    Op.SET_ALPHA_TARGET: frozenset({"slot", "alpha_target", "alpha_speed", "alpha_curve"}),
    Op.PRUNE: frozenset({"slot"}),
    Op.FOSSILIZE: frozenset({"slot"}),
    Op.ADVANCE: frozenset({"slot"}),
    Op.GROW: frozenset({"blueprint", "blend_epochs"}),
}
#: [n_ops, n_heads] bool: which heads matter for each op (the op head always does).
HEAD_RELEVANCE = np.array(
    [[head == "op" or head in _RELEVANT_HEADS[op] for head in HEADS] for op in Op], dtype=bool
)

#: A seed must be at least this many epochs old before it may be pruned: younger, its worth is not measured yet.
MIN_PRUNE_AGE = 5
_ADVANCEABLE = frozenset({Stage.GERMINATED, Stage.TRAINING, Stage.BLENDING})


@dataclass(frozen=True)
class Action:
    """One controller decision in named form. Unused fields keep their canonical defaults."""

    op: Op = Op.WAIT
    slot: str | None = None
    blueprint: str | None = None
    blend: BlendKind = BlendKind.ADD
    blend_epochs: int = BLEND_EPOCHS[0]
    alpha_target: float = ALPHA_TARGETS[0]
    alpha_speed: int = ALPHA_SPEEDS[0]
    alpha_curve: AlphaCurve = AlphaCurve.LINEAR
    #: Why the controller chose it, for people (the heuristic says; a learned policy does not): shown with the
    #: action in telemetry and reports, never part of the decision, its state or its equality.
    why: str = field(default="", compare=False)

    def state(self) -> dict[str, object]:
        """The action as plain values (what `torch.load(weights_only=True)` reads back)."""
        return {"op": self.op.name, "slot": self.slot, "blueprint": self.blueprint, "blend": self.blend.value,
                "blend_epochs": self.blend_epochs, "alpha_target": self.alpha_target,
                "alpha_speed": self.alpha_speed, "alpha_curve": self.alpha_curve.value}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Action:
        """The action `state` wrote; a missing or malformed field is a ValueError."""
        try:
            return cls(Op[state["op"]], None if state["slot"] is None else str(state["slot"]),
                       None if state["blueprint"] is None else str(state["blueprint"]), BlendKind(state["blend"]),
                       int(state["blend_epochs"]), float(state["alpha_target"]), int(state["alpha_speed"]),
                       AlphaCurve(state["alpha_curve"]))
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"not an action saved by this version of morphogen ({error!r})") from None

    def describe(self) -> str:
        if self.op is Op.WAIT:
            return "WAIT"
        if self.op is Op.GERMINATE:
            return f"GERMINATE {self.blueprint}@{self.slot} ({self.blend.value}, {self.blend_epochs} ep)"
        if self.op is Op.GROW:
            return f"GROW {self.blueprint} in every empty slot ({self.blend_epochs} ep)"
        if self.op is Op.SET_ALPHA_TARGET:
            return f"SET_ALPHA {self.slot}->{self.alpha_target:.1f} in {self.alpha_speed} ({self.alpha_curve.value})"
        return f"{self.op.name} {self.slot}"


def _slot_validity(slots: Sequence[SeedSlot]) -> np.ndarray:
    """[n_ops, n_slots]: whether each op is physically legal in each slot now."""
    seed_in_training = any(s.stage in (Stage.GERMINATED, Stage.TRAINING) for s in slots)
    slot_valid = np.zeros((len(Op), len(slots)), dtype=bool)
    for j, slot in enumerate(slots):
        ramping = slot.alpha.mode is not AlphaMode.HOLD
        slot_valid[Op.GERMINATE, j] = slot.stage is Stage.DORMANT and not seed_in_training
        slot_valid[Op.GROW, j] = slot_valid[Op.GERMINATE, j]  # GROW needs one empty slot and fills them all
        slot_valid[Op.SET_ALPHA_TARGET, j] = (slot.stage in (Stage.BLENDING, Stage.HOLDING)) and not ramping
        slot_valid[Op.PRUNE, j] = (slot.stage in PRUNABLE_STAGES and slot.lifecycle.seed_age >= MIN_PRUNE_AGE
                                   and not ramping)
        slot_valid[Op.FOSSILIZE, j] = slot.stage is Stage.HOLDING
        slot_valid[Op.ADVANCE, j] = slot.stage in _ADVANCEABLE and not (slot.stage is Stage.BLENDING and ramping)
    return slot_valid


class ActionSpace:
    """Index encoding of `Action`s for a model's slots and its topology's blueprints."""

    def __init__(self, slot_ids: Sequence[str], topology: str) -> None:
        if not slot_ids:
            raise ValueError("an action space needs at least one slot; give the model one or more slots")
        self.slot_ids, self.topology = tuple(slot_ids), topology
        self.blueprints = blueprint_names(topology)
        self.choices: dict[str, tuple[object, ...]] = {
            **FIXED_CHOICES, "slot": self.slot_ids, "blueprint": self.blueprints}

    @property
    def sizes(self) -> tuple[int, ...]:
        """Number of choices per head, in `HEADS` order (the MultiDiscrete nvec)."""
        return tuple(len(self.choices[head]) for head in HEADS)

    def decode(self, indices: Sequence[int]) -> Action:
        """Indices (one per head) -> Action; irrelevant heads are ignored."""
        op = Op(int(indices[0]))
        values = {head: self.choices[head][int(i)] for head, i in zip(HEADS, indices, strict=True)}
        relevant = _RELEVANT_HEADS[op]
        canonical = Action()
        return Action(
            op=op,
            slot=values["slot"] if "slot" in relevant else None,  # type: ignore[arg-type]
            blueprint=values["blueprint"] if "blueprint" in relevant else None,  # type: ignore[arg-type]
            blend=values["blend"] if "blend" in relevant else canonical.blend,  # type: ignore[arg-type]
            blend_epochs=values["blend_epochs"] if "blend_epochs" in relevant else canonical.blend_epochs,  # type: ignore[arg-type]
            alpha_target=values["alpha_target"] if "alpha_target" in relevant else canonical.alpha_target,  # type: ignore[arg-type]
            alpha_speed=values["alpha_speed"] if "alpha_speed" in relevant else canonical.alpha_speed,  # type: ignore[arg-type]
            alpha_curve=values["alpha_curve"] if "alpha_curve" in relevant else canonical.alpha_curve,  # type: ignore[arg-type]
        )

    def encode(self, action: Action) -> list[int]:
        """Action -> indices, with heads irrelevant to its op at the canonical index 0."""
        named: dict[str, object] = {
            "op": action.op, "slot": action.slot, "blueprint": action.blueprint, "blend": action.blend,
            "blend_epochs": action.blend_epochs, "alpha_target": action.alpha_target, "alpha_speed": action.alpha_speed,
            "alpha_curve": action.alpha_curve,
        }
        relevant = _RELEVANT_HEADS[action.op] | {"op"}
        indices = []
        for head in HEADS:
            if head not in relevant:
                indices.append(0)
                continue
            try:
                indices.append(self.choices[head].index(named[head]))
            except ValueError:
                raise ValueError(f"{head}={named[head]!r} is not one of {self.choices[head]}") from None
        return indices

    def masks(self, model: MorphogeneticModel) -> list[np.ndarray]:
        """Physical-validity masks: op [n_ops], then [n_ops, n_choices] per other head."""
        n_ops = len(Op)
        slots = [model.slot(slot_id) for slot_id in self.slot_ids]
        slot_valid = _slot_validity(slots)
        graftable = self._graftable(model, slots) if slot_valid[Op.GROW].any() else None
        if graftable is not None and not graftable.any():
            slot_valid[Op.GROW] = False
        op_mask = np.asarray(slot_valid.any(axis=1))
        op_mask[Op.WAIT] = True
        masks: list[np.ndarray] = [op_mask]
        for head in HEADS[1:]:
            mask = slot_valid.copy() if head == "slot" else np.ones((n_ops, len(self.choices[head])), dtype=bool)
            if head == "blueprint" and graftable is not None and graftable.any():
                mask[Op.GROW] = graftable
            if head == "blueprint" and slot_valid[Op.GERMINATE].any():
                mask[Op.GERMINATE] = self._placeable(slots)
            # Heads an op ignores are pinned to the canonical choice 0.
            irrelevant = ~HEAD_RELEVANCE[:, HEADS.index(head)]
            mask[irrelevant] = False
            mask[irrelevant, 0] = True
            masks.append(mask)
        return masks

    def _placeable(self, slots: list[SeedSlot]) -> np.ndarray:
        """[n_blueprints]: whether some empty slot has the site each blueprint needs (a widening one the layers
        around it, a branch a measured segment input); all True where none would be."""
        empty = [slot for slot in slots if slot.stage is Stage.DORMANT]
        placeable = np.array([any(not slot.site_problem(name) for slot in empty) for name in self.blueprints],
                             dtype=bool)
        return placeable if placeable.any() else np.ones(len(self.blueprints), dtype=bool)

    def _graftable(self, model: MorphogeneticModel, slots: list[SeedSlot]) -> np.ndarray:
        """[n_blueprints]: whether GROW can graft each blueprint into every empty slot (`MorphogeneticModel.can_graft`:
        a widening one only at a width site inside the block before the slot, a branch only at a branch site, a
        copy of the layer before the slot only where the host has that layer)."""
        empty = [slot.slot_id for slot in slots if slot.stage is Stage.DORMANT]
        return np.array([all(model.can_graft(slot_id, name) for slot_id in empty)
                          for name in self.blueprints], dtype=bool)
