"""Tests for the observation encoder; every expected value is worked out by hand from the snapshot."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from morphogen.core.blueprints import blueprint_names
from morphogen.core.lifecycle import Stage
from morphogen.env.actions import Op
from morphogen.env.observation import (
    MAGNITUDE_CEILING,
    UNMEASURED,
    ObservationEncoder,
)
from morphogen.env.snapshot import HISTORY_LENGTH, EpisodeSnapshot, SlotSnapshot

SLOT_IDS = ("r0c0", "r0c1")


def make_slot(slot_id: str, stage: Stage = Stage.DORMANT, **overrides: Any) -> SlotSnapshot:
    fields: dict[str, Any] = dict(
        slot_id=slot_id, stage=stage, blueprint=None, blueprint_id=0, alpha=0.0, alpha_target=0.0,
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
        accuracy_all_off=None, last_op=0, last_action_succeeded=True,
    )
    fields.update(overrides)
    return EpisodeSnapshot(**fields)


def by_name(encoder: ObservationEncoder, features: np.ndarray) -> dict[str, float]:
    return dict(zip(encoder.feature_names(), features.tolist(), strict=True))


def test_every_feature_has_its_hand_computed_value() -> None:
    encoder = ObservationEncoder(SLOT_IDS, "cnn")
    holding = make_slot(
        "r0c0", Stage.HOLDING, blueprint="conv_light", blueprint_id=6, alpha=1.0, alpha_target=1.0,
        alpha_progress=1.0, epochs_in_stage=4, seed_age=15, seed_parameters=500, contribution=2.5,
        previous_contribution=1.5, gradient_norm=math.e - 1.0, gradient_health=0.9, gradient_ratio=0.0,
    )
    snapshot = make_snapshot(
        (holding, make_slot("r0c1")), epoch=3, max_epochs=20, train_loss=1.0, val_loss=1.5, val_accuracy=62.0,
        accuracy_history=(50.0, 58.0, 62.0), loss_history=(2.0, 1.8, 1.5), host_parameters=10_000,
        active_parameters=10_500, last_op=int(Op.GERMINATE), last_action_succeeded=False,
    )
    expected = {
        "epoch_fraction": 3 / 20, "val_loss": math.log(2.5), "val_accuracy": 0.62,
        "train_loss": math.log(2.0), "train_loss_measured": 1.0,
        "accuracy_history[-5]": -1.0, "accuracy_history[-4]": -1.0, "accuracy_history[-3]": 0.50,
        "accuracy_history[-2]": 0.58, "accuracy_history[-1]": 0.62, "accuracy_history_count": 0.6,
        "loss_history[-5]": -1.0, "loss_history[-4]": -1.0, "loss_history[-3]": math.log(3.0),
        "loss_history[-2]": math.log(2.8), "loss_history[-1]": math.log(2.5), "loss_history_count": 0.6,
        "accuracy_delta": 0.04, "accuracy_delta_measured": 1.0,
        "stage_count/dormant": 0.5, "stage_count/holding": 0.5,
        "last_op/GERMINATE": 1.0, "last_action_succeeded": 0.0, "added_parameter_ratio": 0.05,
        "gain_over_all_off": -1.0, "gain_over_all_off_measured": 0.0, "rolled_back": 0.0,
        "slot/r0c0/stage/holding": 1.0, "slot/r0c0/alpha": 1.0, "slot/r0c0/alpha_target": 1.0,
        "slot/r0c0/alpha_progress": 1.0, "slot/r0c0/alpha_ramping": 0.0,
        "slot/r0c0/contribution": 0.025, "slot/r0c0/contribution_measured": 1.0,
        "slot/r0c0/contribution_trend": 0.01, "slot/r0c0/contribution_trend_measured": 1.0,
        "slot/r0c0/gradient_norm": 1.0, "slot/r0c0/gradient_norm_measured": 1.0,
        "slot/r0c0/gradient_health": 0.9, "slot/r0c0/gradient_health_measured": 1.0,
        "slot/r0c0/gradient_ratio": 0.0, "slot/r0c0/gradient_ratio_measured": 1.0,
        "slot/r0c0/epochs_in_stage": 0.2, "slot/r0c0/seed_age": 0.75, "slot/r0c0/seed_parameter_ratio": 0.05,
        "slot/r0c1/stage/dormant": 1.0,
        "slot/r0c1/contribution": -1.0, "slot/r0c1/contribution_trend": -1.0,
        "slot/r0c1/gradient_norm": -1.0, "slot/r0c1/gradient_health": -1.0, "slot/r0c1/gradient_ratio": -1.0,
    }
    # Every position not listed above is 0 (other one-hots, flags, the empty slot's alpha and clocks).
    observation = encoder.encode(snapshot)
    actual = by_name(encoder, observation.features)
    assert set(expected) <= set(actual)
    for name, value in actual.items():
        assert value == pytest.approx(expected.get(name, 0.0), rel=1e-6, abs=1e-7), name
    assert observation.features.dtype == np.float32
    assert observation.blueprint_ids.dtype == np.int64
    assert observation.blueprint_ids.tolist() == [6, 0]


def test_unmeasured_gives_sentinel_and_flag_zero_but_measured_zero_gives_zero_and_flag_one() -> None:
    encoder = ObservationEncoder(SLOT_IDS, "cnn")
    measured_zero = make_slot("r0c0", Stage.HOLDING, alpha=1.0, contribution=0.0, previous_contribution=0.0,
                              gradient_norm=0.0, gradient_health=0.0, gradient_ratio=0.0)
    unmeasured = make_slot("r0c1", Stage.HOLDING, alpha=1.0)
    zero_snapshot = make_snapshot((measured_zero, unmeasured), train_loss=0.0, accuracy_all_off=10.0,
                                  accuracy_history=(10.0, 10.0))
    unknown_snapshot = make_snapshot((measured_zero, unmeasured), train_loss=None, accuracy_all_off=None)
    zero = by_name(encoder, encoder.encode(zero_snapshot).features)
    unknown = by_name(encoder, encoder.encode(unknown_snapshot).features)
    for name in ("contribution", "contribution_trend", "gradient_norm", "gradient_health", "gradient_ratio"):
        assert (zero[f"slot/r0c0/{name}"], zero[f"slot/r0c0/{name}_measured"]) == (0.0, 1.0)
        assert (zero[f"slot/r0c1/{name}"], zero[f"slot/r0c1/{name}_measured"]) == (UNMEASURED, 0.0)
    for name in ("train_loss", "gain_over_all_off", "accuracy_delta"):
        assert (zero[name], zero[f"{name}_measured"]) == (0.0, 1.0)
        assert (unknown[name], unknown[f"{name}_measured"]) == (UNMEASURED, 0.0)


def test_contribution_trend_needs_both_measurements() -> None:
    encoder = ObservationEncoder(SLOT_IDS, "cnn")
    first_measurement = make_slot("r0c0", Stage.BLENDING, alpha=0.5, contribution=3.0,
                                  previous_contribution=None)
    snapshot = make_snapshot((first_measurement, make_slot("r0c1")))
    features = by_name(encoder, encoder.encode(snapshot).features)
    assert (features["slot/r0c0/contribution"], features["slot/r0c0/contribution_measured"]) == (
        pytest.approx(0.03), 1.0)
    assert (features["slot/r0c0/contribution_trend"], features["slot/r0c0/contribution_trend_measured"]) == (
        UNMEASURED, 0.0)


@pytest.mark.parametrize("entries", [0, 1, 4, 5, 7])
def test_history_is_right_aligned_padded_and_counted(entries: int) -> None:
    encoder = ObservationEncoder(SLOT_IDS, "cnn")
    accuracies = tuple(10.0 * (i + 1) for i in range(entries))
    losses = tuple(float(i) for i in range(entries))
    snapshot = make_snapshot(accuracy_history=accuracies, loss_history=losses)
    features = by_name(encoder, encoder.encode(snapshot).features)
    kept = min(entries, HISTORY_LENGTH)
    padding = [UNMEASURED] * (HISTORY_LENGTH - kept)
    expected_accuracy = padding + [a / 100 for a in accuracies[entries - kept:]]
    expected_loss = padding + [math.log1p(x) for x in losses[entries - kept:]]
    offsets = range(-HISTORY_LENGTH, 0)
    assert [features[f"accuracy_history[{k}]"] for k in offsets] == pytest.approx(expected_accuracy)
    assert [features[f"loss_history[{k}]"] for k in offsets] == pytest.approx(expected_loss)
    assert features["accuracy_history_count"] == pytest.approx(kept / HISTORY_LENGTH)
    assert features["loss_history_count"] == pytest.approx(kept / HISTORY_LENGTH)
    assert features["accuracy_delta_measured"] == (1.0 if entries >= 2 else 0.0)
    if entries >= 2:  # the two newest accuracies differ by 10 points
        assert features["accuracy_delta"] == pytest.approx(0.10)


def test_slots_are_encoded_in_encoder_order_whatever_the_snapshot_order() -> None:
    encoder = ObservationEncoder(SLOT_IDS, "cnn")
    first = make_slot("r0c0", Stage.TRAINING, blueprint_id=2, seed_age=4)
    second = make_slot("r0c1", Stage.BLENDING, blueprint_id=5, alpha=0.3)
    in_order = encoder.encode(make_snapshot((first, second)))
    reversed_order = encoder.encode(make_snapshot((second, first)))
    np.testing.assert_array_equal(in_order.features, reversed_order.features)
    assert reversed_order.blueprint_ids.tolist() == [2, 5]
    features = by_name(encoder, reversed_order.features)
    assert features["slot/r0c0/stage/training"] == 1.0
    assert features["slot/r0c1/alpha"] == pytest.approx(0.3)


@pytest.mark.parametrize("slot_ids", [
    ("r0c0",), ("r0c0", "r0c1", "r0c2"), ("r0c0", "r1c0"), ("r0c0", "r0c0"),
])
def test_snapshot_with_other_slot_ids_raises(slot_ids: tuple[str, ...]) -> None:
    encoder = ObservationEncoder(SLOT_IDS, "cnn")
    snapshot = make_snapshot(tuple(make_slot(slot_id) for slot_id in slot_ids))
    with pytest.raises(ValueError, match="do not match the encoder's slots"):
        encoder.encode(snapshot)


def test_constructor_rejects_bad_slot_ids_and_topology() -> None:
    with pytest.raises(ValueError, match="empty"):
        ObservationEncoder([], "cnn")
    with pytest.raises(ValueError, match="unique"):
        ObservationEncoder(["r0c0", "r0c0"], "cnn")
    with pytest.raises(ValueError, match="unknown topology"):
        ObservationEncoder(SLOT_IDS, "graph")


def test_sizes_follow_slots_and_topology() -> None:
    cnn = ObservationEncoder(SLOT_IDS, "cnn")
    transformer = ObservationEncoder(("s0", "s1", "s2"), "transformer")
    assert cnn.n_slots == 2 and transformer.n_slots == 3
    assert cnn.n_blueprints == len(blueprint_names("cnn"))
    assert transformer.n_blueprints == len(blueprint_names("transformer"))
    per_slot = transformer.size - cnn.size  # one more slot, same base block
    assert cnn.size == len(cnn.feature_names()) and transformer.size == len(transformer.feature_names())
    assert sum(name.startswith("slot/s0/") for name in transformer.feature_names()) == per_slot
    assert len(set(cnn.feature_names())) == cnn.size


def test_non_finite_magnitudes_encode_as_the_ceiling() -> None:
    encoder = ObservationEncoder(SLOT_IDS, "cnn")
    exploded = make_slot("r0c0", Stage.TRAINING, gradient_norm=float("inf"), gradient_ratio=float("nan"))
    snapshot = make_snapshot((exploded, make_slot("r0c1")), val_loss=float("nan"), train_loss=1e12)
    features = by_name(encoder, encoder.encode(snapshot).features)
    ceiling = math.log1p(MAGNITUDE_CEILING)
    for name in ("val_loss", "train_loss", "slot/r0c0/gradient_norm", "slot/r0c0/gradient_ratio"):
        assert features[name] == pytest.approx(ceiling), name
    assert features["slot/r0c0/gradient_norm_measured"] == 1.0


def test_non_finite_plain_value_raises_with_its_name() -> None:
    encoder = ObservationEncoder(SLOT_IDS, "cnn")
    broken = make_slot("r0c0", Stage.BLENDING, alpha=float("nan"))
    with pytest.raises(ValueError, match=r"slot/r0c0/alpha"):
        encoder.encode(make_snapshot((broken, make_slot("r0c1"))))


def test_bad_blueprint_id_and_last_op_raise() -> None:
    encoder = ObservationEncoder(SLOT_IDS, "cnn")
    too_large = make_slot("r0c0", Stage.TRAINING, blueprint_id=encoder.n_blueprints + 1)
    with pytest.raises(ValueError, match="blueprint ids"):
        encoder.encode(make_snapshot((too_large, make_slot("r0c1"))))
    encoder.encode(make_snapshot((make_slot("r0c0", blueprint_id=encoder.n_blueprints), make_slot("r0c1"))))
    with pytest.raises(ValueError, match="last_op=6"):
        encoder.encode(make_snapshot(last_op=6))


optional_points = st.none() | st.floats(-100.0, 100.0)
optional_magnitude = st.none() | st.floats(0.0, 1e9)


@st.composite
def snapshots(draw: st.DrawFn) -> EpisodeSnapshot:
    max_epochs = draw(st.integers(1, 50))
    slots = tuple(
        make_slot(
            slot_id, draw(st.sampled_from(list(Stage))), blueprint_id=draw(st.integers(0, 7)),
            alpha=draw(st.floats(0.0, 1.0)), alpha_target=draw(st.floats(0.0, 1.0)),
            alpha_progress=draw(st.floats(0.0, 1.0)), alpha_ramping=draw(st.booleans()),
            epochs_in_stage=draw(st.integers(0, max_epochs)), seed_age=draw(st.integers(0, max_epochs)),
            seed_parameters=draw(st.integers(0, 10**6)), contribution=draw(optional_points),
            previous_contribution=draw(optional_points), gradient_norm=draw(optional_magnitude),
            gradient_health=draw(st.none() | st.floats(0.0, 1.0)), gradient_ratio=draw(optional_magnitude),
        )
        for slot_id in SLOT_IDS
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
    )


@settings(max_examples=60, deadline=None)
@given(snapshot=snapshots())
def test_any_snapshot_encodes_to_a_finite_vector_of_the_advertised_size(snapshot: EpisodeSnapshot) -> None:
    encoder = ObservationEncoder(SLOT_IDS, "cnn")
    observation = encoder.encode(snapshot)
    assert observation.features.shape == (encoder.size,) == (len(encoder.feature_names()),)
    assert observation.blueprint_ids.shape == (encoder.n_slots,)
    assert np.isfinite(observation.features).all()
    features = by_name(encoder, observation.features)
    # Flags are 0/1 and a value reads the sentinel exactly when its flag is 0.
    for name, value in features.items():
        if name.endswith("_measured"):
            assert value in (0.0, 1.0)
            if value == 0.0:
                assert features[name.removesuffix("_measured")] == UNMEASURED
    # One-hots sum to one per slot and for the last op.
    for slot_id in SLOT_IDS:
        assert sum(features[f"slot/{slot_id}/stage/{stage.value}"] for stage in Stage) == 1.0
    assert sum(features[f"last_op/{op.name}"] for op in Op) == 1.0
    assert sum(features[f"stage_count/{stage.value}"] for stage in Stage) == pytest.approx(1.0)
