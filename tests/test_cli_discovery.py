"""The CLI guides a new user: --version, `list`, subcommand usage on a bad flag, shared flag names,
--threads, and a saved config that re-runs into a new run directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from morphogen import __version__
from morphogen.cli import EXIT_USER_ERROR, build_parser, main
from morphogen.commands.listing import listed_host
from morphogen.commands.threads import MAX_DEFAULT_THREADS, default_threads
from morphogen.data import load_task
from morphogen.env.episode import task_host

TINY_RUN = ["run", "--epochs", "2", "--max-train-samples", "100", "--slots", "r0c1", "--no-baseline"]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"morphogen {__version__}"


def test_a_bad_flag_prints_the_subcommands_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--bogus", "1"])
    assert exit_info.value.code == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert err.startswith("usage: morphogen train") and "--envs" in err
    assert "morphogen train: error: unrecognized arguments: --bogus 1" in err


def test_list_tasks(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "tasks"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("digits", "cifar10", "text"))


@pytest.mark.parametrize("what", ["tasks", "slots", "blueprints", "presets"])
def test_listings_piped_to_a_file_carry_no_trailing_padding(what: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", what]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) > 2 and all(line == line.rstrip() for line in lines)


def test_list_slots_of_the_digits_host_with_widths(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "slots", "--task", "digits", "--pool-slots"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert rows == [["r0c0", "8"], ["r1c0", "8"], ["r0c1", "16"], ["r1c1", "16"]]


def test_list_blueprints_gives_parameters_per_slot(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "blueprints"]) == 0
    out = capsys.readouterr().out
    norm = next(line for line in out.splitlines() if line.startswith("norm"))
    # Group norm blended by a scale: weight and bias of the norm plus one scale per channel = 3 C, in each of
    # the digits host's two slots (widths 8 and 16), then the description.
    assert norm.split()[1:4] == ["24", "48", "group"]
    assert "conv_heavy" in out


def test_list_needs_no_data_for_slot_widths(capsys: pytest.CaptureFixture[str]) -> None:
    """Slot widths depend on the host's size only: cifar10 is listed without its data (no --data-dir)."""
    assert main(["list", "slots", "--task", "cifar10"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert rows == [["r0c0", "32"], ["r0c1", "64"], ["r0c2", "128"]]
    assert main(["list", "blueprints", "--task", "text"]) == 0
    assert "r0c0 (w 32)" in capsys.readouterr().out


def test_list_of_an_unknown_task_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "slots", "--task", "cifar100"]) == EXIT_USER_ERROR
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["morphogen list: error: unknown task 'cifar100'; valid task names: digits, cifar10, text, mnist1d, "
                   "or module:function for a task of your own (my_task:make_task)"]


def test_run_and_train_accept_the_same_words_for_the_episode_length() -> None:
    parser = build_parser()
    assert parser.parse_args(["run", "--episode-length", "7"]).epochs == 7
    assert parser.parse_args(["run", "--epochs", "7"]).epochs == 7
    assert parser.parse_args(["train", "--epochs", "7"]).episode_length == 7
    assert parser.parse_args(["train", "--episode-length", "7"]).episode_length == 7


@pytest.mark.parametrize("command", ["run", "train", "eval"])
def test_the_help_of_task_names_the_form_of_a_users_task(command: str) -> None:
    subparsers = next(action for action in build_parser()._actions if action.dest == "command")
    flag = next(action for action in subparsers.choices[command]._actions if "--task" in action.option_strings)
    assert "package.module:function" in flag.help


def test_threads_flag_sets_torch_threads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = torch.get_num_threads()
    try:
        assert main([*TINY_RUN, "--threads", "2", "--run-dir", str(tmp_path / "r")]) == 0
        assert torch.get_num_threads() == 2
        assert main([*TINY_RUN, "--threads", "0"]) == EXIT_USER_ERROR
        assert "--threads must be >= 1, got 0" in capsys.readouterr().err
    finally:
        torch.set_num_threads(before)


def test_default_threads_leave_room_on_small_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("morphogen.commands.threads.available_cores", lambda: 2)
    assert default_threads() == 1
    monkeypatch.setattr("morphogen.commands.threads.available_cores", lambda: 64)
    assert default_threads() == MAX_DEFAULT_THREADS
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert default_threads() == 3


def test_a_saved_config_reruns_into_a_new_run_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    first = tmp_path / "first"
    assert main([*TINY_RUN, "--run-dir", str(first)]) == 0
    saved = json.loads((first / "config.json").read_text())
    assert saved["run_dir"] is None, "the saved config does not pin its run directory"
    events_before = (first / "events.jsonl").read_bytes()
    assert main(["run", "--config", str(first / "config.json")]) == 0
    assert (first / "events.jsonl").read_bytes() == events_before, "the old run is untouched"
    new_runs = [path for path in (tmp_path / "runs").iterdir() if (path / "events.jsonl").is_file()]
    assert len(new_runs) == 1 and "run dir: runs/" in capsys.readouterr().out


def test_progress_lines_fit_120_columns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--epochs", "3", "--max-train-samples", "100", "--pool-slots",
                 "--run-dir", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 120


@pytest.mark.parametrize("task", ["digits", "text", "mnist1d"])
def test_listed_slot_widths_are_those_of_the_host_built_from_the_data(task: str) -> None:
    loaded = load_task(task, max_train_samples=64)
    for pool_slots in (False, True):
        built = task_host(loaded, "meta", pool_slots=pool_slots).injection_points
        assert listed_host(task, pool_slots).widths == dict(built)


def test_list_presets_names_each_with_its_purpose(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "presets"]) == 0
    out = capsys.readouterr().out
    assert "grow_for_compute" in out and "grow_lean" in out and "0.6 of its training FLOPs" in out
