"""The digits task: shapes, a fixed stratified 80/20 split, and train-split standardization."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from morphogen.data import Task, load_task
from morphogen.data.digits import read_digits, stratified_split


@pytest.fixture(scope="module")
def digits() -> Task:
    return load_task("digits")


def test_shapes_dtypes_and_preset(digits: Task) -> None:
    # 1797 images; a 20% test share rounds up to 360.
    assert digits.train.inputs.shape == (1437, 1, 8, 8)
    assert digits.validation.inputs.shape == (360, 1, 8, 8)
    assert digits.train.inputs.dtype == torch.float32 and digits.train.targets.dtype == torch.long
    assert digits.train.targets.shape == (1437,) and digits.validation.targets.shape == (360,)
    assert digits.topology == "cnn" and digits.objective == "classification"
    assert digits.host_kwargs == {
        "num_classes": 10,
        "in_channels": 1,
        "n_blocks": 2,
        "base_channels": 8,
        "kernel_size": 3,
    }
    assert digits.augment is None and digits.vocabulary is None and digits.batch_size == 64


def test_training_split_is_standardized(digits: Task) -> None:
    pixels = digits.train.inputs.double().numpy()
    assert abs(pixels.mean()) < 1e-6
    assert abs(pixels.std() - 1.0) < 1e-6


def test_split_partitions_the_dataset_with_labels_intact(digits: Task) -> None:
    """Undo the affine standardization and find every original (image, label) exactly once."""
    train_pixels = digits.train.inputs.double()
    levels = torch.unique(train_pixels)
    assert len(levels) == 17, "raw pixels take the 17 values 0..16"
    step = float(levels[1] - levels[0])
    lowest = float(levels[0])

    def raw_samples(inputs: torch.Tensor, targets: torch.Tensor) -> list[tuple[tuple[int, ...], int]]:
        raw = torch.round((inputs.double() - lowest) / step).long().flatten(1)
        return [(tuple(row), label) for row, label in zip(raw.tolist(), targets.tolist(), strict=True)]

    ours = raw_samples(digits.train.inputs, digits.train.targets)
    ours += raw_samples(digits.validation.inputs, digits.validation.targets)
    original = load_digits()
    expected = [
        (tuple(int(value) for value in image.ravel()), int(label))
        for image, label in zip(original.images, original.target, strict=True)
    ]
    assert Counter(ours) == Counter(expected)


def test_split_is_stratified(digits: Task) -> None:
    all_counts = np.bincount(load_digits().target, minlength=10)
    validation_counts = np.bincount(digits.validation.targets.numpy(), minlength=10)
    assert np.all(np.abs(validation_counts - 0.2 * all_counts) <= 1)


def test_split_is_fixed_and_seed_only_picks_the_capped_subset(digits: Task) -> None:
    reseeded = load_task("digits", seed=123)
    assert torch.equal(reseeded.train.inputs, digits.train.inputs)
    assert torch.equal(reseeded.validation.inputs, digits.validation.inputs)

    capped = load_task("digits", max_train_samples=100, seed=1)
    assert len(capped.train) == 100
    assert torch.equal(capped.validation.inputs, digits.validation.inputs)
    full_rows = {tuple(row) for row in digits.train.inputs.flatten(1).tolist()}
    assert all(tuple(row) in full_rows for row in capped.train.inputs.flatten(1).tolist())
    assert torch.equal(load_task("digits", max_train_samples=100, seed=1).train.inputs, capped.train.inputs)
    assert not torch.equal(
        load_task("digits", max_train_samples=100, seed=2).train.inputs, capped.train.inputs
    )
    assert len(load_task("digits", max_train_samples=10_000).train) == 1437


def test_tensors_are_created_on_the_requested_device() -> None:
    task = load_task("digits", device="meta")
    for dataset in (task.train, task.validation):
        assert dataset.inputs.device.type == "meta" and dataset.targets.device.type == "meta"


def test_the_digits_file_is_what_scikit_learn_loads() -> None:
    images, labels = read_digits()
    reference = load_digits()
    assert np.array_equal(images, reference.images) and np.array_equal(labels, reference.target)


@pytest.mark.parametrize("seed", [0, 1, 7])
@pytest.mark.parametrize("fraction", [0.2, 0.1])
@pytest.mark.parametrize("labels", ["digits", "ties"])
def test_stratified_split_selects_what_train_test_split_selects(seed: int, fraction: float, labels: str) -> None:
    """The same sets as scikit-learn's stratified `train_test_split`, also where class remainders tie."""
    y = read_digits()[1] if labels == "digits" else np.repeat(np.arange(7), [13, 13, 13, 9, 9, 5, 3])
    train, test = train_test_split(np.arange(len(y)), test_size=fraction, stratify=y, random_state=seed)
    ours = stratified_split(y, fraction, seed)
    assert np.array_equal(ours[0], np.sort(train)) and np.array_equal(ours[1], np.sort(test))
