"""Tests for the reward formulas; expected values are worked out by hand from the formulas in
docs/architecture.md#rewards and env/rewards.py."""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from morphogen.core.lifecycle import Criterion, Stage
from morphogen.env.actions import Action, Op
from morphogen.env.rewards import (
    RewardBreakdown,
    RewardConfig,
    RewardMode,
    action_cost,
    compute_reward,
    contribution_reward,
    loss_delta_reward,
    parameter_rent,
    shaping_reward,
    stage_potential,
    terminal_reward,
)
from morphogen.env.snapshot import EpisodeSnapshot, SlotSnapshot

SLOT_IDS = ("r0c0", "r0c1", "r0c2")
CONFIG = RewardConfig()
# The default potentials times the default shaping scale 0.05, written out independently of the code.
PHI = {Stage.DORMANT: 0.0, Stage.GERMINATED: 0.05, Stage.TRAINING: 0.10, Stage.BLENDING: 0.175,
       Stage.HOLDING: 0.275, Stage.FOSSILIZED: 0.30, Stage.PRUNED: 0.0, Stage.EMBARGOED: 0.0,
       Stage.RESETTING: 0.0}
MODE_COMPONENTS = {
    RewardMode.CONTRIBUTION: ("contribution", "shaping", "rent", "action_cost", "terminal", "rollback"),
    RewardMode.SIMPLIFIED: ("shaping", "action_cost", "terminal", "rollback"),
    RewardMode.SPARSE: ("terminal", "rent", "rollback"),
    RewardMode.LOSS: ("loss_delta", "rent", "action_cost", "terminal", "rollback"),
}


def make_slot(slot_id: str, stage: Stage = Stage.DORMANT, **overrides: Any) -> SlotSnapshot:
    fields: dict[str, Any] = dict(
        slot_id=slot_id, stage=stage, blueprint=None, alpha=0.0, alpha_target=0.0,
        alpha_progress=0.0, alpha_ramping=False, epochs_in_stage=0, seed_age=0, seed_parameters=0,
        contribution=None, previous_contribution=None, gradient_norm=None, gradient_health=None,
        gradient_ratio=None,
    )
    fields.update(overrides)
    return SlotSnapshot(**fields)


def make_snapshot(*slots: SlotSnapshot, **overrides: Any) -> EpisodeSnapshot:
    """A snapshot whose slots are `slots` followed by dormant ones up to the three SLOT_IDS."""
    given_ids = {slot.slot_id for slot in slots}
    by_id = {slot.slot_id: slot for slot in slots}
    all_slots = tuple(by_id[slot_id] if slot_id in given_ids else make_slot(slot_id) for slot_id in SLOT_IDS)
    fields: dict[str, Any] = dict(
        epoch=1, max_epochs=20, train_loss=1.0, val_loss=1.0, val_accuracy=50.0, accuracy_history=(50.0,),
        loss_history=(1.0,), host_parameters=10_000, active_parameters=10_000, slots=all_slots,
        accuracy_all_off=None, last_op=0, last_action_succeeded=True,
    )
    fields.update(overrides)
    return EpisodeSnapshot(**fields)


def staged(*stages: Stage) -> EpisodeSnapshot:
    slots = (make_slot(slot_id, stage) for slot_id, stage in zip(SLOT_IDS, stages, strict=False))
    return make_snapshot(*slots)


# ---------------------------------------------------------------- rent
@pytest.mark.parametrize(("added", "host", "expected"), [
    (0, 10_000, 0.0),
    (10_000, 10_000, -0.5 * math.log(2.0)),          # doubling the host: -0.3466
    (1_000, 10_000, -0.5 * math.log(1.1)),           # +10 %: -0.04766
    (100, 50, -0.5 * math.log(1.5)),                 # host below the floor: 100 / 200
    (100, 200, -0.5 * math.log(1.5)),                # host at the floor
    (100, 0, -0.5 * math.log(1.5)),                  # no host at all still divides by the floor
    (190_000, 10_000, -0.5 * math.log(20.0)),        # 0.5 ln 20 = 1.4979, just under the cap
    (10**9, 10_000, -1.5),                           # far beyond the cap
])
def test_parameter_rent_matches_the_formula(added: int, host: int, expected: float) -> None:
    assert parameter_rent(added, host, CONFIG) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_parameter_rent_cap_starts_at_e_cubed() -> None:
    # 0.5 ln(1 + x) = 1.5  <=>  x = e^3 - 1 = 19.0855...; just above it the cap binds.
    host = 10_000
    assert parameter_rent(int(19.0 * host), host, CONFIG) > -1.5
    assert parameter_rent(int(19.1 * host), host, CONFIG) == -1.5
    custom = RewardConfig(rent_weight=1.0, rent_cap=0.25, rent_floor_parameters=1)
    assert parameter_rent(1, 4, custom) == pytest.approx(-math.log(1.25))  # 0.2231 < 0.25
    assert parameter_rent(1, 2, custom) == -0.25                          # ln 1.5 = 0.405 capped


def test_parameter_rent_rejects_negative_counts() -> None:
    with pytest.raises(ValueError, match="parameter counts"):
        parameter_rent(-1, 100, CONFIG)


def test_dense_modes_charge_rent_per_step_and_once_more_at_the_end() -> None:
    previous = make_snapshot(active_parameters=20_000, max_epochs=20)
    current = make_snapshot(active_parameters=20_000, max_epochs=20)
    formula = -0.5 * math.log(2.0)
    wait = Action()
    for mode in (RewardMode.CONTRIBUTION, RewardMode.LOSS):
        mid = compute_reward(mode, previous, current, wait, True, False, CONFIG)
        last = compute_reward(mode, previous, current, wait, True, True, CONFIG)
        assert dict(mid.components)["rent"] == pytest.approx(formula / 20)
        assert dict(last.components)["rent"] == pytest.approx(formula / 20 + formula)
    sparse_last = compute_reward(RewardMode.SPARSE, previous, current, wait, True, True, CONFIG)
    assert dict(sparse_last.components)["rent"] == pytest.approx(formula)


# ---------------------------------------------------------------- shaping
def test_stage_potential_is_scaled_table_value() -> None:
    for stage, expected in PHI.items():
        assert stage_potential(stage, CONFIG) == pytest.approx(expected), stage
    assert stage_potential(Stage.HOLDING, RewardConfig(shaping_scale=1.0, potential_holding=2.0)) == 2.0


def test_one_shaping_step_with_discount() -> None:
    previous = staged(Stage.TRAINING)
    current = staged(Stage.BLENDING)
    # 0.995 * 0.175 - 0.10
    assert shaping_reward(previous, current, False, CONFIG, 0.995) == pytest.approx(0.074125)
    # At the end of the episode the next state's potential is 0: -0.10.
    assert shaping_reward(previous, current, True, CONFIG, 0.995) == pytest.approx(-0.10)


TRAJECTORY = [
    (Stage.DORMANT, Stage.DORMANT, Stage.DORMANT),
    (Stage.GERMINATED, Stage.DORMANT, Stage.DORMANT),
    (Stage.TRAINING, Stage.DORMANT, Stage.DORMANT),
    (Stage.BLENDING, Stage.GERMINATED, Stage.DORMANT),
    (Stage.HOLDING, Stage.TRAINING, Stage.DORMANT),
    (Stage.FOSSILIZED, Stage.PRUNED, Stage.GERMINATED),
    (Stage.FOSSILIZED, Stage.EMBARGOED, Stage.TRAINING),
]


def test_shaping_telescopes_over_a_trajectory() -> None:
    snapshots = [staged(*stages) for stages in TRAJECTORY]
    total = sum(shaping_reward(a, b, False, CONFIG, 1.0) for a, b in itertools.pairwise(snapshots))
    # Phi(last) - Phi(first) = (0.30 + 0 + 0.10) - 0
    assert total == pytest.approx(0.40)
    # Ending the episode on the last step zeroes the terminal potential: the sum is -Phi(first) = 0.
    steps = list(itertools.pairwise(snapshots))
    ended = sum(shaping_reward(a, b, i == len(steps) - 1, CONFIG, 1.0) for i, (a, b) in enumerate(steps))
    assert ended == pytest.approx(0.0, abs=1e-12)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(*[st.sampled_from(list(Stage))] * 3), min_size=2, max_size=12))
def test_shaping_telescopes_for_any_stage_sequence(sequence: list[tuple[Stage, Stage, Stage]]) -> None:
    snapshots = [staged(*stages) for stages in sequence]
    total = math.fsum(shaping_reward(a, b, False, CONFIG, 1.0)
                      for a, b in itertools.pairwise(snapshots))
    expected = sum(PHI[s] for s in sequence[-1]) - sum(PHI[s] for s in sequence[0])
    assert total == pytest.approx(expected, abs=1e-9)


# ---------------------------------------------------------------- contribution
def test_contribution_credit_is_scaled_by_alpha() -> None:
    full = make_snapshot(make_slot("r0c0", Stage.HOLDING, alpha=1.0, contribution=3.0))
    ramping = make_snapshot(make_slot("r0c0", Stage.BLENDING, alpha=0.25, contribution=4.0))
    assert contribution_reward(full, CONFIG) == pytest.approx(0.3)     # 0.1 * 1.0 * 3
    assert contribution_reward(ramping, CONFIG) == pytest.approx(0.1)  # 0.1 * 0.25 * 4


def test_tiny_alpha_does_not_farm_contribution() -> None:
    tiny = make_snapshot(make_slot("r0c0", Stage.BLENDING, alpha=0.02, contribution=5.0))
    assert contribution_reward(tiny, CONFIG) == pytest.approx(0.01)  # 0.1 * 0.02 * 5, not 0.5


def test_contribution_is_clipped_and_harm_is_charged_in_full() -> None:
    huge = make_snapshot(make_slot("r0c0", Stage.FOSSILIZED, alpha=1.0, contribution=25.0))
    harmful = make_snapshot(make_slot("r0c0", Stage.BLENDING, alpha=0.5, contribution=-25.0))
    mildly_harmful = make_snapshot(make_slot("r0c0", Stage.BLENDING, alpha=0.5, contribution=-2.0))
    assert contribution_reward(huge, CONFIG) == pytest.approx(1.0)          # clipped to 10 points
    assert contribution_reward(harmful, CONFIG) == pytest.approx(-1.0)      # clipped, not alpha-scaled
    assert contribution_reward(mildly_harmful, CONFIG) == pytest.approx(-0.2)
    custom = RewardConfig(contribution_clip=2.0, contribution_scale=1.0)
    assert contribution_reward(huge, custom) == pytest.approx(2.0)


@pytest.mark.parametrize("slot", [
    make_slot("r0c0", Stage.TRAINING, alpha=0.0, contribution=4.0),
    make_slot("r0c0", Stage.TRAINING, alpha=1.0, contribution=4.0),
    make_slot("r0c0", Stage.BLENDING, alpha=0.0, contribution=4.0),
    make_slot("r0c0", Stage.HOLDING, alpha=1.0, contribution=None),
    make_slot("r0c0", Stage.PRUNED, alpha=0.5, contribution=4.0),
])
def test_contribution_counts_only_for_blended_seeds_with_alpha_and_a_measurement(slot: SlotSnapshot) -> None:
    assert contribution_reward(make_snapshot(slot), CONFIG) == 0.0


def test_contributions_are_capped_by_the_gain_over_all_seeds_off() -> None:
    first = make_slot("r0c0", Stage.HOLDING, alpha=1.0, contribution=3.0)
    second = make_slot("r0c1", Stage.HOLDING, alpha=1.0, contribution=5.0)
    harmful = make_slot("r0c2", Stage.BLENDING, alpha=0.5, contribution=-2.0)
    # Claimed 8 points, gained 80 - 76 = 4: positives halved -> 1.5 + 2.5 = 4 points -> 0.4.
    capped = make_snapshot(first, second, val_accuracy=80.0, accuracy_all_off=76.0)
    assert contribution_reward(capped, CONFIG) == pytest.approx(0.4)
    # The harmful seed is charged in full: (1.5 + 2.5 - 2) * 0.1.
    with_harm = make_snapshot(first, second, harmful, val_accuracy=80.0, accuracy_all_off=76.0)
    assert contribution_reward(with_harm, CONFIG) == pytest.approx(0.2)
    # Gain larger than the claims: nothing is capped (0.1 * 8).
    assert contribution_reward(make_snapshot(first, second, val_accuracy=80.0, accuracy_all_off=60.0),
                               CONFIG) == pytest.approx(0.8)
    # No gain over all-off: no positive credit at all.
    assert contribution_reward(make_snapshot(first, second, val_accuracy=80.0, accuracy_all_off=81.0),
                               CONFIG) == 0.0
    # Unmeasured baseline: no cap.
    assert contribution_reward(make_snapshot(first, second, val_accuracy=80.0), CONFIG) == pytest.approx(0.8)


@pytest.mark.parametrize("unit", [1e-5, 1.0, 400.0])
def test_a_task_with_its_own_loss_is_credited_for_the_share_of_the_loss_a_seed_removes(unit: float) -> None:
    relative = Criterion.RELATIVE_LOSS
    # Removing the seed makes the loss a fifth larger: 10 * ln(1.2) = 1.82 points, times the 0.1 scale; the
    # score in the slot (the negated loss, whatever its unit) is not read.
    kept = make_slot("r0c0", Stage.HOLDING, alpha=1.0, contribution=1e-9, loss_contribution=0.2 * unit)
    harmful = make_slot("r0c1", Stage.HOLDING, alpha=1.0, contribution=0.0, loss_contribution=-0.5 * unit)
    unmeasured = make_slot("r0c2", Stage.HOLDING, alpha=1.0, contribution=5.0)
    snapshot = make_snapshot(kept, harmful, unmeasured, val_loss=unit, criterion=relative, accuracy_all_off=-9.0)
    # Without the harmful seed the loss would be half: 10 * ln(0.5) = -6.93, charged in full; no all-off cap.
    assert contribution_reward(snapshot, CONFIG) == pytest.approx(0.1 * 10 * (math.log(1.2) + math.log(0.5)))
    before, after = make_snapshot(val_loss=1.2 * unit, criterion=relative), make_snapshot(val_loss=unit,
                                                                                         criterion=relative)
    assert loss_delta_reward(before, after, CONFIG) == pytest.approx(math.log(1.2))


# ---------------------------------------------------------------- costs, terminal, loss
def test_action_costs() -> None:
    assert action_cost(Op.WAIT, True, CONFIG) == 0.0
    assert action_cost(Op.WAIT, False, CONFIG) == 0.0
    assert action_cost(Op.GERMINATE, True, CONFIG) == pytest.approx(-0.02)
    assert action_cost(Op.GERMINATE, False, CONFIG) == pytest.approx(-0.03)
    assert action_cost(Op.PRUNE, True, CONFIG) == pytest.approx(-0.01)
    assert action_cost(Op.ADVANCE, False, CONFIG) == pytest.approx(-0.015)


def test_loss_delta_reward() -> None:
    previous = make_snapshot(val_loss=1.2)
    assert loss_delta_reward(previous, make_snapshot(val_loss=0.9), CONFIG) == pytest.approx(0.3)
    assert loss_delta_reward(previous, make_snapshot(val_loss=1.5), CONFIG) == pytest.approx(-0.3)
    assert loss_delta_reward(previous, make_snapshot(val_loss=5.0), CONFIG) == -1.0  # clipped
    assert loss_delta_reward(previous, make_snapshot(val_loss=float("nan")), CONFIG) == -1.0
    assert loss_delta_reward(make_snapshot(val_loss=float("inf")), previous, CONFIG) == 0.0
    scaled = RewardConfig(loss_delta_scale=2.0, loss_delta_clip=10.0)
    assert loss_delta_reward(previous, make_snapshot(val_loss=0.9), scaled) == pytest.approx(0.6)


# ---------------------------------------------------------------- the modes
def test_contribution_mode_step_by_hand() -> None:
    previous = make_snapshot(make_slot("r0c0", Stage.BLENDING, alpha=0.5, contribution=1.0),
                             make_slot("r0c1", Stage.TRAINING), active_parameters=12_000)
    current = make_snapshot(make_slot("r0c0", Stage.HOLDING, alpha=1.0, contribution=2.0),
                            make_slot("r0c1", Stage.TRAINING), active_parameters=12_000, val_accuracy=70.0)
    action = Action(op=Op.ADVANCE, slot="r0c0")
    reward = compute_reward(RewardMode.CONTRIBUTION, previous, current, action, True, False, CONFIG, 0.99)
    expected = {
        "contribution": 0.1 * 1.0 * 2.0,
        "shaping": 0.99 * (0.275 + 0.10) - (0.175 + 0.10),
        "rent": -0.5 * math.log(1.2) / 20,
        "action_cost": -0.005,
        "terminal": 0.0,
        "rollback": 0.0,
    }
    assert [name for name, _ in reward.components] == list(expected)
    for name, value in expected.items():
        assert dict(reward.components)[name] == pytest.approx(value), name
    assert reward.total == pytest.approx(sum(expected.values()))


def test_terminal_and_rollback_terms() -> None:
    previous = make_snapshot()
    current = make_snapshot(val_accuracy=80.0, rolled_back=True)
    reward = compute_reward(RewardMode.SIMPLIFIED, previous, current, Action(), True, True, CONFIG)
    assert dict(reward.components)["terminal"] == pytest.approx(0.8)
    assert dict(reward.components)["rollback"] == -1.0
    weighted = RewardConfig(terminal_accuracy_weight=2.0, rollback_penalty=0.25)
    reward = compute_reward(RewardMode.SIMPLIFIED, previous, current, Action(), True, True, weighted)
    assert dict(reward.components)["terminal"] == pytest.approx(1.6)
    assert dict(reward.components)["rollback"] == -0.25


@pytest.mark.parametrize("unit", [1e-6, 1.0, 250.0])
def test_a_task_with_its_own_loss_is_rewarded_for_the_share_of_the_loss_growth_removed(unit: float) -> None:
    relative = Criterion.RELATIVE_LOSS
    config = RewardConfig(terminal_accuracy_weight=50.0)

    def terminal(loss: float) -> float:  # the score is the negated loss: judged by it, growth is worth ~nothing
        snapshot = make_snapshot(val_loss=loss * unit, val_accuracy=-loss * unit, criterion=relative)
        return terminal_reward(snapshot, config)

    # A loss a fifth lower than the no-growth twin's: 50 / 100 * 10 * ln(1 / 0.8) = 1.12, in any unit of the loss.
    assert terminal(0.08) - terminal(0.10) == pytest.approx(0.5 * 10 * math.log(1.25))
    # A loss that is not positive or not finite has no log: the terminal reads the score, as for accuracy.
    assert terminal_reward(make_snapshot(val_loss=-0.5, val_accuracy=0.5, criterion=relative), config) == 0.25
    assert terminal_reward(make_snapshot(val_loss=math.inf, val_accuracy=-7.0, criterion=relative), config) == -3.5
    # A classifier's terminal is its accuracy, whatever its loss.
    assert terminal_reward(make_snapshot(val_loss=0.1, val_accuracy=80.0, criterion=Criterion.LOSS), config) == 40.0


def test_sparse_is_zero_before_done_except_rollback() -> None:
    previous = staged(Stage.TRAINING)
    current = make_snapshot(make_slot("r0c0", Stage.BLENDING, alpha=0.5, contribution=3.0),
                            active_parameters=15_000, val_accuracy=90.0)
    germinate = Action(op=Op.GERMINATE, slot="r0c1", blueprint="norm")
    mid = compute_reward(RewardMode.SPARSE, previous, current, germinate, False, False, CONFIG)
    assert mid.total == 0.0 and all(value == 0.0 for _, value in mid.components)
    rolled = dataclasses.replace(current, rolled_back=True)
    assert compute_reward(RewardMode.SPARSE, previous, rolled, germinate, False, False, CONFIG).total == -1.0
    last = compute_reward(RewardMode.SPARSE, previous, current, germinate, False, True, CONFIG)
    assert dict(last.components)["terminal"] == pytest.approx(0.9)
    assert dict(last.components)["rent"] == pytest.approx(-0.5 * math.log(1.5))
    assert last.total == pytest.approx(0.9 - 0.5 * math.log(1.5))


def test_compute_reward_rejects_bad_inputs() -> None:
    snapshot = make_snapshot()
    with pytest.raises(TypeError, match="RewardMode"):
        compute_reward("contribution", snapshot, snapshot, Action(), True, False, CONFIG)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gamma"):
        compute_reward(RewardMode.CONTRIBUTION, snapshot, snapshot, Action(), True, False, CONFIG, gamma=0.0)
    other_episode = dataclasses.replace(snapshot, slots=snapshot.slots[:2])
    with pytest.raises(ValueError, match="different episodes"):
        compute_reward(RewardMode.CONTRIBUTION, snapshot, other_episode, Action(), True, False, CONFIG)


# ---------------------------------------------------------------- config and breakdown
@pytest.mark.parametrize(("field", "value", "error"), [
    ("rent_weight", -0.1, ValueError),
    ("rent_cap", float("nan"), ValueError),
    ("rent_floor_parameters", 0, ValueError),
    ("rent_floor_parameters", 200.5, ValueError),
    ("contribution_clip", 0.0, ValueError),
    ("loss_delta_clip", 0.0, ValueError),
    ("germinate_cost", -0.02, ValueError),
    ("shaping_scale", float("inf"), ValueError),
    ("rollback_penalty", "1", TypeError),
    ("terminal_accuracy_weight", True, TypeError),
])
def test_config_validation_names_the_field(field: str, value: object, error: type[Exception]) -> None:
    with pytest.raises(error, match=field):
        RewardConfig(**{field: value})


def test_potentials_may_be_negative() -> None:
    config = RewardConfig(potential_training=-1.0)
    assert stage_potential(Stage.TRAINING, config) == pytest.approx(-0.05)


def test_breakdown_total_must_be_the_sum() -> None:
    breakdown = RewardBreakdown.from_components([("a", 0.1), ("b", 0.2), ("c", -0.05)])
    assert breakdown.total == pytest.approx(0.25)
    assert breakdown.components == (("a", 0.1), ("b", 0.2), ("c", -0.05))
    with pytest.raises(ValueError, match="not the sum"):
        RewardBreakdown(1.0, (("a", 0.1),))
    with pytest.raises(ValueError, match="non-finite"):
        RewardBreakdown.from_components([("a", float("nan"))])


optional_points = st.none() | st.floats(-100.0, 100.0)


@st.composite
def slots(draw: st.DrawFn, slot_id: str) -> SlotSnapshot:
    return make_slot(slot_id, draw(st.sampled_from(list(Stage))), alpha=draw(st.floats(0.0, 1.0)),
                     contribution=draw(optional_points))


@st.composite
def episode_snapshots(draw: st.DrawFn) -> EpisodeSnapshot:
    host = draw(st.integers(0, 10**7))
    return make_snapshot(
        *(draw(slots(slot_id)) for slot_id in SLOT_IDS),
        val_loss=draw(st.floats(0.0, 20.0)), val_accuracy=draw(st.floats(0.0, 100.0)),
        host_parameters=host, active_parameters=host + draw(st.integers(0, 10**8)),
        accuracy_all_off=draw(st.none() | st.floats(0.0, 100.0)), rolled_back=draw(st.booleans()),
    )


@settings(max_examples=80, deadline=None)
@given(mode=st.sampled_from(list(RewardMode)), previous=episode_snapshots(), current=episode_snapshots(),
       op=st.sampled_from(list(Op)), succeeded=st.booleans(), done=st.booleans(),
       gamma=st.floats(0.5, 1.0))
def test_total_is_the_sum_of_the_components_in_every_mode(
    mode: RewardMode, previous: EpisodeSnapshot, current: EpisodeSnapshot, op: Op, succeeded: bool,
    done: bool, gamma: float,
) -> None:
    reward = compute_reward(mode, previous, current, Action(op=op), succeeded, done, CONFIG, gamma)
    assert [name for name, _ in reward.components] == list(MODE_COMPONENTS[mode])
    assert reward.total == pytest.approx(sum(value for _, value in reward.components), rel=1e-12, abs=1e-12)
    assert math.isfinite(reward.total)
    if mode is RewardMode.SPARSE and not done:
        assert reward.total == (-1.0 if current.rolled_back else 0.0)
    # Every rent charge stays within the cap (per step plus the final full charge).
    if "rent" in MODE_COMPONENTS[mode]:
        assert -1.5 * (1 + 1 / 20) - 1e-12 <= dict(reward.components)["rent"] <= 0.0
