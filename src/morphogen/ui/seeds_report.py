"""`morphogen report RUN_DIR` for a run over several seeds (`run --seeds`, `grow_over_seeds`): its `seeds.json`.

Each seed's score beside each comparison's, each model's figures as mean ± std over the seeds (the table the run
printed), then the grown model's differences from them,
paired by seed, and which model dominates it per parameter and per training FLOP, computed from those figures.
The file is untrusted: numbers must be finite and at most `run_files.MAX_MAGNITUDE` (1e100) in magnitude, names
short, seeds at most `MAX_SEEDS_SHOWN`; what does not fit reads as missing ("-").
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from morphogen.paired_statistics import DOMINANCE_HEADING, SeedFigures, dominance_lines, dominated_by, paired_difference
from morphogen.run_directory import SEEDS_FILENAME, read_json_object
from morphogen.telemetry.story import NEGATIVE_LOSS
from morphogen.ui.run_files import RunDirectoryError, score_name, summary_number
from morphogen.ui.seeds_table import seeds_table_header, seeds_table_row
from morphogen.ui.terminal_text import cut, printable
from morphogen.ui.units import format_difference, format_score

#: Most seeds shown (`grow_over_seeds` plays at most 100); most hosts compared with and the longest name of one
#: (`compare_with` takes at most 16 of at most 40 characters).
MAX_SEEDS_SHOWN, MAX_HOSTS, MAX_NAME = 100, 16, 40
#: The comparisons every seed's run may hold, beside the hosts compared with (`fixed`).
COMPARISONS = ("no growth", "from scratch")


def render_seeds_report(run_dir: str | Path) -> str:
    """The report of a run over several seeds, every string from the file with its control characters escaped."""
    path = Path(run_dir)
    if not (path / SEEDS_FILENAME).exists():
        raise RunDirectoryError(f"the run over several seeds in {path} has not finished (no {SEEDS_FILENAME}): "
                                f"`morphogen run --resume {path}` goes on with it; a seed's run that finished: "
                                f"morphogen report {path}/seed_<s>")
    figures = read_json_object(path / SEEDS_FILENAME)
    if figures is None:
        raise RunDirectoryError(f"{path / SEEDS_FILENAME} cannot be read (damaged, or too large)")
    score = figures.get("score")
    metric = score_name(score.get("name") if isinstance(score, dict) else None)
    seeds = _seeds(figures.get("seeds"))
    lines = [f"run over {len(seeds)} seeds {path}: final validation {_score_title(metric)} by seed", "",
             *_table(seeds, metric)]
    means = _means_table(seeds, metric)
    if means:
        lines += ["", *means]
    differences = _differences(seeds, metric)
    if differences:
        lines += ["", "differences, paired by seed (mean ± standard error, over the seeds with both scores):",
                  *differences]
    dominance = _dominance(seeds)
    if dominance:
        lines += ["", DOMINANCE_HEADING, *dominance]
    lines += ["", f"each seed's run: morphogen report {path}/seed_<s>"]
    return "\n".join(printable(line) for line in lines)


def _score_title(metric: str) -> str:
    """What the table's scores are: "accuracy", the loss (a negated loss is shown as the loss) or the metric."""
    return "loss" if metric == NEGATIVE_LOSS else metric


def _columns(seeds: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The models any seed has a score of: the grown one, the comparisons, the hosts compared with."""
    hosts = dict.fromkeys(name for _, scores in seeds for name in _fixed(scores))
    return ["grown", *(name for name in [*COMPARISONS, *list(hosts)[:MAX_HOSTS]]
                       if any(_score_of(scores, name) is not None for _, scores in seeds))]


def _table(seeds: list[tuple[str, dict[str, Any]]], metric: str) -> list[str]:
    """A row per seed, a column per model any seed has a score of (the grown one first), then their means."""
    columns = _columns(seeds)
    lines = [f"{'seed':>6}" + "".join(f"{cut(name, 13):>14}" for name in columns)]
    for seed, scores in seeds:
        lines.append(f"{cut(seed, 6):>6}" + "".join(f"{_cell(_score_of(scores, name), metric):>14}"
                                                     for name in columns))
    means = [_mean([_score_of(scores, name) for _, scores in seeds]) for name in columns]
    lines.append(f"{'mean':>6}" + "".join(f"{_cell(mean, metric):>14}" for mean in means))
    return lines


def _means_table(seeds: list[tuple[str, dict[str, Any]]], metric: str) -> list[str]:
    """Each model's figures as mean ± std over the seeds: the table `run --seeds` printed, with its columns and
    digits (`seeds_table`), from the figures the file holds; none for a file that holds no costs (written before
    they were kept)."""
    if not any(isinstance(scores.get("costs"), dict) for _, scores in seeds):
        return []

    def present(values: Iterable[float | None]) -> list[float]:
        return [value for value in values if value is not None]

    rows = [seeds_table_row(
        name, metric, present(_score_of(scores, name) for _, scores in seeds),
        present(_loss_of(scores, name) for _, scores in seeds),
        *(present(_cost_of(scores, name, cost) for _, scores in seeds) for cost in ("parameters", "flops", "seconds")))
        for name in _columns(seeds)]
    return ["each model over the seeds, mean ± std (the table `run --seeds` closed with):", seeds_table_header(metric),
            *rows]


def _differences(seeds: list[tuple[str, dict[str, Any]]], metric: str) -> list[str]:
    """The grown model's score minus each other model's, paired by seed, computed from the scores the table shows
    (not from the file's own summary of them, which could say otherwise), with the seeds ahead and behind."""
    lines = []
    for name in _columns(seeds)[1:]:
        pairs = [(grown, other) for _, scores in seeds if (grown := _score_of(scores, "grown")) is not None
                 and (other := _score_of(scores, name)) is not None]
        if not pairs:
            continue
        mean, error = paired_difference([grown for grown, _ in pairs], [other for _, other in pairs])
        ahead, behind = sum(grown > other for grown, other in pairs), sum(grown < other for grown, other in pairs)
        lines.append(f"  {'grown - ' + name:<30}{format_difference(mean, error, metric)} ({len(pairs)} "
                     f"{'seed' if len(pairs) == 1 else 'seeds'}: {ahead} ahead, {behind} behind)")
    return lines


def _dominance(seeds: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Which model dominates the grown one per cost, over the seeds whose every figure the file holds (none when
    fewer than two seeds have them all)."""
    columns = _columns(seeds)
    complete = [scores for _, scores in seeds if all(
        _score_of(scores, name) is not None and _cost_of(scores, name, "parameters") is not None
        and _cost_of(scores, name, "flops") is not None for name in columns)]
    if len(complete) < 2 or len(columns) < 2:
        return []

    def figures(name: str) -> SeedFigures:  # every value is there: `complete` holds only such seeds
        return SeedFigures([_score_of(scores, name) or 0.0 for scores in complete],
                           [_cost_of(scores, name, "parameters") or 0.0 for scores in complete],
                           [_cost_of(scores, name, "flops") or 0.0 for scores in complete])

    verdicts = dominated_by(figures("grown"), {name: figures(name) for name in columns[1:]})
    return dominance_lines({cost: [cut(name, 20) for name in names] for cost, names in verdicts.items()},
                           len(complete))


def _loss_of(scores: Mapping[str, Any], name: str) -> float | None:
    """A seed's final validation loss of a model, from the file's `costs` (None where missing; a user's loss may be
    negative)."""
    costs = scores.get("costs")
    return summary_number(costs.get(name) if isinstance(costs, dict) else None, "loss")


def _cost_of(scores: Mapping[str, Any], name: str, cost: str) -> float | None:
    """A seed's figure `cost` ("parameters", "flops") of a model, from the file's `costs` (None where missing)."""
    costs = scores.get("costs")
    model = costs.get(name) if isinstance(costs, dict) else None
    value = summary_number(model, cost)
    return None if value is None or value < 0 else value


def _seeds(table: object) -> list[tuple[str, dict[str, Any]]]:
    """(seed, its scores) for each seed the file lists with a table, in its order."""
    if not isinstance(table, dict):
        return []
    return [(seed, scores) for seed, scores in list(table.items())[:MAX_SEEDS_SHOWN]
            if isinstance(seed, str) and isinstance(scores, dict)]


def _fixed(scores: Mapping[str, Any]) -> dict[str, Any]:
    """A seed's scores of the hosts compared with, by name (names of at most `MAX_NAME` characters)."""
    fixed = scores.get("fixed")
    if not isinstance(fixed, dict):
        return {}
    return {name: value for name, value in fixed.items() if isinstance(name, str) and 0 < len(name) <= MAX_NAME}


def _score_of(scores: Mapping[str, Any], name: str) -> float | None:
    """A seed's score of the grown model, a comparison, or a host compared with."""
    if name == "grown" or name in COMPARISONS:
        return summary_number(scores, name)
    return summary_number(_fixed(scores), name)


def _mean(values: list[float | None]) -> float | None:
    """The mean of the scores the file holds (None when it holds none)."""
    present = [value for value in values if value is not None]
    return statistics.fmean(present) if present else None


def _cell(value: float | None, metric: str) -> str:
    return "-" if value is None else format_score(value, metric)
