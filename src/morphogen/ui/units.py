"""Numbers with their units, as every view of a run prints them."""

from __future__ import annotations


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
