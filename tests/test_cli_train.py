"""`morphogen train`, `morphogen eval` and `morphogen run --policy` end to end on a tiny digits setup.

A module-scoped run trains a policy for 3 rounds; tests read it or work on copies. User errors must exit
with code 2 and one stderr line, and must leave every file of the run untouched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import re
import shutil
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch

import morphogen.commands.evaluate
import morphogen.commands.run
import morphogen.session
from morphogen.cli import EXIT_USER_ERROR, main
from morphogen.control.checkpoint import load_checkpoint
from morphogen.data import Task
from morphogen.env.episode import EpisodeConfig, MorphogenesisEpisode
from morphogen.env.optimizer import OptimizerConfig
from morphogen.env.seeding import derive_seed
from morphogen.run_directory import CHECKPOINT_NAME
from morphogen.session import SessionOptions
from morphogen.ui.units import format_loss

TINY = ["--envs", "2", "--episode-length", "3", "--max-train-samples", "200", "--hidden-size", "16"]




class TrainedRun(NamedTuple):
    directory: Path
    output: str


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrainedRun]:
    """`morphogen train` for 3 rounds, uninterrupted. Tests must not write into it (copy it first)."""
    directory = tmp_path_factory.mktemp("trained") / "run"
    out, err = io.StringIO(), io.StringIO()  # capsys is per test; this output is shared by the module
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["train", *TINY, "--rounds", "3", "--run-dir", str(directory)])
    assert code == 0, err.getvalue()
    yield TrainedRun(directory, out.getvalue())


def files_of(directory: Path) -> dict[str, tuple[int, bytes]]:
    """Every file of a run directory with its modification time (ns) and bytes."""
    return {str(path.relative_to(directory)): (path.stat().st_mtime_ns, path.read_bytes())
            for path in sorted(directory.rglob("*")) if path.is_file()}


def copy_run(trained: TrainedRun, destination: Path) -> Path:
    return Path(shutil.copytree(trained.directory, destination))


def expect_user_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run the CLI; check exit code 2 and exactly one traceback-free stderr line; return that line."""
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == EXIT_USER_ERROR, (out, err)
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith(f"morphogen {argv[0]}: error: ")
    return lines[0]


def policy_of(directory: Path) -> dict[str, torch.Tensor]:
    state = load_checkpoint(directory)
    policy: dict[str, torch.Tensor] = state["policy"]
    return policy


# ----------------------------------------------------------------------------------------------- train


def test_train_prints_a_line_per_round_and_writes_the_run_directory(trained: TrainedRun) -> None:
    lines = trained.output.splitlines()
    assert lines[0].startswith("morphogen train: task digits 2x8x3 (3 epochs), 2 envs per round, rounds 1..3")
    assert [line[:9] for line in lines if line.startswith("round")] == ["round   1", "round   2", "round   3"]
    assert lines[-1] == f"checkpoint: {trained.directory / CHECKPOINT_NAME}"
    assert {p.name for p in trained.directory.iterdir()} == {"checkpoint.pt", "config.json", "events.jsonl"}
    state = load_checkpoint(trained.directory)
    assert state["round"] == 3 and state["hidden_size"] == 16
    assert json.loads(state["config"])["episode"]["max_epochs"] == 3


def test_train_with_a_paired_baseline_says_its_returns_are_net_of_the_twin(
        trained: TrainedRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Its round lines' return subtracts each env's no-growth twin's (an eval episode's reward, the report's reward
    by component and the episodes' returns do not): the run says so before its first round, a run without one not."""
    assert "twin" not in trained.output
    assert main(["train", *TINY, "--rounds", "1", "--paired-baseline", "--run-dir", str(tmp_path / "paired")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "return: each episode's return minus its no-growth twin's (paired_baseline), what growth added"
    assert lines[3].split()[0] == "return" and lines[4].startswith("round   1 ")  # the rounds' header, then round 1


def test_resume_through_the_cli_equals_the_uninterrupted_run(trained: TrainedRun, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    assert main(["train", *TINY, "--rounds", "2", "--run-dir", str(run)]) == 0
    capsys.readouterr()
    config_before = (run / "config.json").read_bytes()
    events_before = (run / "events.jsonl").read_bytes()

    assert main(["train", "--resume", str(run), "--rounds", "3"]) == 0
    out, _ = capsys.readouterr()
    assert "rounds 3..3" in out and [line[:9] for line in out.splitlines() if line.startswith("round")] == \
        ["round   3"]
    expected, got = policy_of(trained.directory), policy_of(run)
    assert expected.keys() == got.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0.0, atol=1e-6, msg=name)
    assert (run / "config.json").read_bytes() == config_before, "resuming keeps the run's config"
    events_after = (run / "events.jsonl").read_bytes()
    assert events_after.startswith(events_before) and len(events_after) > len(events_before), \
        "resuming appends to the run's events"


def _events_without_times(path: Path) -> list[dict[str, Any]]:
    """A run's events without their wall-clock fields (time, seconds, phase times), which no rerun repeats."""
    events = []
    for line in path.read_text().splitlines():
        event = json.loads(line)
        if event["event"] != "phase_times":
            events.append({key: value for key, value in event.items() if key not in ("time", "seconds")})
    return events


def test_resume_of_a_run_stopped_before_its_first_checkpoint_starts_it_again(
        trained: TrainedRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Stopped in round 1 (Ctrl-C, a kill), a run has its config.json and part of its events but no checkpoint:
    `--resume` plays it from round 1 in its directory and ends with the uninterrupted run's policy and events."""
    run = tmp_path / "run"
    assert main(["train", *TINY, "--rounds", "1", "--run-dir", str(run)]) == 0
    (run / CHECKPOINT_NAME).unlink()  # what a kill inside round 1 leaves, with a torn last line
    with (run / "events.jsonl").open("ab") as events:
        events.write(b'{"time": 1.0, "event": "epoch_comp')
    capsys.readouterr()

    assert main(["train", "--resume", str(run), "--rounds", "3"]) == 0
    out, _ = capsys.readouterr()
    assert "rounds 1..3" in out
    assert "resume: the run stopped before its first checkpoint; it starts again from the beginning" in out
    assert [line[:9] for line in out.splitlines() if line.startswith("round")] == \
        ["round   1", "round   2", "round   3"]
    expected, got = policy_of(trained.directory), policy_of(run)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0.0, atol=0.0, msg=name)
    assert _events_without_times(run / "events.jsonl") == _events_without_times(trained.directory / "events.jsonl")


def test_resume_refuses_a_directory_without_checkpoint_of_another_command(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A `run` directory stopped in its first epoch also has only config.json: it is not started as training."""
    run = tmp_path / "run"
    assert main(["run", "--epochs", "1", "--max-train-samples", "100", "--no-baseline", "--no-from-scratch",
                 "--run-dir", str(run)]) == 0
    for name in ("summary.json", "model.pt"):
        (run / name).unlink()
    capsys.readouterr()
    before = files_of(run)
    line = expect_user_error(["train", "--resume", str(run), "--rounds", "2"], capsys)
    assert line.startswith(f"morphogen train: error: no checkpoint at {run / CHECKPOINT_NAME}, and the run cannot "
                           "start again from its config.json: it is not the config of `morphogen train` (")
    assert "accepted" not in line
    assert files_of(run) == before
    empty = tmp_path / "empty"
    empty.mkdir()
    line = expect_user_error(["train", "--resume", str(empty)], capsys)
    assert line.endswith(f"no checkpoint at {empty / CHECKPOINT_NAME} (expected a run directory with checkpoint.pt)")


def test_batch_envs_trains_identical_envs_batched_and_records_it(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    assert main(["train", *TINY, "--rounds", "1", "--batch-envs", "--run-dir", str(run)]) == 0
    assert json.loads((run / "config.json").read_text())["episode"]["batch_identical"] is True
    capsys.readouterr()
    line = expect_user_error(["train", "--resume", str(run), "--rounds", "2", "--batch-envs"], capsys)
    assert "--resume continues a run with its saved config" in line


# ------------------------------------------------------------------------------------------------ eval


def test_eval_prints_the_comparison_table(trained: TrainedRun, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "--policy", str(trained.directory), "--episodes", "2"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("controller"))
    for column in ("final acc %", "params added", "acc pts / 1k params", "fossilized", "pruned"):
        assert column in header
    rows = {name: next(line for line in lines if line.startswith(name)) for name in ("learned", "heuristic",
                                                                                     "no growth")}
    # Parameters added are whole numbers, with thousands separators: "1,240 ± 0", never "1240.00".
    assert all(re.fullmatch(r"\d{1,3}(,\d{3})* ± +\d{1,3}(,\d{3})*", row[29:49].strip()) for row in rows.values())
    # Per-episode accuracies are printed as "<controller> 12.34%"; the table's mean ± std must agree.
    episodes = [line for line in lines if line.startswith("episode ")]
    assert len(episodes) == 2
    # Each line names the seed its episodes were played from, whole, not cut to its last five digits.
    seeds = [int(re.search(r"\(seed (\d+)\)", line).group(1)) for line in episodes]  # type: ignore[union-attr]
    assert seeds == [derive_seed(0, morphogen.commands.evaluate.EVALUATION_STREAM, index) for index in range(2)]
    for name, row in rows.items():
        accuracies = [float(re.search(rf"{name} (\d+\.\d+)%", line).group(1)) for line in episodes]  # type: ignore[union-attr]
        cells = re.findall(r"(-?\d[\d,]*\.\d+) ± +(\d+\.\d+)", row)
        assert len(cells) >= 3, row  # acc, fossilized, pruned (acc per 1k params may be "-"; added is counted)
        mean, spread = (float(v.replace(",", "")) for v in cells[0])
        assert mean == pytest.approx(statistics.fmean(accuracies), abs=0.006)
        assert spread == pytest.approx(statistics.stdev(accuracies), abs=0.006)  # the sample std, as run --seeds
    assert rows["no growth"][29:49].split() == ["0", "±", "0"]


def test_the_table_gives_parameters_added_as_whole_numbers_with_thousands_separators() -> None:
    scores = morphogen.commands.evaluate.ControllerScores(
        name="learned", accuracies=(97.5, 98.5), added=(5328.0, 5328.0), gain_per_thousand=(0.1, 0.3),
        fossilized=(1.0, 1.0), pruned=(0.0, 0.0))
    out = io.StringIO()
    morphogen.commands.evaluate._print_table([scores], out)
    row = next(line for line in out.getvalue().splitlines() if line.startswith("learned"))
    assert row[29:49] == "       5,328 ±     0"


# ------------------------------------------------------------------------------------------ run --policy


def test_run_with_the_policy_plays_the_episode_run_chooses(trained: TrainedRun, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The policy was trained on 3-epoch digits episodes with 2 slots; it plays a 5-epoch episode on one slot."""
    run_dir = tmp_path / "episode"
    code = main(["run", "--policy", str(trained.directory), "--max-train-samples", "200", "--no-baseline",
                 "--epochs", "5", "--slots", "r0c1", "--run-dir", str(run_dir)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "epoch   5/5" in out and "epoch   6/" not in out
    assert (run_dir / "summary.json").is_file()


def test_a_policy_trained_on_digits_acts_on_mnist1d_in_eval(trained: TrainedRun, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Another task, topology (1-D convolutions), host size (3 slots) and episode length than in training."""
    config = tmp_path / "eval.toml"
    config.write_text('task = "mnist1d"\n[host]\nn_blocks = 3\n')
    record = tmp_path / "eval"
    code = main(["eval", "--policy", str(trained.directory), "--config", str(config), "--max-train-samples", "200",
                 "--episode-length", "4", "--episodes", "1", "--run-dir", str(record)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "4 epochs on mnist1d (cnn1d host)" in out
    table = json.loads((record / "eval.json").read_text())
    assert [row["name"] for row in table] == ["learned", "heuristic", "no growth"]
    events = [json.loads(line) for line in (record / "events.jsonl").read_text().splitlines()]
    learned = [event for event in events if event["event"] == "action_taken" and event["env_id"] == 0]
    assert len(learned) == 4, "the learned policy chose an action in every epoch"
    slots = {state["slot"] for event in events if event["event"] == "epoch_completed" for state in event["slots"]}
    assert slots == {"r0c0", "r0c1", "r0c2"}


USER_TASK = """
import torch
import morphogen

def make_task(seed=0):
    x = torch.randn(300, 12)
    y = (x[:, :6].sum(1) > x[:, 6:].sum(1)).long()
    model = torch.nn.Sequential(torch.nn.Linear(12, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    host = morphogen.host_from_module(model, slots=["1"], example_input=x[:2])
    return morphogen.task_from_data("sums", (x[:240], y[:240]), (x[240:], y[240:]), num_classes=2), host
"""


def test_a_policy_trained_on_digits_acts_on_a_users_own_model(trained: TrainedRun, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A user's MLP (topology mlp, one slot, its own blueprints) through `--task module:function`."""
    (tmp_path / "user_task.py").write_text(USER_TASK)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["eval", "--policy", str(trained.directory), "--task", "user_task:make_task", "--episode-length",
                 "3", "--episodes", "1"]) == 0
    assert "3 epochs on sums (mlp host)" in capsys.readouterr().out
    assert main(["run", "--policy", str(trained.directory), "--task", "user_task:make_task", "--epochs", "3",
                 "--no-baseline", "--run-dir", "episode"]) == 0
    assert "epoch   3/3" in capsys.readouterr().out


REGRESSION_TASK = """
import torch
import morphogen

def make_task(seed=0):
    x = torch.randn(200, 6)
    y = x[:, :3].sum(1, keepdim=True) * x[:, 3:4]
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    host = morphogen.host_from_module(model, slots=["1"], example_input=x[:2])
    return morphogen.task_from_data("products", (x[:160], y[:160]), (x[160:], y[160:]),
                                    loss=torch.nn.functional.mse_loss), host
"""


def test_training_on_a_regression_shows_its_loss_not_an_accuracy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A task with its own loss scores by the loss negated: round lines, config.json and `report` show the loss, as
    `run` does, never "acc -2.35%"."""
    (tmp_path / "regression_task.py").write_text(REGRESSION_TASK)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["train", "--task", "regression_task:make_task", "--envs", "2", "--rounds", "1", "--episode-length",
                 "3", "--hidden-size", "16", "--run-dir", "run"]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("round   1"))
    loss = -json.loads(next(record for record in (tmp_path / "run" / "events.jsonl").read_text().splitlines()
                            if '"round_completed"' in record))["mean_final_accuracy"]
    assert f"loss {loss:7.4g}" in line and "acc" not in line
    recorded = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (recorded["task_name"], recorded["task_metric"]) == ("products", "negative loss")
    assert main(["report", "run"]) == 0
    report = capsys.readouterr().out
    rounds = report[report.index("rounds:"):].splitlines()
    assert "final loss" in rounds[1] and format_loss(loss) in rounds[2] and "%" not in rounds[2]
    assert main(["train", "--resume", "run", "--rounds", "2"]) == 0, "the recorded score does not block a resume"


def test_a_checkpoint_of_an_earlier_format_is_refused_in_one_line(trained: TrainedRun, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    run = copy_run(trained, tmp_path / "run")
    state = torch.load(run / CHECKPOINT_NAME, weights_only=True)
    torch.save({**state, "format_version": 2}, run / CHECKPOINT_NAME)
    for argv in (["eval", "--policy", str(run), "--episodes", "1"],
                 ["run", "--policy", str(run), "--run-dir", str(tmp_path / "episode")]):
        line = expect_user_error(argv, capsys)
        assert "is of format 2, from an earlier morphogen whose policy was tied to one task and slot layout" in line
    assert not (tmp_path / "episode").exists()


# ------------------------------------------------------------------------------------------ host size


def test_train_eval_and_run_policy_use_the_host_table_of_training(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The `[host]` table of `train` is saved with the run; `eval` builds that host by default, `run --policy` the
    host its own config names."""
    config = tmp_path / "train.toml"
    config.write_text("[host]\nbase_channels = 4\nn_blocks = 2\n")
    run = tmp_path / "run"
    assert main(["train", *TINY, "--rounds", "1", "--config", str(config), "--run-dir", str(run)]) == 0
    expected = {"n_blocks": 2, "base_channels": 4, "kernel_size": 3}
    assert json.loads((run / "config.json").read_text())["host"] == expected
    assert json.loads(load_checkpoint(run)["config"])["host"] == expected

    loaded: list[dict[str, int]] = []
    real = morphogen.session.load_session_task

    def recording(options: SessionOptions, device: str) -> Task:
        task = real(options, device)
        loaded.append({key: task.host_kwargs[key] for key in expected})
        return task

    monkeypatch.setattr(morphogen.commands.evaluate, "load_session_task", recording)
    monkeypatch.setattr(morphogen.commands.run, "load_session_task", recording)
    assert main(["eval", "--policy", str(run), "--episodes", "1"]) == 0
    assert main(["run", "--policy", str(run), "--no-baseline", "--max-train-samples", "200", "--epochs", "3",
                 "--config", str(config), "--run-dir", str(tmp_path / "episode")]) == 0
    capsys.readouterr()
    assert loaded == [expected, expected]
    assert json.loads((tmp_path / "episode" / "config.json").read_text())["host"] == expected


# ----------------------------------------------------------------------------------------- user errors


def test_zero_envs(trained: TrainedRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = copy_run(trained, tmp_path / "run")
    before = files_of(run)
    line = expect_user_error(["train", *TINY[2:], "--envs", "0", "--run-dir", str(run)], capsys)
    assert "--envs must be >= 1, got 0" in line
    line = expect_user_error(["train", "--resume", str(run), "--envs", "0", "--rounds", "4"], capsys)
    assert "cannot change n_envs" in line
    assert files_of(run) == before


def test_train_into_an_existing_run_without_resume(trained: TrainedRun, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    run = copy_run(trained, tmp_path / "run")
    before = files_of(run)
    line = expect_user_error(["train", *TINY, "--rounds", "1", "--run-dir", str(run)], capsys)
    assert "already holds another run (config.json, events.jsonl, checkpoint.pt)" in line
    assert f"train --resume {run}" in line
    assert files_of(run) == before


def test_resume_of_a_finished_run(trained: TrainedRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = copy_run(trained, tmp_path / "run")
    before = files_of(run)
    line = expect_user_error(["train", "--resume", str(run), "--rounds", "3"], capsys)
    assert line.endswith("already finished all 3 of its rounds; pass --rounds N with N > 3 to continue it")
    line = expect_user_error(["train", "--resume", str(run), "--rounds", "1"], capsys)
    assert line.endswith("already finished 3 rounds, more than the 1 asked for; pass --rounds N with N > 3 to "
                         "continue it")
    assert files_of(run) == before


def test_resume_refuses_a_checkpoint_copied_from_another_run(trained: TrainedRun, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "other"
    assert main(["train", *TINY, "--rounds", "1", "--seed", "1", "--hidden-size", "8", "--run-dir", str(other)]) == 0
    run = copy_run(trained, tmp_path / "run")
    shutil.copy(other / CHECKPOINT_NAME, run / CHECKPOINT_NAME)
    capsys.readouterr()
    before = files_of(run)
    line = expect_user_error(["train", "--resume", str(run), "--rounds", "4"], capsys)
    assert line.endswith(f"{run / CHECKPOINT_NAME} was saved with another config than the one resuming it "
                         "(config.json differs in hidden_size, seed: was the checkpoint copied from another run?); "
                         "a resumed run keeps the config it started with")
    assert files_of(run) == before


USERS_TASK_CAPPED = "max_train_samples: caps the built-in tasks; task my_tasks:make_task chooses its own data"
TASK_BESIDE_MIX = ("task: mix says what to train on, so task mnist1d would be ignored; name it in a [[mix]] entry "
                   "instead")


@pytest.mark.parametrize(("config", "flags", "message"), [
    ('[[mix]]\ntask = "my_tasks:make_task"\n[[mix]]\ntask = "digits"\n', ["--max-train-samples", "100"],
     USERS_TASK_CAPPED),
    ('max_train_samples = 100\n[[mix]]\ntask = "my_tasks:make_task"\n', [], USERS_TASK_CAPPED),
    (None, ["--tasks", "my_tasks:make_task,digits", "--max-train-samples", "100"], USERS_TASK_CAPPED),
    ('task = "mnist1d"\n[[mix]]\ntask = "digits"\n', [], TASK_BESIDE_MIX),
    ('[[mix]]\ntask = "digits"\n', ["--task", "mnist1d"], TASK_BESIDE_MIX),
    (None, ["--tasks", "digits", "--task", "mnist1d"],
     "task: tasks says what to train on, so task mnist1d would be ignored; add it to tasks instead"),
    # --task given on purpose is refused beside the mix even where it names the default task, digits.
    (None, ["--tasks", "mnist1d", "--task", "digits"],
     "task: tasks says what to train on, so task digits would be ignored; add it to tasks instead"),
    ('[[mix]]\ntask = "mnist1d"\n', ["--task", "digits"],
     "task: mix says what to train on, so task digits would be ignored; name it in a [[mix]] entry instead"),
    ('[host]\nn_blocks = 3\n[[mix]]\ntask = "digits"\n', [],
     "host: mix trains each task on its own host size, so a [host] table would be ignored; give the entry a host "
     "table instead"),
    ('[[mix]]\ntask = "digits"\nepisode_length = 4\n', ["--episode-length", "6"],
     "episode.max_epochs: every mix entry sets its own episode_length, so episode.max_epochs = 6 (--episode-length) "
     "would be ignored; leave it out, or leave episode_length out of the entries that should play it"),
    # ... and so is an --episode-length that happens to be train's default, 25.
    ('[[mix]]\ntask = "digits"\nepisode_length = 4\n', ["--episode-length", "25"],
     "episode.max_epochs: every mix entry sets its own episode_length, so episode.max_epochs = 25 (--episode-length) "
     "would be ignored; leave it out, or leave episode_length out of the entries that should play it"),
    ('max_train_samples = 100\n[[mix]]\ntask = "digits"\nmax_train_samples = 200\n', [],
     "max_train_samples: every mix entry sets its own max_train_samples, so max_train_samples = 100 would be "
     "ignored; leave it out, or leave max_train_samples out of the entries that should take it"),
    # A config file's settings that the mix ignores are refused as the flags are, even where they are the defaults.
    ('task = "digits"\n[[mix]]\ntask = "mnist1d"\n', [],
     "task: mix says what to train on, so task digits would be ignored; name it in a [[mix]] entry instead"),
    ('task = "digits"\ntasks = ["mnist1d"]\n', [],
     "task: tasks says what to train on, so task digits would be ignored; add it to tasks instead"),
    ('task = "digits"\n', ["--tasks", "mnist1d"],
     "task: tasks says what to train on, so task digits would be ignored; add it to tasks instead"),
    ('[host]\nn_blocks = 2\n[[mix]]\ntask = "mnist1d"\n', [],
     "host: mix trains each task on its own host size, so a [host] table would be ignored; give the entry a host "
     "table instead"),
    ('tasks = ["mnist1d"]\n[host]\nn_blocks = 2\n', [],
     "host: tasks trains each task on its own host size, so a [host] table would be ignored; use [[mix]] entries "
     "with host tables instead"),
    ('[episode]\nmax_epochs = 25\n[[mix]]\ntask = "digits"\nepisode_length = 4\n', [],
     "episode.max_epochs: every mix entry sets its own episode_length, so episode.max_epochs = 25 (--episode-length) "
     "would be ignored; leave it out, or leave episode_length out of the entries that should play it"),
])
def test_a_setting_beside_the_training_mix_that_it_would_ignore_is_one_line(
        config: str | None, flags: list[str], message: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    argv = ["train", *flags, "--rounds", "1", "--run-dir", str(run)]
    if config is not None:
        (tmp_path / "train.toml").write_text(config)
        argv += ["--config", str(tmp_path / "train.toml")]
    line = expect_user_error(argv, capsys)
    assert line.endswith(message)
    assert not run.exists()


@pytest.mark.parametrize(("name", "text"), [
    ("train.json", '{"task": "digits", "mix": [{"task": "mnist1d"}]}'),
    ("train.yaml", "task: digits\nmix:\n  - task: mnist1d\n"),
])
def test_a_json_or_yaml_config_is_refused_a_setting_beside_the_mix_as_toml_is(
        name: str, text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / name).write_text(text)
    line = expect_user_error(["train", "--config", str(tmp_path / name), "--run-dir", str(tmp_path / "run")], capsys)
    assert line.endswith("task: mix says what to train on, so task digits would be ignored; name it in a [[mix]] "
                         "entry instead")


def test_a_runs_recorded_config_with_a_mix_trains_again(tmp_path: Path) -> None:
    """A run's config.json records every setting, the task and host the mix replaced too: given back as --config, it
    is not refused for them (a config.json written by hand, without the run's events beside it, is)."""
    from morphogen.cli import build_parser, train_config_from_args
    from morphogen.config import ConfigError

    recorded = {"task": "digits", "host": {"n_blocks": 2, "base_channels": 8, "kernel_size": 3},
                "tasks": ["digits", "mnist1d"], "episode": {"max_epochs": 25}}
    for directory in (tmp_path / "run", tmp_path / "mine"):
        directory.mkdir()
        (directory / "config.json").write_text(json.dumps(recorded))
    (tmp_path / "run" / "events.jsonl").write_text("")
    args = build_parser().parse_args(["train", "--config", str(tmp_path / "run" / "config.json")])
    assert train_config_from_args(args).tasks == ("digits", "mnist1d")
    args = build_parser().parse_args(["train", "--config", str(tmp_path / "mine" / "config.json")])
    with pytest.raises(ConfigError, match=r"^task: tasks says what to train on"):
        train_config_from_args(args)


def test_unknown_slot_creates_no_run_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    line = expect_user_error(["train", *TINY, "--rounds", "1", "--slots", "r9c9", "--run-dir", str(run)], capsys)
    assert "unknown slot 'r9c9'" in line
    assert not run.exists()


def truncate_checkpoint(run: Path) -> None:
    checkpoint = run / CHECKPOINT_NAME
    data = checkpoint.read_bytes()
    checkpoint.write_bytes(data[: len(data) // 2])


def test_truncated_checkpoint_with_resume_and_with_eval(trained: TrainedRun, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    run = copy_run(trained, tmp_path / "run")
    truncate_checkpoint(run)
    before = files_of(run)
    line = expect_user_error(["train", "--resume", str(run), "--rounds", "4"], capsys)
    assert "is unreadable (truncated or corrupt?)" in line and CHECKPOINT_NAME in line
    line = expect_user_error(["eval", "--policy", str(run), "--episodes", "1"], capsys)
    assert "is unreadable (truncated or corrupt?)" in line
    assert files_of(run) == before


def test_eval_needs_an_episode(trained: TrainedRun, capsys: pytest.CaptureFixture[str]) -> None:
    line = expect_user_error(["eval", "--policy", str(trained.directory), "--episodes", "0"], capsys)
    assert "episodes: must be >= 1, got 0" in line


def test_eval_records_into_a_run_directory_from_a_config_file(trained: TrainedRun, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from morphogen.telemetry import events
    from morphogen.telemetry.sinks import read_events

    config = tmp_path / "eval.toml"
    config.write_text(f'policy = "{trained.directory}"\nepisodes = 1\n[telemetry]\nlevel = "normal"\n')
    record = tmp_path / "eval-run"
    assert main(["eval", "--config", str(config), "--run-dir", str(record), "--telemetry", "minimal"]) == 0
    assert f"recorded in {record}" in capsys.readouterr().out
    scores = json.loads((record / "eval.json").read_text())
    assert [s["name"] for s in scores] == ["learned", "heuristic", "no growth"]
    assert json.loads((record / "config.json").read_text())["telemetry"]["level"] == "minimal"
    written = read_events(record / "events.jsonl")
    finished = [e.env_id for e in written if isinstance(e, events.EpisodeCompleted)]
    assert finished == [0, 1, 2], "episode i of controller c is env c * episodes + i"
    assert not any(isinstance(e, events.RewardComputed) for e in written), "minimal level from the flag"


def test_eval_trains_its_hosts_with_the_optimizer_table_of_its_config(trained: TrainedRun, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """An `[optimizer]` table (the keys of run's `[episode.optimizer]`) is how every played host trains: laid over
    the task's default optimizer, recorded in config.json."""
    played: list[OptimizerConfig | None] = []
    episode_class = morphogen.commands.evaluate.MorphogenesisEpisode

    def recording(task: Task, config: EpisodeConfig, **kwargs: Any) -> MorphogenesisEpisode:
        played.append(config.optimizer)
        return episode_class(task, config, **kwargs)

    monkeypatch.setattr(morphogen.commands.evaluate, "MorphogenesisEpisode", recording)
    config = tmp_path / "eval.toml"
    config.write_text('task = "digits"\n[optimizer]\nschedule = "cosine"\nhost_lr = 0.05\n')
    record = tmp_path / "eval"
    assert main(["eval", "--policy", str(trained.directory), "--config", str(config), "--max-train-samples", "200",
                 "--episode-length", "2", "--episodes", "1", "--run-dir", str(record)]) == 0
    capsys.readouterr()
    assert len(played) == 1 + 3, "one model built to check the slots before recording, then one episode per controller"
    assert all(optimizer is not None and (optimizer.schedule, optimizer.host_lr, optimizer.seed_lr) == ("cosine", 0.05,
               0.01) for optimizer in played), played
    recorded = json.loads((record / "config.json").read_text())["optimizer"]
    assert (recorded["schedule"], recorded["host_lr"], recorded["name"]) == ("cosine", 0.05, "sgd")


def test_eval_plays_a_task_of_the_training_mix_with_the_optimizer_it_trained_with() -> None:
    """`--tasks mnist1d` with an `[episode.optimizer]` table trained mnist1d's hosts at that rate: eval of that policy
    on mnist1d (its first setting, or named) trains them so too, not at the task's default; another task keeps its
    own default."""
    from morphogen.commands.evaluate import EvalConfig, evaluation_setting
    from morphogen.control.trainer import TrainConfig

    trained = TrainConfig(tasks=("mnist1d",))
    trained = dataclasses.replace(trained, episode=dataclasses.replace(
        trained.episode, optimizer=OptimizerConfig(host_lr=0.05)))
    for config in (EvalConfig(policy="run"), EvalConfig(policy="run", task="mnist1d")):
        session, episode = evaluation_setting(config, trained)
        assert session.task == "mnist1d" and episode.optimizer is not None and episode.optimizer.host_lr == 0.05
    assert evaluation_setting(EvalConfig(policy="run", task="digits"), trained)[1].optimizer is None


def test_an_eval_optimizer_table_keeps_the_tasks_own_optimizer_and_needs_the_task(
        trained: TrainedRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from morphogen.cli import build_parser, eval_config_from_args

    config = tmp_path / "eval.toml"
    config.write_text('task = "text"\n[optimizer]\nhost_lr = 1e-3\n')
    args = build_parser().parse_args(["eval", "--policy", str(trained.directory), "--config", str(config)])
    optimizer = eval_config_from_args(args).optimizer
    assert optimizer is not None
    assert (optimizer.name, optimizer.host_lr, optimizer.seed_lr) == ("adamw", 1e-3, 5e-3), "no SGD defaults"
    config.write_text('[optimizer]\nschedule = "cosine"\n')
    line = expect_user_error(["eval", "--policy", str(trained.directory), "--config", str(config)], capsys)
    assert "an [optimizer] table says how the hosts of `task` train; name the task too" in line
    config.write_text('task = "digits"\n[optimizer]\nschedule = "sometimes"\n')
    line = expect_user_error(["eval", "--policy", str(trained.directory), "--config", str(config)], capsys)
    assert "optimizer.schedule: must be one of constant, cosine, got 'sometimes'" in line


def test_eval_telemetry_without_a_run_directory_is_a_usage_error(trained: TrainedRun,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    line = expect_user_error(["eval", "--policy", str(trained.directory), "--telemetry", "debug"], capsys)
    assert "give --run-dir DIR" in line


def test_eval_config_with_telemetry_but_no_run_directory_records_nothing_and_a_recorded_config_replays(
        trained: TrainedRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Only the --telemetry flag needs --run-dir; eval's config.json, like run's, holds no run directory, so
    replaying it prints the table and records where --run-dir says, never into the evaluation it came from."""
    config = tmp_path / "eval.toml"
    config.write_text(f'policy = "{trained.directory}"\nepisodes = 1\n[telemetry]\nlevel = "minimal"\n')
    assert main(["eval", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "recorded in" not in out and out.startswith("morphogen eval: 1 episode of 3 epochs on digits")
    record = tmp_path / "eval-run"
    assert main(["eval", "--config", str(config), "--run-dir", str(record)]) == 0
    capsys.readouterr()
    assert json.loads((record / "config.json").read_text())["run_dir"] is None
    before = {path.name: path.read_bytes() for path in record.iterdir() if path.is_file()}
    assert main(["eval", "--config", str(record / "config.json")]) == 0
    assert "recorded in" not in capsys.readouterr().out
    assert {path.name: path.read_bytes() for path in record.iterdir() if path.is_file()} == before
    again = tmp_path / "again"
    assert main(["eval", "--config", str(record / "config.json"), "--run-dir", str(again)]) == 0
    assert f"recorded in {again}" in capsys.readouterr().out
    assert json.loads((again / "config.json").read_text())["telemetry"]["level"] == "minimal"


def test_the_shipped_policy_plays_run_and_eval_without_a_training_run(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """`--policy default` is the checkpoint in the package: it loads, names what it was trained on, and acts on a
    task and host of the user's choosing."""
    from morphogen.commands.evaluate import DEFAULT_POLICY_FILE, read_policy_run

    assert DEFAULT_POLICY_FILE.is_file()
    trained, _ = read_policy_run("default", "cpu")
    assert [entry.task for entry in trained.training_mix()] == ["digits", "mnist1d", "digits"]
    code = main(["run", "--policy", "default", "--task", "mnist1d", "--max-train-samples", "200", "--no-baseline",
                 "--no-from-scratch", "--epochs", "3", "--run-dir", str(tmp_path / "episode")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "epoch   3/3" in out
    assert main(["eval", "--policy", "default", "--task", "digits", "--max-train-samples", "200",
                 "--episode-length", "3", "--episodes", "1"]) == 0
    assert "3 epochs on digits (cnn host)" in capsys.readouterr().out


def test_a_feed_forward_policy_trains_and_evaluates_from_its_checkpoint(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """`train --feed-forward` keeps no LSTM (nor judges one); `eval` tells it from its weights."""
    run = tmp_path / "run"
    assert main(["train", *TINY, "--rounds", "1", "--feed-forward", "--run-dir", str(run)]) == 0
    out = capsys.readouterr().out
    assert "round   1" in out and "lstm" not in out.lower()
    assert not any(key.startswith("lstm.") for key in policy_of(run))
    assert json.loads((run / "config.json").read_text())["recurrent"] is False
    events = (run / "events.jsonl").read_text()
    assert '"ppo_update_completed"' in events and "lstm_health" not in events
    assert main(["eval", "--policy", str(run), "--max-train-samples", "200", "--episode-length", "3",
                 "--episodes", "1"]) == 0
    assert "3 epochs on digits (cnn host)" in capsys.readouterr().out


def test_imitation_with_a_ramp_the_policy_cannot_choose_is_one_line_before_any_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The heuristic's seeds blend over [episode.slots] blend_epochs; imitation labels it with the policy's ramp head.
    config = tmp_path / "ramp.toml"
    config.write_text("[episode.slots]\nblend_epochs = 2\n")
    run = tmp_path / "run"
    line = expect_user_error(["train", *TINY, "--rounds", "1", "--imitate-rounds", "1", "--config", str(config),
                              "--run-dir", str(run)], capsys)
    assert "episode.slots.blend_epochs = 2: imitation fits the policy's ramp head" in line and "3, 5, 8" in line
    assert not run.exists()
