"""Typed events: JSON round trip, strict decoding, registry rules and metric names."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, ClassVar

import jsonschema
import pytest

from morphogen.run_directory import EVENTS_FILENAME
from morphogen.telemetry.events import (
    ALL_ENVS,
    SCHEMA_VERSION,
    ActionTaken,
    AnomalyDetected,
    CounterfactualMeasured,
    EpisodeCompleted,
    EpochCompleted,
    Event,
    GovernorRollback,
    GradientHealthMeasured,
    ImitationCompleted,
    LayerStatistics,
    LayerStats,
    LSTMHealthMeasured,
    PhaseTimes,
    PPOUpdateCompleted,
    RankTimes,
    RewardComputed,
    RoundCompleted,
    SlotState,
    StageTransition,
    TelemetryLevelChanged,
    event_from_dict,
    event_types,
)
from morphogen.telemetry.schema import SCHEMA_PATH
from morphogen.telemetry.sinks import Telemetry

METRIC_PREFIXES = ("episode/", "growth/", "ppo/", "health/", "time/")

SAMPLES: list[Event] = [
    EpochCompleted(
        epoch=3,
        env_id=1,
        train_loss=0.75,
        val_loss=0.5,
        val_accuracy=91.25,
        param_count=12345,
        slots=(
            SlotState(slot="r0c0", stage="TRAINING", blueprint="conv_light", alpha=0.0),
            SlotState(slot="r0c1", stage="DORMANT", blueprint=None, alpha=0.0),
            SlotState(slot="r0c2", stage="BLENDING", blueprint="attention", alpha=0.375),
        ),
        action="GERMINATE",
        action_succeeded=True,
    ),
    StageTransition(
        epoch=4,
        env_id=0,
        slot="r0c0",
        blueprint="conv_light",
        from_stage="TRAINING",
        to_stage="BLENDING",
        reason="gate passed: health 0.92 >= 0.70",
    ),
    ActionTaken(
        epoch=5, env_id=2, op="WAIT", slot=None, blueprint=None, succeeded=True, reason="plateau not reached"
    ),
    ActionTaken(
        epoch=6, env_id=2, op="PRUNE", slot="r0c2", blueprint="attention", succeeded=False, reason="age < 5"
    ),
    CounterfactualMeasured(
        epoch=7,
        env_id=0,
        configs=("main", "without_r0c0", "all_off"),
        accuracies=(92.5, 90.0, 88.75),
        losses=(0.25, 0.3125, 0.375),
        contributions=(("r0c0", 2.5),),
    ),
    GovernorRollback(
        epoch=8,
        env_id=3,
        reason="loss 41.0 > 6 sigma",
        loss=41.0,
        threshold=3.5,
        pruned_slots=("r0c0", "r0c2"),
    ),
    RewardComputed(epoch=9, env_id=0, total=-0.125, components=(("contribution", 0.25), ("rent", -0.375))),
    EpisodeCompleted(
        epoch=25,
        env_id=1,
        final_accuracy=93.0,
        param_count=15000,
        host_param_count=12000,
        fossilized=2,
        pruned=1,
        episode_return=4.5,
    ),
    AnomalyDetected(
        epoch=50, env_id=ALL_ENVS, anomaly="kl_spike", message="approximate KL 0.1 > 4 x 0.015", advice="lower lr"
    ),
    TelemetryLevelChanged(epoch=50, env_id=ALL_ENVS, from_level="normal", to_level="debug", reason="anomaly"),
    PPOUpdateCompleted(
        epoch=50,
        env_id=ALL_ENVS,
        round=1,
        policy_loss=-0.0625,
        value_loss=0.5,
        entropy_loss=-1.25,
        entropy_per_head=(("op", 1.5), ("slot", 0.75)),
        approx_kl=0.0078125,
        clip_fraction=0.125,
        explained_variance=0.25,
        grad_norm=2.5,
        epochs_completed=3,
        early_stopped=True,
    ),
    ImitationCompleted(
        epoch=0,
        env_id=ALL_ENVS,
        rounds=2,
        episodes=8,
        action_loss_before=0.47,
        action_loss_after=0.02,
        match_probability=0.98,
        agreement=1.0,
        value_loss=0.03,
    ),
    RoundCompleted(
        epoch=50,
        env_id=ALL_ENVS,
        round=1,
        mean_return=1.5,
        mean_final_accuracy=88.5,
        mean_parameters_added=1200.0,
        seconds=12.25,
    ),
    PhaseTimes(epoch=50, env_id=ALL_ENVS, phases=(("train", 8.5), ("validate", 2.0), ("update", 1.25))),
    RankTimes(epoch=50, env_id=ALL_ENVS, round=2, collect_seconds=(4.5, 4.5), collect_wait_seconds=(1.5, 0.25),
              update_seconds=(0.5, 0.5), all_reduce_seconds=(0.125, 0.25)),
    GradientHealthMeasured(epoch=4, env_id=1, host_norm=0.75, seeds=(("r0c0", 0.125, 0.9, 0.5),)),
    LSTMHealthMeasured(
        epoch=50,
        env_id=ALL_ENVS,
        hidden_rms_mean=0.25,
        hidden_rms_max=0.5,
        cell_rms_mean=1.5,
        cell_rms_max=3.0,
        non_finite=0,
    ),
    LayerStatistics(
        epoch=4,
        env_id=0,
        module="host",
        layers=(
            LayerStats("0.weight", "parameter", 6, 2.0, 0.5, 0.25, -1.0, 1.5, 1, 0, 0),
            LayerStats("0.weight", "gradient", 6, math.inf, math.nan, math.nan, -1.0, math.inf, 0, 1, 1),
        ),
    ),
]


def test_samples_cover_every_registered_event() -> None:
    assert {event.kind for event in SAMPLES} == set(event_types())


@pytest.mark.parametrize("event", SAMPLES, ids=lambda event: f"{event.kind}-{event.epoch}")
def test_round_trip_through_json_text(event: Event) -> None:
    line = json.dumps(event.to_dict())
    rebuilt = event_from_dict(json.loads(line))
    # NaN != NaN, so compare the JSON text of both sides.
    assert json.dumps(rebuilt.to_dict()) == line
    assert type(rebuilt) is type(event)


def test_every_event_written_by_the_sink_validates_against_the_schema(tmp_path: Path) -> None:
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator(schema)
    with Telemetry(tmp_path, level="debug") as telemetry:
        for event in SAMPLES:
            telemetry.emit(event)
    lines = (tmp_path / EVENTS_FILENAME).read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(SAMPLES)
    for line in lines:
        validator.validate(json.loads(line))
    broken = json.loads(lines[-1]) | {"module": 3}
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(broken)


def test_to_dict_layout() -> None:
    record = SAMPLES[0].to_dict()
    assert list(record)[:4] == ["event", "schema_version", "epoch", "env_id"]
    assert record["event"] == "epoch_completed"
    assert record["schema_version"] == SCHEMA_VERSION
    assert record["slots"][1] == {"slot": "r0c1", "stage": "DORMANT", "blueprint": None, "alpha": 0.0}
    assert CounterfactualMeasured.kind == "counterfactual_measured"
    assert SAMPLES[4].to_dict()["contributions"] == [["r0c0", 2.5]]


def test_event_fields_start_with_epoch_and_env_id() -> None:
    for event_type in event_types().values():
        names = [field.name for field in dataclasses.fields(event_type)]
        assert names[:2] == ["epoch", "env_id"], event_type


def test_time_key_is_ignored_and_ints_accepted_for_floats() -> None:
    record = SAMPLES[6].to_dict() | {"time": 1700000000.5, "total": -1}
    rebuilt = event_from_dict(record)
    assert isinstance(rebuilt, RewardComputed)
    assert rebuilt.total == -1.0 and isinstance(rebuilt.total, float)


def _record(**changes: Any) -> dict[str, Any]:
    return SAMPLES[1].to_dict() | changes


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (_record(event="no_such_event"), "unknown event kind 'no_such_event'"),
        (_record(schema_version=SCHEMA_VERSION + 1), "schema_version"),
        ({k: v for k, v in _record().items() if k != "schema_version"}, "schema_version None"),
        ({k: v for k, v in _record().items() if k != "reason"}, "missing required field 'reason'"),
        (_record(surprise=1), "unknown fields ['surprise']"),
        (_record(epoch="3"), "stage_transition.epoch: expected int"),
        (_record(epoch=True), "stage_transition.epoch: expected int"),
        (_record(epoch=10**400), "stage_transition.epoch: expected int"),  # past 64 bits: read as a float, overflows
        (_record(slot=None), "stage_transition.slot: expected str"),
    ],
)
def test_bad_records_raise_value_error(record: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        event_from_dict(record)


def test_nested_values_are_type_checked() -> None:
    record = SAMPLES[0].to_dict()
    record["slots"][0]["alpha"] = "half"
    with pytest.raises(ValueError, match=r"epoch_completed\.slots\[0\]\.alpha: expected float"):
        event_from_dict(record)
    record["slots"][0]["alpha"] = 10**400  # an integer no float holds
    with pytest.raises(ValueError, match=r"epoch_completed\.slots\[0\]\.alpha: expected float"):
        event_from_dict(record)
    pairs = SAMPLES[6].to_dict()
    pairs["components"] = [["rent", -0.5, "extra"]]
    with pytest.raises(ValueError, match="expected 2 items, got 3"):
        event_from_dict(pairs)


def test_counterfactual_lengths_must_match() -> None:
    with pytest.raises(ValueError, match="one entry per config"):
        CounterfactualMeasured(
            epoch=0,
            env_id=0,
            configs=("main", "all_off"),
            accuracies=(90.0,),
            losses=(0.1, 0.2),
            contributions=(),
        )


def test_events_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        SAMPLES[0].epoch = 9  # type: ignore[misc]


def test_event_class_without_kind_is_rejected() -> None:
    with pytest.raises(TypeError, match="must define `kind"):

        @dataclasses.dataclass(frozen=True)
        class Nameless(Event):
            value: float


def test_duplicate_kind_is_rejected() -> None:
    with pytest.raises(TypeError, match="already used by EpochCompleted"):

        @dataclasses.dataclass(frozen=True)
        class Impostor(Event):
            kind: ClassVar[str] = "epoch_completed"


def test_minimal_level_events() -> None:
    minimal = {kind for kind, event_type in event_types().items() if event_type.min_level == "minimal"}
    assert minimal == {
        "epoch_completed",
        "episode_completed",
        "governor_rollback",
        "anomaly_detected",
        "telemetry_level_changed",
        "round_completed",
        "imitation_completed",
        "rank_times",
    }
    debug = {kind for kind, event_type in event_types().items() if event_type.min_level == "debug"}
    assert debug == {"layer_statistics"}


def test_scalars_use_the_shared_prefixes() -> None:
    for event in SAMPLES:
        for name, value in event.scalars().items():
            assert name.startswith(METRIC_PREFIXES), name
            assert isinstance(value, float), name


def test_scalar_values() -> None:
    epoch, *_ = SAMPLES
    assert epoch.scalars() == {
        "episode/train_loss": 0.75,
        "episode/val_loss": 0.5,
        "episode/val_accuracy": 91.25,
        "episode/action_succeeded": 1.0,
        "growth/param_count": 12345.0,
        "growth/seeds": 2.0,
        "growth/alpha/r0c0": 0.0,
        "growth/alpha/r0c1": 0.0,
        "growth/alpha/r0c2": 0.375,
    }
    assert SAMPLES[4].scalars() == {
        "growth/contribution/r0c0": 2.5,
        "growth/counterfactual_accuracy/main": 92.5,
        "growth/counterfactual_accuracy/without_r0c0": 90.0,
        "growth/counterfactual_accuracy/all_off": 88.75,
    }
    assert SAMPLES[6].scalars() == {
        "episode/reward": -0.125,
        "episode/reward/contribution": 0.25,
        "episode/reward/rent": -0.375,
    }
    episode = _sample(EpisodeCompleted).scalars()
    assert episode["growth/added_params"] == 3000.0
    assert episode["episode/return"] == 4.5
    assert SAMPLES[1].scalars() == {}


def _sample(event_type: type[Event]) -> Event:
    return next(event for event in SAMPLES if type(event) is event_type)


def test_scalar_values_of_training_events() -> None:
    assert _sample(AnomalyDetected).scalars() == {"health/anomaly/kl_spike": 1.0}
    assert _sample(TelemetryLevelChanged).scalars() == {"health/telemetry_level": 3.0}
    ppo = _sample(PPOUpdateCompleted).scalars()
    assert ppo["ppo/entropy/op"] == 1.5 and ppo["ppo/entropy/slot"] == 0.75
    assert ppo["ppo/approx_kl"] == 0.0078125 and ppo["ppo/early_stopped"] == 1.0
    assert ppo["ppo/epochs_completed"] == 3.0 and ppo["ppo/clip_fraction"] == 0.125
    assert _sample(RoundCompleted).scalars()["time/round"] == 12.25
    assert _sample(PhaseTimes).scalars() == {"time/train": 8.5, "time/validate": 2.0, "time/update": 1.25}
    assert _sample(RankTimes).scalars() == {
        "time/rank0/collect": 4.5, "time/rank0/collect_wait": 1.5, "time/rank0/all_reduce": 0.125,
        "time/rank1/collect": 4.5, "time/rank1/collect_wait": 0.25, "time/rank1/all_reduce": 0.25}
    assert _sample(GradientHealthMeasured).scalars() == {
        "health/host_gradient_norm": 0.75,
        "health/seed_gradient_norm/r0c0": 0.125,
        "health/seed_health/r0c0": 0.9,
        "health/seed_gradient_ratio/r0c0": 0.5,
    }
    assert _sample(LSTMHealthMeasured).scalars()["health/lstm_cell_rms_max"] == 3.0
    layers = _sample(LayerStatistics).scalars()
    assert layers["health/layers/host/parameter/0.weight/norm"] == 2.0
    assert layers["health/layers/host/gradient/0.weight/nan"] == 1.0
    assert len(layers) == 16
