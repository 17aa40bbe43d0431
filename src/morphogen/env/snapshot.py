"""Plain-number snapshots of an episode after an epoch: what observations and rewards are computed from.

Snapshots hold Python numbers (already materialized from the device), so observation encoding and
reward formulas are pure functions that never touch a tensor or synchronize. ``None`` means "not
measured" and must stay distinguishable from a measured zero.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from morphogen.core.flops import SeedCost
from morphogen.core.lifecycle import Criterion, Stage

HISTORY_LENGTH = 5
"""How many of the latest validation accuracies and losses a snapshot keeps (`accuracy_history`, `loss_history`)."""


@dataclass(frozen=True)
class SlotSnapshot:
    """One slot after an epoch."""

    slot_id: str
    stage: Stage
    blueprint: str | None
    alpha: float
    alpha_target: float
    alpha_progress: float
    alpha_ramping: bool
    epochs_in_stage: int
    seed_age: int
    seed_parameters: int
    #: Counterfactual contribution in accuracy points: acc(model) - acc(model without this seed).
    contribution: float | None
    #: The contribution measured one epoch earlier (for its trend).
    previous_contribution: float | None
    gradient_norm: float | None
    gradient_health: float | None
    gradient_ratio: float | None
    #: Validation accuracy when the seed entered its current stage (to judge what the stage did).
    accuracy_at_stage_start: float | None = None
    #: The slot's channels (or d_model) over those of the host's widest injection point.
    width_fraction: float = 1.0
    #: Positions (pixels, samples, tokens) of the activation at the slot over those of the input.
    resolution_fraction: float = 1.0
    #: Where the slot sits in the host: (its injection point's index + 1) / (injection points + 1).
    depth_fraction: float = 0.5
    #: Validation loss the seed removes: loss(model without this seed) - loss(model); for a TRAINING seed,
    #: loss(model) - loss(its shadow). Nats per token for a language model.
    loss_contribution: float | None = None
    #: Validation loss when the seed entered its current stage.
    loss_at_stage_start: float | None = None
    #: Whether a branch seed has a site beside the segment before the slot (its input was measured; not where
    #: that input is a model's several inputs, nor on the built-in hosts).
    can_branch: bool = False
    #: For an empty slot, when a controller asked for growth signals: what the loss could gain at the slot's
    #: activation (deepening) and at the next layer's output (widening; None without layers to widen), as
    #: `MorphogeneticModel.growth_signals` measures them.
    depth_signal: float | None = None
    width_signal: float | None = None
    #: For an empty slot, when a controller asked: (blueprint, what it would add) for each of its candidates.
    seed_costs: tuple[tuple[str, SeedCost], ...] = ()


@dataclass(frozen=True)
class EpisodeSnapshot:
    """The whole episode after an epoch (or at reset, before any training: epoch 0)."""

    epoch: int
    max_epochs: int
    train_loss: float | None
    val_loss: float
    val_accuracy: float
    #: Up to the last 5 validation accuracies / losses, oldest first, including the current one.
    accuracy_history: tuple[float, ...]
    loss_history: tuple[float, ...]
    host_parameters: int
    #: Host plus seeds blended into the output.
    active_parameters: int
    slots: tuple[SlotSnapshot, ...]
    #: Accuracy with every live seed's alpha forced to 0, when measured (2..4 live seeds).
    accuracy_all_off: float | None
    #: Op index of the last action (0 = WAIT) and whether it took effect.
    last_op: int
    last_action_succeeded: bool
    #: True when the governor rolled the model back during this epoch.
    rolled_back: bool = False
    #: Host topology (cnn, cnn1d, transformer, mlp): what the blueprint names below belong to.
    topology: str = ""
    #: Accuracy of guessing (100 / classes) on a classification task scored by accuracy; None otherwise.
    chance_accuracy: float | None = None
    #: Validation loss of the untrained model (epoch 0): later losses are read relative to it.
    initial_val_loss: float | None = None
    #: The blueprints a GERMINATE may name, in the action space's order.
    blueprints: tuple[str, ...] = ()
    #: Parameters each blueprint would add in each slot: `blueprint_parameters[slot][blueprint]`, slots in
    #: `slots` order, blueprints in `blueprints` order.
    blueprint_parameters: tuple[tuple[int, ...], ...] = ()
    #: Forward FLOPs per sample each blueprint would add in each slot, laid out as `blueprint_parameters`.
    blueprint_flops: tuple[tuple[int, ...], ...] = ()
    #: Forward FLOPs per sample of the host (0 when not counted).
    host_flops: int = 0
    #: What the gates judge seeds by (the score, or the validation loss for a language model); the heuristic
    #: judges by the same.
    criterion: Criterion = Criterion.SCORE
    #: The contribution the fossilize gate asks of a seed, in the unit of `criterion` (`GateConfig.
    #: fossilize_contribution`; None: permissive gates, or a snapshot saved before it was kept).
    fossilize_contribution: float | None = None
    #: The ramp and blend operator (`BlendKind` value) of a seed germinated without its own
    #: (`[episode.slots] blend_epochs` and `blend`): what the heuristic germinates with.
    blend_epochs: int = 3
    blend: str = "add"

    @property
    def added_parameters(self) -> int:
        return self.active_parameters - self.host_parameters

    @property
    def progress(self) -> float:
        return self.epoch / self.max_epochs if self.max_epochs else 1.0

    def stage_counts(self) -> dict[Stage, int]:
        counts = dict.fromkeys(Stage, 0)
        for slot in self.slots:
            counts[slot.stage] += 1
        return counts


def snapshot_state(snapshot: EpisodeSnapshot) -> dict[str, Any]:
    """`snapshot` as plain values (numbers, strings, lists and dicts: what `torch.load(weights_only=True)` reads)."""
    state: dict[str, Any] = {field.name: _plain(getattr(snapshot, field.name)) for field in fields(snapshot)}
    state["slots"] = [{field.name: _plain(getattr(slot, field.name)) for field in fields(slot)}
                      for slot in snapshot.slots]
    return state


def snapshot_from_state(state: dict[str, Any]) -> EpisodeSnapshot:
    """The snapshot `snapshot_state` wrote; a missing or malformed field is a ValueError naming it."""
    try:
        slots = tuple(SlotSnapshot(**{
            **slot, "stage": Stage(slot["stage"]),
            "seed_costs": tuple((str(name), SeedCost(*cost)) for name, cost in slot["seed_costs"])})
            for slot in state["slots"])
        return EpisodeSnapshot(**{
            **state, "slots": slots, "criterion": Criterion(state["criterion"]),
            "accuracy_history": tuple(state["accuracy_history"]), "loss_history": tuple(state["loss_history"]),
            "blueprints": tuple(state["blueprints"]),
            "blueprint_parameters": tuple(tuple(row) for row in state["blueprint_parameters"]),
            "blueprint_flops": tuple(tuple(row) for row in state["blueprint_flops"])})
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"not an episode snapshot saved by this version of morphogen ({error})") from None


def _plain(value: object) -> object:
    """Enums as their values, tuples as lists, recursively."""
    if isinstance(value, Stage | Criterion):
        return value.value
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    return value
