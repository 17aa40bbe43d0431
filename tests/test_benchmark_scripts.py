"""Benchmark scripts that the README quotes still measure what they say on the smallest run they allow."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import growth
import growth_plans
import jobs
import pareto
import step_overhead
import telemetry_overhead
from morphogen.core import width
from morphogen.data import load_task
from morphogen.env import training
from morphogen.env.actions import Action, Op
from morphogen.env.episode import MorphogenesisEpisode
from morphogen.env.play import run_episode
from morphogen.env.training import HostAndSeedTrainer


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


def test_step_benchmark_times_the_naive_step_on_the_same_training_and_puts_morphogens_back() -> None:
    """`benchmarks/step_overhead.py` compares morphogen's training step with the naive one on two copies of a trainer
    with a TRAINING widening seed (whose segments are cut): both must train the same parameters, bit for bit, and
    morphogen's own functions must be back after the timing."""
    torch.set_num_threads(1)
    task = load_task("digits", max_train_samples=256, seed=0)
    episode = MorphogenesisEpisode(task, seed=0)
    episode.reset()
    episode.step(Action(Op.GERMINATE, "r0c0", "wider"))
    episode.step(Action())
    assert step_overhead.state_of(episode) == "TRAINING seed"
    kept = training.clip_gradients, width._run_layers, HostAndSeedTrainer.train_batch
    figures = step_overhead.measure_state(task, "TRAINING seed", episode.trainer, 0, batches=2, rounds=2)
    assert (training.clip_gradients, width._run_layers, HostAndSeedTrainer.train_batch) == kept
    assert figures.naive_ms > 0 and figures.ours_ms > 0 and figures.speed_up > 0


def test_growth_table_of_one_seed_shows_no_spread_rather_than_a_spread_of_zero(
        capsys: pytest.CaptureFixture[str]) -> None:
    """One seed of `benchmarks/growth.py` (its table built from figures, nothing trained): every spread reads "n/a",
    none 0.00 or 0.0; the means are the seed's own figures."""
    figures = {"grown": growth.Figures(91.25, 0.3, 2_000, 4.0, 10**9),
               "no growth": growth.Figures(90.0, 0.35, 1_000, 3.0, 5 * 10**8),
               "from scratch": growth.Figures(90.5, 0.32, 2_000, 3.5, 9 * 10**8)}
    growth.print_task_table("digits", [growth.JobResult("digits", 0, figures, {"r0c0": "conv_light"}, [1.5])])
    out = capsys.readouterr().out
    grown = next(line for line in out.splitlines() if line.strip().startswith("grown "))
    assert grown.split()[1:7] == ["91.25", "±", "n/a", "0.3000", "±", "n/a"] and grown.split()[-2:] == ["±", "n/a"]
    assert "  grown - no growth: +1.25 ± n/a points (mean ± standard error)" in out
    # Three figures of three variants, two paired differences and the shadow contribution: none measured as 0.
    assert out.count("± n/a") == 12 and "± 0" not in out


def test_pareto_one_seed_has_no_spread_and_judges_no_dominance() -> None:
    """With one seed a more accurate, cheaper fixed host does not dominate the grown point: there is no error to
    be ahead by (a spread of 0 made every lead count); with two seeds it does."""
    fixed = pareto.summarize("fixed 1x8", [pareto.Point(95.0, 500, 10**8, 1.0)])
    grown = pareto.summarize("grown from 1x8", [pareto.Point(90.0, 1_000, 10**9, 2.0)])
    assert fixed.accuracy_std is None and fixed.accuracy_error is None
    assert not pareto.dominates(fixed, grown, "parameters")
    fixed = pareto.summarize("fixed 1x8", [pareto.Point(95.0, 500, 10**8, 1.0), pareto.Point(96.0, 500, 10**8, 1.0)])
    grown = pareto.summarize("grown", [pareto.Point(90.0, 1_000, 10**9, 2.0), pareto.Point(91.0, 1_000, 10**9, 2.0)])
    assert pareto.dominates(fixed, grown, "parameters")
