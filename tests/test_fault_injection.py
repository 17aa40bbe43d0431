"""Killing `morphogen train` (SIGKILL) anywhere and resuming gives the uninterrupted run, bit for bit.

Each interrupted run is a child process that kills itself at one point: mid-round (between env steps),
inside a checkpoint write with half of the temporary file written, and inside a checkpoint write with
the temporary file whole but not yet renamed. A torn last line of `events.jsonl` (what a full disk
leaves) is added on top. After the final resume, the checkpoint file equals the uninterrupted run's
byte for byte (policy, optimizer, normalizers, RNG, detector, telemetry escalation: everything), the
report counts the same events and seeds, and no temporary or lock file is left.
"""

from __future__ import annotations

import collections
import contextlib
import io
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from morphogen.cli import main
from morphogen.control.checkpoint import load_checkpoint
from morphogen.run_directory import CHECKPOINT_NAME, EVENTS_FILENAME, LOCK_NAME
from morphogen.telemetry.sinks import read_events
from morphogen.telemetry.story import seed_stories

TINY = ["--envs", "1", "--episode-length", "2", "--max-train-samples", "100", "--hidden-size", "16"]
ROUNDS = 3  # two env steps per round: steps 1-2 are round 1, 3-4 round 2, 5-6 round 3

# Runs the CLI with the arguments after `--`, killing itself (SIGKILL: no cleanup of any kind) at the
# point named by argv[1] the argv[2]-th time it is reached.
CHILD = textwrap.dedent("""
    import os, signal, sys
    import morphogen.control.integrity as integrity
    import morphogen.env.vector as vector
    import morphogen.run_directory as storage
    from morphogen.cli import main

    point, count = sys.argv[1], int(sys.argv[2])
    reached = [0]

    def die_on_count():
        reached[0] += 1
        if reached[0] == count:
            os.kill(os.getpid(), signal.SIGKILL)

    if point == "mid-round":
        real_step = vector.VectorEpisodes.step
        def step(self, actions):
            die_on_count()
            return real_step(self, actions)
        vector.VectorEpisodes.step = step
    elif point == "half-written":
        real_write = integrity.write_atomic  # what checkpoints (and every checksummed file) are written with
        def write(path, data):
            reached[0] += str(path).endswith("checkpoint.pt")
            if reached[0] == count:
                with storage.temporary_name(path).open("xb") as handle:
                    handle.write(data[: len(data) // 2])
                    handle.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            real_write(path, data)
        integrity.write_atomic = write
    elif point == "before-rename":
        real_replace = storage.os.replace
        def replace(source, destination):
            if str(destination).endswith("checkpoint.pt"):
                die_on_count()
            real_replace(source, destination)
        storage.os.replace = replace
    sys.exit(main(sys.argv[sys.argv.index("--") + 1:]))
""")


def run_child(argv: list[str], point: str = "none", count: int = 0) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", CHILD, point, str(count), "--", *argv], capture_output=True,
                          text=True, timeout=300, env=environment)


def kill_at(run: Path, argv: list[str], point: str, count: int) -> None:
    result = run_child(argv, point, count)
    assert result.returncode == -signal.SIGKILL, (point, result.returncode, result.stderr[-2000:])


def report_counts(run: Path) -> tuple[collections.Counter[str], list[tuple[object, ...]]]:
    """How many events of each kind, and every seed's story: what `report` counts."""
    history = read_events(run / EVENTS_FILENAME)
    stories = [(s.env_id, s.slot, s.blueprint, s.germinated, tuple(s.stages), s.outcome, s.contribution)
               for s in seed_stories(history)]
    return collections.Counter(event.kind for event in history), stories


@pytest.mark.slow
def test_killed_anywhere_then_resumed_equals_the_uninterrupted_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    reference = run_child(["train", *TINY, "--rounds", str(ROUNDS), "--run-dir", str(run)])
    assert reference.returncode == 0, reference.stderr[-2000:]
    shutil.move(run, tmp_path / "reference")  # the chain below runs in the same path: config.run_dir agrees
    expected = tmp_path / "reference"

    kill_at(run, ["train", *TINY, "--rounds", str(ROUNDS), "--run-dir", str(run)], "mid-round", 4)
    assert load_checkpoint(run)["round"] == 1
    kill_at(run, ["train", "--resume", str(run)], "half-written", 1)  # round 2's checkpoint, half written
    assert load_checkpoint(run)["round"] == 1 and list(run.glob(".*.tmp"))
    kill_at(run, ["train", "--resume", str(run)], "before-rename", 2)  # round 3's, whole but not renamed
    assert load_checkpoint(run)["round"] == 2 and len(list(run.glob(".*.tmp"))) == 1
    with (run / EVENTS_FILENAME).open("a") as events:
        events.write('{"time": 1.0, "event": "epoch_com')  # a torn last line, as a full disk leaves one

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main(["train", "--resume", str(run)]) == 0, err.getvalue()
    assert "rounds 3..3" in out.getvalue() and "resume: dropped" in out.getvalue()

    assert (run / CHECKPOINT_NAME).read_bytes() == (expected / CHECKPOINT_NAME).read_bytes()
    assert report_counts(run) == report_counts(expected)
    assert sorted(p.name for p in run.iterdir()) == sorted(p.name for p in expected.iterdir()) == \
        ["checkpoint.pt", "config.json", "events.jsonl"], "no temporary or lock file may be left"
    assert not (run / LOCK_NAME).exists()
    with contextlib.redirect_stdout(io.StringIO()) as report:
        assert main(["report", str(run)]) == 0
    assert "seeds" in report.getvalue()
