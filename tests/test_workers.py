"""Worker processes and Ctrl-C: a worker playing a job is interrupted as a run is; an idle one ends quietly. Workers
never outlive the command: a parent stopped by a signal sent to it alone stops them, and a killed one takes them
along."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from morphogen.commands import workers
from morphogen.commands.workers import WorkerJob
from morphogen.exit_status import EXIT_INTERRUPTED


@pytest.fixture
def signal_handlers() -> Iterator[None]:
    """`_interrupted` ignores later signals in the process it runs in: give this test process its handlers back."""
    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    yield
    for number, handler in handlers.items():
        signal.signal(number, handler)


def _interrupt_now(job: int) -> int:
    try:
        workers._interrupted(signal.SIGINT, None)
    finally:  # stopping its job now: the parent passing the Ctrl-C on cuts no clean-up short
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN and signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    return job


def test_ctrl_c_interrupts_a_job_and_ends_an_idle_worker_without_a_traceback(signal_handlers: None) -> None:
    with pytest.raises(KeyboardInterrupt):  # in a job: the run stops as Ctrl-C stops it ("interrupted")
        WorkerJob(_interrupt_now)(3)
    assert signal.getsignal(signal.SIGINT) is signal.getsignal(signal.SIGTERM) is workers._interrupted  # idle again
    with pytest.raises(SystemExit) as ended:  # between jobs, waiting for the next: the process just exits
        workers._interrupted(signal.SIGINT, None)
    assert ended.value.code == EXIT_INTERRUPTED
    assert WorkerJob(abs)(-2) == 2  # a job's result passes through


# Starts 2 workers on jobs of 10 minutes, prints their PIDs once both jobs run, then waits for the jobs, or sends
# itself SIGINT (argv[2] "interrupt", "interrupt twice") as `kill -INT PID` would: to it alone, not to its workers.
PARENT = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    from morphogen.commands.workers import WorkerJob, spawned_workers

    def nothing():
        pass

    def long_job(marker):
        if sys.argv[2] == "interrupt twice":  # a job that cannot stop at once: it only notes that it was asked
            signal.signal(signal.SIGINT, lambda number, frame: Path(marker + ".asked").write_text(""))
        Path(marker).write_text(str(os.getpid()))
        time.sleep(600)

    if __name__ == "__main__":
        directory = Path(sys.argv[1])
        with spawned_workers(2, 1, nothing, ()) as pool:
            futures = [pool.submit(WorkerJob(long_job), str(directory / f"started_{index}")) for index in range(2)]
            while len(list(directory.glob("started_*"))) < 2:
                time.sleep(0.01)
            print(" ".join(path.read_text() for path in sorted(directory.glob("started_*"))), flush=True)
            if sys.argv[2].startswith("interrupt"):
                os.kill(os.getpid(), signal.SIGINT)
            for future in futures:
                future.result()
""")


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped by init, counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def _start_parent(tmp_path: Path, how: str) -> tuple[subprocess.Popen[str], list[int]]:
    script = tmp_path / "parent.py"  # a file, not `-c`: spawned workers import the jobs from it
    script.write_text(PARENT)
    parent = subprocess.Popen([sys.executable, str(script), str(tmp_path), how], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert parent.stdout is not None
    line = parent.stdout.readline()
    assert line.strip(), parent.communicate(timeout=60)
    return parent, [int(pid) for pid in line.split()]


def _wait_until_ended(pids: list[int], seconds: float) -> list[int]:
    """The PIDs of `pids` still running after at most `seconds` (a bound against a hang, not a timing)."""
    deadline = time.monotonic() + seconds
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [pid for pid in pids if _alive(pid)]


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_workers_end_with_a_parent_killed_by_sigkill(tmp_path: Path) -> None:
    parent, pids = _start_parent(tmp_path, "wait")
    try:
        parent.kill()
        parent.communicate(timeout=60)
        assert _wait_until_ended(pids, 60) == [], "orphaned workers kept playing their jobs"
    finally:
        _kill_all(pids)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_a_parent_interrupted_alone_stops_its_workers_jobs_instead_of_waiting_for_them(tmp_path: Path) -> None:
    parent, pids = _start_parent(tmp_path, "interrupt")
    try:
        _, err = parent.communicate(timeout=120)  # the jobs last 10 minutes: waited for, this times out
        assert parent.returncode == -signal.SIGINT and err.rstrip().endswith("KeyboardInterrupt"), err
        assert _wait_until_ended(pids, 60) == []
    finally:
        parent.kill()
        _kill_all(pids)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_a_second_ctrl_c_while_the_parent_waits_for_its_workers_ends_them_instead_of_hanging(tmp_path: Path) -> None:
    parent, pids = _start_parent(tmp_path, "interrupt twice")
    try:
        asked = [tmp_path / f"started_{index}.asked" for index in range(2)]
        deadline = time.monotonic() + 60
        while not all(path.exists() for path in asked) and time.monotonic() < deadline:  # the parent waits for them
            time.sleep(0.01)
        assert all(path.exists() for path in asked), "the parent's Ctrl-C must reach its workers' jobs"
        parent.send_signal(signal.SIGINT)  # the user's second Ctrl-C
        _, err = parent.communicate(timeout=120)  # waiting on for the workers, or joined at exit, this times out
        assert parent.returncode == -signal.SIGINT and err.rstrip().endswith("KeyboardInterrupt"), err
        assert _wait_until_ended(pids, 60) == []
    finally:
        parent.kill()
        _kill_all(pids)
