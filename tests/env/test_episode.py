"""End-to-end episodes on digits: the heuristic growing a seed with telemetry written to a run directory,
and a fixed action sequence that walks one seed through its whole life to FOSSILIZED."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from morphogen.control.controller import NoGrowthController
from morphogen.control.heuristic import DEFAULT_ROTATION, HeuristicConfig, HeuristicController
from morphogen.core.lifecycle import GateConfig, GateMode, Stage
from morphogen.core.slot import SlotConfig
from morphogen.data import Task, load_task
from morphogen.env.actions import Action, Op
from morphogen.env.counterfactual import MAIN
from morphogen.env.episode import EpisodeConfig, MorphogenesisEpisode
from morphogen.env.play import run_episode
from morphogen.run_directory import EVENTS_FILENAME
from morphogen.telemetry import events
from morphogen.telemetry.sinks import Telemetry, read_events


@pytest.fixture(scope="module")
def digits() -> Task:
    return load_task("digits", max_train_samples=300)


def test_heuristic_episode_grows_and_writes_its_events(digits: Task, tmp_path: Path) -> None:
    config = EpisodeConfig(max_epochs=8)
    eager = HeuristicConfig(warmup_epochs=1, plateau_epochs=1, plateau_threshold=100.0, min_training_epochs=2,
                            choice="rotation")  # the choice by growth signals: tests/control/test_growth_choice.py
    with Telemetry(tmp_path, level="normal") as telemetry:
        episode = MorphogenesisEpisode(digits, config, seed=0, slots=["r0c1"], telemetry=telemetry)
        episode.reset()
        controller = HeuristicController(episode.action_space, digits.topology, eager)
        outcome = run_episode(episode, controller)

    written = read_events(tmp_path / EVENTS_FILENAME)
    assert written == episode.history, "the run directory must hold exactly the episode's events"
    epochs = [e for e in written if isinstance(e, events.EpochCompleted)]
    assert [e.epoch for e in epochs] == list(range(1, 9))
    assert all(math.isfinite(e.train_loss) and math.isfinite(e.val_loss) for e in epochs)
    assert isinstance(written[-1], events.EpisodeCompleted)
    assert written[-1].final_accuracy == outcome.final_accuracy
    germinations = [e for e in written if isinstance(e, events.ActionTaken) and e.op == "GERMINATE" and e.succeeded]
    assert germinations and germinations[0].epoch == 2, "warmup 1 + an always-true plateau: germinate at once"
    assert germinations[0].blueprint == "conv_heavy" == DEFAULT_ROTATION["cnn"][0]  # first of the default rotation
    transitions = [(e.slot, e.from_stage, e.to_stage) for e in written if isinstance(e, events.StageTransition)]
    assert ("r0c1", "dormant", "germinated") in transitions
    assert ("r0c1", "germinated", "training") in transitions
    assert outcome.stories and outcome.stories[0].slot == "r0c1"
    assert outcome.final_accuracy > 50.0, "8 epochs on digits should learn far above chance (10%)"


def test_fixed_actions_walk_a_seed_to_fossilized(digits: Task) -> None:
    gates = GateConfig(mode=GateMode.PERMISSIVE, min_training_epochs=2)
    config = EpisodeConfig(max_epochs=8, slots=SlotConfig(gates=gates, blend_epochs=2))
    episode = MorphogenesisEpisode(digits, config, seed=0, slots=["r0c1"])
    start = episode.reset()
    assert start.epoch == 0 and start.train_loss is None
    # A seed germinated by an action ramps over the action's tempo (3 epochs), not the slot config's blend_epochs.
    script = [
        (Action(Op.GERMINATE, "r0c1", "conv_light"), Stage.TRAINING),  # auto-advances out of GERMINATED
        (Action(), Stage.TRAINING),
        (Action(Op.ADVANCE, "r0c1"), Stage.BLENDING),  # 2 epochs trained, gradient health measured
        (Action(), Stage.BLENDING),
        (Action(), Stage.HOLDING),  # the ramp's third tick reaches alpha 1 and auto-advances
        (Action(), Stage.HOLDING),  # a full-strength contribution is measured
        (Action(Op.FOSSILIZE, "r0c1"), Stage.FOSSILIZED),
        (Action(), Stage.FOSSILIZED),
    ]
    assert episode.model is not None
    slot = episode.model.slot("r0c1")
    for epoch, (action, stage) in enumerate(script, start=1):
        result = episode.step(action)
        assert result.action_succeeded, f"epoch {epoch}: {action.describe()} refused: {result.reason}"
        assert slot.stage is stage, f"epoch {epoch}: expected {stage}, got {slot.stage}"
        assert result.snapshot.epoch == epoch and result.rollback is None
        assert math.isfinite(result.reward.total)
    assert result.done
    assert slot.alpha.alpha == 1.0
    snapshot = result.snapshot
    assert snapshot.active_parameters == snapshot.host_parameters + slot.seed_parameter_count()
    # Measured while HOLDING, where the fossilize decision reads it; no decision reads a fossilized seed's.
    assert snapshot.slots[0].contribution is None and slot.signals.contribution is not None

    path = [(e.from_stage, e.to_stage) for e in episode.history if isinstance(e, events.StageTransition)]
    assert path == [("dormant", "germinated"), ("germinated", "training"), ("training", "blending"),
                    ("blending", "holding"), ("holding", "fossilized")]
    measured = [e for e in episode.history if isinstance(e, events.CounterfactualMeasured)]
    assert measured and measured[-1].configs == (MAIN, "without:r0c1")
    completed = episode.history[-1]
    assert isinstance(completed, events.EpisodeCompleted) and completed.fossilized == 1 and completed.pruned == 0


def test_step_after_the_end_raises(digits: Task) -> None:
    episode = MorphogenesisEpisode(digits, EpisodeConfig(max_epochs=1), slots=["r0c0"])
    episode.reset()
    assert episode.step(Action()).done
    with pytest.raises(RuntimeError, match="reset"):
        episode.step(Action())


@pytest.mark.parametrize("epochs", [3, 7])
def test_an_outcome_keeps_the_scores_of_its_last_trained_epochs_not_the_untrained_start(epochs: int) -> None:
    task = load_task("digits", max_train_samples=64)
    episode = MorphogenesisEpisode(task, EpisodeConfig(max_epochs=epochs))
    scores: list[float] = []
    outcome = run_episode(episode, NoGrowthController(), lambda result: scores.append(result.snapshot.val_accuracy))
    assert outcome.recent_scores == tuple(scores[-5:]) and outcome.recent_scores[-1] == outcome.final_accuracy
