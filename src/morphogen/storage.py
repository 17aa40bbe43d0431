"""Writing run-directory files whole or not at all, and saying so in one line when the disk is full.

`write_atomic(path, data)` writes a temporary file next to `path` (`.NAME.<hex>.tmp`), fsyncs it,
renames it over `path` and fsyncs the directory: a crash at any moment leaves either the old file or
the new one, whole. On any failure the temporary file is removed; only a process killed inside the
write (SIGKILL, power loss) can leave one behind, and `remove_stale_temporaries(directory)` deletes
those when the next command takes the run directory (after its lock, so never a live writer's).

A full disk or an exhausted quota raises `DiskFullError` naming the path, the bytes the write needed
and the bytes free, instead of a chained OSError traceback: it is the user's machine, not a bug.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import uuid
from pathlib import Path

_DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class DiskFullError(OSError):
    """No room to write a run-directory file; the previous version of the file is intact."""


def temporary_name(path: Path) -> Path:
    """A fresh temporary path next to `path` that `remove_stale_temporaries` recognizes."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")


def _free_bytes(directory: Path) -> int | None:
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return None


def write_atomic(path: str | Path, data: bytes) -> None:
    """Replace `path` with `data` atomically (see the module docstring); `DiskFullError` if there is no room."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = temporary_name(path)
    try:
        with temporary.open("xb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException as error:
        temporary.unlink(missing_ok=True)
        if isinstance(error, OSError) and error.errno in _DISK_FULL:
            free = _free_bytes(path.parent)
            room = "" if free is None else f", {free:,} free"
            full = DiskFullError(f"no space left to write {path}: it needs {len(data):,} bytes{room}; "
                                 f"the previous {path.name}, if any, is intact")
            full.errno = error.errno
            raise full from None
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def remove_stale_temporaries(directory: str | Path) -> list[Path]:
    """Delete temporary files that writes killed mid-way left in `directory`; return what was removed.

    Call it only while holding the directory's lock (`morphogen.run_lock`): a live writer's temporary
    file looks the same.
    """
    removed = []
    for candidate in Path(directory).glob(".*.tmp"):
        if candidate.is_file():
            with contextlib.suppress(FileNotFoundError):
                candidate.unlink()
                removed.append(candidate)
    return removed
