"""Seeds derived from a base seed and keys, so every random choice of a run can be replayed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

#: The key of an epoch's training in `derive_seed`: what draws from torch's global generator while an epoch trains (a
#: user's `DataLoader(shuffle=True)`, a random transform in their `Dataset`, dropout) draws from a generator seeded by
#: the episode's seed and the epoch. So a grown run and its no-growth twin see the same batches in the same order,
#: and a germination or an earlier run in the same process changes none of them.
TRAINING_RNG_STREAM = 1_000_033


def derive_seed(base: int, *keys: int) -> int:
    """A 63-bit seed determined by `base` and `keys` (NumPy's SeedSequence mixing)."""
    return int(np.random.SeedSequence([base % 2**63, *keys]).generate_state(1, dtype=np.uint64)[0] >> 1)


@contextmanager
def seeded(seed: int, *devices: torch.device) -> Iterator[None]:
    """Run a block (module construction, say) with torch's global RNG set to `seed`, restoring it after (the CPU's
    and that of each CUDA device among `devices`)."""
    with torch.random.fork_rng(devices=list(dict.fromkeys(device for device in devices if device.type == "cuda"))):
        torch.manual_seed(seed)
        yield
