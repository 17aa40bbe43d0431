"""One writer per run directory: an advisory lock on `RUN_DIR/.lock` held for a whole command.

Two `morphogen train --run-dir D` (or two `--resume D`, or a `run` and a `train`) writing one run
directory interleave their events and overwrite each other's checkpoints. Every command that writes
a run directory therefore holds `hold_run_directory(D)` from before it reads the directory's state
until it has written its last file; a second one is refused with a `RunDirectoryBusy` line naming
the holder's PID.

The lock is `fcntl.flock` on the lock file, which the kernel drops when the holder exits however it
exits (SIGKILL included). A lock file left behind by a dead process is therefore *stale*: the next
command takes it over and writes its own PID. A stopped holder (SIGSTOP) still holds the lock.
The file is removed on release; `_acquire` re-checks after locking that the path still names the
locked file, so a release racing an acquisition cannot leave two holders.

Within one process the lock is re-entrant (the CLI takes it before reading a checkpoint to resume,
and `train_command` takes it again), counted per resolved path. Advisory means it binds only
morphogen: other programs may still write the directory. It needs a POSIX system and a file system
that supports `flock` (local disks do; some network file systems do not).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

LOCK_NAME = ".lock"

_held: dict[Path, tuple[int, int]] = {}
"""Resolved run directory -> (file descriptor, re-entrancy count) of the locks this process holds."""


class RunDirectoryLockError(RuntimeError):
    """The lock of a run directory cannot be taken (the message says why, in one line)."""


class RunDirectoryBusy(RunDirectoryLockError):
    """Another live process holds the lock of the run directory."""


def _holder(path: Path) -> str:
    try:
        text = path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return "another process"
    return f"process {text}" if text.isdigit() else "another process"


def _acquire(directory: Path) -> int:
    """Lock `directory/.lock` for this process and write our PID into it; return its descriptor."""
    path = directory / LOCK_NAME
    while True:
        try:
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            raise RunDirectoryLockError(f"cannot lock run directory {directory}: {error.strerror or error}") from None
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(descriptor)
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise RunDirectoryBusy(f"run directory {directory} is in use by {_holder(path)} (lock {path}); wait for "
                                   "it to finish or choose another --run-dir") from None
        try:
            same_file = os.stat(path).st_ino == os.fstat(descriptor).st_ino
        except FileNotFoundError:
            same_file = False
        if same_file:
            break
        os.close(descriptor)  # the holder released and removed it between our open and our flock: retry
    os.ftruncate(descriptor, 0)
    os.write(descriptor, f"{os.getpid()}\n".encode("ascii"))
    return descriptor


def _release(directory: Path, descriptor: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(directory / LOCK_NAME)  # while still locked: nobody else can hold this file now
    os.close(descriptor)


@contextlib.contextmanager
def hold_run_directory(directory: str | Path) -> Iterator[Path]:
    """Hold the lock of an existing run directory for the block; raise `RunDirectoryBusy` if another holds it."""
    key = Path(directory).resolve()
    if key in _held:
        descriptor, count = _held[key]
        _held[key] = (descriptor, count + 1)
    else:
        _held[key] = (_acquire(key), 1)
    try:
        yield Path(directory)
    finally:
        descriptor, count = _held[key]
        if count > 1:
            _held[key] = (descriptor, count - 1)
        else:
            del _held[key]
            _release(key, descriptor)
