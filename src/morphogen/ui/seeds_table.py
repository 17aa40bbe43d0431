"""The table of a run over seeds that `run --seeds` closes with and `report` prints again from `seeds.json`: one
row per model, its score and validation loss as mean ± std over the seeds, its parameters, training FLOPs and
seconds as means. One formatting for both, so that the two print the same figures to the digit."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from morphogen.paired_statistics import format_mean_std
from morphogen.telemetry.story import NEGATIVE_LOSS
from morphogen.ui.terminal_text import cut, printable
from morphogen.ui.units import format_flops


def seeds_table_header(metric_name: str) -> str:
    """The header: a negated loss has no score column (the loss column says it, as in one seed's closing table)."""
    score = "" if metric_name == NEGATIVE_LOSS else f"{cut(f'val {metric_name}', 16):>18}"
    return f"{'':22}{score}{'val loss':>20}{'parameters':>12}{'training FLOPs':>16}{'seconds':>10}"


def seeds_table_row(name: str, metric_name: str, scores: Sequence[float], losses: Sequence[float],
                    parameters: Sequence[float], flops: Sequence[float], seconds: Sequence[float]) -> str:
    """A model's row from its figures, one per seed; a figure no seed has reads "-" (a `seeds.json` written before
    the costs were kept)."""
    def spread(values: Sequence[float], decimals: int) -> str:
        return format_mean_std(values, f".{decimals}f") if values else "-"  # one seed: "± n/a"

    shown = "" if metric_name == NEGATIVE_LOSS else f"{spread(scores, 2 if metric_name == 'accuracy' else 4):>18}"
    count = f"{round(statistics.fmean(parameters)):,}" if parameters else "-"
    cost = format_flops(round(statistics.fmean(flops))) if flops else "-"
    time = f"{statistics.fmean(seconds):.1f}s" if seconds else "-"
    return f"  {cut(printable(name), 20):<20}{shown}{spread(losses, 4):>20}{count:>12}{cost:>16}{time:>10}"
