"""Names of a copied run directory that are not regular files: a FIFO (opening it for reading waits for a
writer forever), a link to `/dev/zero` (an endless read), a directory. Every reader treats them as unreadable
within seconds, and `report --html` never replaces one."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from morphogen.cli import main, saved_policy_device
from morphogen.run_directory import BASELINE_DIRNAME, CONFIG_FILENAME, EVENTS_FILENAME, SUMMARY_FILENAME

#: Seconds a reader may take on one planted file before the test calls it a hang.
HANG_SECONDS = 60


@contextlib.contextmanager
def no_hang() -> Iterator[None]:
    """Fail (instead of waiting forever) when the block outlives `HANG_SECONDS`."""
    def hung(signum: int, frame: object) -> None:
        raise TimeoutError(f"still reading after {HANG_SECONDS} s: a planted file made the reader wait")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(HANG_SECONDS)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def plant_fifo(path: Path) -> None:
    os.mkfifo(path)


def plant_endless_device(path: Path) -> None:
    path.symlink_to("/dev/zero")


def plant_directory(path: Path) -> None:
    path.mkdir()


PLANTS: dict[str, Callable[[Path], None]] = {"fifo": plant_fifo, "dev-zero": plant_endless_device,
                                             "directory": plant_directory}


@pytest.mark.parametrize("plant", sorted(PLANTS))
@pytest.mark.parametrize("name", [CONFIG_FILENAME, SUMMARY_FILENAME, f"{BASELINE_DIRNAME}/{EVENTS_FILENAME}"])
def test_a_planted_special_file_reads_as_unreadable_and_the_run_is_still_shown(
        grown_run: Path, tmp_path: Path, name: str, plant: str, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "runs" / "run"
    shutil.copytree(grown_run, run)
    (run / name).unlink()
    PLANTS[plant](run / name)
    with no_hang():
        assert main(["report", str(run)]) == 0
        header = capsys.readouterr().out.splitlines()[0]
        assert header.endswith(f"({name} unreadable)"), header
        assert main(["report", str(run), "--html", "--output", str(tmp_path / "r.html")]) == 0
        capsys.readouterr()
        assert main(["runs", str(tmp_path / "runs")]) == 0
        assert capsys.readouterr().out.splitlines()[1].split()[:2] == ["run", "run"]


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_planted_events_are_one_line_and_exit_2(grown_run: Path, tmp_path: Path, plant: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    shutil.copytree(grown_run, run)
    (run / EVENTS_FILENAME).unlink()
    PLANTS[plant](run / EVENTS_FILENAME)
    with no_hang():
        assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0] == f"morphogen report: error: {run / EVENTS_FILENAME} is not a regular file"


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_resume_reads_the_saved_device_without_waiting(tmp_path: Path, plant: str) -> None:
    PLANTS[plant](tmp_path / CONFIG_FILENAME)
    with no_hang():
        assert saved_policy_device(str(tmp_path)) == "cpu"


@pytest.mark.parametrize("plant", ["fifo", "directory"])
def test_html_report_never_replaces_what_is_not_a_file(grown_run: Path, tmp_path: Path, plant: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "report.html"
    PLANTS[plant](target)
    mode = os.lstat(target).st_mode
    assert main(["report", str(grown_run), "--html", "--output", str(target)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"morphogen report: error: cannot write {target}: ")
    assert stat.S_IFMT(os.lstat(target).st_mode) == stat.S_IFMT(mode), "left as it was"
    assert [path.name for path in tmp_path.iterdir()] == ["report.html"], "no temporary file left"
