"""The figures of a run over several seeds: each seed's scores, each model's mean ± std, and the grown model's
differences from each comparison, paired by seed (`grow_over_seeds`, `morphogen run --seeds`).

A seed's figures come from its `RunResult` when it was played now, or from its run directory's `summary.json` when
it finished before (a run over seeds resumed): `SeedRun` holds either the same way.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from morphogen.commands.run import RunResult
from morphogen.config import ConfigError
from morphogen.env.compute import ComputeAccount
from morphogen.env.play import EpisodeOutcome
from morphogen.paired_statistics import (
    DOMINANCE_HEADING,
    SeedFigures,
    dominance_lines,
    dominated_by,
    paired_difference,
)
from morphogen.run_directory import SUMMARY_FILENAME, read_json_object
from morphogen.ui.run_files import summary_number
from morphogen.ui.seeds_table import seeds_table_header, seeds_table_row
from morphogen.ui.terminal_text import cut, printable
from morphogen.ui.units import format_difference, format_flops, format_score

#: The comparisons every seed's run may train, before the hosts it compares with.
NO_GROWTH, FROM_SCRATCH = "no growth", "from scratch"


@dataclass(frozen=True)
class SeedRun:
    """One seed's run as the figures over seeds read it: the grown model's outcome and each comparison's, by name
    ("no growth", "from scratch", then the hosts compared with)."""

    grown: EpisodeOutcome
    comparisons: dict[str, EpisodeOutcome]
    run_dir: Path
    metric_name: str

    @classmethod
    def of(cls, run: RunResult, from_scratch: bool) -> SeedRun:
        """A run played now. Where it kept no seed its final architecture is the host, and that training (asked
        for with `from_scratch`) is the no-growth one, which `grow` does not train twice."""
        scratch = run.baseline if from_scratch and run.from_scratch is None and not run.model.architecture() \
            else run.from_scratch
        return cls.made(run.grown, run.baseline, scratch, run.fixed, run.run_dir, run.metric_name)

    @classmethod
    def read(cls, run_dir: Path, from_scratch: bool) -> SeedRun:
        """A run that finished before, from its `summary.json` (`ConfigError` when it cannot be read)."""
        summary = read_json_object(run_dir / SUMMARY_FILENAME)
        grown = None if summary is None else _outcome(summary.get("grown"))
        if summary is None or grown is None:
            raise ConfigError(f"{run_dir / SUMMARY_FILENAME}: cannot be read as a finished run's figures (damaged?); "
                              "move that seed's directory away to play the seed again")
        baseline, scratch = _outcome(summary.get("baseline")), _outcome(summary.get("from_scratch"))
        if from_scratch and scratch is None:  # none was trained: nothing was kept (as `of` says)
            scratch = baseline
        fixed = summary.get("fixed")
        hosts = {entry["name"]: _outcome(entry) for entry in (fixed if isinstance(fixed, list) else [])
                 if isinstance(entry, dict) and isinstance(entry.get("name"), str)}
        score = summary.get("score")
        name = score.get("name") if isinstance(score, dict) else None
        return cls.made(grown, baseline, scratch, hosts, run_dir, name if isinstance(name, str) else "accuracy")

    @classmethod
    def made(cls, grown: EpisodeOutcome, baseline: EpisodeOutcome | None, scratch: EpisodeOutcome | None,
             fixed: Mapping[str, EpisodeOutcome | None], run_dir: Path, metric_name: str) -> SeedRun:
        """A seed's run from its outcomes, leaving out the comparisons it did not train."""
        others = {NO_GROWTH: baseline, FROM_SCRATCH: scratch, **fixed}
        return cls(grown, {name: o for name, o in others.items() if o is not None}, run_dir, metric_name)


#: The parts of a run's training FLOPs summary.json records (`ComputeAccount`'s fields).
FLOP_PARTS = ("training", "shadow", "validation", "counterfactual", "probe")


def _outcome(table: object) -> EpisodeOutcome | None:
    """An outcome's figures as summary.json records them (`commands/run.py: _outcome_dict`), or None where one is
    missing or not a finite number (`summary_number`: the file is untrusted)."""
    if not isinstance(table, dict):
        return None
    numbers = [summary_number(table, key) for key in ("final_accuracy", "final_loss", "parameters",
                                                      "host_parameters", "seconds", "episode_return")]
    flops = [summary_number(table.get("flops"), key) for key in FLOP_PARTS]
    present, parts = [n for n in numbers if n is not None], [n for n in flops if n is not None]
    if len(present) < len(numbers) or len(parts) < len(flops):
        return None
    accuracy, loss, parameters, host_parameters, seconds, episode_return = present
    # The figures over seeds read scores, sizes, FLOPs and seconds; a seed's story stays in its own run's files.
    return EpisodeOutcome(
        final_accuracy=accuracy, final_loss=loss, parameters=int(parameters), host_parameters=int(host_parameters),
        seconds=seconds, episode_return=episode_return, stories=[], phase_seconds={},
        flops=ComputeAccount(**{key: int(value) for key, value in zip(FLOP_PARTS, parts, strict=True)}))


Pairs = list[tuple[EpisodeOutcome, EpisodeOutcome]]


def seed_pairs(runs: Sequence[SeedRun]) -> dict[str, Pairs]:
    """(grown, comparison) of every seed, by comparison, for each comparison that every seed's run trained."""
    return {name: [(run.grown, run.comparisons[name]) for run in runs]
            for name in runs[0].comparisons if all(name in run.comparisons for run in runs)}


def differences_of(pairs: Mapping[str, Pairs]) -> dict[str, tuple[float, float]]:
    """The grown model's score minus each comparison's, paired by seed: (mean, standard error)."""
    return {name: paired_difference([grown.final_accuracy for grown, _ in both],
                                    [other.final_accuracy for _, other in both]) for name, both in pairs.items()}


def _figures(outcomes: Sequence[EpisodeOutcome]) -> SeedFigures:
    return SeedFigures([o.final_accuracy for o in outcomes], [o.parameters for o in outcomes],
                       [o.flops.total for o in outcomes])


def dominance_of(pairs: Mapping[str, Pairs]) -> dict[str, list[str]]:
    """By cost ("parameters", "training_flops"), the comparisons that dominate the grown model (`dominated_by`)."""
    if not pairs:
        return {}
    grown = _figures([grown for grown, _ in next(iter(pairs.values()))])
    return dominated_by(grown, {name: _figures([other for _, other in both]) for name, both in pairs.items()})


def flops_of_from_scratch(pairs: Mapping[str, Pairs]) -> float | None:
    """The grown run's training FLOPs over its final architecture's from scratch, the mean over seeds (None
    without that comparison, or where a seed's from-scratch training counted no FLOPs: as the closing table of one
    seed, which shows no ratio then)."""
    both = pairs.get(FROM_SCRATCH)
    if not both or any(other.flops.total <= 0 for _, other in both):
        return None
    return statistics.fmean(grown.flops.total / other.flops.total for grown, other in both)


def seed_line(seed: int, run: SeedRun) -> str:
    """One seed's figures: the grown model's score, parameters and FLOPs, then each comparison's score."""
    parts = [f", {printable(name)} {format_score(outcome.final_accuracy, run.metric_name)}"
             for name, outcome in run.comparisons.items()]
    return (f"seed {seed}: grown {format_score(run.grown.final_accuracy, run.metric_name)} "
            f"({run.grown.parameters:,} parameters, {format_flops(run.grown.flops.total)})" + "".join(parts))


def summary_lines(runs: Mapping[int, SeedRun], pairs: Mapping[str, Pairs],
                  differences: Mapping[str, tuple[float, float]]) -> list[str]:
    """The closing table: each model's means over the seeds, then the grown model's paired differences."""
    metric_name = next(iter(runs.values())).metric_name
    lines = [f"\n{len(runs)} {'seed' if len(runs) == 1 else 'seeds'} ({', '.join(map(str, runs))}): mean ± std over "
             "the seeds",
             seeds_table_header(metric_name),
             _model_line("grown", [run.grown for run in runs.values()], metric_name)]
    lines += [_model_line(name, [other for _, other in both], metric_name) for name, both in pairs.items()]
    lines.append("differences, paired by seed (mean ± standard error):")
    for name, (mean, error) in differences.items():
        ahead = sum(grown.final_accuracy > other.final_accuracy for grown, other in pairs[name])
        behind = sum(grown.final_accuracy < other.final_accuracy for grown, other in pairs[name])
        label = f"grown - {cut(printable(name), 20)}"
        lines.append(f"  {label:<30}{format_difference(mean, error, metric_name)} ({ahead} "
                     f"{'seed' if ahead == 1 else 'seeds'} ahead, {behind} behind)")
    ratio = flops_of_from_scratch(pairs)
    if ratio is not None:
        lines.append(f"  {'training FLOPs, grown':<30}{ratio:.2f}x those of from scratch (mean over seeds)")
    if pairs:
        lines.append(DOMINANCE_HEADING)
        verdicts = {cost: [printable(cut(name, 20)) for name in names]
                    for cost, names in dominance_of(pairs).items()}
        lines += dominance_lines(verdicts, len(runs))
    return lines


def _model_line(name: str, outcomes: Sequence[EpisodeOutcome], metric_name: str) -> str:
    """A model's row: score and loss as mean ± std over the seeds; parameters, FLOPs and seconds as means."""
    return seeds_table_row(name, metric_name, [o.final_accuracy for o in outcomes], [o.final_loss for o in outcomes],
                           [o.parameters for o in outcomes], [o.flops.total for o in outcomes],
                           [o.seconds for o in outcomes])


def seeds_figures(runs: Mapping[int, SeedRun], differences: Mapping[str, tuple[float, float]]) -> dict[str, Any]:
    """What `seeds.json` holds: each seed's run directory, scores and costs (loss, parameters, training FLOPs,
    seconds) of every model, the paired differences, the FLOPs against from scratch and what dominates the grown
    model."""
    def score(run: SeedRun, name: str) -> float | None:
        outcome = run.comparisons.get(name)
        return None if outcome is None else outcome.final_accuracy

    def costs(run: SeedRun) -> dict[str, dict[str, float]]:
        return {name: {"loss": outcome.final_loss, "parameters": outcome.parameters,
                       "flops": outcome.flops.total, "seconds": outcome.seconds}
                for name, outcome in {"grown": run.grown, **run.comparisons}.items()}

    pairs = seed_pairs(list(runs.values()))

    return {"score": {"name": next(iter(runs.values())).metric_name},
            "seeds": {str(seed): {"run_dir": str(run.run_dir), "grown": run.grown.final_accuracy,
                                  NO_GROWTH: score(run, NO_GROWTH), FROM_SCRATCH: score(run, FROM_SCRATCH),
                                  "fixed": {name: outcome.final_accuracy for name, outcome in run.comparisons.items()
                                            if name not in (NO_GROWTH, FROM_SCRATCH)},
                                  "costs": costs(run)}
                      for seed, run in runs.items()},
            "differences": {name: {"mean": mean, "standard_error": error if math.isfinite(error) else None}
                            for name, (mean, error) in differences.items()},
            "flops_of_from_scratch": flops_of_from_scratch(pairs),
            "dominated_by": dominance_of(pairs) if len(runs) > 1 else None}
