"""Worker processes that play independent jobs side by side (`eval --jobs`, `run --seeds --jobs`).

Spawned, not forked: a fork of a process whose torch threads already ran can deadlock in the child. Each worker
gets its torch thread count first, then its own setup (what it plays, sent once rather than with every job).
Workers never outlive the command: stopped early (an error, Ctrl-C, a SIGINT or SIGTERM sent to the parent alone)
the parent interrupts them, and a parent that dies without a word (SIGKILL) takes them along.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import torch

from morphogen.exit_status import EXIT_INTERRUPTED, EXIT_PARENT_GONE


@contextlib.contextmanager
def spawned_workers(count: int, threads: int, setup: Callable[..., None],
                    setup_args: tuple[Any, ...]) -> Iterator[ProcessPoolExecutor]:
    """A pool of `count` spawned processes, each with `threads` torch threads that then runs `setup(*setup_args)`
    (a function at a module's top level); shut down on leaving the block, the jobs not begun cancelled. Left by an
    exception, the workers' running jobs are interrupted first, so the parent never waits for them to play out."""
    pool = ProcessPoolExecutor(max_workers=count, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_start, initargs=(threads, setup, setup_args))
    try:
        yield pool
    except BaseException:
        _shut_down(pool, interrupt=True)
        raise
    _shut_down(pool, interrupt=False)


def _shut_down(pool: ProcessPoolExecutor, interrupt: bool) -> None:
    """Wait for the workers to end (their running jobs interrupted first if `interrupt`); a second Ctrl-C meanwhile
    ends them at once rather than leave the parent waiting, or a worker waiting for a job that never comes."""
    try:
        if interrupt:
            interrupt_workers(pool)
        pool.shutdown(wait=True, cancel_futures=True)
    except BaseException:
        _kill_workers(pool)
        raise


def interrupt_workers(pool: ProcessPoolExecutor) -> None:
    """Send SIGINT to every live worker of `pool`: each stops as Ctrl-C stops it (a worker that the terminal's Ctrl-C
    reached already ignores this second one)."""
    for process in list(pool._processes.values()):  # the executor keeps its processes by PID, and exposes no other way
        with contextlib.suppress(ProcessLookupError, ValueError):  # already ended (ValueError: already closed)
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGINT)


def _kill_workers(pool: ProcessPoolExecutor) -> None:
    """End every worker of `pool` at once (SIGKILL): what they wrote survives a kill at any moment, and a worker
    left waiting for a job that will never come would keep the parent from exiting."""
    for process in list(pool._processes.values()):
        with contextlib.suppress(ProcessLookupError, ValueError):
            process.kill()
    pool.shutdown(wait=False, cancel_futures=True)


def _start(threads: int, setup: Callable[..., None], setup_args: tuple[Any, ...]) -> None:
    torch.set_num_threads(threads)
    signal.signal(signal.SIGINT, _interrupted)
    signal.signal(signal.SIGTERM, _interrupted)  # a scheduler's kill of the whole job: as Ctrl-C
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_end_with_parent, args=(parent.sentinel,), name="morphogen-parent-watch",
                         daemon=True).start()
    setup(*setup_args)


def _end_with_parent(parent_sentinel: int) -> None:
    """End this worker as soon as its parent is gone (killed by SIGKILL, say): nobody reads its results any more,
    and left running it would play on into a run directory whose lock died with the parent. Exiting at once is
    safe: every file a worker writes survives a kill at any moment (atomic writes, whole event lines)."""
    multiprocessing.connection.wait([parent_sentinel])
    os._exit(EXIT_PARENT_GONE)


#: Whether this worker is playing a job now (`WorkerJob`); an idle one waits for the next.
_busy = False


def _interrupted(signum: int, frame: object) -> None:
    """Ctrl-C reaches every process of the terminal's group. A worker playing a job stops it as Ctrl-C stops a run
    (`KeyboardInterrupt`: the parent says "interrupted"); an idle one, waiting for a job, just ends, instead of
    printing multiprocessing's traceback of the wait. Either way it is stopping now, so a second signal (the parent
    passing the interruption on) is ignored rather than cut through the clean-up."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if _busy:
        raise KeyboardInterrupt
    raise SystemExit(EXIT_INTERRUPTED)


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
            signal.signal(signal.SIGINT, _interrupted)  # idle again: a later Ctrl-C ends this worker (`_interrupted`)
            signal.signal(signal.SIGTERM, _interrupted)
