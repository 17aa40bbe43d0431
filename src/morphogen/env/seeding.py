"""Seeds derived from a base seed and keys, so every random choice of a run can be replayed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch


def derive_seed(base: int, *keys: int) -> int:
    """A 63-bit seed determined by `base` and `keys` (NumPy's SeedSequence mixing)."""
    return int(np.random.SeedSequence([base % 2**63, *keys]).generate_state(1, dtype=np.uint64)[0] >> 1)


@contextmanager
def seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Run a block (module construction, say) with torch's global RNG set to `seed`, restoring it after."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        yield
