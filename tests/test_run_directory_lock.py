"""One writer per run directory: a second process is refused with one line naming the holder; a dead
holder's lock is taken over; the lock is re-entrant within a process and gone after a clean exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from morphogen.cli import EXIT_USER_ERROR, main
from morphogen.run_directory import LOCK_NAME, LockPurpose, RunDirectoryBusy, _is_paused, hold_run_directory

TINY = ["--envs", "1", "--episode-length", "2", "--max-train-samples", "100", "--hidden-size", "16"]

# Holds the lock of argv[1], says so on stdout, then waits to be killed.
HOLDER = textwrap.dedent("""
    import sys, time
    from morphogen.run_directory import hold_run_directory
    with hold_run_directory(sys.argv[1]):
        print("locked", flush=True)
        time.sleep(600)
""")


def start_holder(directory: Path) -> subprocess.Popen[str]:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(directory)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
    return holder


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


def test_second_writer_is_refused_and_a_dead_holders_lock_is_taken_over(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    assert main(["train", *TINY, "--rounds", "1", "--run-dir", str(run)]) == 0
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in run.iterdir()}

    holder = start_holder(run)
    try:
        os.kill(holder.pid, signal.SIGSTOP)  # a paused holder still holds the lock
        # The signal is delivered asynchronously: wait until /proc says stopped (on a loaded machine it takes a while).
        deadline = time.monotonic() + 10
        while Path("/proc/self/stat").exists() and not _is_paused(holder.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert main(["train", "--resume", str(run), "--rounds", "2"]) == EXIT_USER_ERROR
        line = one_error_line(capsys)
        # Waited for, a paused holder would never finish; a resume has no other directory to choose.
        paused = (f"morphogen train: error: run directory {run} is in use by process {holder.pid}, which is paused "
                  f"(Ctrl-Z or SIGSTOP; lock {run / LOCK_NAME}): `kill -CONT {holder.pid}` lets it go on, "
                  f"`kill {holder.pid}` ends it; resume once it has ended")
        running = (f"morphogen train: error: run directory {run} is in use by process {holder.pid} "
                   f"(lock {run / LOCK_NAME}); wait for it to finish, or stop it (`kill {holder.pid}`), then resume")
        assert line == (paused if Path("/proc/self/stat").exists() else running)  # only Linux's /proc tells paused
        assert main(["run", "--epochs", "1", "--max-train-samples", "100", "--no-baseline",
                     "--run-dir", str(run)]) == EXIT_USER_ERROR
        assert f"{run} already holds another run" in one_error_line(capsys)  # one run per directory
        assert {p.name: p.read_bytes() for p in run.iterdir() if p.name != LOCK_NAME} == before, \
            "a refused command must not touch the run"
    finally:
        holder.kill()  # SIGKILL: the holder cleans up nothing; its lock file stays behind, stale
        holder.wait()
    assert (run / LOCK_NAME).read_text().strip() == str(holder.pid)

    assert main(["train", "--resume", str(run), "--rounds", "2"]) == 0
    assert "rounds 2..2" in capsys.readouterr().out
    assert not (run / LOCK_NAME).exists(), "a clean exit removes the lock file"


def test_lock_is_reentrant_in_one_process_and_exclusive_across_processes(tmp_path: Path) -> None:
    with hold_run_directory(tmp_path), hold_run_directory(tmp_path / "."):
        assert (tmp_path / LOCK_NAME).read_text() == f"{os.getpid()}\n"
        probe = subprocess.run([sys.executable, "-c", textwrap.dedent("""
            import sys
            from morphogen.run_directory import RunDirectoryBusy, hold_run_directory
            try:
                with hold_run_directory(sys.argv[1]):
                    sys.exit(0)
            except RunDirectoryBusy as error:
                print(error)
                sys.exit(3)
        """), str(tmp_path)], capture_output=True, text=True, timeout=120)
        assert probe.returncode == 3, probe.stderr
        assert f"in use by process {os.getpid()}" in probe.stdout
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_leftover_lock_file_of_a_dead_process_is_taken_over(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / LOCK_NAME).write_text(f"{dead.pid}\n")
    started = time.monotonic()
    with hold_run_directory(tmp_path):
        assert (tmp_path / LOCK_NAME).read_text() == f"{os.getpid()}\n"
    assert time.monotonic() - started < 5, "taking over a stale lock must not wait"


def test_a_live_holder_makes_hold_run_directory_raise_busy(tmp_path: Path) -> None:
    holder = start_holder(tmp_path)
    try:
        with pytest.raises(RunDirectoryBusy, match=f"in use by process {holder.pid} .*; wait for it to finish"), \
                hold_run_directory(tmp_path):
            pass
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize(("purpose", "advice"), [
    (LockPurpose.NEW_RUN, "wait for it to finish or choose another --run-dir"),
    (LockPurpose.RESUME, "wait for it to finish, or stop it (`kill {pid}`), then resume"),
    (LockPurpose.EXPORT, "wait for it to finish or give --output a path outside the run directory"),
])
def test_a_busy_directory_is_refused_with_advice_that_fits_why_it_was_locked(
        tmp_path: Path, purpose: LockPurpose, advice: str) -> None:
    holder = start_holder(tmp_path)
    try:
        with pytest.raises(RunDirectoryBusy) as refused, hold_run_directory(tmp_path, purpose):
            pass
    finally:
        holder.kill()
        holder.wait()
    assert str(refused.value) == (f"run directory {tmp_path} is in use by process {holder.pid} "
                                  f"(lock {tmp_path / LOCK_NAME}); {advice.format(pid=holder.pid)}")


def test_a_resume_refused_by_a_holder_of_unknown_pid_says_to_stop_it(tmp_path: Path) -> None:
    holder = start_holder(tmp_path)
    try:
        (tmp_path / LOCK_NAME).write_text("")  # its PID is not in the file (written by hand, say): the lock still holds
        refusal = r"by another process \(lock .*\); wait for it to finish, or stop it, then resume$"
        with pytest.raises(RunDirectoryBusy, match=refusal), hold_run_directory(tmp_path, LockPurpose.RESUME):
            pass
    finally:
        holder.kill()
        holder.wait()


def test_a_full_disk_at_the_lock_is_one_line_and_leaves_no_lock_file(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from morphogen.run_directory import RunDirectoryLockError

    def no_space(descriptor: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", no_space)
    with pytest.raises(RunDirectoryLockError, match="no space left on its disk"), hold_run_directory(tmp_path):
        pass
    monkeypatch.undo()
    assert not (tmp_path / LOCK_NAME).exists()
    with hold_run_directory(tmp_path):  # nothing stale is left to trip the next command
        assert (tmp_path / LOCK_NAME).read_text() == f"{os.getpid()}\n"


def test_a_used_up_quota_at_the_lock_says_so_rather_than_no_space(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from morphogen.run_directory import RunDirectoryLockError

    def over_quota(descriptor: int, data: bytes) -> int:
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))

    monkeypatch.setattr(os, "write", over_quota)
    with pytest.raises(RunDirectoryLockError, match=f"^cannot lock run directory {tmp_path}: disk quota exceeded$"), \
            hold_run_directory(tmp_path):
        pass
    monkeypatch.undo()
    assert not (tmp_path / LOCK_NAME).exists()
