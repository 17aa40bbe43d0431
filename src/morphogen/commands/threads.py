"""How many CPU threads torch may use: `--threads N`, or a default that does not oversubscribe.

torch's default is one intra-op thread per core. For morphogen's small hosts that is slower, not
faster, as soon as anything else runs on the machine: on 2 shared cores `morphogen run --epochs 5`
trained in 18.7 s with the default and 1.4 s with one thread. The default therefore leaves room:
`OMP_NUM_THREADS` when the user exported it, else half the cores this process may run on, at least
1 and at most `MAX_DEFAULT_THREADS` (more threads rarely help layers this small).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from morphogen.limits import MAX_THREADS, check_count

MAX_DEFAULT_THREADS = 4
"""Upper bound of the default thread count."""


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def default_threads() -> int:
    """The thread count used when `--threads` is not given (see the module docstring)."""
    exported = os.environ.get("OMP_NUM_THREADS", "")
    if exported.isdigit() and int(exported) >= 1:
        return min(int(exported), MAX_THREADS)
    return max(1, min(MAX_DEFAULT_THREADS, available_cores() // 2))


def set_threads(threads: int | None) -> int:
    """Give torch `threads` intra-op threads (None: `default_threads()`); returns the count set."""
    import torch

    count = default_threads() if threads is None else threads
    check_count("--threads", count, MAX_THREADS)
    torch.set_num_threads(count)
    return count


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch's intra-op thread count set to `threads` for the block, restored after (a library call must not leave
    the caller's process with another count)."""
    import torch

    check_count("threads", threads, MAX_THREADS)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
