"""Worker processes that play independent jobs side by side (`eval --jobs`, `run --seeds --jobs`).

Spawned, not forked: a fork of a process whose torch threads already ran can deadlock in the child. Each worker
gets its torch thread count first, then its own setup (what it plays, sent once rather than with every job).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
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
    signal.signal(signal.SIGINT, _interrupted)
    setup(*setup_args)


#: Whether this worker is playing a job now (`WorkerJob`); an idle one waits for the next.
_busy = False


def _interrupted(signum: int, frame: object) -> None:
    """Ctrl-C reaches every process of the terminal's group. A worker playing a job stops it as Ctrl-C stops a run
    (`KeyboardInterrupt`: the parent says "interrupted"); an idle one, waiting for a job, just ends, instead of
    printing multiprocessing's traceback of the wait."""
    if _busy:
        raise KeyboardInterrupt
    raise SystemExit(EXIT_INTERRUPTED)


#: The exit status of an interrupted process, as a shell gives one that SIGINT ended.
EXIT_INTERRUPTED = 130


class WorkerJob:
    """`function` as a job of `spawned_workers`' pool (`pool.map(WorkerJob(function), jobs)`): while it runs, Ctrl-C
    interrupts it; between jobs it ends the worker quietly."""

    def __init__(self, function: Callable[[Any], Any]) -> None:
        self.function = function

    def __call__(self, job: Any) -> Any:
        global _busy
        _busy = True
        try:
            return self.function(job)
        finally:
            _busy = False
