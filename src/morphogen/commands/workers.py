"""Worker processes that play independent jobs side by side (`eval --jobs`, `run --seeds --jobs`).

Spawned, not forked: a fork of a process whose torch threads already ran can deadlock in the child. Each worker
gets its torch thread count first, then its own setup (what it plays, sent once rather than with every job).
"""

from __future__ import annotations

import contextlib
import multiprocessing
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import torch


@contextlib.contextmanager
def spawned_workers(count: int, threads: int, setup: Callable[..., None],
                    setup_args: tuple[Any, ...]) -> Iterator[ProcessPoolExecutor]:
    """A pool of `count` spawned processes, each with `threads` torch threads that then runs `setup(*setup_args)`
    (a function at a module's top level); shut down on leaving the block, the jobs not begun cancelled (stopped
    early by an error or Ctrl-C, they never are)."""
    pool = ProcessPoolExecutor(max_workers=count, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_start, initargs=(threads, setup, setup_args))
    try:
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _start(threads: int, setup: Callable[..., None], setup_args: tuple[Any, ...]) -> None:
    torch.set_num_threads(threads)
    setup(*setup_args)
