"""DeviceDataset: one permutation per epoch, every sample once, reproducible, device-aware."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from morphogen.data import DeviceDataset


def numbered_dataset(count: int, device: str = "cpu") -> DeviceDataset:
    """Sample i has input row [i, i, i] and target 10 * i, so pairing and coverage are checkable."""
    indices = torch.arange(count, device=device)
    return DeviceDataset(indices[:, None].repeat(1, 3).float(), indices * 10)


def epoch_sample_ids(
    dataset: DeviceDataset,
    batch_size: int,
    *,
    generator: torch.Generator | None = None,
    shuffle: bool = True,
    drop_last: bool = False,
) -> list[int]:
    """The sample ids of one epoch in the order they were yielded."""
    ids: list[int] = []
    batches = dataset.iterate_batches(batch_size, generator=generator, shuffle=shuffle, drop_last=drop_last)
    for inputs, targets in batches:
        assert torch.equal(inputs[:, 0].long() * 10, targets), "inputs and targets lost their pairing"
        ids.extend(targets.div(10, rounding_mode="floor").tolist())
    return ids


def test_rejects_mismatched_lengths_and_devices() -> None:
    with pytest.raises(ValueError, match="same first dimension"):
        DeviceDataset(torch.zeros(4, 2), torch.zeros(3))
    with pytest.raises(TypeError, match="torch tensors"):
        DeviceDataset([[1.0]], torch.zeros(1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="one device"):
        DeviceDataset(torch.zeros(4, 2), torch.zeros(4, device="meta"))


@pytest.mark.parametrize("drop_last", [False, True])
def test_epoch_covers_every_sample_once(drop_last: bool) -> None:
    dataset = numbered_dataset(103)
    generator = torch.Generator().manual_seed(5)
    ids = epoch_sample_ids(dataset, 10, generator=generator, drop_last=drop_last)
    if drop_last:
        assert len(ids) == 100 and len(set(ids)) == 100 and set(ids) <= set(range(103))
    else:
        assert sorted(ids) == list(range(103))
    assert ids != sorted(ids), "shuffle=True should change the order"


def test_batch_sizes() -> None:
    dataset = numbered_dataset(103)
    sizes = [len(targets) for _, targets in dataset.iterate_batches(10)]
    assert sizes == [10] * 10 + [3]
    assert [len(targets) for _, targets in numbered_dataset(100).iterate_batches(10)] == [10] * 10
    assert len(list(dataset.iterate_batches(10, drop_last=True))) == 10


def test_seeded_generator_reproduces_the_order() -> None:
    dataset = numbered_dataset(64)
    first = epoch_sample_ids(dataset, 8, generator=torch.Generator().manual_seed(1))
    again = epoch_sample_ids(dataset, 8, generator=torch.Generator().manual_seed(1))
    other = epoch_sample_ids(dataset, 8, generator=torch.Generator().manual_seed(2))
    assert first == again
    assert first != other


def test_consecutive_epochs_differ_with_one_generator() -> None:
    dataset = numbered_dataset(64)
    generator = torch.Generator().manual_seed(3)
    assert epoch_sample_ids(dataset, 8, generator=generator) != epoch_sample_ids(
        dataset, 8, generator=generator
    )


def test_no_shuffle_yields_stored_order() -> None:
    assert epoch_sample_ids(numbered_dataset(25), 7, shuffle=False) == list(range(25))


def test_augment_sees_inputs_and_generator_but_not_targets() -> None:
    dataset = numbered_dataset(20)
    generator = torch.Generator().manual_seed(0)
    seen: list[torch.Generator | None] = []

    def negate(inputs: Tensor, augment_generator: torch.Generator | None) -> Tensor:
        seen.append(augment_generator)
        return -inputs

    batches = list(dataset.iterate_batches(8, generator=generator, augment=negate))
    assert len(seen) == 3 and all(item is generator for item in seen)
    for inputs, targets in batches:
        assert torch.equal(-inputs[:, 0].long() * 10, targets)


def test_cpu_generator_drives_a_dataset_on_another_device() -> None:
    dataset = numbered_dataset(30).to("meta")
    assert dataset.device.type == "meta"
    batches = list(dataset.iterate_batches(8, generator=torch.Generator().manual_seed(0)))
    assert [inputs.shape[0] for inputs, _ in batches] == [8, 8, 8, 6]
    assert all(inputs.device.type == "meta" and targets.device.type == "meta" for inputs, targets in batches)


def test_bad_batch_size_fails_at_the_call() -> None:
    dataset = numbered_dataset(5)
    with pytest.raises(ValueError, match="positive int"):
        dataset.iterate_batches(0)
    with pytest.raises(ValueError, match="positive int"):
        next(dataset.iterate_batches(-1, drop_last=True))


def test_to_moves_both_tensors() -> None:
    dataset = numbered_dataset(4)
    assert dataset.to("cpu").inputs is dataset.inputs
    moved = dataset.to(torch.device("meta"))
    assert moved.inputs.device.type == "meta" and moved.targets.device.type == "meta"
    assert len(moved) == 4
