"""A batch's inputs (`morphogen.inputs`): one tensor, or a tuple, list or dict of tensors sharing their rows."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from morphogen.inputs import (
    Inputs,
    InputSpec,
    batch_differences,
    problem,
    repeat_rows,
    rows,
    take_rows,
    tensors,
    to_device,
)

BATCH, LENGTH = 5, 7


def tokens(batch: int = BATCH) -> Tensor:
    return torch.arange(batch * LENGTH).reshape(batch, LENGTH)


def mask(batch: int = BATCH) -> Tensor:
    return torch.arange(batch * LENGTH).reshape(batch, LENGTH) % 2 == 0


def structures(batch: int = BATCH) -> dict[str, Inputs]:
    """The same two tensors (one alone for "tensor") in every structure a model can be called with."""
    return {"tensor": tokens(batch), "tuple": (tokens(batch), mask(batch)), "list": [tokens(batch), mask(batch)],
            "dict": {"tokens": tokens(batch), "mask": mask(batch)}}


@pytest.mark.parametrize("kind", ["tensor", "tuple", "list", "dict"])
def test_every_structure_is_a_model_input_and_keeps_its_structure_through_rows(kind: str) -> None:
    inputs = structures()[kind]
    assert problem(inputs) is None
    assert rows(inputs) == BATCH
    taken = take_rows(inputs, slice(1, 3))
    repeated = repeat_rows(inputs, 3)
    picked = take_rows(inputs, torch.tensor([4, 0]))
    for result in (taken, repeated, picked):
        assert type(result) is type(inputs)
    if isinstance(inputs, dict):
        assert isinstance(taken, dict) and list(taken) == ["tokens", "mask"]
    assert rows(taken) == 2 and rows(repeated) == 3 * BATCH and rows(picked) == 2
    for original, part, block, chosen in zip(tensors(inputs), tensors(taken), tensors(repeated), tensors(picked),
                                             strict=True):
        assert torch.equal(part, original[1:3])
        assert torch.equal(block, torch.cat([original] * 3))  # block after block, as configurations are stacked
        assert torch.equal(chosen, original[[4, 0]])


@pytest.mark.parametrize(("inputs", "says"), [
    (torch.tensor(1.0), "scalar tensor"),
    ((torch.zeros(3, 2), torch.zeros(4)), "different numbers of samples (3, 4)"),
    ((torch.zeros(3, 2), [1, 2, 3]), "every input must be a tensor"),
    ((), "0 items"),
    ({"not a name": torch.zeros(3)}, "keys are not all argument names"),
    ({"x": torch.zeros(3), "y": torch.tensor(0.0)}, "scalar tensor"),
    ("tokens", "a str, not a tensor"),
])
def test_what_is_not_a_model_input_is_said_in_one_line(inputs: object, says: str) -> None:
    reason = problem(inputs)
    assert reason is not None and says in reason and "\n" not in reason


@pytest.mark.parametrize("kind", ["tensor", "tuple", "list", "dict"])
def test_inputs_move_to_another_device_in_their_structure(kind: str) -> None:
    inputs = structures()[kind]
    moved = to_device(inputs, "meta")
    assert type(moved) is type(inputs)
    assert all(value.device.type == "meta" for value in tensors(moved))
    assert [(value.shape, value.dtype) for value in tensors(moved)] == [
        (value.shape, value.dtype) for value in tensors(inputs)]
    assert all(value.device.type == "cpu" for value in tensors(inputs))  # the batch itself is not moved


@pytest.mark.parametrize("kind", ["tensor", "tuple", "list", "dict"])
def test_a_spec_is_what_flop_counts_are_keyed_by_and_made_on(kind: str) -> None:
    spec = InputSpec.of(structures()[kind])
    assert spec.kind == kind and spec.rows == BATCH
    assert spec == InputSpec.of(structures()[kind]) and hash(spec) == hash(InputSpec.of(structures()[kind]))
    # Another batch size: another spec, the same per-sample key (its counts scale from the same count).
    smaller = InputSpec.of(structures(2)[kind])
    assert smaller != spec and smaller.per_sample == spec.per_sample and smaller == spec.with_rows(2)
    zeros = spec.with_rows(3).zeros("meta")
    assert type(zeros) is type(structures()[kind]) and InputSpec.of(zeros) == spec.with_rows(3)
    assert all(value.device.type == "meta" for value in tensors(zeros))
    if kind == "dict":
        assert spec.keys == ("tokens", "mask") and isinstance(zeros, dict) and list(zeros) == ["tokens", "mask"]


def test_specs_differ_by_structure_dtype_shape_and_argument_names() -> None:
    specs = {name: InputSpec.of(inputs) for name, inputs in structures().items()}
    assert len({spec.per_sample for spec in specs.values()}) == 4  # tensor, tuple, list, dict: four keys
    assert InputSpec.of(tokens()) == InputSpec.tensor((BATCH, LENGTH), torch.int64)
    assert InputSpec.of(tokens().int()) != InputSpec.of(tokens())
    assert InputSpec.of(tokens()[:, :3]).per_sample != InputSpec.of(tokens()).per_sample
    renamed = InputSpec.of({"ids": tokens(), "mask": mask()})
    assert renamed != specs["dict"] and renamed.per_sample != specs["dict"].per_sample
    swapped = InputSpec.of((mask(), tokens()))
    assert swapped.per_sample != specs["tuple"].per_sample  # argument order matters


def test_zeros_of_a_spec_are_zeros_on_the_cpu_by_default() -> None:
    spec = InputSpec.of({"tokens": tokens(), "mask": mask()})
    zeros = spec.zeros()
    assert isinstance(zeros, dict)
    assert zeros["tokens"].dtype == torch.int64 and zeros["mask"].dtype == torch.bool
    assert all(value.device.type == "cpu" and not value.any() for value in zeros.values())


def test_a_batch_of_another_number_of_inputs_is_a_difference() -> None:
    """Three input tensors against two (or two against three) differ, though each tensor they share agrees."""
    two = ((tokens(), mask()), torch.zeros(BATCH))
    three = ((tokens(), mask(), mask()), torch.zeros(BATCH))
    assert batch_differences(three, two) == ["inputs are a tuple of 3 tensors, not of 2"]
    assert batch_differences(two, three) == ["inputs are a tuple of 2 tensors, not of 3"]
    assert batch_differences(two, two) == []
