"""Settings for the whole test suite."""

import torch


def pytest_configure() -> None:
    """One intra-op thread: the models under test are tiny, and on a busy 2-core machine a second
    spinning thread makes them several times slower (and timings noisier), not faster."""
    torch.set_num_threads(1)
