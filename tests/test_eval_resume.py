"""`morphogen eval --resume`: an evaluation killed between or inside its episodes goes on to the table and events
an uninterrupted one writes."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.test_run_resume import Killed, without_clock

import morphogen.commands.evaluate as evaluate_module
from morphogen.cli import main
from morphogen.control.integrity import state_checksum
from morphogen.run_directory import EVAL_RESUME_FILENAME, EVENTS_FILENAME, SCORES_FILENAME, temporary_name
from morphogen.ui.runs import query_runs

EPISODES = 2
#: What `kill_after` replaces, to put back while keeping the test's working directory.
ORIGINAL_SAVE = evaluate_module.write_resume_state
#: Two episodes per controller of 3 epochs on 200 digits, with the shipped policy (about 3 s in all).
EVAL = ["eval", "--policy", "default", "--task", "digits", "--max-train-samples", "200", "--episode-length", "3",
        "--episodes", str(EPISODES)]


def written(run_dir: Path) -> dict[str, Any]:
    """What an evaluation leaves for its readers, less wall-clock times: its table and its events."""
    lines = (run_dir / EVENTS_FILENAME).read_text().splitlines()
    return {"table": json.loads((run_dir / SCORES_FILENAME).read_text()),
            "events": [without_clock(json.loads(line)) for line in lines]}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    run_dir = tmp_path_factory.mktemp("eval") / "whole"
    assert main([*EVAL, "--run-dir", str(run_dir)]) == 0
    assert not (run_dir / EVAL_RESUME_FILENAME).exists()  # a whole evaluation leaves none
    return written(run_dir)


def kill_after(monkeypatch: pytest.MonkeyPatch, saves: int) -> None:
    """Kill the evaluation once it has saved `saves` episodes, in the middle of the next one: part of its events
    written, the last line torn."""
    original = evaluate_module.write_resume_state
    count = 0

    def save_then_die(path: Path, *args: Any, **kwargs: Any) -> None:
        nonlocal count
        if count == saves:
            with (path.parent / EVENTS_FILENAME).open("a") as events:
                events.write('{"time": 1, "event": "action_taken", "schema_version": 2, "epoch": 99}\n{"time": 1, "ev')
            raise Killed
        original(path, *args, **kwargs)
        count += 1

    monkeypatch.setattr(evaluate_module, "write_resume_state", save_then_die)


@pytest.mark.parametrize("saves", [0, 1, 3, 5], ids=["in the first episode", "learned played, heuristic not",
                                                     "a seed's three controllers played", "in the last episode"])
def test_an_evaluation_killed_anywhere_resumes_to_what_an_uninterrupted_one_writes(
        saves: int, uninterrupted: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "eval"
    kill_after(monkeypatch, saves)
    with pytest.raises(Killed):
        main([*EVAL, "--run-dir", str(run_dir)])
    monkeypatch.undo()
    assert not (run_dir / SCORES_FILENAME).exists()
    stale = temporary_name(run_dir / EVAL_RESUME_FILENAME)  # a save that the kill cut short
    stale.write_bytes(b"half a file")
    capsys.readouterr()
    assert main(["eval", "--episodes", "3", "--resume", str(run_dir)]) == 2  # flags refused
    assert "only --device, --jobs and --threads may be given with it, not --episodes" in capsys.readouterr().err
    jobs = ["--jobs", "2"] if saves == 3 else []  # resumed by two processes: the same files
    assert main(["eval", "--resume", str(run_dir), "--threads", "1", *jobs]) == 0
    out = capsys.readouterr().out
    assert (f"resume: {saves} of {EPISODES * 3} episodes played ({EPISODES} for each of learned, heuristic, "
            "no growth)") in out
    assert written(run_dir) == uninterrupted
    assert not (run_dir / EVAL_RESUME_FILENAME).exists() and not stale.exists()
    assert main(["eval", "--resume", str(run_dir)]) == 2
    assert "is finished (eval.json is written); nothing to resume" in capsys.readouterr().err


def test_what_eval_cannot_resume_is_one_line_and_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "eval"
    kill_after(monkeypatch, 2)
    with pytest.raises(Killed):
        main([*EVAL, "--run-dir", str(run_dir)])
    monkeypatch.undo()
    capsys.readouterr()
    state_file = run_dir / EVAL_RESUME_FILENAME
    saved = state_file.read_bytes()

    def refused(*args: str) -> str:
        assert main(["eval", *args]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        return err

    assert "holds no evaluation of `morphogen eval --run-dir` to resume" in refused("--resume", str(tmp_path / "no"))
    assert f"`morphogen eval --resume {run_dir}` continues it" in refused(*EVAL[1:], "--run-dir", str(run_dir))
    state_file.write_bytes(saved[: len(saved) // 2])
    assert "resume state" in (line := refused("--resume", str(run_dir))) and "unreadable" in line
    forged = torch.load(io.BytesIO(saved), weights_only=True)
    forged["played"][0][0] = 100.0  # a better score for the learned policy; the checksum stays the saved one
    torch.save(forged, state_file)
    assert "is damaged: its contents do not match the checksum" in refused("--resume", str(run_dir))
    forged["played"][0][2] = "many"  # parameters that are no count, the checksum made to match
    forged.pop("checksum")
    forged["checksum"] = state_checksum(forged)
    torch.save(forged, state_file)
    assert "its episodes are of the wrong kind" in refused("--resume", str(run_dir))
    state_file.write_bytes(saved)
    config_file = run_dir / "config.json"
    original = config_file.read_text()
    config_file.write_text(original.replace('"seed": 0', '"seed": 1'))
    assert "was saved with another config than the one resuming it" in refused("--resume", str(run_dir))
    config_file.write_text(original)
    assert main(["eval", "--resume", str(run_dir)]) == 0  # the intact state still resumes
    assert "resume: 2 of 6 episodes played (2 for each of learned, heuristic, no growth)" in capsys.readouterr().out


def test_episodes_played_by_worker_processes_write_what_one_process_writes(
        uninterrupted: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--jobs 3`: every episode is played in a spawned worker; the table and events are those of one process."""
    run_dir = tmp_path / "eval"
    assert main([*EVAL, "--run-dir", str(run_dir), "--jobs", "3", "--threads", "1"]) == 0
    assert ", 3 processes" in capsys.readouterr().out
    assert written(run_dir) == uninterrupted
    assert json.loads((run_dir / "config.json").read_text())["jobs"] == 3


def test_a_recorded_evaluation_finds_its_policy_from_any_directory_and_resumes_only_with_its_weights(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """config.json records a relative `--policy` absolute (as `run` does), so `eval --config DIR/config.json` and
    `eval --resume DIR` work from elsewhere; a policy whose weights changed since (its `train` run continued) is
    refused in one line instead of finishing an evaluation half played by other weights."""
    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "checkpoint.pt").write_bytes(evaluate_module.DEFAULT_POLICY_FILE.read_bytes())
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "eval"
    kill_after(monkeypatch, 2)
    with pytest.raises(Killed):
        main([*EVAL[:2], "policy", *EVAL[3:], "--run-dir", str(run_dir)])
    monkeypatch.undo()
    assert json.loads((run_dir / "config.json").read_text())["policy"] == str(policy)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    state = torch.load(policy / "checkpoint.pt", weights_only=True)
    saved = (policy / "checkpoint.pt").read_bytes()
    state["policy"] = {name: value + 0.01 if value.is_floating_point() else value
                       for name, value in state["policy"].items()}  # trained on
    state.pop("checksum")
    state["checksum"] = state_checksum(state)
    torch.save(state, policy / "checkpoint.pt")
    capsys.readouterr()
    assert main(["eval", "--resume", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "was its `train` run continued?" in err, err
    (policy / "checkpoint.pt").write_bytes(saved)
    assert main(["eval", "--resume", str(run_dir)]) == 0
    assert "resume: 2 of 6 episodes played" in capsys.readouterr().out


def test_an_evaluation_given_a_relative_text_file_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """config.json records the data paths absolute; the saved state is matched against them so, not against the
    relative path the evaluation was started with (which refused every such resume as 'another config')."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 150)
    kill_after(monkeypatch, 1)
    with pytest.raises(Killed):
        main(["eval", "--policy", "default", "--task", "text", "--text-file", "corpus.txt", "--max-train-samples",
              "64", "--episode-length", "1", "--episodes", "1", "--run-dir", "eval"])
    monkeypatch.setattr(evaluate_module, "write_resume_state", ORIGINAL_SAVE)  # alive again, still in tmp_path
    capsys.readouterr()
    assert main(["eval", "--resume", "eval", "--threads", "1"]) == 0, capsys.readouterr().err
    assert "resume: 1 of 3 episodes played" in capsys.readouterr().out


def test_an_evaluation_of_the_policys_own_task_records_that_task_for_its_readers(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "eval"
    # No --task: the policy's first training setting (digits for the shipped policy), as `eval` prints it.
    assert main(["eval", "--policy", "default", "--episode-length", "2", "--episodes", "1",
                 "--run-dir", str(run_dir)]) == 0
    config = json.loads((run_dir / "config.json").read_text())
    assert (config["task"], config["task_name"], config["task_metric"]) == (None, "digits", "accuracy")
    header, rows, _ = query_runs(tmp_path / "runs")
    assert [row[header.index("task")] for row in rows] == ["digits"]  # it was '-'
    assert main(["eval", "--config", str(run_dir / "config.json"), "--run-dir", str(tmp_path / "again")]) == 0
