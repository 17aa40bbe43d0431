"""load_task argument handling shared by all tasks."""

from __future__ import annotations

from pathlib import Path

import pytest

from morphogen.core.hosts import host_size_arguments
from morphogen.data import DEFAULT_HOST_SIZES, TASK_NAMES, TASK_TOPOLOGIES, DataError, host_size, load_task


def test_task_names() -> None:
    assert TASK_NAMES == ("digits", "cifar10", "text", "mnist1d")


def test_unknown_task_lists_the_valid_names() -> None:
    with pytest.raises(DataError, match="unknown task 'mnist'; valid task names: digits, cifar10, text, mnist1d"):
        load_task("mnist")


@pytest.mark.parametrize("task", TASK_NAMES)
def test_default_host_size_is_every_size_argument_of_the_task_host(task: str) -> None:
    """The data layer cannot import the hosts, so this keeps its tables in step with their constructors."""
    assert tuple(DEFAULT_HOST_SIZES[task]) == host_size_arguments(TASK_TOPOLOGIES[task])
    assert host_size(task) == DEFAULT_HOST_SIZES[task]


def test_host_size_overrides_and_their_errors() -> None:
    assert host_size("digits", {"base_channels": 4}) == {"n_blocks": 2, "base_channels": 4, "kernel_size": 3}
    with pytest.raises(DataError) as error:
        host_size("digits", {"d_model": 8})
    assert str(error.value) == "host.d_model: unknown key; accepted: n_blocks, base_channels, kernel_size"
    with pytest.raises(DataError, match=r"^host\.num_classes: unknown key"):
        host_size("digits", {"num_classes": 3})
    with pytest.raises(DataError, match=r"^host\.base_channels: must be >= 1, got 0$"):
        load_task("digits", host={"base_channels": 0})
    with pytest.raises(DataError, match=r"^host\.n_blocks: expected an integer, got '2'$"):
        host_size("mnist1d", {"n_blocks": "2"})
    assert DEFAULT_HOST_SIZES["digits"] == {"n_blocks": 2, "base_channels": 8, "kernel_size": 3}  # unchanged


def test_text_windows_follow_the_host_block_size(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 20)
    task = load_task("text", text_file=corpus, host={"block_size": 16, "d_model": 32})
    assert task.train.inputs.shape[1] == 16 and task.validation.inputs.shape[1] == 16
    assert task.host_kwargs["block_size"] == 16 and task.host_kwargs["d_model"] == 32


def test_data_error_is_a_value_error() -> None:
    assert issubclass(DataError, ValueError)


@pytest.mark.parametrize("cap", [0, -3, 2.5, True])
def test_bad_max_train_samples(cap: object) -> None:
    with pytest.raises(DataError, match="max_train_samples must be None or a positive int"):
        load_task("digits", max_train_samples=cap)  # type: ignore[arg-type]


def test_arguments_the_task_does_not_read_warn(tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match="ignores text_file"):
        load_task("digits", text_file="corpus.txt")
    with pytest.warns(UserWarning, match="ignores data_dir"):
        load_task("digits", data_dir=str(tmp_path))
