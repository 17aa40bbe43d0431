"""Growth end to end on the small default digits host: closed-loop seeds get in and add accuracy."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from morphogen.commands.run import RunConfig, run_command
from morphogen.config import build_config
from morphogen.control.heuristic import HeuristicController
from morphogen.core.blend import BlendKind
from morphogen.core.lifecycle import BLENDED_STAGES, Stage
from morphogen.data import load_task
from morphogen.env.episode import EpisodeConfig, MorphogenesisEpisode
from morphogen.env.play import run_episode


@pytest.mark.slow
def test_a_heuristic_episode_on_the_small_digits_host_blends_a_seed_that_contributes() -> None:
    task = load_task("digits")
    episode = MorphogenesisEpisode(task, EpisodeConfig(max_epochs=30), seed=0)
    episode.reset()
    outcome = run_episode(episode, HeuristicController(episode.action_space, task.topology))
    blended = [story for story in outcome.stories if "blending" in story.stages]
    assert blended, [story.stage_path() for story in outcome.stories]
    first = blended[0]
    assert first.contribution is not None and first.contribution > 0.0
    assert first.predicted_contribution is not None  # it was measured behind the host before blending
    assert outcome.parameters > outcome.host_parameters


def test_an_installed_architecture_is_part_of_the_model_from_epoch_zero() -> None:
    task = load_task("digits", max_train_samples=64)
    episode = MorphogenesisEpisode(task, EpisodeConfig(max_epochs=1), seed=3, architecture={"r0c0": "conv_light"})
    episode.reset()
    assert episode.model is not None
    slot = episode.model.slot("r0c0")
    assert slot.stage is Stage.FOSSILIZED and slot.alpha.alpha == 1.0 and not slot.detach_input
    assert episode.model.architecture() == {"r0c0": "conv_light"}
    assert episode.snapshot.active_parameters == episode.model.host_param_count() + slot.seed_parameter_count()
    assert episode.history == []  # installing is not an event of the episode
    assert all(s.stage not in BLENDED_STAGES for s in episode.model.slots() if s.slot_id != "r0c0")


def test_a_seed_grown_with_a_gate_is_rebuilt_with_its_gate() -> None:
    # A policy may blend a seed in by a learned gate, which has parameters of its own: the architecture trained
    # from scratch for comparison must be the grown one, gate included.
    task = load_task("digits", max_train_samples=64)
    grown = MorphogenesisEpisode(task, EpisodeConfig(max_epochs=1), seed=3)
    grown.reset()
    assert grown.model is not None
    grown.model.install("r0c0", "conv_light", blend=BlendKind.GATE)
    grown.model.install("r0c1", "conv_light")
    assert grown.model.blends() == {"r0c0": "gate"}  # the added one is the default, not listed
    rebuilt = MorphogenesisEpisode(task, EpisodeConfig(max_epochs=1), seed=3, architecture=grown.model.architecture(),
                                   blends=grown.model.blends())
    rebuilt.reset()
    assert rebuilt.model is not None
    assert rebuilt.model.param_count() == grown.model.param_count()
    assert rebuilt.model.blends() == {"r0c0": "gate"}
    added = MorphogenesisEpisode(task, EpisodeConfig(max_epochs=1), seed=3, architecture=grown.model.architecture())
    added.reset()
    assert added.model is not None and added.model.param_count() < grown.model.param_count()  # the gate's own


def test_run_compares_grown_no_growth_and_the_final_architecture_from_scratch(tmp_path: Path) -> None:
    # Permissive gates and an eager heuristic: a seed is blended in within a 6-epoch run.
    config = build_config(RunConfig, {
        "max_train_samples": 200, "run_dir": str(tmp_path / "run"), "telemetry": {"level": "minimal"},
        "episode": {"max_epochs": 6, "slots": {"blend_epochs": 1, "gates": {
            "mode": "permissive", "min_training_epochs": 1}}},
        "heuristic": {"warmup_epochs": 0, "plateau_epochs": 1, "plateau_threshold": 100.0,
                      "min_training_epochs": 1},
    })
    out = io.StringIO()
    result = run_command(config, out=out)
    grown, baseline, run_dir = result.grown, result.baseline, result.run_dir
    summary = json.loads((run_dir / "summary.json").read_text())
    assert baseline is not None and summary["baseline"]["parameters"] == baseline.parameters
    scratch = summary["from_scratch"]
    assert scratch is not None and scratch["architecture"]
    # The final architecture has exactly the grown model's parameters, and is trained for as many epochs.
    assert scratch["parameters"] == grown.parameters > baseline.parameters
    table = out.getvalue()
    assert "from scratch" in table and "predicted" in table
