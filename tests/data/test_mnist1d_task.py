"""The mnist1d task: the published sizes, generated offline by the package's own generator, cached,
deterministic, and leaving the caller's random streams alone."""

from __future__ import annotations

import random
import socket

import numpy as np
import pytest
import torch

from morphogen.data import Task, load_task
from morphogen.data.mnist1d import generate_mnist1d


@pytest.fixture(scope="module")
def mnist1d() -> Task:
    return load_task("mnist1d")


def test_published_sizes_shapes_and_preset(mnist1d: Task) -> None:
    assert mnist1d.train.inputs.shape == (4000, 1, 40)
    assert mnist1d.validation.inputs.shape == (1000, 1, 40)
    assert mnist1d.train.inputs.dtype == torch.float32 and mnist1d.train.targets.dtype == torch.long
    assert set(mnist1d.train.targets.tolist()) == set(range(10))
    assert set(mnist1d.validation.targets.tolist()) == set(range(10))
    assert mnist1d.topology == "cnn1d" and mnist1d.objective == "classification"
    assert mnist1d.host_kwargs == {"num_classes": 10, "in_channels": 1, "n_blocks": 2, "base_channels": 8,
                                   "kernel_size": 5}
    assert mnist1d.batch_size == 100 and mnist1d.augment is None and mnist1d.vocabulary is None


def test_generated_offline_by_the_package_generator_without_touching_global_rngs(
        mnist1d: Task, monkeypatch: pytest.MonkeyPatch) -> None:
    from mnist1d.data import get_dataset_args, make_dataset

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("mnist1d must be generated offline")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    random.seed(7)
    np.random.seed(7)
    python_state, numpy_draw = random.getstate(), np.random.get_state()[1].copy()
    generate_mnist1d.cache_clear()
    regenerated = generate_mnist1d()
    assert random.getstate() == python_state
    assert np.array_equal(np.random.get_state()[1], numpy_draw)

    reference = make_dataset(get_dataset_args())  # reseeds the global RNGs itself (seed 42)
    np.testing.assert_array_equal(regenerated.train_signals, reference["x"])
    np.testing.assert_array_equal(regenerated.test_labels, reference["y_test"])
    np.testing.assert_array_equal(mnist1d.train.inputs[:, 0].numpy(), reference["x"].astype(np.float32))
    np.testing.assert_array_equal(mnist1d.train.targets.numpy(), reference["y"])
    np.testing.assert_array_equal(mnist1d.validation.inputs[:, 0].numpy(), reference["x_test"].astype(np.float32))
    np.testing.assert_array_equal(mnist1d.validation.targets.numpy(), reference["y_test"])


def test_repeated_loads_reuse_the_cached_arrays_without_aliasing_them(mnist1d: Task) -> None:
    assert generate_mnist1d() is generate_mnist1d()
    again = load_task("mnist1d")
    assert torch.equal(again.train.inputs, mnist1d.train.inputs)
    again.train.inputs.zero_()  # a caller that writes into its task does not change the next load
    assert torch.equal(load_task("mnist1d").train.inputs, mnist1d.train.inputs)
    assert not generate_mnist1d().train_signals.flags.writeable


def test_seed_only_picks_the_capped_subset(mnist1d: Task) -> None:
    capped = load_task("mnist1d", max_train_samples=100, seed=1)
    assert len(capped.train) == 100
    assert torch.equal(capped.validation.inputs, mnist1d.validation.inputs)
    full_rows = {tuple(row) for row in mnist1d.train.inputs.flatten(1).tolist()}
    assert all(tuple(row) in full_rows for row in capped.train.inputs.flatten(1).tolist())
    assert torch.equal(load_task("mnist1d", max_train_samples=100, seed=1).train.inputs, capped.train.inputs)
    assert not torch.equal(load_task("mnist1d", max_train_samples=100, seed=2).train.inputs, capped.train.inputs)
    assert torch.equal(load_task("mnist1d", seed=5).train.inputs, mnist1d.train.inputs)


def test_host_size_overrides_reach_the_host_kwargs() -> None:
    task = load_task("mnist1d", max_train_samples=10, host={"base_channels": 4, "n_blocks": 2})
    assert task.host_kwargs == {"num_classes": 10, "in_channels": 1, "n_blocks": 2, "base_channels": 4,
                                "kernel_size": 5}
