"""A run directory: atomic writes that never follow a planted link (a full disk is one line naming the path and
the bytes, and leaves the previous file whole); stale temporaries removed; one run per directory, none in system
directories."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from morphogen.run_directory import (
    DiskFullError,
    RunDirectoryLockError,
    RunDirectoryRefused,
    append_line,
    hold_run_directory,
    make_run_dir,
    open_for_append,
    own_directory,
    remove_stale_temporaries,
    temporary_name,
    truncate_file,
    write_atomic,
)


def fail_fsync_with(code: int, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_space(descriptor: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", no_space)


@pytest.mark.parametrize(("code", "lead"), [
    (errno.ENOSPC, "no space left to write {path}"),
    (errno.EDQUOT, "cannot write {path} (disk quota exceeded)"),  # a quota: "no space left" beside 80 GB free misleads
    (errno.EFBIG, "cannot write {path} (file size limit exceeded)")], ids=["ENOSPC", "EDQUOT", "EFBIG"])
def test_full_disk_is_one_line_with_path_and_bytes_and_keeps_the_previous_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, lead: str) -> None:
    path = tmp_path / "checkpoint.pt"
    write_atomic(path, b"previous")
    fail_fsync_with(code, monkeypatch)
    with pytest.raises(DiskFullError) as caught:
        write_atomic(path, b"x" * 12_345)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{lead.format(path=path)}: it needs 12,345 bytes, ")
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


def test_write_atomic_replaces_a_planted_link_and_leaves_its_target_alone(tmp_path: Path) -> None:
    target = tmp_path / "authorized_keys"
    target.write_text("ssh-ed25519 AAAA key\n")
    (tmp_path / "run").mkdir()
    link = tmp_path / "run" / "report.html"
    link.symlink_to(target)
    write_atomic(link, b"<html>\nssh-rsa planted\n</html>\n")
    assert target.read_text() == "ssh-ed25519 AAAA key\n"
    assert not link.is_symlink() and link.read_bytes().startswith(b"<html>")


def test_appending_and_truncating_refuse_a_planted_link(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("precious\n")
    link = tmp_path / "events.jsonl"
    link.symlink_to(target)
    with pytest.raises(OSError, match="is a symbolic link"):
        open_for_append(link)
    with pytest.raises(OSError, match="is a symbolic link"):
        truncate_file(link, 0)
    assert target.read_text() == "precious\n"


def test_the_lock_file_is_never_a_planted_link(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("precious\n")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".lock").symlink_to(target)
    with pytest.raises(RunDirectoryLockError, match="symbolic link"), hold_run_directory(tmp_path / "run"):
        pass
    assert target.read_text() == "precious\n"


@pytest.mark.parametrize("name", ["events.jsonl", "config.json", "summary.json", "checkpoint.pt", "baseline"])
def test_a_new_run_refuses_a_directory_holding_another_runs_file(tmp_path: Path, name: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / name).mkdir() if name == "baseline" else (run / name).write_text("{}")
    with pytest.raises(RunDirectoryRefused, match=f"already holds another run \\({name}\\)"):
        make_run_dir(str(run), "runs", "digits")


def test_a_new_run_takes_an_empty_or_missing_directory_and_makes_a_fresh_one(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert make_run_dir(str(tmp_path / "empty"), "runs", "digits") == tmp_path / "empty"
    assert make_run_dir(str(tmp_path / "a" / "b"), "runs", "digits").is_dir()
    first = make_run_dir(None, str(tmp_path / "runs"), "digits")
    (first / "events.jsonl").write_text("")
    second = make_run_dir(None, str(tmp_path / "runs"), "digits")
    assert first != second and second.parent == first.parent


@pytest.mark.parametrize(("kind", "what"), [("file", "a file"), ("link to a file", "a link that leads to no directory"),
                                            ("dangling link", "a link that leads to no directory")])
def test_a_run_directory_that_is_a_file_or_a_link_to_none_says_so(tmp_path: Path, kind: str, what: str) -> None:
    target, run = tmp_path / "notes.txt", tmp_path / "run"
    if kind == "file":
        run.write_text("mine")
    else:
        if kind == "link to a file":
            target.write_text("mine")
        run.symlink_to(target)
    with pytest.raises(RunDirectoryRefused, match=f"^run_dir: {run} is {what}, not a directory; give a directory"):
        make_run_dir(str(run), "runs", "digits")
    assert not target.exists() or target.read_text() == "mine"


@pytest.mark.parametrize(("place", "what"), [
    ("/", "is the root directory"), ("/etc", "is a system directory"),
    ("/usr/lib/x", "is inside the system directory /usr"), ("/tmp", "is a top-level directory"),
    ("~", "is the home directory"),
])
def test_system_and_home_directories_are_refused(place: str, what: str) -> None:
    with pytest.raises(RunDirectoryRefused) as caught:
        make_run_dir(str(Path(place).expanduser()), "runs", "digits")
    assert str(caught.value) == (f"run_dir: {Path(place).expanduser()} {what}; give a directory of its own, "
                                 "e.g. runs/my-run")


def test_a_line_cut_short_by_a_full_disk_is_undone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "events.jsonl"
    descriptor = open_for_append(path)
    try:
        append_line(descriptor, b'{"first": 1}\n')
        real_write = os.write
        monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, data[: len(data) // 2]))
        with pytest.raises(OSError) as caught:
            append_line(descriptor, b'{"second": 2, "padding": "xxxxxxxxxxxxxxxx"}\n')
        assert caught.value.errno == errno.ENOSPC
        monkeypatch.undo()
        append_line(descriptor, b'{"third": 3}\n')
    finally:
        os.close(descriptor)
    assert path.read_bytes() == b'{"first": 1}\n{"third": 3}\n', "no torn fragment glued to the next line"


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_write_atomic_replaces_only_files_and_links(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "report.html"
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    with pytest.raises(OSError, match="morphogen replaces only files"):
        write_atomic(path, b"<html>")
    assert (path.is_dir() if kind == "directory" else path.is_fifo()) and list(tmp_path.iterdir()) == [path]


def test_appending_refuses_what_is_not_a_file(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "events.jsonl")
    with pytest.raises(OSError, match="not a regular file"):
        open_for_append(tmp_path / "events.jsonl")


def test_the_run_directorys_own_directories_are_never_planted_links(tmp_path: Path) -> None:
    """A copied run's `tb` or `profile` may point anywhere: TensorBoard and the profiler would write there."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    (run / "tb").symlink_to(elsewhere)
    (run / "profile").write_text("")
    with pytest.raises(RunDirectoryRefused, match="is a symbolic link"):
        own_directory(run / "tb")
    with pytest.raises(RunDirectoryRefused, match="is not a directory"):
        own_directory(run / "profile")
    assert own_directory(run / "tb2" / "env0").is_dir() and list(elsewhere.iterdir()) == []
