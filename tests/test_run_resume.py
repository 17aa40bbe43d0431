"""`morphogen run --resume` (and `grow(..., resume=True)`): a run killed in any of its three trainings goes on
to the summary, model and events an uninterrupted run writes."""

from __future__ import annotations

import io
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import morphogen
import morphogen.commands.run as run_module
from morphogen.cli import EXIT_TERMINATED, main
from morphogen.commands.run import RunConfig, run_command
from morphogen.config import build_config
from morphogen.control.checkpoint import CheckpointError
from morphogen.control.integrity import state_checksum
from morphogen.model_file import read_model_file
from morphogen.run_directory import (
    BASELINE_DIRNAME,
    EVENTS_FILENAME,
    FROM_SCRATCH_DIRNAME,
    LOCK_NAME,
    RESUME_FILENAME,
    temporary_name,
)

EPOCHS = 6
#: A 6-epoch digits run on 300 samples that grows at once, so that all three trainings run (about 2 s).
SETTINGS: dict[str, Any] = {
    "task": "digits", "max_train_samples": 300,
    "episode": {"max_epochs": EPOCHS, "slots": {"blend_epochs": 1,
                                                "gates": {"mode": "permissive", "min_training_epochs": 1}}},
    "heuristic": {"warmup_epochs": 0, "plateau_epochs": 1, "plateau_threshold": 1e9, "min_training_epochs": 1},
}
TRAININGS = ("", BASELINE_DIRNAME, FROM_SCRATCH_DIRNAME)
#: Fields that hold wall-clock time, different in any two runs.
CLOCK_FIELDS = ("time", "seconds", "phases")


class Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs, no `except Exception` catches it."""


def config(run_dir: Path) -> RunConfig:
    return build_config(RunConfig, {**SETTINGS, "run_dir": str(run_dir)})


def without_clock(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: without_clock(item) for key, item in value.items() if key not in CLOCK_FIELDS}
    if isinstance(value, list):
        return [without_clock(item) for item in value]
    return value


def written(run_dir: Path) -> dict[str, Any]:
    """What a run leaves for its readers, less wall-clock times: summary, events of each training, model."""
    files: dict[str, Any] = {"summary": without_clock(json.loads((run_dir / "summary.json").read_text()))}
    for training in TRAININGS:
        lines = (run_dir / training / EVENTS_FILENAME).read_text().splitlines()
        files[f"{training}/events"] = [without_clock(json.loads(line)) for line in lines]
    for model in ("model.pt", f"{FROM_SCRATCH_DIRNAME}/model.pt"):
        state = read_model_file(run_dir / model)["model"]
        files[model] = {key: value.tolist() for key, value in state.items() if isinstance(value, torch.Tensor)}
    return files


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    run_dir = tmp_path_factory.mktemp("resume") / "whole"
    result = run_command(config(run_dir), out=io.StringIO())
    assert result.from_scratch is not None, "the settings must grow a seed, so that all three trainings run"
    assert not any((run_dir / training / RESUME_FILENAME).exists() for training in TRAININGS)  # a whole run: none
    return written(run_dir)


def kill_after(monkeypatch: pytest.MonkeyPatch, saves: int) -> None:
    """Kill the run once it has saved `saves` epochs, in the middle of the next one: part of that epoch's events
    written, the last line torn."""
    original = run_module.save_training_state
    count = 0

    def save_then_die(directory: Path, *args: Any, **kwargs: Any) -> None:
        nonlocal count
        original(directory, *args, **kwargs)
        count += 1
        if count == saves:
            with (directory / EVENTS_FILENAME).open("a") as events:
                events.write('{"time": 1, "event": "action_taken", "schema_version": 2, "epoch": 99}\n{"time": 1, "ev')
            raise Killed

    monkeypatch.setattr(run_module, "save_training_state", save_then_die)


@pytest.mark.parametrize("saves", [2, EPOCHS, EPOCHS + 3, 2 * EPOCHS + 4],
                         ids=["grown, seed training", "grown, at its end", "no growth", "from scratch"])
def test_a_run_killed_anywhere_resumes_to_what_an_uninterrupted_run_writes(
        saves: int, uninterrupted: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    kill_after(monkeypatch, saves)
    with pytest.raises(Killed):
        run_command(config(run_dir), out=io.StringIO())
    monkeypatch.undo()
    assert not (run_dir / "summary.json").exists()
    stale = temporary_name(run_dir / RESUME_FILENAME)  # a save that the kill cut short
    stale.write_bytes(b"half a file")
    assert main(["run", "--config", str(tmp_path / "none.toml"), "--resume", str(run_dir)]) == 2  # flags refused
    assert "only --device, --policy and --threads" in capsys.readouterr().err
    assert main(["run", "--resume", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert f"resume: grown from epoch {min(saves, EPOCHS)} of {EPOCHS}" in out
    assert written(run_dir) == uninterrupted
    assert not any((run_dir / training / RESUME_FILENAME).exists() for training in TRAININGS)
    assert not stale.exists()
    assert main(["run", "--resume", str(run_dir)]) == 2
    assert "is finished (summary.json is written); nothing to resume" in capsys.readouterr().err


def python_task() -> tuple[morphogen.Task, Any, RunConfig]:
    """A task built in Python (which halves of 8 numbers sum higher), a function building its MLP host, and the
    run settings of this file."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=generator)
    y = (x[:, :4].sum(1) > 0).long()
    task = morphogen.task_from_data("halves", (x[:192], y[:192]), (x[192:], y[192:]))

    def host() -> morphogen.SegmentedHost:
        net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.ReLU(),
                                  torch.nn.Linear(16, 2))
        return morphogen.host_from_module(net, slots=["1", "3"], example_input=x[:2])

    settings = build_config(RunConfig, {key: value for key, value in SETTINGS.items() if key != "task"
                                        and key != "max_train_samples"})
    return task, host, settings


def test_grow_resumes_a_users_task_built_in_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    task, host, settings = python_task()
    whole = morphogen.grow(task, host, run_dir=str(tmp_path / "whole"), config=settings, out=io.StringIO())
    kill_after(monkeypatch, EPOCHS + 2)
    with pytest.raises(Killed):
        morphogen.grow(task, host, run_dir=str(tmp_path / "cut"), config=settings, out=io.StringIO())
    monkeypatch.undo()
    assert main(["run", "--resume", str(tmp_path / "cut")]) == 2  # the CLI cannot rebuild a task made in Python
    assert "resume it from Python with morphogen.grow(task, host, run_dir=..., resume=True)" in capsys.readouterr().err
    resumed = morphogen.grow(task, host, run_dir=str(tmp_path / "cut"), config=settings, out=io.StringIO(),
                             resume=True)
    assert (resumed.grown.final_loss, resumed.baseline.final_loss) == (whole.grown.final_loss,
                                                                       whole.baseline.final_loss)
    assert [story.ending() for story in resumed.grown.stories] == [story.ending() for story in whole.grown.stories]
    state = resumed.model.state_dict()
    for key, value in whole.model.state_dict().items():
        assert torch.equal(state[key], value) if isinstance(value, torch.Tensor) else state[key] == value, key


def test_grow_acts_with_the_shipped_policy_and_resumes_only_with_it(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`grow(..., policy="default")` is `run --policy default` for a task built in Python."""
    task, host, settings = python_task()
    whole = morphogen.grow(task, host, run_dir=str(tmp_path / "whole"), config=settings, out=io.StringIO(),
                           policy="default")
    assert json.loads((tmp_path / "whole" / "summary.json").read_text())["controller"] == "policy"
    kill_after(monkeypatch, 3)
    with pytest.raises(Killed):
        morphogen.grow(task, host, run_dir=str(tmp_path / "cut"), config=settings, out=io.StringIO(), policy="default")
    monkeypatch.undo()
    with pytest.raises(CheckpointError, match=r"was played by policy default \(weights [0-9a-f]{12}\), not by the "
                                              "heuristic; resume it with that policy"):
        morphogen.grow(task, host, run_dir=str(tmp_path / "cut"), config=settings, out=io.StringIO(), resume=True)
    resumed = morphogen.grow(task, host, run_dir=str(tmp_path / "cut"), config=settings, out=io.StringIO(),
                             resume=True, policy="default")
    assert resumed.grown.final_loss == whole.grown.final_loss
    assert [story.ending() for story in resumed.grown.stories] == [story.ending() for story in whole.grown.stories]


def test_what_cannot_be_resumed_is_one_line_and_exit_2(uninterrupted: dict[str, Any], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    kill_after(monkeypatch, 3)
    with pytest.raises(Killed):
        run_command(config(run_dir), out=io.StringIO())
    monkeypatch.undo()
    saved = (run_dir / RESUME_FILENAME).read_bytes()

    def refused(*args: str) -> str:
        assert main(["run", "--resume", *args]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        return err

    assert "no run of `morphogen run` to resume (no config.json)" in refused(str(tmp_path / "nothing"))
    training = tmp_path / "policy-training"
    training.mkdir()
    (training / "config.json").write_text("{}")
    (training / "checkpoint.pt").write_bytes(b"")
    assert f"`morphogen train --resume {training}` continues it" in refused(str(training))
    for eval_file in ("eval_resume.pt", "eval.json"):  # an evaluation stopped, or finished
        evaluation = tmp_path / f"evaluation-{eval_file}"
        evaluation.mkdir()
        (evaluation / "config.json").write_text('{"policy": "default", "episodes": 2}')
        (evaluation / eval_file).write_bytes(b"")
        assert f"holds an evaluation of `morphogen eval`; `morphogen eval --resume {evaluation}` continues it" \
            in refused(str(evaluation))  # it said 'episodes: unknown key'
    assert "`morphogen run --resume" in refused_new_run(run_dir, capsys)
    line = refused(str(run_dir), "--policy", "default")
    assert f"the run in {run_dir} was played by the heuristic, not by policy default (weights " in line
    assert line.endswith("; resume it without --policy (grow: without policy=...)\n")
    (run_dir / RESUME_FILENAME).write_bytes(saved[: len(saved) // 2])
    assert "resume state" in (line := refused(str(run_dir))) and "unreadable (truncated or corrupt?)" in line
    forged = torch.load(io.BytesIO(saved), weights_only=True)
    forged["episode"]["epoch"] += 1  # the checksum stays that of the saved state
    torch.save(forged, run_dir / RESUME_FILENAME)
    assert "is damaged: its contents do not match the checksum" in refused(str(run_dir))
    forged["torch_rng"] = torch.zeros(3)  # a generator state of floats, the checksum made to match
    forged.pop("checksum")
    forged["checksum"] = state_checksum(forged)
    torch.save(forged, run_dir / RESUME_FILENAME)
    assert "its generator, episode or seconds are of the wrong kind" in refused(str(run_dir))
    (run_dir / RESUME_FILENAME).write_bytes(saved)
    config_file = run_dir / "config.json"
    original = config_file.read_text()
    config_file.write_text(original.replace('"seed": 0', '"seed": 1'))
    assert "was saved with another config than the one resuming it" in refused(str(run_dir))
    config_file.write_text(original)
    events = run_dir / EVENTS_FILENAME
    events.write_bytes(events.read_bytes()[:10])
    assert "fewer than the" in refused(str(run_dir))


@pytest.mark.parametrize("comparison", [BASELINE_DIRNAME, FROM_SCRATCH_DIRNAME, "fixed"])
def test_a_comparisons_directory_planted_as_a_link_is_refused_on_resume(
        comparison: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A copied run's `baseline/` (or `from_scratch/`, `fixed/`) may be a link to another directory: resuming would
    cut that directory's events, remove its temporary files and append there. One line, exit 2, nothing touched."""
    run_dir = tmp_path / "run"
    compare = {"compare_with": {"3x4": {"n_blocks": 3, "base_channels": 4}}} if comparison == "fixed" else {}
    kill_after(monkeypatch, 2)
    with pytest.raises(Killed):
        run_command(build_config(RunConfig, {**SETTINGS, "run_dir": str(run_dir), **compare}), out=io.StringIO())
    monkeypatch.undo()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / EVENTS_FILENAME).write_text("someone else's lines\n")
    theirs = temporary_name(elsewhere / RESUME_FILENAME)
    theirs.write_bytes(b"someone else's file")
    (run_dir / comparison).symlink_to(elsewhere)
    assert main(["run", "--resume", str(run_dir)]) == 2
    assert capsys.readouterr().err == (f"morphogen run: error: {run_dir / comparison} is a symbolic link; morphogen "
                                       "does not write through links in a run directory (remove it)\n")
    assert sorted(path.name for path in elsewhere.iterdir()) == sorted([EVENTS_FILENAME, theirs.name])
    assert (elsewhere / EVENTS_FILENAME).read_text() == "someone else's lines\n"
    assert not (run_dir / "summary.json").exists()


def refused_new_run(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """A new run into the stopped run's directory is refused, with the way to continue it."""
    assert main(["run", "--run-dir", str(run_dir)]) == 2
    return capsys.readouterr().err


def test_a_resumed_run_keeps_its_place_when_copied_elsewhere(uninterrupted: dict[str, Any], tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The run directory holds everything a resume reads: a stopped run moved to another disk goes on there."""
    kill_after(monkeypatch, EPOCHS + 1)
    with pytest.raises(Killed):
        run_command(config(tmp_path / "here"), out=io.StringIO())
    monkeypatch.undo()
    shutil.copytree(tmp_path / "here", tmp_path / "there")
    assert main(["run", "--resume", str(tmp_path / "there")]) == 0
    assert written(tmp_path / "there") == uninterrupted


def test_saving_every_few_epochs_replays_from_the_last_saved_one(uninterrupted: dict[str, Any], tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """`save_every = 4` saves epochs 4 and 6 (the last) of each training: killed after epoch 4's save, a run
    replays epochs 5 and 6."""
    run_dir = tmp_path / "run"
    kill_after(monkeypatch, 1)
    with pytest.raises(Killed):
        run_command(build_config(RunConfig, {**SETTINGS, "run_dir": str(run_dir), "save_every": 4}), out=io.StringIO())
    monkeypatch.undo()
    assert main(["run", "--resume", str(run_dir)]) == 0
    assert f"resume: grown from epoch 4 of {EPOCHS}" in capsys.readouterr().out
    assert written(run_dir) == uninterrupted


def test_a_run_that_saves_nothing_starts_over_when_resumed(uninterrupted: dict[str, Any], tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    original = run_module.run_episode
    calls = 0

    def stop_in_the_second_training(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise Killed
        return original(*args, **kwargs)

    monkeypatch.setattr(run_module, "run_episode", stop_in_the_second_training)
    with pytest.raises(Killed):
        run_command(build_config(RunConfig, {**SETTINGS, "run_dir": str(run_dir), "save_every": 0}), out=io.StringIO())
    monkeypatch.undo()
    assert not (run_dir / RESUME_FILENAME).exists()
    assert main(["run", "--resume", str(run_dir)]) == 0
    assert "the grown training saved no epoch (save_every = 0, or it stopped in its first); it starts over" in \
        capsys.readouterr().out
    assert written(run_dir) == uninterrupted


def test_a_run_of_the_learned_policy_resumes_with_the_policy_it_recorded(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """The policy's memory (its LSTM state, its sampling generator) travels in the state: the resumed run acts as
    the uninterrupted one. config.json records which policy played, by name and weights: `run --resume` goes on
    with it, and refuses a policy of other weights (here of the same width, which would act without complaint)
    in one line naming both, touching nothing."""
    from morphogen.commands.evaluate import DEFAULT_POLICY_FILE, policy_checksum
    from morphogen.control.checkpoint import load_checkpoint, save_checkpoint

    def policy_run(run_dir: Path) -> None:
        settings = build_config(RunConfig, {**SETTINGS, "run_dir": str(run_dir), "baseline": False,
                                            "policy": "default"})
        run_command(settings, out=io.StringIO())

    policy_run(tmp_path / "whole")
    kill_after(monkeypatch, 3)
    with pytest.raises(Killed):
        policy_run(tmp_path / "cut")
    monkeypatch.undo()
    shipped = load_checkpoint(DEFAULT_POLICY_FILE)
    recorded = json.loads((tmp_path / "cut" / "config.json").read_text())
    assert (recorded["policy"], recorded["policy_checksum"]) == ("default", policy_checksum(shipped))
    other = {key: value for key, value in shipped.items() if key not in ("format_version", "checksum")}
    name = next(key for key, tensor in other["policy"].items() if tensor.is_floating_point())
    other["policy"] = {**other["policy"], name: other["policy"][name] + 0.5}
    save_checkpoint(other, tmp_path / "other.pt")
    before = {path: path.read_bytes() for path in sorted((tmp_path / "cut").rglob("*")) if path.is_file()}

    assert main(["run", "--resume", str(tmp_path / "cut"), "--policy", str(tmp_path / "other.pt")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith(
        f"the run in {tmp_path / 'cut'} was played by policy default (weights {policy_checksum(shipped)[:12]}), not "
        f"by policy {tmp_path / 'other.pt'} (weights {policy_checksum(other)[:12]}); resume it with that policy, "
        "unchanged (--policy default, or none: `run --resume` takes it from config.json; grow: policy=...)\n")
    assert {path: path.read_bytes() for path in sorted((tmp_path / "cut").rglob("*")) if path.is_file()} == before
    assert main(["run", "--resume", str(tmp_path / "cut")]) == 0
    whole, resumed = (json.loads((tmp_path / name / "summary.json").read_text()) for name in ("whole", "cut"))
    assert resumed["controller"] == "policy"
    assert without_clock(resumed) == without_clock(whole)


def test_a_run_stopped_by_sigterm_in_its_baseline_resumes_to_what_an_uninterrupted_run_writes(
        uninterrupted: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A scheduler's SIGTERM, for real, in the middle of the no-growth training: one line naming the resume, no lock
    left, and the resumed run ends where an uninterrupted one does."""
    run_dir, settings = tmp_path / "run", tmp_path / "settings.json"
    settings.write_text(json.dumps(SETTINGS))
    command = [sys.executable, "-m", "morphogen", "run", "--config", str(settings), "--run-dir", str(run_dir),
               "--threads", "1"]
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    baseline_events = run_dir / BASELINE_DIRNAME / EVENTS_FILENAME
    while child.poll() is None and not (baseline_events.exists()
                                        and baseline_events.read_text().count('"epoch_completed"') >= 2):
        time.sleep(0.01)
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=120)
    assert child.returncode == EXIT_TERMINATED, err
    assert err.splitlines()[-1] == (f"morphogen run: stopped by SIGTERM; `morphogen run --resume {run_dir}` goes on "
                                    "from its last save"), err
    assert not (run_dir / LOCK_NAME).exists() and not list(run_dir.rglob(".*.tmp"))
    assert main(["run", "--resume", str(run_dir)]) == 0
    assert f"resume: grown from epoch {EPOCHS} of {EPOCHS}" in capsys.readouterr().out
    assert written(run_dir) == uninterrupted
