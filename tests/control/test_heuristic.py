"""Tests for the rule-based controller on hand-made episode snapshots and masks."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from morphogen.control.heuristic import (
    DEFAULT_DEPTH_BLUEPRINT,
    DEFAULT_ROTATION,
    HeuristicConfig,
    HeuristicController,
    has_plateaued,
    is_slowing,
)
from morphogen.core.blend import BlendKind
from morphogen.core.blueprints import UnknownBlueprintError
from morphogen.core.lifecycle import Criterion, Stage
from morphogen.env.actions import HEADS, Action, ActionSpace, Op
from morphogen.env.snapshot import EpisodeSnapshot, SlotSnapshot

SLOTS = ("r0c0", "r0c1", "r0c2")
PLATEAU = (97.0, 97.1, 97.2, 97.1, 97.3)  # +0.3 points over the last 3 epochs
RISING = (90.0, 92.0, 94.0, 96.0, 98.0)


# ---------------------------------------------------------------- plateau oracle


@pytest.mark.parametrize(
    ("history", "epochs", "threshold", "expected"),
    [
        ((90.0, 90.25), 3, 0.5, False),  # too short to judge 3 epochs
        ((90.0, 90.25, 90.375, 90.125), 3, 0.5, True),  # best gain 0.375 < 0.5
        ((90.0, 90.25, 90.625, 90.125), 3, 0.5, False),  # best gain 0.625
        ((50.0, 90.0, 90.125, 90.25, 90.125), 3, 0.5, True),  # only the last 4 values count
        ((95.0, 94.0, 93.0, 92.0), 3, 0.5, True),  # falling accuracy is no gain
        ((90.0, 90.5), 1, 0.5, False),  # a gain equal to the threshold is not a plateau
        ((90.0, 90.25), 1, 0.5, True),
    ],
)
def test_has_plateaued(history: tuple[float, ...], epochs: int, threshold: float, expected: bool) -> None:
    assert has_plateaued(history, epochs, threshold) is expected


@pytest.mark.parametrize(
    ("losses", "window", "ratio", "expected"),
    [
        ((1.0, 0.8, 0.6, 0.5, 0.45), 2, 0.5, True),  # gains 0.4 then 0.15: below half
        ((1.0, 0.75, 0.5, 0.375, 0.25), 2, 0.5, False),  # gains 0.5 then 0.25: exactly half is not slowing
        ((1.0, 0.8, 0.6, 0.3, 0.1), 2, 0.5, False),  # accelerating
        ((1.0, 0.8, 0.6, 0.7, 0.65), 2, 0.5, True),  # rose again recently
        ((0.5, 0.5, 0.5, 0.5, 0.5), 2, 0.5, False),  # flat from the start: no earlier gain to slow down from
        ((1.0, 0.5, 0.45), 1, 0.5, True),
        ((1.0, 0.5, 0.45), 2, 0.5, False),  # too short for two windows
    ],
)
def test_is_slowing(losses: tuple[float, ...], window: int, ratio: float, expected: bool) -> None:
    assert is_slowing(losses, window, ratio) is expected


# ---------------------------------------------------------------- helpers


def make_slot(slot_id: str, stage: Stage = Stage.DORMANT, **overrides: Any) -> SlotSnapshot:
    seeded = stage in (Stage.GERMINATED, Stage.TRAINING, Stage.BLENDING, Stage.HOLDING, Stage.FOSSILIZED)
    fields: dict[str, Any] = dict(
        slot_id=slot_id,
        stage=stage,
        blueprint="conv_light" if seeded else None,

        alpha=1.0 if stage in (Stage.HOLDING, Stage.FOSSILIZED) else 0.0,
        alpha_target=0.0,
        alpha_progress=0.0,
        alpha_ramping=False,
        epochs_in_stage=0,
        seed_age=10 if seeded else 0,
        seed_parameters=0,
        contribution=None,
        previous_contribution=None,
        gradient_norm=None,
        gradient_health=None,
        gradient_ratio=None,
        accuracy_at_stage_start=None,
    )
    fields.update(overrides)
    return SlotSnapshot(**fields)


def make_snapshot(
    *slots: SlotSnapshot, epoch: int = 10, history: tuple[float, ...] = PLATEAU, max_epochs: int = 30,
    losses: tuple[float, ...] | None = None, criterion: Criterion = Criterion.SCORE,
) -> EpisodeSnapshot:
    given = {slot.slot_id: slot for slot in slots}
    return EpisodeSnapshot(
        epoch=epoch,
        max_epochs=max_epochs,
        train_loss=0.1,
        val_loss=0.1 if losses is None else losses[-1],
        val_accuracy=history[-1],
        accuracy_history=history,
        loss_history=(0.1,) * len(history) if losses is None else losses,
        host_parameters=1000,
        active_parameters=1000,
        slots=tuple(given.get(slot_id, make_slot(slot_id)) for slot_id in SLOTS),
        accuracy_all_off=None,
        last_op=0,
        last_action_succeeded=True,
        criterion=criterion,
    )


def make_masks(space: ActionSpace, allowed: dict[Op, tuple[str, ...]], branch_sites: bool = False) -> list[np.ndarray]:
    """Op and slot masks where each op in `allowed` is legal in exactly the listed slots; WAIT always. Unless
    `branch_sites`, no slot can take a branch seed, as on the built-in hosts."""
    n_ops = len(Op)
    slot_mask = np.zeros((n_ops, len(SLOTS)), dtype=bool)
    slot_mask[Op.WAIT, 0] = True
    for op, slot_ids in allowed.items():
        for slot_id in slot_ids:
            slot_mask[op, SLOTS.index(slot_id)] = True
    op_mask = slot_mask.any(axis=1)
    others = [np.ones((n_ops, size), dtype=bool) for size in space.sizes[2:]]
    assert len(others) == len(HEADS) - 2
    if not branch_sites and "branch_wide" in space.blueprints:
        others[0][Op.GERMINATE, space.blueprints.index("branch_wide")] = False
    return [op_mask, slot_mask, *others]


def controller(**config: Any) -> tuple[HeuristicController, ActionSpace]:
    space = ActionSpace(SLOTS, "cnn")
    return HeuristicController(space, "cnn", HeuristicConfig(**config)), space


ALL_EMPTY = {Op.GERMINATE: SLOTS}


# ---------------------------------------------------------------- germination


def test_waits_during_warmup_even_on_a_plateau() -> None:
    heuristic, space = controller(warmup_epochs=3)
    assert heuristic.act(make_snapshot(epoch=2), make_masks(space, ALL_EMPTY)) == Action()


def test_germinates_after_warmup_once_accuracy_plateaus() -> None:
    heuristic, space = controller(warmup_epochs=3)
    action = heuristic.act(make_snapshot(epoch=3), make_masks(space, ALL_EMPTY))
    assert action == Action(Op.GERMINATE, "r0c0", DEFAULT_ROTATION["cnn"][0])


@pytest.mark.parametrize("max_epochs", [30, 100])
def test_a_warmup_fraction_waits_that_share_of_any_episode_then_grows(max_epochs: int) -> None:
    heuristic, space = controller(warmup_fraction=0.5)
    half = max_epochs // 2
    assert heuristic.act(make_snapshot(epoch=half - 1, max_epochs=max_epochs), make_masks(space, ALL_EMPTY)) == Action()
    action = heuristic.act(make_snapshot(epoch=half, max_epochs=max_epochs), make_masks(space, ALL_EMPTY))
    assert action.op is Op.GERMINATE


def test_waits_while_accuracy_still_rises() -> None:
    heuristic, space = controller()
    assert heuristic.act(make_snapshot(epoch=5, history=RISING), make_masks(space, ALL_EMPTY)) == Action()


def test_germinates_the_first_seed_by_a_third_of_the_episode_though_learning_has_not_slowed() -> None:
    heuristic, space = controller()
    steady = (1.0, 0.8, 0.6, 0.4, 0.2)
    assert HeuristicConfig().first_growth_by == 0.33
    rising = make_snapshot(epoch=9, history=RISING, losses=steady)
    assert heuristic.act(rising, make_masks(space, ALL_EMPTY)) == Action()  # 9 < 0.33 * 30
    action = heuristic.act(make_snapshot(epoch=10, history=RISING, losses=steady), make_masks(space, ALL_EMPTY))
    assert action.op is Op.GERMINATE
    # Only the first seed: later ones wait for the signal again.
    late = make_snapshot(epoch=20, history=RISING, losses=steady)
    assert heuristic.act(late, make_masks(space, ALL_EMPTY)) == Action()
    patient = controller(first_growth_by=1.0)[0]
    assert patient.act(late, make_masks(space, ALL_EMPTY)) == Action()


def test_germinates_when_the_loss_slows_down_though_accuracy_still_rises() -> None:
    heuristic, space = controller()
    slowing = (1.0, 0.8, 0.6, 0.55, 0.52)
    action = heuristic.act(make_snapshot(history=RISING, losses=slowing), make_masks(space, ALL_EMPTY))
    assert action.op is Op.GERMINATE
    steady = (1.0, 0.8, 0.6, 0.4, 0.2)
    assert heuristic.act(make_snapshot(history=RISING, losses=steady), make_masks(space, ALL_EMPTY)) == Action()


def test_waits_when_a_seed_could_not_reach_the_output_before_the_end() -> None:
    # min_training_epochs 5: the first seed trains 5 epochs, and its first blending epoch must fit: 7 epochs left.
    heuristic, space = controller()
    assert HeuristicConfig().min_training_epochs == 5
    assert heuristic.act(make_snapshot(epoch=24, max_epochs=30), make_masks(space, ALL_EMPTY)) == Action()
    assert heuristic.act(make_snapshot(epoch=23, max_epochs=30), make_masks(space, ALL_EMPTY)).op is Op.GERMINATE
    late = controller(min_training_epochs=2)[0]
    assert late.act(make_snapshot(epoch=26, max_epochs=30), make_masks(space, ALL_EMPTY)).op is Op.GERMINATE


def test_a_further_seed_waits_when_it_could_not_be_judged_before_the_end() -> None:
    # After a first seed, another trains 5 epochs, blends over 3, holds 1 and is judged the epoch after:
    # started with fewer than 10 epochs left it would end the episode unjudged, its FLOPs buying nothing.
    for config, last_start in (({}, 20), ({"min_training_epochs": 2, "min_holding_epochs": 0}, 24)):
        heuristic, space = controller(**config)
        assert heuristic.act(make_snapshot(epoch=10, max_epochs=30), make_masks(space, ALL_EMPTY)).op is Op.GERMINATE
        late = make_snapshot(epoch=last_start + 1, max_epochs=30)
        assert heuristic.act(late, make_masks(space, ALL_EMPTY)) == Action()
        assert heuristic.act(make_snapshot(epoch=last_start, max_epochs=30), make_masks(space, ALL_EMPTY)).op \
            is Op.GERMINATE


def test_seeds_blend_as_the_slots_are_configured_and_a_longer_ramp_needs_more_room() -> None:
    # [episode.slots] blend_epochs and blend reach the heuristic's seeds through the snapshot; a further seed
    # must fit its whole ramp before the end.
    heuristic, space = controller()
    action = heuristic.act(dataclasses.replace(make_snapshot(epoch=10), blend_epochs=8, blend="multiply"),
                           make_masks(space, ALL_EMPTY))
    assert (action.op, action.blend_epochs, action.blend) == (Op.GERMINATE, 8, BlendKind.MULTIPLY)
    late = dataclasses.replace(make_snapshot(epoch=16, max_epochs=30), blend_epochs=8)
    assert heuristic.act(late, make_masks(space, ALL_EMPTY)) == Action()  # 5 + 8 + 1 + 1 > 14 epochs left
    assert heuristic.act(dataclasses.replace(late, blend_epochs=3), make_masks(space, ALL_EMPTY)).op is Op.GERMINATE


def test_waits_when_the_mask_forbids_germination() -> None:
    heuristic, space = controller()
    assert heuristic.act(make_snapshot(), make_masks(space, {})) == Action()


def test_rotation_cycles_blueprints_and_allowed_slots() -> None:
    heuristic, space = controller(rotation=("norm", "attention"))
    masks = make_masks(space, {Op.GERMINATE: ("r0c1", "r0c2")})
    picks = [heuristic.act(make_snapshot(), masks) for _ in range(3)]
    assert [(a.slot, a.blueprint) for a in picks] == [("r0c1", "norm"), ("r0c2", "attention"), ("r0c1", "norm")]
    heuristic.reset()
    assert heuristic.act(make_snapshot(), masks).blueprint == "norm"


def test_rotation_skips_a_recently_pruned_blueprint() -> None:
    heuristic, space = controller(rotation=("norm", "attention"), prune_penalty_epochs=10, fossilize_threshold=0.5)
    losing = make_slot("r0c0", Stage.HOLDING, blueprint="norm", contribution=0.1, epochs_in_stage=1)
    assert heuristic.act(make_snapshot(losing, epoch=10), make_masks(space, {Op.PRUNE: ("r0c0",)})) == Action(
        Op.PRUNE, "r0c0"
    )
    germinate = make_masks(space, {Op.GERMINATE: ("r0c1",)})
    # "norm" is next in the rotation but was pruned at epoch 10: skipped until epoch 20.
    assert heuristic.act(make_snapshot(epoch=15), germinate).blueprint == "attention"
    assert heuristic.act(make_snapshot(epoch=16), germinate).blueprint == "attention"
    assert heuristic.act(make_snapshot(epoch=20), germinate).blueprint == "norm"


def test_waits_when_every_blueprint_is_penalized() -> None:
    heuristic, space = controller(rotation=("norm",), prune_penalty_epochs=10)
    losing = make_slot("r0c0", Stage.HOLDING, blueprint="norm", contribution=0.1, epochs_in_stage=1)
    heuristic.act(make_snapshot(losing, epoch=10), make_masks(space, {Op.PRUNE: ("r0c0",)}))
    assert heuristic.act(make_snapshot(epoch=19), make_masks(space, {Op.GERMINATE: ("r0c1",)})) == Action()


# ---------------------------------------------------------------- managing a seed


def test_advances_a_seed_that_trained_long_enough() -> None:
    heuristic, space = controller(min_training_epochs=4)
    masks = make_masks(space, {Op.ADVANCE: ("r0c2",)})
    young = make_slot("r0c2", Stage.TRAINING, epochs_in_stage=3)
    assert heuristic.act(make_snapshot(young, history=RISING), masks) == Action()
    ready = make_slot("r0c2", Stage.TRAINING, epochs_in_stage=4)
    assert heuristic.act(make_snapshot(ready), masks) == Action(Op.ADVANCE, "r0c2")


def test_prunes_a_training_seed_the_blending_gate_kept_refusing() -> None:
    heuristic, space = controller(min_training_epochs=4, training_patience=3)
    masks = make_masks(space, {Op.ADVANCE: ("r0c2",), Op.PRUNE: ("r0c2",)})
    waiting = make_slot("r0c2", Stage.TRAINING, epochs_in_stage=6)
    assert heuristic.act(make_snapshot(waiting), masks) == Action(Op.ADVANCE, "r0c2")
    hopeless = make_slot("r0c2", Stage.TRAINING, epochs_in_stage=7)
    assert heuristic.act(make_snapshot(hopeless), masks) == Action(Op.PRUNE, "r0c2")


def test_every_decision_says_why_in_the_words_of_its_settings() -> None:
    # What a user reads in the report and events: the rule that decided, with the setting behind it.
    heuristic, space = controller(warmup_epochs=3, min_training_epochs=4, training_patience=3, fossilize_threshold=0.5)
    assert heuristic.act(make_snapshot(epoch=2), make_masks(space, ALL_EMPTY)).why == \
        "the host trains alone until epoch 3 (heuristic warm-up)"
    assert heuristic.act(make_snapshot(epoch=5, history=RISING, losses=(1.0, 0.8, 0.6, 0.4, 0.2)),
                         make_masks(space, ALL_EMPTY)).why == "the model is still improving"
    assert heuristic.act(make_snapshot(epoch=28), make_masks(space, ALL_EMPTY)).why == \
        "2 epochs left, fewer than the 6 a seed needs to reach the output"
    grown = heuristic.act(make_snapshot(epoch=10, history=RISING, losses=(1.0, 0.8, 0.6, 0.4, 0.2)),
                          make_masks(space, ALL_EMPTY))
    assert grown.op is Op.GERMINATE and grown.why.startswith("the first seed is due by 33% of the episode")
    plateau = controller()[0].act(make_snapshot(epoch=10), make_masks(space, ALL_EMPTY))  # the curve's reason first
    assert plateau.why.startswith("the validation score gained less than 0.50 points in 3 epochs")
    hopeless = make_slot("r0c2", Stage.TRAINING, epochs_in_stage=7)
    masks = make_masks(space, {Op.ADVANCE: ("r0c2",), Op.PRUNE: ("r0c2",)})
    assert heuristic.act(make_snapshot(hopeless), masks).why == \
        "still not allowed to blend 3 epochs after its 4 of training (heuristic.training_patience)"
    holding = make_slot("r0c1", Stage.HOLDING, contribution=0.75, epochs_in_stage=1)
    kept = heuristic.act(make_snapshot(holding), make_masks(space, {Op.FOSSILIZE: ("r0c1",), Op.PRUNE: ("r0c1",)}))
    assert (kept.op, kept.why) == (Op.FOSSILIZE, "its ablation says it adds +0.75 points, more than +0.50 points")
    busy = heuristic.act(make_snapshot(epoch=12), make_masks(space, {}))
    assert busy.why == "no seed can be germinated now (one is training, or no slot is free)"


def test_advances_a_germinated_seed() -> None:
    heuristic, space = controller()
    masks = make_masks(space, {Op.ADVANCE: ("r0c0",)})
    assert heuristic.act(make_snapshot(make_slot("r0c0", Stage.GERMINATED)), masks) == Action(Op.ADVANCE, "r0c0")


def test_advances_a_finished_blend_when_holding_is_not_automatic() -> None:
    heuristic, space = controller()
    masks = make_masks(space, {Op.ADVANCE: ("r0c1",)})
    ramping = make_slot("r0c1", Stage.BLENDING, alpha=0.5, alpha_ramping=True)
    assert heuristic.act(make_snapshot(ramping, history=RISING), masks) == Action()
    finished = make_slot("r0c1", Stage.BLENDING, alpha=1.0)
    assert heuristic.act(make_snapshot(finished, history=RISING), masks) == Action(Op.ADVANCE, "r0c1")


@pytest.mark.parametrize(("contribution", "op"), [(0.75, Op.FOSSILIZE), (0.5, Op.PRUNE), (-1.0, Op.PRUNE)])
def test_holding_seed_is_fossilized_above_the_threshold_else_pruned(contribution: float, op: Op) -> None:
    heuristic, space = controller(fossilize_threshold=0.5)
    masks = make_masks(space, {Op.FOSSILIZE: ("r0c1",), Op.PRUNE: ("r0c1",)})
    holding = make_slot("r0c1", Stage.HOLDING, contribution=contribution, epochs_in_stage=1)
    assert heuristic.act(make_snapshot(holding), masks) == Action(op, "r0c1")


def test_holding_seed_is_judged_only_on_a_full_strength_measurement() -> None:
    # Entering HOLDING happens after the epoch's validation, which still ran at alpha < 1.
    heuristic, space = controller(fossilize_threshold=0.5)
    masks = make_masks(space, {Op.FOSSILIZE: ("r0c1",), Op.PRUNE: ("r0c1",)})
    just_arrived = make_slot("r0c1", Stage.HOLDING, contribution=0.1, epochs_in_stage=0)
    assert heuristic.act(make_snapshot(just_arrived, history=RISING), masks) == Action()
    unmeasured = make_slot("r0c1", Stage.HOLDING, contribution=None, epochs_in_stage=3)
    assert heuristic.act(make_snapshot(unmeasured, history=RISING), masks) == Action()


def with_last_action(snapshot: EpisodeSnapshot, op: Op, succeeded: bool) -> EpisodeSnapshot:
    return dataclasses.replace(snapshot, last_op=int(op), last_action_succeeded=succeeded)


def test_a_seed_the_fossilize_gate_refuses_is_pruned() -> None:
    # A strict gate may want more contribution (1.0 points) than the heuristic's threshold (0.5).
    heuristic, space = controller(fossilize_threshold=0.5)
    masks = make_masks(space, {Op.FOSSILIZE: ("r0c1",), Op.PRUNE: ("r0c1",)})
    holding = make_snapshot(make_slot("r0c1", Stage.HOLDING, contribution=0.75, epochs_in_stage=1))
    assert heuristic.act(holding, masks) == Action(Op.FOSSILIZE, "r0c1")
    refused = with_last_action(holding, Op.FOSSILIZE, succeeded=False)
    assert heuristic.act(refused, masks) == Action(Op.PRUNE, "r0c1")


def holding_by_loss(nats: float, epoch: int, gate_asks: float | None = None) -> EpisodeSnapshot:
    """A classifier judged by loss, its seed in HOLDING removing `nats` of validation loss; the fossilize gate asks
    `gate_asks` nats (None: the snapshot does not say, as one saved by an earlier morphogen)."""
    slot = make_slot("r0c1", Stage.HOLDING, loss_contribution=nats, epochs_in_stage=epoch - 7)
    snapshot = make_snapshot(slot, epoch=epoch, history=RISING, criterion=Criterion.LOSS)
    return dataclasses.replace(snapshot, fossilize_contribution=gate_asks)


def test_a_refused_seed_that_now_measures_what_the_gate_asks_is_asked_again() -> None:
    # A user's encoder run: the gate (0.01 nats) refused the seed on 0.0071 nats, the next epoch measured 0.0549.
    heuristic, space = controller()
    masks = make_masks(space, {Op.FOSSILIZE: ("r0c1",), Op.PRUNE: ("r0c1",)})
    assert heuristic.act(holding_by_loss(0.0071, epoch=8, gate_asks=0.01), masks) == Action(Op.FOSSILIZE, "r0c1")
    refused = with_last_action(holding_by_loss(0.0549, epoch=9, gate_asks=0.01), Op.FOSSILIZE, succeeded=False)
    again = heuristic.act(refused, masks)
    assert again == Action(Op.FOSSILIZE, "r0c1")
    assert again.why == "its ablation says it adds +0.0549 nats now, at least the +0.0100 nats the fossilize gate asks"
    assert heuristic.fossilize_refused == {"r0c1": (0.0071, 1)}


@pytest.mark.parametrize(("now", "gate_asks", "expected", "why"), [
    # Rose, but still under what the gate asks: pruned.
    (0.0080, 0.01, Op.PRUNE, "the fossilize gate refused it, and its ablation says it adds +0.0080 nats now, less "
                             "than the +0.0100 nats it asks"),
    # The snapshot does not say what the gate asks: a measurement above the refused one is asked again ...
    (0.0549, None, Op.FOSSILIZE, "its ablation says it adds +0.0549 nats now, more than the +0.0071 nats the "
                                 "fossilize gate refused"),
    # ... and one no higher is pruned.
    (0.0068, None, Op.PRUNE, "the fossilize gate refused it on +0.0071 nats, and its ablation says it adds +0.0068 "
                             "nats now, no more"),
])
def test_a_refused_seed_is_judged_on_its_newer_measurement(now: float, gate_asks: float | None, expected: Op,
                                                           why: str) -> None:
    heuristic, space = controller()
    masks = make_masks(space, {Op.FOSSILIZE: ("r0c1",), Op.PRUNE: ("r0c1",)})
    heuristic.act(holding_by_loss(0.0071, epoch=8, gate_asks=gate_asks), masks)
    refused = with_last_action(holding_by_loss(now, epoch=9, gate_asks=gate_asks), Op.FOSSILIZE, succeeded=False)
    judged = heuristic.act(refused, masks)
    assert judged == Action(expected, "r0c1")
    assert judged.why == why


@pytest.mark.parametrize("gate_asks", [0.005, None])
def test_a_seed_the_gate_keeps_refusing_is_pruned_once_the_patience_is_spent(gate_asks: float | None) -> None:
    # Refused on enough contribution each time (e.g. for a seed's unhealthy gradients), or on a rising one.
    heuristic, space = controller(fossilize_patience=2)
    masks = make_masks(space, {Op.FOSSILIZE: ("r0c1",), Op.PRUNE: ("r0c1",)})
    heuristic.act(holding_by_loss(0.006, epoch=8, gate_asks=gate_asks), masks)
    for epoch, nats in ((9, 0.007), (10, 0.008)):
        refused = with_last_action(holding_by_loss(nats, epoch, gate_asks), Op.FOSSILIZE, succeeded=False)
        assert heuristic.act(refused, masks) == Action(Op.FOSSILIZE, "r0c1")
    refused = with_last_action(holding_by_loss(0.009, epoch=11, gate_asks=gate_asks), Op.FOSSILIZE, succeeded=False)
    pruned = heuristic.act(refused, masks)
    assert pruned == Action(Op.PRUNE, "r0c1")
    assert pruned.why == "the fossilize gate refused it 3 times, the last on +0.0080 nats " \
                         "(heuristic.fossilize_patience 2)"


def test_without_fossilize_patience_a_refused_seed_is_pruned_at_once() -> None:
    heuristic, space = controller(fossilize_patience=0)
    masks = make_masks(space, {Op.FOSSILIZE: ("r0c1",), Op.PRUNE: ("r0c1",)})
    heuristic.act(holding_by_loss(0.0071, epoch=8), masks)
    refused = with_last_action(holding_by_loss(0.0549, epoch=9), Op.FOSSILIZE, succeeded=False)
    pruned = heuristic.act(refused, masks)
    assert pruned == Action(Op.PRUNE, "r0c1")
    assert pruned.why == "the fossilize gate refused it on +0.0071 nats (heuristic.fossilize_patience 0)"


def test_a_refusal_survives_a_saved_state_and_an_older_state_loads() -> None:
    heuristic, space = controller()
    masks = make_masks(space, {Op.FOSSILIZE: ("r0c1",), Op.PRUNE: ("r0c1",)})
    heuristic.act(holding_by_loss(0.0071, epoch=8), masks)
    state = heuristic.state_dict()
    resumed, _ = controller()
    resumed.load_state_dict(state, space)
    refused = with_last_action(holding_by_loss(0.0549, epoch=9), Op.FOSSILIZE, succeeded=False)
    assert resumed.act(refused, masks) == Action(Op.FOSSILIZE, "r0c1")
    # A state saved before refusals kept what they were refused on: the refused seed is pruned, as it was then.
    older = {key: value for key, value in resumed.state_dict().items()
             if key not in ("fossilize_refusals", "fossilize_asked_on")}
    older["fossilize_refused"] = ["r0c1"]
    restored, _ = controller()
    restored.load_state_dict(older, space)
    pruned = restored.act(holding_by_loss(0.0549, epoch=10), masks)
    assert pruned == Action(Op.PRUNE, "r0c1") and pruned.why == "the fossilize gate refused it"


def test_a_fork_keeps_its_refusals_to_itself() -> None:
    heuristic, space = controller()
    masks = make_masks(space, {Op.FOSSILIZE: ("r0c1",), Op.PRUNE: ("r0c1",)})
    heuristic.act(holding_by_loss(0.0071, epoch=8), masks)
    refused = with_last_action(holding_by_loss(0.0549, epoch=9), Op.FOSSILIZE, succeeded=False)
    twin = heuristic.fork()
    assert twin.act(refused, masks) == Action(Op.FOSSILIZE, "r0c1")
    assert heuristic.fossilize_refused == {} and twin.fossilize_refused == {"r0c1": (0.0071, 1)}
    assert heuristic.act(refused, masks) == Action(Op.FOSSILIZE, "r0c1")


def test_a_refusal_is_forgotten_once_the_slot_leaves_holding() -> None:
    heuristic, space = controller(fossilize_threshold=0.5)
    masks = make_masks(space, {Op.FOSSILIZE: ("r0c1",), Op.PRUNE: ("r0c1",)})
    holding = make_snapshot(make_slot("r0c1", Stage.HOLDING, contribution=0.75, epochs_in_stage=1))
    heuristic.act(holding, masks)
    no_prune_yet = make_masks(space, {Op.FOSSILIZE: ("r0c1",)})  # seed too young to prune: wait
    assert heuristic.act(with_last_action(holding, Op.FOSSILIZE, succeeded=False), no_prune_yet) == Action()
    assert heuristic.act(make_snapshot(make_slot("r0c1", Stage.EMBARGOED), history=RISING), masks) == Action()
    # A new seed holding in the same slot is judged afresh.
    assert heuristic.act(holding, masks) == Action(Op.FOSSILIZE, "r0c1")


def test_a_successful_fossilize_marks_nothing() -> None:
    heuristic, space = controller(fossilize_threshold=0.5)
    masks = make_masks(space, {Op.FOSSILIZE: ("r0c1",), Op.PRUNE: ("r0c1",)})
    holding = make_snapshot(make_slot("r0c1", Stage.HOLDING, contribution=0.75, epochs_in_stage=1))
    heuristic.act(holding, masks)
    assert heuristic.act(with_last_action(holding, Op.FOSSILIZE, succeeded=True), masks).op is Op.FOSSILIZE
    assert heuristic.fossilize_refused == {}


def test_masked_fossilize_or_prune_is_not_chosen() -> None:
    heuristic, space = controller(fossilize_threshold=0.5)
    holding = make_slot("r0c1", Stage.HOLDING, contribution=3.0, epochs_in_stage=2)
    assert heuristic.act(make_snapshot(holding, history=RISING), make_masks(space, {Op.PRUNE: ("r0c1",)})) == Action()
    weak = make_slot("r0c1", Stage.HOLDING, contribution=0.0, epochs_in_stage=2, seed_age=3)
    no_prune = make_masks(space, {Op.FOSSILIZE: ("r0c1",)})
    assert heuristic.act(make_snapshot(weak, history=RISING), no_prune) == Action()


@pytest.mark.parametrize("stage", [Stage.BLENDING, Stage.HOLDING])
def test_prunes_a_seed_whose_stage_cost_more_than_the_worse_threshold(stage: Stage) -> None:
    heuristic, space = controller(worse_threshold=2.0)
    masks = make_masks(space, {Op.PRUNE: ("r0c2",)})
    history = (97.0, 97.0, 97.0, 97.0, 95.0)
    hurt = make_slot("r0c2", stage, accuracy_at_stage_start=97.25, alpha_ramping=stage is Stage.BLENDING)
    assert heuristic.act(make_snapshot(hurt, history=history), masks) == Action(Op.PRUNE, "r0c2")
    slightly = make_slot("r0c2", stage, accuracy_at_stage_start=96.75, alpha_ramping=stage is Stage.BLENDING)
    assert heuristic.act(make_snapshot(slightly, history=history), masks) == Action()


# ---------------------------------------------------------------- configuration


def test_unknown_blueprint_in_rotation_is_a_user_error() -> None:
    with pytest.raises(UnknownBlueprintError, match=r"heuristic\.rotation.*'nope'.*valid: .*conv_light"):
        controller(rotation=("conv_light", "nope"))


def test_unknown_depth_blueprint_is_a_user_error() -> None:
    with pytest.raises(UnknownBlueprintError, match=r"heuristic\.depth_blueprint.*'tower'.*valid: .*block"):
        HeuristicController(ActionSpace(SLOTS, "transformer"), "transformer", HeuristicConfig(depth_blueprint="tower"))


def test_transformer_topology_uses_its_own_rotation() -> None:
    space = ActionSpace(("s0", "s1"), "transformer")
    assert HeuristicController(space, "transformer").rotation == DEFAULT_ROTATION["transformer"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"warmup_epochs": -1}, "warmup_epochs"),
        ({"warmup_fraction": 1.0}, "warmup_fraction"),
        ({"warmup_fraction": float("nan")}, "warmup_fraction"),
        ({"plateau_epochs": 0}, "plateau_epochs"),
        ({"plateau_epochs": 5}, "plateau_epochs"),  # the snapshot keeps only 5 accuracies
        ({"min_holding_epochs": -1}, "min_holding_epochs"),
        ({"rotation": ()}, "rotation"),
        ({"slowing_window": 3}, "slowing_window"),  # two windows of 3 need 7 losses, the snapshot keeps 5
        ({"slowing_ratio": 1.0}, "slowing_ratio"),
        ({"slowing_ratio": float("nan")}, "slowing_ratio"),
        ({"first_growth_by": 0.0}, "first_growth_by"),
        ({"first_growth_by": float("nan")}, "first_growth_by"),
        ({"training_patience": -1}, "training_patience"),
        ({"fossilize_patience": -1}, "fossilize_patience"),
        ({"loss_plateau_threshold": -0.01}, "loss_plateau_threshold"),
        ({"loss_worse_threshold": float("nan")}, "loss_worse_threshold"),
        ({"loss_fossilize_threshold": -1.0}, "loss_fossilize_threshold"),
        ({"relative_plateau_threshold": -0.01}, "relative_plateau_threshold"),
        ({"relative_worse_threshold": float("nan")}, "relative_worse_threshold"),
        ({"relative_fossilize_threshold": -1.0}, "relative_fossilize_threshold"),
    ],
)
def test_config_rejects_bad_values(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HeuristicConfig(**overrides)


# ---------------------------------------------------------------- a language model: judged in nats, grown by depth

#: Validation losses (nats per token) on a plateau: they fell 0.006 over the last 3 epochs, under 0.01, and
#: they are not slowing down (0.005 then 0.003 over two windows of two epochs: more than half).
LOSS_PLATEAU = (1.600, 1.598, 1.595, 1.594, 1.592)
#: Falling 0.02 nats per epoch, steadily.
LOSS_FALLING = (1.70, 1.68, 1.66, 1.64, 1.62)


def test_a_language_model_plateaus_on_its_loss_not_its_accuracy() -> None:
    heuristic, space = controller()
    masks = make_masks(space, ALL_EMPTY)
    on_plateau = make_snapshot(history=RISING, losses=LOSS_PLATEAU, criterion=Criterion.LOSS)
    assert heuristic.act(on_plateau, masks).op is Op.GERMINATE
    # The same accuracies and losses judged by the score: the accuracy still rises, nothing to do.
    assert heuristic.act(dataclasses.replace(on_plateau, criterion=Criterion.SCORE), masks) == Action()
    # An accuracy plateau does not count for a language model whose loss still falls steadily.
    falling = make_snapshot(history=PLATEAU, losses=LOSS_FALLING, criterion=Criterion.LOSS)
    assert heuristic.act(falling, masks) == Action()


@pytest.mark.parametrize(("loss_contribution", "op"), [(0.008, Op.FOSSILIZE), (0.005, Op.PRUNE), (-0.1, Op.PRUNE)])
def test_a_language_model_keeps_a_seed_that_lowers_the_loss(loss_contribution: float, op: Op) -> None:
    heuristic, space = controller()
    assert HeuristicConfig().loss_fossilize_threshold == 0.005
    masks = make_masks(space, {Op.FOSSILIZE: ("r0c1",), Op.PRUNE: ("r0c1",)})
    # No accuracy point to show (0.0), which the score criterion would prune.
    holding = make_slot("r0c1", Stage.HOLDING, contribution=0.0, loss_contribution=loss_contribution,
                        epochs_in_stage=1)
    snapshot = make_snapshot(holding, history=RISING, losses=LOSS_FALLING, criterion=Criterion.LOSS)
    assert heuristic.act(snapshot, masks) == Action(op, "r0c1")


def test_a_language_model_prunes_a_seed_whose_stage_raised_the_loss() -> None:
    heuristic, space = controller()
    assert HeuristicConfig().loss_worse_threshold == 0.05
    masks = make_masks(space, {Op.PRUNE: ("r0c2",)})
    rising = (1.50, 1.50, 1.51, 1.53, 1.56)
    hurt = make_slot("r0c2", Stage.BLENDING, loss_at_stage_start=1.50, alpha_ramping=True)
    assert heuristic.act(make_snapshot(hurt, losses=rising, criterion=Criterion.LOSS), masks) == Action(
        Op.PRUNE, "r0c2")
    slightly = make_slot("r0c2", Stage.BLENDING, loss_at_stage_start=1.52, alpha_ramping=True)
    assert heuristic.act(make_snapshot(slightly, losses=rising, criterion=Criterion.LOSS), masks) == Action()


# ---------------------------------------------------------------- a task with its own loss: judged in shares of it

@pytest.mark.parametrize("scale", [1e-5, 1.0, 300.0])
def test_a_task_with_its_own_loss_is_judged_alike_on_every_scale(scale: float) -> None:
    heuristic, space = controller()
    relative = Criterion.RELATIVE_LOSS
    assert HeuristicConfig().relative_plateau_threshold == 0.02
    empty = make_masks(space, ALL_EMPTY)
    # Fell 1.5% over the last 3 epochs (a plateau), then 6% (still learning): the same at any unit of the loss.
    plateau = tuple(scale * loss for loss in (0.410, 0.405, 0.403, 0.401, 0.399))
    falling = tuple(scale * loss for loss in (0.450, 0.435, 0.420, 0.405, 0.395))
    assert heuristic.act(make_snapshot(history=RISING, losses=plateau, criterion=relative), empty).op is Op.GERMINATE
    assert heuristic.act(make_snapshot(history=PLATEAU, losses=falling, criterion=relative), empty) == Action()
    # A holding seed is kept when it removes more than 1% of the loss, else pruned.
    judge = make_masks(space, {Op.FOSSILIZE: ("r0c1",), Op.PRUNE: ("r0c1",)})
    for share, op in ((0.03, Op.FOSSILIZE), (0.005, Op.PRUNE)):
        holding = make_slot("r0c1", Stage.HOLDING, contribution=0.0, loss_contribution=share * plateau[-1],
                            epochs_in_stage=1)
        assert heuristic.act(make_snapshot(holding, history=RISING, losses=plateau, criterion=relative),
                             judge) == Action(op, "r0c1")
    # A blending seed whose stage raised the loss by a third is pruned; by a tenth, it is left to the gates.
    prune = make_masks(space, {Op.PRUNE: ("r0c2",)})
    rising = tuple(scale * loss for loss in (0.30, 0.30, 0.32, 0.36, 0.40))
    for start, expected in ((0.30, Action(Op.PRUNE, "r0c2")), (0.36, Action())):
        blending = make_slot("r0c2", Stage.BLENDING, loss_at_stage_start=scale * start, alpha_ramping=True)
        assert heuristic.act(make_snapshot(blending, losses=rising, criterion=relative), prune) == expected


def test_a_loss_that_is_not_positive_never_plateaus_under_the_relative_criterion() -> None:
    heuristic, space = controller()
    negative = (-0.5, -0.5, -0.5, -0.5, -0.5)  # flat, but no share of it means anything: growth waits
    snapshot = make_snapshot(epoch=6, history=RISING, losses=negative, criterion=Criterion.RELATIVE_LOSS)
    masks = make_masks(space, ALL_EMPTY)
    assert heuristic.act(snapshot, masks) == Action()
    # ... for `first_growth_by` (a third of the episode).
    assert heuristic.act(dataclasses.replace(snapshot, epoch=10), masks).op is Op.GERMINATE


def transformer_controller(**config: Any) -> tuple[HeuristicController, ActionSpace]:
    space = ActionSpace(SLOTS, "transformer")
    return HeuristicController(space, "transformer", HeuristicConfig(**config)), space


def test_a_transformer_grows_whole_blocks_into_every_slot_when_the_loss_slows() -> None:
    assert DEFAULT_DEPTH_BLUEPRINT["transformer"] == "block_copy"
    heuristic, space = transformer_controller()
    masks = make_masks(space, {Op.GERMINATE: SLOTS, Op.GROW: SLOTS})
    slowing = (2.2, 1.9, 1.7, 1.65, 1.62)  # 0.5 then 0.08 nats over two windows of two epochs
    action = heuristic.act(make_snapshot(epoch=4, losses=slowing, history=RISING, criterion=Criterion.LOSS), masks)
    assert action == Action(Op.GROW, blueprint="block_copy")
    steady = (2.2, 2.0, 1.8, 1.6, 1.4)
    assert heuristic.act(make_snapshot(epoch=4, losses=steady, history=RISING, criterion=Criterion.LOSS),
                         masks) == Action()
    # Not during the warm-up, and not when GROW is masked (a seed still training, no empty slot).
    assert heuristic.act(make_snapshot(epoch=2, losses=slowing, criterion=Criterion.LOSS), masks) == Action()
    assert heuristic.act(make_snapshot(epoch=4, losses=slowing, criterion=Criterion.LOSS),
                         make_masks(space, {})) == Action()


def test_depth_growth_can_grow_zero_blocks_or_be_switched_off() -> None:
    masks_of = {Op.GERMINATE: SLOTS, Op.GROW: SLOTS}
    zeros, space = transformer_controller(depth_blueprint="block")
    assert zeros.act(make_snapshot(), make_masks(space, masks_of)) == Action(Op.GROW, blueprint="block")
    seed_by_seed, space = transformer_controller(depth_blueprint="")
    action = seed_by_seed.act(make_snapshot(), make_masks(space, masks_of))
    assert action == Action(Op.GERMINATE, "r0c0", DEFAULT_ROTATION["transformer"][0])
    # Convolutional hosts grow seed by seed unless told otherwise.
    assert controller()[0].depth_blueprint == ""


def test_a_refused_grow_turns_the_heuristic_to_growing_seed_by_seed() -> None:
    # A host without a block before its slots (a user's token model of plain linear layers) has nothing for
    # block_copy to copy.
    heuristic, space = transformer_controller(depth_blueprint="block_copy")
    masks = make_masks(space, {Op.GERMINATE: SLOTS, Op.GROW: SLOTS})
    assert heuristic.act(make_snapshot(), masks).op is Op.GROW
    refused = dataclasses.replace(make_snapshot(), last_op=int(Op.GROW), last_action_succeeded=False)
    assert heuristic.act(refused, masks) == Action(Op.GERMINATE, "r0c0", DEFAULT_ROTATION["transformer"][0])
    heuristic.reset()  # a new episode tries depth growth again
    assert heuristic.act(make_snapshot(), masks).op is Op.GROW


def test_depth_growth_happens_once_and_pruned_blocks_are_not_grafted_again() -> None:
    heuristic, space = transformer_controller()
    masks = make_masks(space, {Op.GERMINATE: SLOTS, Op.GROW: SLOTS})
    assert heuristic.act(make_snapshot(), masks).op is Op.GROW
    grown = dataclasses.replace(make_snapshot(), last_op=int(Op.GROW), last_action_succeeded=True)
    # Later every slot is empty again (its block pruned) and the loss slows: no GROW, and no seed either.
    assert heuristic.act(grown, masks) == Action()
    assert heuristic.act(make_snapshot(epoch=12), masks) == Action()
    heuristic.reset()  # a new episode grows again
    assert heuristic.act(make_snapshot(), masks).op is Op.GROW


def test_a_rollback_that_pruned_the_grown_blocks_lets_depth_growth_happen_again() -> None:
    heuristic, space = transformer_controller()
    masks = make_masks(space, {Op.GERMINATE: SLOTS, Op.GROW: SLOTS})
    assert heuristic.act(make_snapshot(), masks).op is Op.GROW
    # The graft epoch diverged: the governor restored the host and pruned every grafted block.
    rolled_back = dataclasses.replace(make_snapshot(), last_op=int(Op.GROW), last_action_succeeded=True,
                                      rolled_back=True)
    epoch = rolled_back.epoch
    assert heuristic.act(rolled_back, masks) == Action()  # the restored host trains for warmup_epochs first
    assert heuristic.act(make_snapshot(epoch=epoch + HeuristicConfig().warmup_epochs - 1), masks) == Action()
    assert heuristic.act(make_snapshot(epoch=epoch + HeuristicConfig().warmup_epochs), masks).op is Op.GROW


def test_a_host_without_layers_to_copy_grows_zero_initialised_blocks_by_default() -> None:
    # The masks say GROW cannot graft `block_copy` here (no block before the slots: a user's linear layers),
    # but can graft `block`: the default grows those, and no GROW is wasted.
    heuristic, space = transformer_controller()
    masks = make_masks(space, {Op.GERMINATE: SLOTS, Op.GROW: SLOTS})
    masks[2][Op.GROW, space.blueprints.index("block_copy")] = False
    assert heuristic.act(make_snapshot(), masks) == Action(Op.GROW, blueprint="block")
    # Told to copy layers, it grows seed by seed instead; where no block fits either, so does the default.
    told, _ = transformer_controller(depth_blueprint="block_copy")
    assert told.act(make_snapshot(), masks) == Action(Op.GERMINATE, "r0c0", DEFAULT_ROTATION["transformer"][0])
    masks[2][Op.GROW, space.blueprints.index("block")] = False
    heuristic.reset()
    assert heuristic.act(make_snapshot(), masks) == Action(Op.GERMINATE, "r0c0", DEFAULT_ROTATION["transformer"][0])
