"""Hosts compared with from the settings: `morphogen run --compare NAME=SPEC` and `compare_with` in a config."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
import torch

import morphogen
from morphogen.cli import EXIT_USER_ERROR, main
from morphogen.core.hosts import build_host
from morphogen.data import load_task

#: A task of the user's own and two functions building hosts for it, as `--compare wide=compared_task:wide` names
#: one.
USER_TASK = """
import torch
import morphogen

x = torch.randn(300, 12, generator=torch.Generator().manual_seed(0))
y = (x[:, :6].sum(1) > x[:, 6:].sum(1)).long()

def host(width=8):
    model = torch.nn.Sequential(torch.nn.Linear(12, width), torch.nn.ReLU(), torch.nn.Linear(width, 2))
    return morphogen.host_from_module(model, slots=["1"], example_input=x[:2])

def wide():
    return host(32)

def three_classes():
    model = torch.nn.Sequential(torch.nn.Linear(12, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    return morphogen.host_from_module(model, slots=["1"], example_input=x[:2])

def make_task():
    return morphogen.task_from_data("sums", (x[:240], y[:240]), (x[240:], y[240:]), num_classes=2), host
"""


def _fixed(run_dir: Path) -> list[tuple[str, int]]:
    return [(entry["name"], entry["parameters"]) for entry in
            json.loads((run_dir / "summary.json").read_text())["fixed"]]


def _parameters(task: str, **sizes: int) -> int:
    loaded = load_task(task, host=sizes)
    return sum(p.numel() for p in build_host(loaded.topology, **loaded.host_kwargs).parameters())


def test_run_compares_with_built_in_hosts_of_other_sizes_from_flags_and_config(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Sizes left out are the grown host's (here 3 blocks); the config's hosts and the flags' are trained alike, and
    config.json keeps them, so the saved config runs the same comparison again."""
    (tmp_path / "compare.toml").write_text('[host]\nn_blocks = 3\n[compare_with."width 4"]\nbase_channels = 4\n')
    assert main(["run", "--config", str(tmp_path / "compare.toml"), "--max-train-samples", "150", "--epochs", "2",
                 "--threads", "1", "--no-from-scratch", "--compare", "2x6=n_blocks=2,base_channels=6",
                 "--run-dir", str(tmp_path / "run")]) == 0
    table = capsys.readouterr().out.split("hosts to compare with, trained without growth", 1)[1]
    assert "width 4" in table and "2x6" in table
    assert _fixed(tmp_path / "run") == [("width 4", _parameters("digits", n_blocks=3, base_channels=4)),
                                        ("2x6", _parameters("digits", n_blocks=2, base_channels=6))]
    saved = json.loads((tmp_path / "run" / "config.json").read_text())["compare_with"]
    assert saved == {"width 4": {"base_channels": 4}, "2x6": {"n_blocks": 2, "base_channels": 6}}


def test_run_over_seeds_pairs_the_grown_model_with_each_host_compared_with(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--max-train-samples", "150", "--epochs", "2", "--threads", "1", "--seeds", "2",
                 "--no-from-scratch", "--compare", "3x4=n_blocks=3,base_channels=4", "--run-dir",
                 str(tmp_path / "seeds")]) == 0
    assert "grown - 3x4" in capsys.readouterr().out
    figures = json.loads((tmp_path / "seeds" / "seeds.json").read_text())
    assert set(figures["differences"]) == {"no growth", "3x4"}


def test_a_users_task_compares_with_hosts_its_module_builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "compared_task.py").write_text(USER_TASK)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["run", "--task", "compared_task:make_task", "--epochs", "2", "--no-from-scratch", "--compare",
                 "width 32=compared_task:wide", "--run-dir", "run"]) == 0
    assert _fixed(tmp_path / "run") == [("width 32", (12 * 32 + 32) + (32 * 2 + 2))]
    capsys.readouterr()
    line = _user_error(["run", "--task", "compared_task:make_task", "--compare", "3x6=n_blocks=3"], capsys)
    assert line == ("morphogen run: error: compare_with: '3x6': host sizes fit only a built-in task's host; task "
                    "'compared_task:make_task' builds its own, so name a function building one "
                    "(package.module:function)")
    line = _user_error(["run", "--task", "compared_task:make_task", "--compare", "wide=compared_task:make_task",
                        "--run-dir", "refused"], capsys)
    assert line == ("morphogen run: error: compare_with: 'wide': its host function returned a tuple, not a host; "
                    "return morphogen.host_from_module(model, slots=..., example_input=...)")  # not the task's host
    line = _user_error(["run", "--task", "compared_task:make_task", "--compare", "3=compared_task:three_classes",
                        "--run-dir", "refused"], capsys)
    assert line == ("morphogen run: error: compare_with: '3': the model's outputs have shape (2, 3) for targets (2,): "
                    "3 class scores on the last dimension, but the task has num_classes=2 (give the model 2 outputs "
                    "there, or the task num_classes=3)")  # before the grown model trains
    assert not (tmp_path / "refused").exists()


def _user_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == EXIT_USER_ERROR
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    return lines[0]


@pytest.mark.parametrize(("argv", "message"), [
    (["--compare", "3x6"], "--compare: expected NAME=SPEC, got '3x6'"),
    (["--compare", "3x6=n_blocks=three"], "--compare '3x6': expected host sizes key=integer separated by commas"),
    (["--compare", "3x6=n_blocks=0"], "compare_with: '3x6': n_blocks: must be >= 1, got 0"),
    (["--compare", "a=n_blocks=3", "--compare", "a=n_blocks=4"], "--compare: each host needs a name of its own"),
    (["--compare", "no growth=n_blocks=3"], "compare_with: 'no growth' names one of the run's own models"),
    (["--compare", "3x6=depth=3"], "compare_with: '3x6': depth"),
    (["--compare", "x=no_such_module:host"], "compare_with: 'x': cannot import 'no_such_module' for "
                                             "no_such_module:host: ModuleNotFoundError"),
])
def test_a_host_to_compare_with_that_cannot_be_had_is_one_line_before_anything_runs(
        argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _user_error(["run", *argv, "--run-dir", str(tmp_path / "run")], capsys)
    assert line.startswith(f"morphogen run: error: {message}")
    assert not (tmp_path / "run").exists()


def test_grow_takes_hosts_from_its_config_and_its_argument_but_not_one_name_from_both(tmp_path: Path) -> None:
    task = morphogen.task_from_data("blobs", (torch.randn(64, 4), torch.randint(0, 2, (64,))),
                                    (torch.randn(32, 4), torch.randint(0, 2, (32,))), num_classes=2)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    host = morphogen.host_from_module(model, ["1"], example_input=torch.zeros(2, 4))
    with pytest.raises(morphogen.ConfigError, match=re.escape("compare_with: 'same' is named by both the config and "
                                                              "the argument")):
        morphogen.grow(task, host, epochs=1, out=io.StringIO(), run_dir=str(tmp_path / "run"),
                       config={"compare_with": {"same": "os.path:join"}}, compare_with={"same": host})
    assert not (tmp_path / "run").exists()
    with pytest.raises(morphogen.ConfigError, match=re.escape("compare_with: 'x': host sizes fit only a built-in "
                                                              "task's host; task 'python' builds its own")):
        morphogen.grow(task, host, epochs=1, out=io.StringIO(), config={"compare_with": {"x": {"n_blocks": 3}}})


def test_a_host_the_flags_name_replaces_the_configs_host_of_that_name_whole(tmp_path: Path) -> None:
    """`--compare a=n_blocks=3` over a config's `[compare_with.a] base_channels = 4` is the host the flag names, not
    one with 3 blocks of 4 channels; the config's other hosts are still compared with."""
    from morphogen.cli import _run_config_and_task, build_parser

    (tmp_path / "compare.toml").write_text('[compare_with.a]\nbase_channels = 4\n[compare_with.b]\nn_blocks = 1\n')
    args = build_parser().parse_args(["run", "--config", str(tmp_path / "compare.toml"), "--compare", "a=n_blocks=3"])
    config, _ = _run_config_and_task(args, load=False)
    assert config.compare_with == {"a": {"n_blocks": 3}, "b": {"n_blocks": 1}}
