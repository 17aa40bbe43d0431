"""A run directory: the names of its files, its lock, the writes into it, and making or refusing one.

Files (every command writes only these names; readers look only for them):

- `config.json`: the resolved config; `events.jsonl`: one JSON object per event; `summary.json`: the
  closing numbers of a `run`; `model.pt`: the model a `run` grew (`morphogen.model_file`), which
  `morphogen export` writes as `model.pt2` or `model.onnx`; `baseline/events.jsonl`: a `run`'s
  no-growth episode; `checkpoint.pt` and `imitation.json`: a `train` run; `eval.json`: an `eval
  --run-dir` table; `report.html`: the default place of `report --html`; `tb/` and `profile/`:
  TensorBoard scalars and profiler traces.

Rules:

- **One run per directory.** `make_run_dir` refuses a directory that already holds any of the files
  above (naming them): a second `run`, `train` or `eval` there would append to the first one's events
  and overwrite its config and summary. Only `train --resume` reopens a run. It also refuses `/`, the
  home directory and system directories (`/etc`, `/usr`, ...), where a mistyped `--run-dir` would
  scatter files.
- **One writer per directory.** `hold_run_directory(D)` is an advisory `fcntl.flock` on `D/.lock`,
  held for a whole command and re-entrant within a process; a second holder is refused with a
  `RunDirectoryBusy` line naming the holder's PID. The kernel drops the lock however the holder exits
  (SIGKILL included), so a lock file left by a dead process is stale and the next command takes it
  over. The lock binds only morphogen, and needs a file system with `flock` (local disks have it).
- **Whole files, never through links.** A run directory may be copied from elsewhere, so its names
  may be symbolic links planted to redirect a write. `write_atomic` writes a temporary file with
  `O_EXCL` (which refuses an existing name, link or not) and renames it over the name, which replaces
  a link instead of writing through it; `open_for_append` and `truncate_file` refuse a link outright.
  A crash leaves either the old file or the new one, whole; `remove_stale_temporaries` deletes the
  temporaries of killed writes, only under the lock (a live writer's look the same).
- **A full disk is the user's machine, not a bug**: `DiskFullError` names the path, the bytes needed
  and the bytes free, and the previous version of the file is intact.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO

CONFIG_FILENAME = "config.json"
EVENTS_FILENAME = "events.jsonl"
SUMMARY_FILENAME = "summary.json"
MODEL_FILENAME = "model.pt"
BASELINE_DIRNAME = "baseline"
CHECKPOINT_NAME = "checkpoint.pt"
IMITATION_FILENAME = "imitation.json"
SCORES_FILENAME = "eval.json"
REPORT_FILENAME = "report.html"
TENSORBOARD_DIRNAME = "tb"
PROFILE_DIRNAME = "profile"
LOCK_NAME = ".lock"

RUN_FILE_NAMES = (CONFIG_FILENAME, EVENTS_FILENAME, SUMMARY_FILENAME, MODEL_FILENAME, BASELINE_DIRNAME,
                  CHECKPOINT_NAME, IMITATION_FILENAME, SCORES_FILENAME, REPORT_FILENAME, TENSORBOARD_DIRNAME,
                  PROFILE_DIRNAME)
"""Names whose presence means a directory already holds a run."""

SYSTEM_DIRECTORIES = tuple(Path(name) for name in ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64",
                                                   "/proc", "/sbin", "/sys", "/usr"))
"""Directories refused as a run directory together with everything under them."""
TOP_DIRECTORIES = tuple(Path(name) for name in ("/", "/home", "/media", "/mnt", "/opt", "/root", "/run", "/srv",
                                                "/tmp", "/var"))
"""Directories refused themselves (a run directory under them is fine)."""

_DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_NO_FOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC

_held: dict[Path, tuple[int, int]] = {}
"""Resolved run directory -> (file descriptor, re-entrancy count) of the locks this process holds."""


class RunDirectoryRefused(ValueError):
    """A run directory that a new run may not use (another run's files, or a system directory)."""


class RunDirectoryLockError(RuntimeError):
    """The lock of a run directory cannot be taken (the message says why, in one line)."""


class RunDirectoryBusy(RunDirectoryLockError):
    """Another live process holds the lock of the run directory."""


class DiskFullError(OSError):
    """No room to write a run-directory file; the previous version of the file is intact."""


def _disk_full(error: OSError, path: Path, needed: int) -> DiskFullError:
    try:
        room = f", {shutil.disk_usage(path.parent).free:,} free"
    except OSError:
        room = ""
    full = DiskFullError(f"no space left to write {path}: it needs {needed:,} bytes{room}; "
                         f"the previous {path.name}, if any, is intact")
    full.errno = error.errno
    return full


def _refuse_link(path: Path, error: OSError) -> OSError:
    """`error`, reworded when it is O_NOFOLLOW's refusal of a symbolic link."""
    if error.errno == errno.ELOOP:
        return OSError(errno.ELOOP, f"{path} is a symbolic link; morphogen does not write through links "
                                    "in a run directory (remove it)")
    return error


# ---------------------------------------------------------------------------------------------- writes


def temporary_name(path: Path) -> Path:
    """A fresh temporary path next to `path` that `remove_stale_temporaries` recognizes."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")


def write_atomic(path: str | Path, data: bytes) -> None:
    """Replace `path` with `data` atomically, never writing through a link (see the module docstring).

    `DiskFullError` if there is no room.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = temporary_name(path)
    try:
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NO_FOLLOW, 0o666)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException as error:
        temporary.unlink(missing_ok=True)
        if isinstance(error, OSError) and error.errno in _DISK_FULL:
            raise _disk_full(error, path, len(data)) from None
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def open_for_append(path: str | Path) -> IO[str]:
    """`path` opened for appending text, created if missing; OSError if it is a symbolic link."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NO_FOLLOW, 0o666)
    except OSError as error:
        raise _refuse_link(path, error) from None
    return os.fdopen(descriptor, "a", encoding="utf-8")


def truncate_file(path: str | Path, size: int) -> None:
    """Cut the file at `path` to `size` bytes; OSError if it is a symbolic link."""
    path = Path(path)
    try:
        descriptor = os.open(path, os.O_WRONLY | _NO_FOLLOW)
    except OSError as error:
        raise _refuse_link(path, error) from None
    try:
        os.ftruncate(descriptor, size)
    finally:
        os.close(descriptor)


def remove_stale_temporaries(directory: str | Path) -> list[Path]:
    """Delete temporary files that writes killed mid-way left in `directory`; return what was removed.

    Call it only while holding the directory's lock: a live writer's temporary file looks the same.
    """
    removed = []
    for candidate in Path(directory).glob(".*.tmp"):
        if candidate.is_file() and not candidate.is_symlink():
            with contextlib.suppress(FileNotFoundError):
                candidate.unlink()
                removed.append(candidate)
    return removed


# ------------------------------------------------------------------------------------------------ lock


def _holder(path: Path) -> str:
    try:
        descriptor = os.open(path, os.O_RDONLY | _NO_FOLLOW)
        with os.fdopen(descriptor, "rb") as handle:
            text = handle.read(32).decode("ascii", errors="replace").strip()
    except OSError:
        return "another process"
    return f"process {text}" if text.isdigit() else "another process"


def _acquire(directory: Path) -> int:
    """Lock `directory/.lock` for this process and write our PID into it; return its descriptor."""
    path = directory / LOCK_NAME
    while True:
        try:
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT | _NO_FOLLOW, 0o644)
        except OSError as error:
            reason = _refuse_link(path, error)
            raise RunDirectoryLockError(f"cannot lock run directory {directory}: {reason.strerror or reason}") from None
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(descriptor)
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise RunDirectoryBusy(f"run directory {directory} is in use by {_holder(path)} (lock {path}); wait for "
                                   "it to finish or choose another --run-dir") from None
        try:
            same_file = os.stat(path, follow_symlinks=False).st_ino == os.fstat(descriptor).st_ino
        except FileNotFoundError:
            same_file = False
        if same_file:
            break
        os.close(descriptor)  # the holder released and removed it between our open and our flock: retry
    try:
        os.ftruncate(descriptor, 0)
        os.write(descriptor, f"{os.getpid()}\n".encode("ascii"))
    except OSError as error:
        _release(directory, descriptor)
        if error.errno in _DISK_FULL:
            raise RunDirectoryLockError(f"cannot lock run directory {directory}: no space left on its disk") from None
        raise
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


# ------------------------------------------------------------------------------------- making a run dir


def refuse_system_directory(path: Path) -> None:
    """`RunDirectoryRefused` if `path` (resolved) is `/`, the home directory or a system directory."""
    resolved = path.resolve()
    refused = resolved in TOP_DIRECTORIES or resolved == Path.home().resolve() or any(
        resolved == system or system in resolved.parents for system in SYSTEM_DIRECTORIES)
    if refused:
        raise RunDirectoryRefused(f"run_dir: {path} is {'/' if resolved == Path('/') else 'a system or home'} "
                                  "directory; give a directory of its own, e.g. runs/my-run")


def refuse_other_run(path: Path) -> None:
    """`RunDirectoryRefused` naming the run files `path` already holds (a new run may not mix with them)."""
    present = [name for name in RUN_FILE_NAMES if os.path.lexists(path / name)]
    if present:
        hint = f"; `morphogen train --resume {path}` continues it" if CHECKPOINT_NAME in present else ""
        raise RunDirectoryRefused(f"run_dir: {path} already holds another run ({', '.join(present)}){hint}; "
                                  "choose another --run-dir")


def make_run_dir(run_dir: str | None, runs_root: str, task: str) -> Path:
    """`run_dir` (created if missing) if given, else a new `runs_root/<time>-<task>` directory.

    `RunDirectoryRefused` for a directory that holds another run or a system directory; call
    `refuse_other_run` again once its lock is held, when no other command can start a run there.
    """
    if run_dir is not None:
        path = Path(run_dir)
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = Path(runs_root) / f"{stamp}-{task}"
        suffix = 1
        while path.exists():
            suffix += 1
            path = Path(runs_root) / f"{stamp}-{task}-{suffix}"
    refuse_system_directory(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise RunDirectoryRefused(f"run_dir: cannot create {path}: {error.strerror or error}") from None
    refuse_other_run(path)
    return path
