"""A run directory: the names of its files, its lock, the writes into it, and making or refusing one.

Files (every command writes only these names; readers look only for them):

- `config.json`: the resolved config; `events.jsonl`: one JSON object per event; `summary.json`: the
  closing numbers of a `run`; `model.pt`: the model a `run` grew (`morphogen.model_file`), which
  `morphogen export` writes as `model.pt2` or `model.onnx`; `baseline/events.jsonl` and
  `from_scratch/events.jsonl`: a `run`'s no-growth episode and its final architecture trained from
  scratch; `checkpoint.pt` and `imitation.json`: a `train` run; `eval.json`: an `eval --run-dir` table;
  `report.html`: the default place of `report --html`; `tb/` and `profile/`: TensorBoard scalars and
  profiler traces; `resume.pt` and `eval_resume.pt`: where a stopped `run` or `eval` goes on from;
  `fixed/<index>/`: the hosts of `grow(compare_with=...)`; `seeds.json` and `seeds_plan.json`: a run over
  several seeds.

Rules:

- **One run per directory.** `make_run_dir` refuses a directory that already holds any of the files
  above (naming them): a second `run`, `train` or `eval` there would append to the first one's events
  and overwrite its config and summary. Only `train --resume`, `run --resume` and `eval --resume` reopen a
  run. It also refuses `/`, the home directory and system directories (`/etc`, `/usr`, ...), where a
  mistyped `--run-dir` would scatter files.
- **One writer per directory.** `hold_run_directory(D)` is an advisory `fcntl.flock` on `D/.lock`,
  held for a whole command and re-entrant within a process; a second holder is refused with a
  `RunDirectoryBusy` line naming the holder's PID and what to do: wait, or choose another directory (a resume
  cannot: it waits, or stops the holder). The kernel drops the lock however the holder exits
  (SIGKILL included), so a lock file left by a dead process is stale and the next command takes it
  over. The lock binds only morphogen, and needs a file system with `flock` (local disks have it).
- **Whole files, never through links.** A run directory may be copied from elsewhere, so its names
  may be symbolic links planted to redirect a write. `write_atomic` writes a temporary file with
  `O_EXCL` (which refuses an existing name, link or not) and renames it over the name, which replaces
  a link instead of writing through it; `open_for_append`, `truncate_file` and `own_directory` (the
  `tb/`, `profile/`, `baseline/`, `from_scratch/`, `fixed/` and `seed_<s>/` directories) refuse a link outright.
  A crash leaves either the old file or the new one, whole; `remove_stale_temporaries` deletes the
  temporaries of killed writes, only under the lock (a live writer's look the same). Only a regular
  file (or a link) is replaced: a device, a FIFO or a directory at the name is refused, so that
  `report --output /dev/null` can never turn a device node into a file.
- **Whole lines.** `append_line` writes one line with one `write` call; a write cut short (a full disk)
  is undone with `ftruncate`, so the events file never ends in a torn fragment that the next line
  would be glued to.
- **Bounded reads of regular files.** `read_regular_file` opens without blocking and reads only a
  regular file, at most a given number of bytes: a FIFO planted at `config.json` cannot hang a reader,
  a link to `/dev/zero` cannot fill its memory.
- **A full disk is the user's machine, not a bug**: `DiskFullError` names the path, the bytes needed
  and the bytes free, and the previous version of the file is intact.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import fcntl
import json
import os
import shutil
import stat
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, NamedTuple

CONFIG_FILENAME = "config.json"
EVENTS_FILENAME = "events.jsonl"
SUMMARY_FILENAME = "summary.json"
MODEL_FILENAME = "model.pt"
BASELINE_DIRNAME = "baseline"
FROM_SCRATCH_DIRNAME = "from_scratch"
#: A run over several seeds (`grow_over_seeds`, `run --seeds`): its figures, beside the seeds' `seed_<s>/` runs...
SEEDS_FILENAME = "seeds.json"
#: ...and, from its start, what it plays (the seeds, and what `run --resume` needs to play them again).
SEEDS_PLAN_FILENAME = "seeds_plan.json"
#: Fixed hosts trained without growth for comparison (`grow(compare_with=...)`), one subdirectory each, by index.
FIXED_DIRNAME = "fixed"
CHECKPOINT_NAME = "checkpoint.pt"
RESUME_FILENAME = "resume.pt"
EVAL_RESUME_FILENAME = "eval_resume.pt"
IMITATION_FILENAME = "imitation.json"
#: An evaluation's table (`morphogen eval --run-dir`): a list of the controllers' figures, in the order they played.
SCORES_FILENAME = "eval.json"
REPORT_FILENAME = "report.html"
TENSORBOARD_DIRNAME = "tb"
PROFILE_DIRNAME = "profile"
LOCK_NAME = ".lock"

MAX_JSON_BYTES = 4_194_304
"""Largest JSON file of a run directory read (`config.json`, `summary.json`: 4 MiB; morphogen writes a few kB)."""
MAX_LINE_BYTES = 1_048_576
"""Longest events line read (1 MiB; the longest event telemetry writes is a few kB): longer ones are skipped."""

RUN_FILE_NAMES = (CONFIG_FILENAME, EVENTS_FILENAME, SUMMARY_FILENAME, MODEL_FILENAME, BASELINE_DIRNAME,
                  FROM_SCRATCH_DIRNAME, FIXED_DIRNAME, CHECKPOINT_NAME, IMITATION_FILENAME, SCORES_FILENAME,
                  REPORT_FILENAME, TENSORBOARD_DIRNAME, PROFILE_DIRNAME, RESUME_FILENAME, EVAL_RESUME_FILENAME,
                  SEEDS_FILENAME, SEEDS_PLAN_FILENAME)
"""Names whose presence means a directory already holds a run."""

SYSTEM_DIRECTORIES = tuple(Path(name) for name in ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64",
                                                   "/proc", "/sbin", "/sys", "/usr"))
"""Directories refused as a run directory together with everything under them."""
TOP_DIRECTORIES = tuple(Path(name) for name in ("/", "/home", "/media", "/mnt", "/opt", "/root", "/run", "/srv",
                                                "/tmp", "/var"))
"""Directories refused themselves (a run directory under them is fine)."""

#: A full disk, a used-up quota, a file-size limit (`ulimit -f`): the machine's limits, not bugs.
STORAGE_EXHAUSTED = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_NO_FOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC

_held: dict[Path, tuple[int, int]] = {}
"""Resolved run directory -> (file descriptor, re-entrancy count) of the locks this process holds."""
_outermost: tuple[int, Path | None] = (0, None)
"""How many times this process took a lock while it held none, and the directory it took last so (a run over
seeds': its top directory, not a seed's): what an interrupted command's `--resume` goes on with."""


class RunDirectoryRefused(ValueError):
    """A run directory that a new run may not use (another run's files, or a system directory)."""


class RunDirectoryLockError(RuntimeError):
    """The lock of a run directory cannot be taken (the message says why, in one line)."""


class RunDirectoryBusy(RunDirectoryLockError):
    """Another live process holds the lock of the run directory."""


class DiskFullError(OSError):
    """No room to write a run-directory file; the previous version of the file is intact."""


class PlantedLinkError(OSError):
    """A run-directory file that a command appends to or cuts is a symbolic link (planted in a copied run, say): the
    user's to remove, one line, not a bug."""

    def __str__(self) -> str:
        return str(self.strerror)  # the message names the path; "[Errno 40]" would tell the user nothing


_NO_ROOM_REASONS = {errno.EDQUOT: "disk quota exceeded", errno.EFBIG: "file size limit exceeded"}
"""Why a write found no room when it is not the disk itself that is full (EFBIG: `ulimit -f`, or the file system's
largest file): said so, since "no space left" beside gigabytes free would mislead."""


def _no_room(error: OSError) -> str:
    """Why there is no room, in words: a full disk, a user's quota used up, or a limit on a file's size."""
    return _NO_ROOM_REASONS.get(error.errno or 0, "no space left on its disk")


def _disk_full(error: OSError, path: Path, needed: int) -> DiskFullError:
    reason = _NO_ROOM_REASONS.get(error.errno or 0)
    try:
        room = f", {shutil.disk_usage(path.parent).free:,} free" + (" on the disk" if reason else "")
    except OSError:
        room = ""
    lead = f"cannot write {path} ({reason})" if reason else f"no space left to write {path}"
    full = DiskFullError(f"{lead}: it needs {needed:,} bytes{room}; "
                         f"the previous {path.name}, if any, is intact")
    full.errno = error.errno
    return full


def _refuse_link(path: Path, error: OSError) -> OSError:
    """`error`, reworded when it is O_NOFOLLOW's refusal of a symbolic link."""
    if error.errno == errno.ELOOP:
        return PlantedLinkError(errno.ELOOP, f"{path} is a symbolic link; morphogen does not write through links "
                                              "in a run directory (remove it)")
    return error


# ---------------------------------------------------------------------------------------------- writes


def temporary_name(path: Path) -> Path:
    """A fresh temporary path next to `path` that `remove_stale_temporaries` recognizes."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")


def _refuse_special(path: Path) -> None:
    """OSError if `path` exists and is neither a regular file nor a symbolic link (which would be replaced)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
        raise OSError(errno.EEXIST, f"it is {kind}; morphogen replaces only files", str(path))


def write_atomic(path: str | Path, data: bytes) -> None:
    """Replace `path` with `data` atomically, never writing through a link (see the module docstring).

    `DiskFullError` if there is no room; OSError if `path` is a directory, a device or a FIFO.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _refuse_special(path)
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
        if isinstance(error, OSError) and error.errno in STORAGE_EXHAUSTED:
            raise _disk_full(error, path, len(data)) from None
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def open_for_append(path: str | Path) -> int:
    """A descriptor of `path` opened for appending, created if missing; OSError if it is a symbolic link
    or not a regular file. Write to it with `append_line`; close it with `os.close`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | _NO_FOLLOW, 0o666)
    except OSError as error:
        if error.errno != errno.ENXIO:  # ENXIO: a FIFO that nobody reads
            raise _refuse_link(path, error) from None
        descriptor = None
    if descriptor is None or not stat.S_ISREG(os.fstat(descriptor).st_mode):
        if descriptor is not None:
            os.close(descriptor)
        raise OSError(errno.EINVAL, "not a regular file; morphogen appends only to files", str(path))
    return descriptor


def append_line(descriptor: int, line: bytes) -> None:
    """Append `line` with one write; a write cut short (a full disk) is undone, so no torn line is left.

    OSError (errno ENOSPC for a short write) if it could not be written whole.
    """
    end = os.lseek(descriptor, 0, os.SEEK_END)
    try:
        written = os.write(descriptor, line)
    except OSError:
        os.ftruncate(descriptor, end)  # a failed write may still have written a part
        raise
    if written != len(line):
        os.ftruncate(descriptor, end)
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (wrote {written:,} of {len(line):,} bytes)")


def own_directory(path: str | Path) -> Path:
    """`path`, a directory inside a run directory (`tb/`, `profile/`, a comparison's `baseline/`, a seed's
    `seed_<s>/`), made if missing.

    `RunDirectoryRefused` if it is a symbolic link (a copied run's `tb` or `baseline` could point anywhere, and the
    files written into it would land there) or not a directory.
    """
    path = Path(path)
    refuse_planted_link(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise RunDirectoryRefused(f"{path} is not a directory (remove it)") from None
    return path


def refuse_planted_link(path: Path) -> None:
    """`RunDirectoryRefused` if `path`, a name a command writes under in a run directory, is a symbolic link."""
    if path.is_symlink():
        raise RunDirectoryRefused(f"{path} is a symbolic link; morphogen does not write through links in a "
                                  "run directory (remove it)")


def truncate_file(path: str | Path, size: int) -> None:
    """Cut the file at `path` to `size` bytes; OSError if it is a symbolic link."""
    path = Path(path)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_NONBLOCK | _NO_FOLLOW)  # a FIFO: ENXIO, never a wait
    except OSError as error:
        raise _refuse_link(path, error) from None
    try:
        os.ftruncate(descriptor, size)
    finally:
        os.close(descriptor)


def open_regular_file(path: str | Path) -> IO[bytes]:
    """The regular file at `path` (a link to one is followed) opened for reading in binary.

    OSError if it is missing, unreadable or not a regular file (a FIFO, a device, a directory): it is
    checked before opening (opening a device can do things) and again after, and opening never blocks.
    """
    path = Path(path)
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):  # replaced in between
        os.close(descriptor)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    return os.fdopen(descriptor, "rb")


def evaluation_env_id(position: int, index: int, episodes: int) -> int:
    """The env id of episode `index` of the controller at `position` (its row in `SCORES_FILENAME`) in an evaluation
    of `episodes` episodes per controller: the events of `eval` carry it, and `report` reads it back as names."""
    return position * episodes + index


def read_regular_file(path: str | Path, limit: int) -> bytes:
    """The bytes of the regular file at `path`, if at most `limit` of them (at most `limit + 1` are read).

    OSError as `open_regular_file` says, or with errno EFBIG when the file is larger than `limit`.
    """
    with open_regular_file(path) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit:,} bytes", str(path))
    return data


class Line(NamedTuple):
    """One line of a file as `read_line` returns it."""

    text: bytes | None
    """The line with its newline; None for a line longer than the limit, skipped unread."""
    size: int
    """Bytes it takes in the file (0 at the end of the file)."""
    complete: bool
    """Whether it ends in a newline (the file's last line may be torn, or still being written)."""


def read_line(handle: IO[bytes], limit: int) -> Line:
    """The next line of `handle`, holding at most `limit + 1` bytes of it in memory whatever its length."""
    text = handle.readline(limit + 1)
    if text.endswith(b"\n") or len(text) <= limit:
        return Line(bytes(text), len(text), text.endswith(b"\n"))
    size = len(text)
    while not text.endswith(b"\n"):
        text = handle.readline(limit)
        if not text:
            return Line(None, size, False)
        size += len(text)
    return Line(None, size, True)


def is_seeds_directory(path: str | Path) -> bool:
    """Whether `path` holds a run over several seeds (the seeds' own runs in `seed_<s>/`), finished or not."""
    return any((Path(path) / name).is_file() for name in (SEEDS_FILENAME, SEEDS_PLAN_FILENAME))


def read_json_object(path: str | Path, limit: int = MAX_JSON_BYTES) -> dict[str, Any] | None:
    """The JSON object in the regular file `path`; None if it is missing, larger than `limit` bytes,
    not a regular file, unparsable, nested too deep or not an object (a run's files are untrusted)."""
    try:
        value = json.loads(read_regular_file(path, limit))
    except (OSError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


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


def _holder_pid(path: Path) -> int | None:
    """The PID the lock file at `path` names, if it names one."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _NO_FOLLOW)
        with os.fdopen(descriptor, "rb") as handle:
            text = handle.read(32).decode("ascii", errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _is_paused(pid: int) -> bool:
    """Whether process `pid` is stopped (Ctrl-Z, SIGSTOP), as Linux's /proc says; False where it cannot tell."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text(errors="replace").rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in ("T", "t")


class LockPurpose(enum.Enum):
    """Why a command locks a run directory: the refusal of a busy one says what to do instead of waiting, which
    depends on it (a resume has no other directory to go to)."""

    #: A new run (`run`, `train`, `eval --run-dir`, `grow`): another directory would do.
    NEW_RUN = "new run"
    #: `--resume` (or `resume=True`): the run is in that directory, so the holder has to end first.
    RESUME = "resume"
    #: `morphogen export` writing into the run directory: an `--output` outside it would do.
    EXPORT = "export"


#: What a refused command may do instead of waiting for the holder, by what it locked for (a resume may not).
_INSTEAD = {LockPurpose.NEW_RUN: "choose another --run-dir",
            LockPurpose.EXPORT: "give --output a path outside the run directory"}


def _busy(directory: Path, path: Path, purpose: LockPurpose) -> RunDirectoryBusy:
    """The refusal of a directory whose lock another process holds: who, and what to do, for a paused holder too
    (it would never finish of itself)."""
    pid = _holder_pid(path)
    instead = _INSTEAD.get(purpose)
    if pid is not None and _is_paused(pid):
        what = f", or {instead}" if instead else "; resume once it has ended"
        return RunDirectoryBusy(f"run directory {directory} is in use by process {pid}, which is paused (Ctrl-Z or "
                                f"SIGSTOP; lock {path}): `kill -CONT {pid}` lets it go on, `kill {pid}` ends it{what}")
    holder = "another process" if pid is None else f"process {pid}"
    if instead is None:
        stop = "stop it" if pid is None else f"stop it (`kill {pid}`)"
        what = f"wait for it to finish, or {stop}, then resume"
    else:
        what = f"wait for it to finish or {instead}"
    return RunDirectoryBusy(f"run directory {directory} is in use by {holder} (lock {path}); {what}")


def _acquire(directory: Path, purpose: LockPurpose) -> int:
    """Lock `directory/.lock` for this process and write our PID into it; return its descriptor."""
    path = directory / LOCK_NAME
    while True:
        try:
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | _NO_FOLLOW, 0o644)
        except OSError as error:
            reason = _refuse_link(path, error)
            raise RunDirectoryLockError(f"cannot lock run directory {directory}: {reason.strerror or reason}") from None
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            os.close(descriptor)
            raise RunDirectoryLockError(f"cannot lock run directory {directory}: {path} is not a regular file "
                                        "(remove it)")
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(descriptor)
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise _busy(directory, path, purpose) from None
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
        if error.errno in STORAGE_EXHAUSTED:
            raise RunDirectoryLockError(f"cannot lock run directory {directory}: {_no_room(error)}") from None
        raise
    return descriptor


def _release(directory: Path, descriptor: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(directory / LOCK_NAME)  # while still locked: nobody else can hold this file now
    os.close(descriptor)


@contextlib.contextmanager
def hold_run_directory(directory: str | Path, purpose: LockPurpose = LockPurpose.NEW_RUN) -> Iterator[Path]:
    """Hold the lock of an existing run directory for the block; raise `RunDirectoryBusy` if another holds it, saying
    what to do by the `purpose` of the lock."""
    key = Path(directory).resolve()
    if key in _held:
        descriptor, count = _held[key]
        _held[key] = (descriptor, count + 1)
    else:
        outermost = not _held
        _held[key] = (_acquire(key, purpose), 1)
        if outermost:
            global _outermost
            _outermost = (_outermost[0] + 1, key)
    try:
        yield Path(directory)
    finally:
        descriptor, count = _held[key]
        if count > 1:
            _held[key] = (descriptor, count - 1)
        else:
            del _held[key]
            _release(key, descriptor)


def outermost_lock() -> tuple[int, Path | None]:
    """(a count that grows with every lock taken while holding none, the directory of the last such lock): a command
    compares it before and after to learn which run directory it worked in, if any."""
    return _outermost


# ------------------------------------------------------------------------------------- making a run dir


def refuse_system_directory(path: Path) -> None:
    """`RunDirectoryRefused` if `path` (resolved) is `/`, the home directory or a system directory."""
    resolved = path.resolve()
    system = next((system for system in SYSTEM_DIRECTORIES if resolved == system or system in resolved.parents), None)
    if resolved == Path("/"):
        what = "the root directory"
    elif resolved == Path.home().resolve():
        what = "the home directory"
    elif system is not None:
        what = "a system directory" if resolved == system else f"inside the system directory {system}"
    elif resolved in TOP_DIRECTORIES:
        what = "a top-level directory"
    else:
        return
    raise RunDirectoryRefused(f"run_dir: {path} is {what}; give a directory of its own, e.g. runs/my-run")


def run_of_file(path: str | Path) -> Path | None:
    """The directory of the run whose own file `path` names (a name in `RUN_FILE_NAMES`, in a directory that holds
    run files: a run's top, or its comparisons' folders), else None. A writer of reports and exports must not
    replace such a file. The link at `path` itself is not followed: writers replace links, never write through."""
    path = Path(os.path.abspath(path))
    if path.name in RUN_FILE_NAMES and any(os.path.lexists(path.parent / name) for name in RUN_FILE_NAMES):
        return path.parent
    return None


def refuse_other_run(path: Path) -> None:
    """`RunDirectoryRefused` naming the run files `path` already holds (a new run may not mix with them)."""
    present = [name for name in RUN_FILE_NAMES if os.path.lexists(path / name)]
    if present:
        stopped_seeds = SEEDS_PLAN_FILENAME in present and SEEDS_FILENAME not in present
        command = "train" if CHECKPOINT_NAME in present else "run" if RESUME_FILENAME in present or stopped_seeds \
            else "eval" if EVAL_RESUME_FILENAME in present else ""
        hint = f"; `morphogen {command} --resume {path}` continues it" if command else ""
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
        if os.path.lexists(path) and not path.is_dir():  # a file, or a link to one or to nothing
            what = "a link that leads to no directory" if path.is_symlink() else "a file"
            raise RunDirectoryRefused(f"run_dir: {path} is {what}, not a directory; give a directory of its own, "
                                      "e.g. runs/my-run") from None
        raise RunDirectoryRefused(f"run_dir: cannot create {path}: {error.strerror or error}") from None
    refuse_other_run(path)
    return path
