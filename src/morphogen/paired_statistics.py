"""Figures over seeds: the spread of one model's, and the grown model's score against another's, paired by seed;
plain numbers in, plain numbers and names out.

Used where runs over seeds are summed up (`seeds_summary`, `eval`'s table, the benchmarks) and where their file is
read back (`ui.seeds_report`); it imports nothing of morphogen, so every layer can.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


def sample_std(values: Sequence[float]) -> float | None:
    """The standard deviation of `values` (one per seed or episode) with n - 1 in the denominator: what every
    "mean ± std" morphogen prints means, so that tables of `eval` and `run --seeds` compare. None for fewer than
    two values, which have no spread."""
    return statistics.stdev(values) if len(values) > 1 else None


def standard_error(values: Sequence[float]) -> float | None:
    """The standard error of the mean of `values`, `sample_std / sqrt(n)`; None for fewer than two values."""
    spread = sample_std(values)
    return None if spread is None else spread / math.sqrt(len(values))


#: What a table prints in place of a spread that fewer than two values cannot have: not measured, not zero.
NO_SPREAD = "n/a"

# The fill, alignment and width of a format spec (`<5.2f` -> `<`, `5`), which `NO_SPREAD` keeps in a column.
_SPEC_LAYOUT = re.compile(r"(?P<align>(?:.?[<>^=])?)[-+ ]?z?#?0?(?P<width>\d*)")


def format_spread(spread: float | None, spec: str = ".2f") -> str:
    """`spread` (a std or a standard error) in `spec`, or `NO_SPREAD` in the same column width where there is none:
    None from `sample_std`, or NaN from `paired_difference` on one pair."""
    if spread is not None and math.isfinite(spread):
        return format(spread, spec)
    layout = _SPEC_LAYOUT.match(spec)
    assert layout is not None  # every group is optional: the pattern matches any spec
    align = layout["align"].replace("=", ">") or ">"
    return format(NO_SPREAD, align + layout["width"]) if layout["width"] else NO_SPREAD


def format_mean_std(values: Sequence[float], spec: str = ".2f", spread_spec: str | None = None) -> str:
    """`mean ± sample std` of `values` (`12.34 ± 0.56`), the std in `spread_spec` (default `spec`); one value reads
    `12.34 ± n/a`: one seed shows no spread, which is not a spread of zero."""
    return f"{statistics.fmean(values):{spec}} ± {format_spread(sample_std(values), spread_spec or spec)}"


def format_mean_error(values: Sequence[float], spec: str = "+.2f", error_spec: str = ".2f") -> str:
    """`mean ± standard error` of `values` (differences paired by seed, `+1.23 ± 0.45`); one value reads
    `+1.23 ± n/a`."""
    return f"{statistics.fmean(values):{spec}} ± {format_spread(standard_error(values), error_spec)}"


def paired_difference(first: Sequence[float], second: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of `first[i] - second[i]` (the error is NaN for one pair: one seed has no spread)."""
    differences = [a - b for a, b in zip(first, second, strict=True)]
    error = standard_error(differences)
    return statistics.fmean(differences), math.nan if error is None else error


@dataclass(frozen=True)
class SeedFigures:
    """One model's figures on each seed, in the same seed order for every model: its score (higher is better) and
    what it cost."""

    scores: Sequence[float]
    parameters: Sequence[float]
    flops: Sequence[float]


#: The costs a model can dominate the grown one in: (name in files, name in words, its `SeedFigures` field).
COSTS = (("parameters", "parameters", "parameters"), ("training_flops", "training FLOPs", "flops"))


def dominated_by(grown: SeedFigures, others: Mapping[str, SeedFigures]) -> dict[str, list[str]]:
    """By cost, the models that *dominate* the grown one: their mean cost is at most the grown model's and their
    score is higher by more than the standard error of the paired difference (as `benchmarks/pareto.py` judges
    fixed hosts). One seed has no spread to judge by: nothing dominates there."""
    verdicts: dict[str, list[str]] = {}
    for key, _, field in COSTS:
        verdicts[key] = []
        for name, other in others.items():
            mean, error = paired_difference(other.scores, grown.scores)
            cheaper = statistics.fmean(getattr(other, field)) <= statistics.fmean(getattr(grown, field))
            if cheaper and math.isfinite(error) and mean > error:
                verdicts[key].append(name)
    return verdicts


#: The heading of `dominance_lines`, saying what "dominates" means.
DOMINANCE_HEADING = "per cost (dominated: another model costs no more and scores higher by more than the paired " \
    "standard error):"


def dominance_lines(verdicts: Mapping[str, Sequence[str]], seeds: int) -> list[str]:
    """`dominated_by`'s verdicts in words, a line per cost."""
    if seeds < 2:
        return ["  one seed: no spread to judge by whether another model dominates the grown one"]
    lines = []
    for key, words, _ in COSTS:
        names = verdicts.get(key, [])
        lines.append(f"  {'in ' + words:<30}" + (f"dominated by {', '.join(names)}" if names else
                                                 "not dominated by any model here"))
    return lines
