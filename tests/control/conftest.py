"""Fixtures shared by the controller tests."""

import pytest

from morphogen.data import Task, load_task


@pytest.fixture(scope="module")
def digits() -> Task:
    """A small digits task: 200 training images keep a training round to a second or two."""
    return load_task("digits", max_train_samples=200)


@pytest.fixture(scope="module")
def mnist1d_three_blocks() -> Task:
    """A small mnist1d task on a 3-block host (3 slots, against digits' 2): 200 training signals."""
    return load_task("mnist1d", max_train_samples=200, host={"n_blocks": 3})
