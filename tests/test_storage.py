"""Atomic run-directory writes: a full disk is one line naming the path and the bytes, and leaves the
previous file whole and no temporary file; stale temporaries of killed writes are removed."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from morphogen.storage import DiskFullError, remove_stale_temporaries, temporary_name, write_atomic


def fail_fsync_with(code: int, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_space(descriptor: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", no_space)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT], ids=["ENOSPC", "EDQUOT"])
def test_full_disk_is_one_line_with_path_and_bytes_and_keeps_the_previous_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    path = tmp_path / "checkpoint.pt"
    write_atomic(path, b"previous")
    fail_fsync_with(code, monkeypatch)
    with pytest.raises(DiskFullError) as caught:
        write_atomic(path, b"x" * 12_345)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"no space left to write {path}: it needs 12,345 bytes, ")
    assert "free" in message and caught.value.errno == code
    assert path.read_bytes() == b"previous"
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"], "no temporary file may be left"


def test_other_os_errors_propagate_unchanged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fail_fsync_with(errno.EIO, monkeypatch)
    with pytest.raises(OSError) as caught:
        write_atomic(tmp_path / "f", b"data")
    assert not isinstance(caught.value, DiskFullError) and caught.value.errno == errno.EIO
    assert list(tmp_path.iterdir()) == []


def test_stale_temporaries_are_removed_and_nothing_else(tmp_path: Path) -> None:
    kept = [tmp_path / "checkpoint.pt", tmp_path / "events.jsonl", tmp_path / ".lock"]
    for path in kept:
        path.write_bytes(b"keep")
    stale = [temporary_name(tmp_path / "checkpoint.pt"), temporary_name(tmp_path / "config.json")]
    for path in stale:
        path.write_bytes(b"half a checkpoint")
    assert sorted(remove_stale_temporaries(tmp_path)) == sorted(stale)
    assert sorted(tmp_path.iterdir()) == sorted(kept)
