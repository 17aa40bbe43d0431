"""Numbers with their units, as every view of a run prints them."""

from __future__ import annotations


def format_flops(flops: float) -> str:
    """FLOPs with an SI prefix and three significant digits: `1.23 GFLOP`."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(flops) >= factor:
            return f"{flops / factor:.3g} {prefix}FLOP"
    return f"{flops:.3g} FLOP"
