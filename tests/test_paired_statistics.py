"""Figures over seeds: the spread `eval` and `run --seeds` print, and which model dominates the grown one (the
verdict `run --seeds` prints and `report` recomputes)."""

import io
import math

from morphogen.commands.evaluate import ControllerScores, _print_loss_table, _print_table
from morphogen.env.play import EpisodeOutcome
from morphogen.paired_statistics import (
    NO_SPREAD,
    SeedFigures,
    dominance_lines,
    dominated_by,
    format_mean_error,
    format_mean_std,
    format_spread,
    sample_std,
    standard_error,
)
from morphogen.seeds_summary import _model_line


def _model(scores: list[float], parameters: float, flops: float) -> SeedFigures:
    return SeedFigures(scores, [parameters] * len(scores), [flops] * len(scores))


def test_a_cheaper_model_ahead_by_more_than_the_paired_error_dominates_only_in_the_cost_it_saves() -> None:
    grown = _model([90.0, 91.0, 92.0], parameters=1_000, flops=10e9)
    others = {
        "deeper": _model([93.0, 93.5, 95.0], parameters=2_000, flops=9e9),   # fewer FLOPs, more parameters
        "narrow": _model([91.0, 92.0, 93.0], parameters=500, flops=5e9),     # ahead by 1 on every seed: error 0
        "noisy": _model([95.0, 88.0, 95.0], parameters=500, flops=5e9),      # ahead by 1.67 ± 2.40: within it
        "costly": _model([99.0, 99.0, 99.0], parameters=5_000, flops=50e9),  # far ahead, at a higher cost
        "behind": _model([80.0, 81.0, 82.0], parameters=100, flops=1e9),
    }
    verdicts = dominated_by(grown, others)
    assert verdicts == {"parameters": ["narrow"], "training_flops": ["deeper", "narrow"]}
    lines = dominance_lines(verdicts, seeds=3)
    assert lines[0].split() == ["in", "parameters", "dominated", "by", "narrow"]
    assert lines[1].split() == ["in", "training", "FLOPs", "dominated", "by", "deeper,", "narrow"]


def test_equal_cost_counts_as_no_more_and_one_seed_judges_nothing() -> None:
    grown = _model([90.0, 91.0], parameters=1_000, flops=10e9)
    same_architecture = _model([92.0, 93.5], parameters=1_000, flops=12e9)  # from scratch: as many parameters
    assert dominated_by(grown, {"from scratch": same_architecture}) == {"parameters": ["from scratch"],
                                                                       "training_flops": []}
    one_seed = dominated_by(_model([90.0], 1_000, 10e9), {"narrow": _model([99.0], 10, 1e9)})
    assert one_seed == {"parameters": [], "training_flops": []}
    assert "one seed" in dominance_lines(one_seed, seeds=1)[0]
    assert dominance_lines({"parameters": [], "training_flops": []}, seeds=2)[0].endswith(
        "not dominated by any model here")


def test_the_spread_over_seeds_is_the_sample_std_in_eval_and_in_run_over_seeds_alike() -> None:
    """97.5, 98.5 and 99.5: deviations -1, 0, +1, so the sample std is sqrt(2 / 2) = 1.00 (the population std,
    sqrt(2 / 3), would be 0.82); one figure has no spread. `eval`'s table and `run --seeds`' print the same."""
    accuracies = (97.5, 98.5, 99.5)
    assert sample_std(accuracies) == 1.0
    assert sample_std([97.5]) is None
    out = io.StringIO()
    _print_table([ControllerScores(name="learned", accuracies=accuracies, added=(0.0, 0.0, 0.0), gain_per_thousand=(),
                                   fossilized=(1.0, 1.0, 1.0), pruned=(0.0, 0.0, 0.0))], out)
    row = next(line for line in out.getvalue().splitlines() if line.startswith("learned"))
    assert row.split()[1:4] == ["98.50", "±", "1.00"]
    outcomes = [EpisodeOutcome(final_accuracy=a, final_loss=0.1, parameters=10, host_parameters=10, seconds=1.0,
                               episode_return=0.0, stories=[], phase_seconds={}) for a in accuracies]
    assert _model_line("grown", outcomes, "accuracy").split()[1:4] == ["98.50", "±", "1.00"]


def test_one_episode_of_eval_shows_no_spread_rather_than_a_spread_of_zero() -> None:
    out = io.StringIO()
    _print_loss_table([ControllerScores(name="no growth", accuracies=(-0.5,), added=(0.0,), gain_per_thousand=(),
                                        fossilized=(0.0,), pruned=(0.0,), losses=(0.5,))], out)
    row = next(line for line in out.getvalue().splitlines() if line.startswith("no growth"))
    assert row.split()[2:5] == ["0.5", "±", "n/a"]


def test_one_value_formats_its_spread_as_not_measured_in_the_columns_a_spread_would_take() -> None:
    """1, 2 and 3: mean 2, sample std 1, standard error 1 / sqrt(3) = 0.577; one value has neither, and reads "n/a",
    never 0.00, padded to the width its column's spec asks for."""
    assert format_mean_std([1.0, 2.0, 3.0]) == "2.00 ± 1.00"
    assert format_mean_error([1.0, 2.0, 3.0]) == "+2.00 ± 0.58"
    assert format_mean_std([1.5]) == "1.50 ± n/a" and format_mean_error([-1.5]) == "-1.50 ± n/a"
    assert format_mean_std([1.5], ">8.2f", "<6.2f") == "    1.50 ± n/a   "
    assert format_spread(None, "6.2f") == "   n/a" and format_spread(math.nan, ".4f") == NO_SPREAD
    assert standard_error([4.0]) is None
