"""Worker processes and Ctrl-C: a worker playing a job is interrupted as a run is; an idle one ends quietly."""

from __future__ import annotations

import signal

import pytest

from morphogen.commands import workers
from morphogen.commands.workers import EXIT_INTERRUPTED, WorkerJob


def _interrupt_now(job: int) -> int:
    workers._interrupted(signal.SIGINT, None)
    return job


def test_ctrl_c_interrupts_a_job_and_ends_an_idle_worker_without_a_traceback() -> None:
    with pytest.raises(KeyboardInterrupt):  # in a job: the run stops as Ctrl-C stops it ("interrupted")
        WorkerJob(_interrupt_now)(3)
    with pytest.raises(SystemExit) as ended:  # between jobs, waiting for the next: the process just exits
        workers._interrupted(signal.SIGINT, None)
    assert ended.value.code == EXIT_INTERRUPTED
    assert WorkerJob(abs)(-2) == 2  # a job's result passes through
