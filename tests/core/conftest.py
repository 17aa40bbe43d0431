"""Shared settings for tests/core."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Run each core test on one intra-op thread: the models here are tiny, and on a busy 2-core machine
    a second spinning thread makes them several times slower, not faster."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
