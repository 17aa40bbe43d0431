"""load_task argument handling shared by all tasks."""

from __future__ import annotations

from pathlib import Path

import pytest

from morphogen.data import TASK_NAMES, DataError, load_task


def test_task_names() -> None:
    assert TASK_NAMES == ("digits", "cifar10", "text")


def test_unknown_task_lists_the_valid_names() -> None:
    with pytest.raises(DataError, match="unknown task 'mnist'; valid task names: digits, cifar10, text"):
        load_task("mnist")


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
