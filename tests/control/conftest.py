"""Fixtures shared by the controller tests."""

import pytest

from morphogen.data import Task, load_task


@pytest.fixture(scope="module")
def digits() -> Task:
    """A small digits task: 200 training images keep a training round to a second or two."""
    return load_task("digits", max_train_samples=200)
