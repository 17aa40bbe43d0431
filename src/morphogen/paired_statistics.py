"""The grown model's score minus another's, paired by seed: plain numbers in, mean and standard error out.

Used where runs over seeds are summed up (`seeds_summary`) and where their file is read back (`ui.seeds_report`);
it imports nothing of morphogen, so both layers can.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def paired_difference(first: Sequence[float], second: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of `first[i] - second[i]` (the error is NaN for one pair: one seed has no spread)."""
    differences = [a - b for a, b in zip(first, second, strict=True)]
    spread = statistics.stdev(differences) if len(differences) > 1 else math.nan
    return statistics.fmean(differences), spread / math.sqrt(len(differences))
