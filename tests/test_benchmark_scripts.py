"""Benchmark scripts that the README quotes still measure what they say on the smallest run they allow."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import growth_plans
import jobs
import telemetry_overhead
from morphogen.data import load_task
from morphogen.env.episode import MorphogenesisEpisode
from morphogen.env.play import run_episode


def test_jobs_benchmark_compares_the_figures_of_two_runs_less_their_wall_clock_seconds() -> None:
    """Two `run --seeds` of the same seed give the same figures but not the same seconds: the check that one process
    and N processes agree must not fail on the seconds (it did, so `benchmarks/jobs.py` never printed its table)."""
    torch.set_num_threads(1)
    first = jobs.timed_seeds("digits", 1, 1, 1)[1]
    second = jobs.timed_seeds("digits", 1, 1, 1)[1]
    assert first == second
    assert first["0"]["costs"]["grown"]["flops"] > 0  # type: ignore[index]  # the figures are still compared



def test_telemetry_benchmark_episodes_run_what_its_script_checks_all_off_included() -> None:
    """The script's episodes blend two seeds and measure `all_off` (only an every-epoch counterfactual schedule
    runs it): without that, `benchmarks/telemetry_overhead.py` raised before printing its table."""
    torch.set_num_threads(1)
    episode = MorphogenesisEpisode(load_task("digits", seed=0), telemetry_overhead.episode_config(
        telemetry_overhead.MIN_EPOCHS), seed=0)
    episode.reset()
    run_episode(episode, telemetry_overhead.ScriptedController(telemetry_overhead.SCRIPT))
    telemetry_overhead.check_script_exercised(episode)  # raises RuntimeError naming what the script missed


def test_growth_plans_plays_episodes_of_the_epochs_asked_for_and_keeps_their_results_apart() -> None:
    """`--epochs` makes a small run: twice the epochs trains for about twice the FLOPs, and a results file holds
    the episodes of each length under keys of their own."""
    short, longer = (growth_plans.play("digits", "heuristic", 0, 7000, 1, epochs) for epochs in (2, 4))
    assert (short["epochs"], longer["epochs"]) == (2, 4) and short["key"] != longer["key"]
    assert 1.5 < longer["flops"] / short["flops"] < 2.5
