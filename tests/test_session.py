"""SessionOptions' `[host]` table: resolved against the task's defaults, checked by the host constructor,
errors as one line naming `host.KEY`, recorded whole in the config dict of a run."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from morphogen.commands.run import RunConfig
from morphogen.config import ConfigError, build_config, config_to_dict
from morphogen.control.trainer import TrainConfig
from morphogen.core.hosts import build_host
from morphogen.session import SessionOptions, load_session_task, resolve_host_size


def test_resolved_host_is_the_task_host_size() -> None:
    assert SessionOptions().host == {}
    assert SessionOptions().with_resolved_host().host == {"n_blocks": 2, "base_channels": 8, "kernel_size": 3}
    assert SessionOptions(task="mnist1d").with_resolved_host().host == {"n_blocks": 2, "base_channels": 8,
                                                                        "kernel_size": 5}
    assert SessionOptions(task="text").with_resolved_host().host["d_model"] == 32


def test_overrides_keep_the_other_defaults() -> None:
    options = SessionOptions(task="digits", host={"base_channels": 4})
    assert options.host == {"base_channels": 4}
    resolved = options.with_resolved_host()
    assert resolved.host == {"n_blocks": 2, "base_channels": 4, "kernel_size": 3}
    assert resolved.with_resolved_host() == resolved


def test_changing_the_task_keeps_only_what_the_user_set() -> None:
    options = dataclasses.replace(SessionOptions(host={"base_channels": 4}), task="mnist1d")
    assert options.with_resolved_host().host == {"n_blocks": 2, "base_channels": 4, "kernel_size": 5}
    with pytest.raises(ValueError, match=r"host\.base_channels: unknown key"):
        dataclasses.replace(options, task="text")


@pytest.mark.parametrize(("config_class"), [RunConfig, TrainConfig])
@pytest.mark.parametrize(
    ("host", "message"),
    [
        ({"foo": 1}, "host.foo: unknown key; accepted: n_blocks, base_channels, kernel_size"),
        ({"base_channels": 0}, "host.base_channels: must be >= 1, got 0"),
        ({"kernel_size": 4}, "host.kernel_size: must be odd and >= 1, got 4"),
        ({"n_blocks": 1.5}, "host.n_blocks: expected an integer, got 1.5"),
        ({"num_classes": 3}, "host.num_classes: unknown key; accepted: n_blocks, base_channels, kernel_size"),
    ],
)
def test_bad_host_tables_name_the_key(config_class: type[SessionOptions], host: dict[str, object],
                                      message: str) -> None:
    with pytest.raises(ConfigError) as error:
        build_config(config_class, {"task": "mnist1d", "host": host})
    assert str(error.value) == message


def test_transformer_host_combinations_are_judged_by_the_constructor() -> None:
    with pytest.raises(ConfigError, match=r"^host.d_model: must be divisible by n_heads \(3\), got 32$"):
        build_config(RunConfig, {"task": "text", "host": {"n_heads": 3}})
    assert resolve_host_size("text", {"n_layers": 6, "n_segments": 3})["n_layers"] == 6


def test_host_that_is_not_a_table() -> None:
    with pytest.raises(ConfigError, match=r"^host: must be a table of host size arguments"):
        build_config(RunConfig, {"host": 8})


def test_config_dict_of_the_resolved_options_records_the_whole_table() -> None:
    config = build_config(RunConfig, {"task": "mnist1d", "host": {"base_channels": 4}})
    assert config_to_dict(config)["host"] == {"base_channels": 4}
    assert config_to_dict(config.with_resolved_host())["host"] == {"n_blocks": 2, "base_channels": 4,
                                                                   "kernel_size": 5}


def test_loaded_task_builds_the_configured_host() -> None:
    small = load_session_task(SessionOptions(host={"base_channels": 4, "n_blocks": 2}, max_train_samples=10), "cpu")
    default = load_session_task(SessionOptions(max_train_samples=10), "cpu")

    def parameters(kwargs: dict[str, int]) -> int:
        return sum(p.numel() for p in build_host("cnn", device="meta", **kwargs).parameters())

    # Conv(1->4, 3x3) + BN(4) + Conv(4->8, 3x3) + BN(8) + Linear(8 -> 10)
    assert parameters(small.host_kwargs) == (1 * 4 * 9 + 2 * 4) + (4 * 8 * 9 + 2 * 8) + (8 * 10 + 10)
    assert parameters(small.host_kwargs) < parameters(default.host_kwargs)
    assert small.train.inputs.device == torch.device("cpu")


@pytest.mark.parametrize("config_class", [RunConfig, TrainConfig])
@pytest.mark.parametrize(("key", "value", "message"), [
    ("run_dir", "", "run_dir: must name a directory, got '' (leave it out for runs_root/<time>-<task>)"),
    ("run_dir", "  ", "run_dir: must name a directory, got '  ' (leave it out for runs_root/<time>-<task>)"),
    ("runs_root", "", "runs_root: must name a directory, got '' (the default is runs)"),
])
def test_an_empty_run_directory_is_refused(config_class: type[SessionOptions], key: str, value: str,
                                           message: str) -> None:
    """An empty path is the current directory: the run's files would land among the user's own."""
    with pytest.raises(ConfigError) as caught:
        build_config(config_class, {key: value})
    assert str(caught.value) == message


@pytest.mark.parametrize(("arguments", "message"), [
    (["run", "--run-dir", "", "--epochs", "1", "--threads", "1"],
     "morphogen run: error: run_dir: must name a directory, got '' (leave it out for runs_root/<time>-<task>)"),
    (["eval", "--policy", "default", "--run-dir", " ", "--episodes", "1"],
     "morphogen eval: error: run_dir: must name a directory, got ' ' (leave it out to record nothing)"),
], ids=["run", "eval"])
def test_run_dir_given_empty_on_the_command_line_writes_nothing_where_it_is_run(
        arguments: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from morphogen.cli import EXIT_USER_ERROR, main

    monkeypatch.chdir(tmp_path)
    assert main(arguments) == EXIT_USER_ERROR
    assert capsys.readouterr().err.splitlines() == [message]
    assert list(tmp_path.iterdir()) == []
