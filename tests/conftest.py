"""Settings and fixtures for the whole test suite."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch

SYNC_METHODS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__")


def pytest_configure() -> None:
    """One intra-op thread: the models under test are tiny, and on a busy 2-core machine a second
    spinning thread makes them several times slower (and timings noisier), not faster."""
    torch.set_num_threads(1)


@pytest.fixture
def sync_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Records every Tensor method call that would synchronize a device with the host."""
    calls: list[str] = []
    for name in SYNC_METHODS:
        original = getattr(torch.Tensor, name)

        def counted(
            self: torch.Tensor, *args: object, _name: str = name, _original: Callable[..., object] = original
        ) -> object:
            calls.append(_name)
            return _original(self, *args)

        monkeypatch.setattr(torch.Tensor, name, counted)
    yield calls


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    """Compiled graphs and dynamo's counters are global: a compile test starts and ends with them empty
    (modules that compile use it for every test: `pytestmark = pytest.mark.usefixtures("fresh_dynamo")`)."""
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()
