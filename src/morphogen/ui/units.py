"""Numbers with their units, as every view of a run prints them."""

from __future__ import annotations

from morphogen.paired_statistics import format_spread
from morphogen.telemetry.story import NEGATIVE_LOSS


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """`count` (with thousands separators) and `noun`, plural unless the count is one: `1 env`, `4 envs`, `2
    processes` (`plural` where adding an "s" will not do)."""
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"


def format_flops(flops: float) -> str:
    """FLOPs with an SI prefix and three significant digits: `1.23 GFLOP`."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(flops) >= factor:
            return f"{flops / factor:.3g} {prefix}FLOP"
    return f"{flops:.3g} FLOP"


def format_loss(loss: float, decimals: int = 4) -> str:
    """A validation loss to `decimals` decimals, or as many significant digits when it is below a hundredth (a
    regression's mean squared error can be 1e-5)."""
    return f"{loss:.{decimals}f}" if abs(loss) >= 0.01 or loss == 0.0 else f"{loss:.{decimals - 1}e}"


def format_score(value: float, metric_name: str) -> str:
    """A final score as `run` prints it: accuracy in percent, the negative loss as the loss, any other metric in four
    significant digits."""
    if metric_name == "accuracy":
        return f"{value:.2f}%"
    return format_loss(-value) if metric_name == NEGATIVE_LOSS else f"{value:.4g}"


def format_difference(mean: float, error: float, metric_name: str) -> str:
    """A difference of scores (mean ± standard error) in the score's unit; one of negative losses reads as one of
    losses (lower is better), its sign turned, in the loss's own units ("in loss": a user's loss may be a mean
    squared error, not nats). An error that is not a number (one seed has none) reads `NO_SPREAD`."""
    if metric_name == "accuracy":
        return f"{mean:+.2f} ± {format_spread(error, '.2f')} points"
    if metric_name == NEGATIVE_LOSS:
        return f"{0.0 - mean:+.4f} ± {format_spread(error, '.4f')} in loss"  # 0.0 - 0.0 is +0.0, -(0.0) is -0.0
    return f"{mean:+.4g} ± {format_spread(error, '.4g')}"
