"""Tests for the observation encoding; every expected value is worked out by hand from the snapshot."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from morphogen.core.lifecycle import Stage
from morphogen.env.actions import Action, Op
from morphogen.env.growth_signals import MIN_RELATIVE_FLOPS
from morphogen.env.observation import (
    BLUEPRINT_FEATURES,
    BLUEPRINT_KINDS,
    BLUEPRINT_SIZE,
    GLOBAL_FEATURES,
    GLOBAL_SIZE,
    LOG_RATIO_LIMIT,
    MAGNITUDE_CEILING,
    SLOT_FEATURES,
    SLOT_SIZE,
    UNMEASURED,
    blueprint_kind,
    encode_observation,
    feature_bounds,
    loss_ratio,
)
from morphogen.env.snapshot import HISTORY_LENGTH, EpisodeSnapshot, SlotSnapshot

SLOT_IDS = ("r0c0", "r0c1")


def make_slot(slot_id: str, stage: Stage = Stage.DORMANT, **overrides: Any) -> SlotSnapshot:
    fields: dict[str, Any] = dict(
        slot_id=slot_id, stage=stage, blueprint=None, alpha=0.0, alpha_target=0.0,
        alpha_progress=0.0, alpha_ramping=False, epochs_in_stage=0, seed_age=0, seed_parameters=0,
        contribution=None, previous_contribution=None, gradient_norm=None, gradient_health=None,
        gradient_ratio=None,
    )
    fields.update(overrides)
    return SlotSnapshot(**fields)


def make_snapshot(slots: tuple[SlotSnapshot, ...] | None = None, **overrides: Any) -> EpisodeSnapshot:
    fields: dict[str, Any] = dict(
        epoch=0, max_epochs=20, train_loss=None, val_loss=2.0, val_accuracy=10.0, accuracy_history=(10.0,),
        loss_history=(2.0,), host_parameters=1000, active_parameters=1000,
        slots=slots if slots is not None else tuple(make_slot(slot_id) for slot_id in SLOT_IDS),
        accuracy_all_off=None, last_op=0, last_action_succeeded=True, topology="cnn", chance_accuracy=10.0,
        initial_val_loss=2.0,
    )
    fields.update(overrides)
    return EpisodeSnapshot(**fields)


def named(names: tuple[str, ...], values: np.ndarray) -> dict[str, float]:
    return dict(zip(names, values.tolist(), strict=True))


def test_every_feature_has_its_hand_computed_value() -> None:
    holding = make_slot(
        "r0c0", Stage.HOLDING, blueprint="conv_light", alpha=1.0, alpha_target=1.0,
        alpha_progress=1.0, epochs_in_stage=4, seed_age=15, seed_parameters=500, contribution=2.7,
        previous_contribution=1.8, gradient_norm=math.e - 1.0, gradient_health=0.9, gradient_ratio=0.0,
        width_fraction=0.5, resolution_fraction=0.25, depth_fraction=1 / 3,
    )
    snapshot = make_snapshot(
        (holding, make_slot("r0c1")), epoch=3, max_epochs=20, train_loss=1.0, val_loss=1.5, val_accuracy=64.0,
        accuracy_history=(55.0, 59.5, 64.0), loss_history=(2.0, 1.8, 1.5), host_parameters=10_000,
        active_parameters=10_500, last_op=int(Op.GERMINATE), last_action_succeeded=False, chance_accuracy=10.0,
        initial_val_loss=3.0, blueprints=("conv_light", "widen_x4", "mine"),
        blueprint_parameters=((100, 2000, 0), (300, 9000, 5)), blueprint_flops=((500, 0, 7), (1000, 4000, 0)),
        host_flops=2000,
    )
    observation = encode_observation(snapshot)
    # Scores are read against chance (10%), over the 90 points above it; losses against the initial loss 3.0.
    expected_globals = {
        "epoch_fraction": 3 / 20, "score": 0.6, "loss_ratio": math.log(0.5),
        "train_loss_ratio": math.log(1 / 3), "train_loss_ratio_measured": 1.0,
        "score_history[-5]": -1.0, "score_history[-4]": -1.0, "score_history[-3]": 0.5,
        "score_history[-2]": 0.55, "score_history[-1]": 0.6, "score_history_count": 0.6,
        "loss_ratio_history[-5]": -1.0, "loss_ratio_history[-4]": -1.0,
        "loss_ratio_history[-3]": math.log(2 / 3), "loss_ratio_history[-2]": math.log(0.6),
        "loss_ratio_history[-1]": math.log(0.5), "loss_ratio_history_count": 0.6,
        "score_delta": 0.05, "score_delta_measured": 1.0,
        "stage_fraction/dormant": 0.5, "stage_fraction/holding": 0.5,
        "last_op/GERMINATE": 1.0, "last_action_succeeded": 0.0, "added_parameters": math.log1p(0.05),
        "gain_over_all_off": -1.0, "gain_over_all_off_measured": 0.0, "rolled_back": 0.0, "slot_share": 0.5,
    }
    expected_holding = {
        "stage/holding": 1.0, "alpha": 1.0, "alpha_target": 1.0, "alpha_progress": 1.0, "alpha_ramping": 0.0,
        "contribution": 0.03, "contribution_measured": 1.0, "contribution_trend": 0.01,
        "contribution_trend_measured": 1.0, "gradient_norm": 1.0, "gradient_norm_measured": 1.0,
        "gradient_health": 0.9, "gradient_health_measured": 1.0, "gradient_ratio": 0.0,
        "gradient_ratio_measured": 1.0, "epochs_in_stage": 0.2, "seed_age": 0.75, "seed_parameters": math.log1p(0.05),
        "width_fraction": 0.5, "resolution_fraction": 0.25, "depth_fraction": 1 / 3, "seed_kind/deepen": 1.0,
    }
    expected_dormant = {
        "stage/dormant": 1.0, "contribution": -1.0, "contribution_trend": -1.0, "gradient_norm": -1.0,
        "gradient_health": -1.0, "gradient_ratio": -1.0, "width_fraction": 1.0, "resolution_fraction": 1.0,
        "depth_fraction": 0.5,
    }
    # Every position not listed is 0 (other one-hots, flags, the empty slot's alpha and clocks).
    for names, values, expected in ((GLOBAL_FEATURES, observation.globals, expected_globals),
                                    (SLOT_FEATURES, observation.slots[0], expected_holding),
                                    (SLOT_FEATURES, observation.slots[1], expected_dormant)):
        actual = named(names, values)
        assert set(expected) <= set(actual)
        for name, value in actual.items():
            assert value == pytest.approx(expected.get(name, 0.0), rel=1e-6, abs=1e-7), name
    assert observation.blueprints.shape == (2, 3, BLUEPRINT_SIZE)
    kinds = BLUEPRINT_KINDS.index
    flops = ((500, 0, 7), (1000, 4000, 0))
    for slot, counts in enumerate(((100, 2000, 0), (300, 9000, 5))):
        for blueprint, (kind, count) in enumerate(zip(("deepen", "widen", "other"), counts, strict=True)):
            row = named(BLUEPRINT_FEATURES, observation.blueprints[slot, blueprint])
            assert row["parameters"] == pytest.approx(math.log1p(count / 10_000))
            assert row["flops"] == pytest.approx(math.log1p(flops[slot][blueprint] / 2000))
            assert row["flops_measured"] == 1.0
            assert row[f"kind/{kind}"] == 1.0 and sum(observation.blueprints[slot, blueprint, :kinds("other") + 1]) == 1
    assert observation.globals.dtype == observation.slots.dtype == observation.blueprints.dtype == np.float32


def test_scores_mean_the_same_on_tasks_with_different_chance_levels() -> None:
    """Half-way from guessing to perfect is a score of 0.5 on 2 classes and on 10; a task's own metric has no
    chance level and is read as metric / 100."""
    two = named(GLOBAL_FEATURES, encode_observation(make_snapshot(val_accuracy=75.0, chance_accuracy=50.0)).globals)
    ten = named(GLOBAL_FEATURES, encode_observation(make_snapshot(val_accuracy=55.0, chance_accuracy=10.0)).globals)
    own = named(GLOBAL_FEATURES, encode_observation(make_snapshot(val_accuracy=-0.3, chance_accuracy=None)).globals)
    assert two["score"] == pytest.approx(0.5) == ten["score"]
    assert own["score"] == pytest.approx(-0.003)


@pytest.mark.parametrize(("loss", "initial", "expected"), [
    (1.0, 2.0, math.log(0.5)), (2.0, 2.0, 0.0), (float("nan"), 2.0, LOG_RATIO_LIMIT), (1e30, 1e-9, LOG_RATIO_LIMIT),
    (-1.0, -2.0, 0.5), (1.0, None, 0.0),
])
def test_loss_ratio_is_the_log_ratio_to_the_initial_loss(loss: float, initial: float | None, expected: float) -> None:
    assert loss_ratio(loss, initial) == pytest.approx(expected)


def test_unmeasured_gives_sentinel_and_flag_zero_but_measured_zero_gives_zero_and_flag_one() -> None:
    measured_zero = make_slot("r0c0", Stage.HOLDING, alpha=1.0, contribution=0.0, previous_contribution=0.0,
                              gradient_norm=0.0, gradient_health=0.0, gradient_ratio=0.0)
    unmeasured = make_slot("r0c1", Stage.HOLDING, alpha=1.0)
    zero_snapshot = make_snapshot((measured_zero, unmeasured), train_loss=2.0, accuracy_all_off=10.0,
                                  accuracy_history=(10.0, 10.0))
    unknown_snapshot = make_snapshot((measured_zero, unmeasured), train_loss=None, accuracy_all_off=None)
    zero, unknown = encode_observation(zero_snapshot), encode_observation(unknown_snapshot)
    measured_row, unmeasured_row = named(SLOT_FEATURES, zero.slots[0]), named(SLOT_FEATURES, zero.slots[1])
    for name in ("contribution", "contribution_trend", "gradient_norm", "gradient_health", "gradient_ratio"):
        assert (measured_row[name], measured_row[f"{name}_measured"]) == (0.0, 1.0)
        assert (unmeasured_row[name], unmeasured_row[f"{name}_measured"]) == (UNMEASURED, 0.0)
    zero_globals, unknown_globals = named(GLOBAL_FEATURES, zero.globals), named(GLOBAL_FEATURES, unknown.globals)
    for name in ("train_loss_ratio", "gain_over_all_off", "score_delta"):
        assert (zero_globals[name], zero_globals[f"{name}_measured"]) == (0.0, 1.0)
        assert (unknown_globals[name], unknown_globals[f"{name}_measured"]) == (UNMEASURED, 0.0)


@pytest.mark.parametrize("entries", [0, 1, 4, 5, 7])
def test_history_is_right_aligned_padded_and_counted(entries: int) -> None:
    accuracies = tuple(10.0 + 9.0 * (i + 1) for i in range(entries))
    losses = tuple(2.0 * (i + 1) for i in range(entries))
    features = named(GLOBAL_FEATURES, encode_observation(make_snapshot(accuracy_history=accuracies,
                                                                       loss_history=losses)).globals)
    kept = min(entries, HISTORY_LENGTH)
    padding = [UNMEASURED] * (HISTORY_LENGTH - kept)
    expected_score = padding + [(a - 10.0) / 90.0 for a in accuracies[entries - kept:]]
    expected_loss = padding + [math.log(x / 2.0) for x in losses[entries - kept:]]
    offsets = range(-HISTORY_LENGTH, 0)
    assert [features[f"score_history[{k}]"] for k in offsets] == pytest.approx(expected_score)
    assert [features[f"loss_ratio_history[{k}]"] for k in offsets] == pytest.approx(expected_loss)
    assert features["score_history_count"] == pytest.approx(kept / HISTORY_LENGTH)
    assert features["score_delta_measured"] == (1.0 if entries >= 2 else 0.0)
    if entries >= 2:  # the two newest accuracies differ by 9 points: 0.1 of the 90 above chance
        assert features["score_delta"] == pytest.approx(0.1)


def test_slot_rows_follow_the_snapshot_order_and_do_not_depend_on_the_other_slots() -> None:
    first = make_slot("r0c0", Stage.TRAINING, blueprint="norm", seed_age=4)
    second = make_slot("r0c1", Stage.BLENDING, blueprint="widen_x2", alpha=0.3)
    in_order = encode_observation(make_snapshot((first, second)))
    reversed_order = encode_observation(make_snapshot((second, first)))
    np.testing.assert_array_equal(in_order.slots, reversed_order.slots[::-1])
    np.testing.assert_array_equal(in_order.globals, reversed_order.globals)
    alone = encode_observation(make_snapshot((first,)))
    # Only the per-slot share and the stage fractions of the globals see the other slot.
    np.testing.assert_array_equal(alone.slots[0], in_order.slots[0])


@pytest.mark.parametrize("n_slots", [1, 2, 3, 6])
def test_sizes_do_not_depend_on_the_number_of_slots_or_the_episode_length(n_slots: int) -> None:
    slots = tuple(make_slot(f"r0c{i}") for i in range(n_slots))
    for max_epochs in (5, 30, 100):
        observation = encode_observation(make_snapshot(slots, max_epochs=max_epochs, blueprints=("norm", "lora"),
                                                       blueprint_parameters=((10, 20),) * n_slots))
        assert observation.globals.shape == (GLOBAL_SIZE,)
        assert observation.slots.shape == (n_slots, SLOT_SIZE)
        assert observation.blueprints.shape == (n_slots, 2, BLUEPRINT_SIZE)
    assert len(set(GLOBAL_FEATURES)) == GLOBAL_SIZE and len(set(SLOT_FEATURES)) == SLOT_SIZE


def test_built_in_blueprints_have_their_kinds_and_a_user_blueprint_is_other() -> None:
    assert [blueprint_kind(name) for name in ("conv_heavy", "widen_x8", "lora", "attention", "norm", "mine")] == [
        "deepen", "widen", "adapter", "attention", "norm", "other"]


def test_non_finite_magnitudes_encode_as_the_ceiling() -> None:
    exploded = make_slot("r0c0", Stage.TRAINING, gradient_norm=float("inf"), gradient_ratio=float("nan"))
    observation = encode_observation(make_snapshot((exploded, make_slot("r0c1")), val_loss=float("nan"),
                                                   train_loss=1e12))
    ceiling = math.log1p(MAGNITUDE_CEILING)
    row = named(SLOT_FEATURES, observation.slots[0])
    assert row["gradient_norm"] == pytest.approx(ceiling) and row["gradient_ratio"] == pytest.approx(ceiling)
    assert row["gradient_norm_measured"] == 1.0
    features = named(GLOBAL_FEATURES, observation.globals)
    assert features["loss_ratio"] == LOG_RATIO_LIMIT and features["train_loss_ratio"] == LOG_RATIO_LIMIT


def test_non_finite_plain_value_raises_with_its_name() -> None:
    broken = make_slot("r0c0", Stage.BLENDING, alpha=float("nan"))
    with pytest.raises(ValueError, match=r"slots features \['alpha'\]"):
        encode_observation(make_snapshot((broken, make_slot("r0c1"))))


def test_flops_of_a_host_nobody_counted_are_unmeasured() -> None:
    observation = encode_observation(make_snapshot(blueprints=("norm",), blueprint_parameters=((4,), (4,))))
    row = named(BLUEPRINT_FEATURES, observation.blueprints[0, 0])
    assert (row["flops"], row["flops_measured"]) == (UNMEASURED, 0.0)


def test_bad_last_op_and_blueprint_table_raise() -> None:
    with pytest.raises(ValueError, match="last_op=7"):
        encode_observation(make_snapshot(last_op=7))
    with pytest.raises(ValueError, match="one row of 2 counts per slot"):
        encode_observation(make_snapshot(blueprints=("norm", "lora"), blueprint_parameters=((1, 2),)))


optional_points = st.none() | st.floats(-100.0, 100.0)
optional_magnitude = st.none() | st.floats(0.0, 1e9)


@st.composite
def snapshots(draw: st.DrawFn) -> EpisodeSnapshot:
    max_epochs = draw(st.integers(1, 50))
    n_slots = draw(st.integers(1, 6))
    slots = tuple(
        make_slot(
            f"r0c{index}", draw(st.sampled_from(list(Stage))),
            blueprint=draw(st.none() | st.sampled_from(["conv_heavy", "lora", "mine"])),
            alpha=draw(st.floats(0.0, 1.0)), alpha_target=draw(st.floats(0.0, 1.0)),
            alpha_progress=draw(st.floats(0.0, 1.0)), alpha_ramping=draw(st.booleans()),
            epochs_in_stage=draw(st.integers(0, max_epochs)), seed_age=draw(st.integers(0, max_epochs)),
            seed_parameters=draw(st.integers(0, 10**6)), contribution=draw(optional_points),
            previous_contribution=draw(optional_points), gradient_norm=draw(optional_magnitude),
            gradient_health=draw(st.none() | st.floats(0.0, 1.0)), gradient_ratio=draw(optional_magnitude),
        )
        for index in range(n_slots)
    )
    history = draw(st.integers(0, 5))
    host = draw(st.integers(1, 10**7))
    return make_snapshot(
        slots, epoch=draw(st.integers(0, max_epochs)), max_epochs=max_epochs,
        train_loss=draw(optional_magnitude), val_loss=draw(st.floats(0.0, 1e9)),
        val_accuracy=draw(st.floats(0.0, 100.0)),
        accuracy_history=tuple(draw(st.lists(st.floats(0.0, 100.0), min_size=history, max_size=history))),
        loss_history=tuple(draw(st.lists(st.floats(0.0, 1e3), min_size=history, max_size=history))),
        host_parameters=host, active_parameters=host + draw(st.integers(0, 10**6)),
        accuracy_all_off=draw(st.none() | st.floats(0.0, 100.0)),
        last_op=draw(st.sampled_from(list(Op))).value,
        last_action_succeeded=draw(st.booleans()), rolled_back=draw(st.booleans()),
        chance_accuracy=draw(st.none() | st.floats(0.0, 99.0)), initial_val_loss=draw(st.none() | st.floats(0, 1e9)),
    )


@settings(max_examples=60, deadline=None)
@given(snapshot=snapshots())
def test_any_snapshot_encodes_to_finite_features_of_the_advertised_sizes(snapshot: EpisodeSnapshot) -> None:
    observation = encode_observation(snapshot)
    assert observation.globals.shape == (GLOBAL_SIZE,)
    assert observation.slots.shape == (len(snapshot.slots), SLOT_SIZE)
    assert np.isfinite(observation.globals).all() and np.isfinite(observation.slots).all()
    features = named(GLOBAL_FEATURES, observation.globals)
    rows = [named(SLOT_FEATURES, row) for row in observation.slots]
    # Flags are 0/1 and a value reads the sentinel exactly when its flag is 0.
    for table in (features, *rows):
        for name, value in table.items():
            if name.endswith("_measured"):
                assert value in (0.0, 1.0)
                if value == 0.0:
                    assert table[name.removesuffix("_measured")] == UNMEASURED
    # One-hots sum to one per slot and for the last op; the stage fractions to one over the slots.
    for row in rows:
        assert sum(row[f"stage/{stage.value}"] for stage in Stage) == 1.0
    assert sum(features[f"last_op/{op.name}"] for op in Op) == 1.0
    assert sum(features[f"stage_fraction/{stage.value}"] for stage in Stage) == pytest.approx(1.0)


@st.composite
def snapshots_with_blueprints(draw: st.DrawFn) -> EpisodeSnapshot:
    """`snapshots()` with three blueprints (one a user's), their costs and each empty slot's growth signals."""
    snapshot = draw(snapshots())
    blueprints = ("conv_light", "wider", "mine")
    n_slots = len(snapshot.slots)
    costs = st.tuples(*[st.integers(0, 10**7)] * len(blueprints))
    signal = st.none() | st.floats(-10.0, 1e9)
    slots = tuple(dataclasses.replace(slot, depth_signal=draw(signal), width_signal=draw(signal),
                                      width_fraction=draw(st.floats(0.01, 1.0)),
                                      resolution_fraction=draw(st.floats(0.01, 1.0)))
                  for slot in snapshot.slots)
    return dataclasses.replace(snapshot, slots=slots, blueprints=blueprints,
                               blueprint_parameters=tuple(draw(costs) for _ in range(n_slots)),
                               blueprint_flops=tuple(draw(costs) for _ in range(n_slots)),
                               host_flops=draw(st.integers(0, 10**9)))


@settings(max_examples=60, deadline=None)
@given(snapshot=snapshots_with_blueprints())
def test_every_feature_stays_within_its_bounds(snapshot: EpisodeSnapshot) -> None:
    """The Gymnasium env advertises `feature_bounds` as its Box; no snapshot may encode outside them."""
    observation = encode_observation(snapshot, Action(Op.GERMINATE, snapshot.slots[0].slot_id, "wider"))
    for names, rows in ((GLOBAL_FEATURES, observation.globals.reshape(1, -1)), (SLOT_FEATURES, observation.slots),
                        (BLUEPRINT_FEATURES, observation.blueprints.reshape(-1, BLUEPRINT_SIZE))):
        for row in rows:
            for name, value in named(names, row).items():
                low, high = feature_bounds(name)
                assert np.float32(low) <= value <= np.float32(high), (name, value, (low, high))


def test_flags_fractions_and_clipped_values_are_bounded_and_scores_are_not() -> None:
    assert feature_bounds("gradient_norm_measured") == feature_bounds("alpha") == feature_bounds("kind/widen") == (0, 1)
    assert feature_bounds("loss_ratio_history[-1]") == (-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    assert feature_bounds("growth_signal") == (UNMEASURED, math.log1p(MAGNITUDE_CEILING))
    assert feature_bounds("seed_parameters") == (0.0, math.inf)
    # A task with its own metric has scores, contributions and gains of any size.
    assert feature_bounds("score") == feature_bounds("contribution") == (-math.inf, math.inf)


def test_growth_signals_are_read_against_the_loss_and_per_relative_flop() -> None:
    """A deepening or unknown blueprint reads the slot's depth signal, a channel-widening one its width signal;
    both over |validation loss|, and per FLOP relative to the host's (the heuristic's score)."""
    measured = make_slot("r0c0", depth_signal=3.0, width_signal=1.5)
    no_width_site = make_slot("r0c1", depth_signal=0.75, width_signal=None)
    seeded = make_slot("r0c2", Stage.TRAINING, blueprint="conv_light")  # not empty: nothing measured
    snapshot = make_snapshot((measured, no_width_site, seeded), val_loss=1.5, topology="cnn",
                             blueprints=("conv_light", "wider", "mine"),
                             blueprint_parameters=((100, 200, 0), (100, 200, 8), (100, 200, 8)),
                             blueprint_flops=((500, 4000, 0), (500, 4000, 0), (500, 4000, 0)), host_flops=2000)
    observation = encode_observation(snapshot)

    def signals(slot: int, blueprint: int) -> tuple[float, float, float]:
        row = named(BLUEPRINT_FEATURES, observation.blueprints[slot, blueprint])
        return row["growth_signal"], row["growth_signal_per_flop"], row["growth_signal_measured"]

    # r0c0: conv_light reads 3.0 / 1.5 = 2 at 500 / 2000 of the host's FLOPs; wider reads 1.5 / 1.5 = 1 at 2x.
    assert signals(0, 0) == pytest.approx((math.log1p(2.0), math.log1p(2.0 / 0.25), 1.0))
    assert signals(0, 1) == pytest.approx((math.log1p(1.0), math.log1p(1.0 / 2.0), 1.0))
    assert signals(0, 2) == (UNMEASURED, UNMEASURED, 0.0)  # adds no parameters there: it cannot go in r0c0
    # r0c1: no layers to widen, so no width signal; the user's blueprint reads the depth signal, and its FLOPs
    # (0, as a norm's) count as MIN_RELATIVE_FLOPS of the host's.
    assert signals(1, 0) == pytest.approx((math.log1p(0.5), math.log1p(0.5 / 0.25), 1.0))
    assert signals(1, 1) == (UNMEASURED, UNMEASURED, 0.0)
    assert signals(1, 2) == pytest.approx((math.log1p(0.5), math.log1p(0.5 / MIN_RELATIVE_FLOPS), 1.0))
    assert all(signals(2, index) == (UNMEASURED, UNMEASURED, 0.0) for index in range(3))
    # An episode that measured no signals (none asked for, or no seed could be germinated) says so everywhere.
    unmeasured = encode_observation(dataclasses.replace(snapshot, slots=tuple(
        dataclasses.replace(slot, depth_signal=None, width_signal=None) for slot in snapshot.slots)))
    flags = unmeasured.blueprints[..., BLUEPRINT_FEATURES.index("growth_signal_measured")]
    assert not flags.any()


def test_advice_marks_its_op_its_slot_and_its_blueprint_there_and_no_advice_marks_nothing() -> None:
    snapshot = make_snapshot(tuple(make_slot(slot_id) for slot_id in ("r0c0", "r0c1", "r0c2")), topology="cnn",
                             blueprints=("conv_light", "wider"), blueprint_parameters=((1, 2),) * 3)
    advised = encode_observation(snapshot, Action(Op.GERMINATE, "r0c1", "wider"))
    features = named(GLOBAL_FEATURES, advised.globals)
    assert features["advice_given"] == 1.0
    assert [features[f"advice/{op.name}"] for op in Op] == [1.0 if op is Op.GERMINATE else 0.0 for op in Op]
    assert advised.slots[:, SLOT_FEATURES.index("advised")].tolist() == [0.0, 1.0, 0.0]
    marks = advised.blueprints[..., BLUEPRINT_FEATURES.index("advised")]
    assert marks.tolist() == [[0.0, 0.0], [0.0, 1.0], [0.0, 0.0]]
    # GROW names a blueprint for every empty slot at once.
    grow = encode_observation(snapshot, Action(Op.GROW, blueprint="conv_light"))
    assert grow.blueprints[..., BLUEPRINT_FEATURES.index("advised")].tolist() == [[1.0, 0.0]] * 3
    # Without advice (the Gymnasium env, a policy trained without it) every advice feature is 0, and so is a WAIT's
    # slot and blueprint; the rest of the observation is the same either way.
    for plain in (encode_observation(snapshot), encode_observation(snapshot, Action())):
        assert not plain.slots[:, SLOT_FEATURES.index("advised")].any()
        assert not plain.blueprints[..., BLUEPRINT_FEATURES.index("advised")].any()
    unadvised = named(GLOBAL_FEATURES, encode_observation(snapshot).globals)
    assert unadvised["advice_given"] == 0.0 and not any(unadvised[f"advice/{op.name}"] for op in Op)
    advice_columns = [GLOBAL_FEATURES.index(name) for name in GLOBAL_FEATURES if name.startswith("advice")]
    assert np.array_equal(np.delete(advised.globals, advice_columns), np.delete(encode_observation(snapshot).globals,
                                                                                 advice_columns))
