"""A model's inputs: one tensor, or several tensors that share their first (sample) dimension.

A batch's inputs are what a model is called with: a `Tensor` (`model(x)`), a tuple or list of tensors
(positional arguments, `model(tokens, mask)`) or a dict of tensors by name (keyword arguments,
`model(tokens=..., mask=...)`). Every tensor holds one row per sample. The functions here are the only
places that look inside that structure: how many samples a batch holds, some of its rows, its rows
repeated, the batch on another device. They are pure; none syncs with a device.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Union

import torch
from torch import Tensor

#: A model's inputs: one tensor, or a tuple, list or dict of tensors with one row per sample each.
Inputs = Union[Tensor, tuple[Tensor, ...], list[Tensor], dict[str, Tensor]]  # noqa: UP007  # a runtime alias
#: Most tensors one sample's inputs may be made of: more is not a batch but a mistake.
MAX_INPUT_TENSORS = 64


def problem(inputs: object) -> str | None:
    """Why `inputs` are not a model's inputs (one line), or None when they are."""
    if isinstance(inputs, Tensor):
        return None if inputs.dim() > 0 else "a scalar tensor, without a sample dimension"
    if isinstance(inputs, Mapping):
        if not all(isinstance(key, str) and key.isidentifier() for key in inputs):
            return "a dict whose keys are not all argument names"
        return _problem_of_values(list(inputs.values()), "dict")
    if isinstance(inputs, (tuple, list)):
        return _problem_of_values(list(inputs), type(inputs).__name__)
    return f"a {type(inputs).__name__}, not a tensor or a tuple or dict of tensors"


def _problem_of_values(values: list[object], kind: str) -> str | None:
    if not values or len(values) > MAX_INPUT_TENSORS:
        return f"a {kind} of {len(values)} items (a model takes 1 to {MAX_INPUT_TENSORS} tensors)"
    if not all(isinstance(value, Tensor) for value in values):
        kinds = ", ".join(type(value).__name__ for value in values[:8])
        return f"a {kind} of {kinds}: every input must be a tensor"
    checked = [value for value in values if isinstance(value, Tensor)]
    if any(value.dim() == 0 for value in checked):
        return f"a {kind} holding a scalar tensor, without a sample dimension"
    sizes = {int(value.shape[0]) for value in checked}
    if len(sizes) > 1:
        return f"a {kind} of tensors with different numbers of samples ({', '.join(map(str, sorted(sizes)))})"
    return None


def tensors(inputs: Inputs) -> list[Tensor]:
    """The tensors of `inputs`, in argument order."""
    if isinstance(inputs, Tensor):
        return [inputs]
    return list(inputs.values()) if isinstance(inputs, dict) else list(inputs)


def dtype_mismatch(inputs: Inputs, parameters: Iterable[Tensor], error: BaseException | None = None) -> str:
    """Where a floating-point input is of another dtype than the first floating-point parameter, a hint saying so
    (for the message of the error it caused), else "". Not a refusal: a model may cast its inputs itself.
    Given the `error` the model raised, integer inputs (uint8 pixels) get the hint too where its message is about
    a type: ids an embedding reads are integers, and a model of them fails for other reasons."""
    dtype = next((p.dtype for p in parameters if p.is_floating_point()), None)
    given = next((t.dtype for t in tensors(inputs) if t.is_floating_point() and t.dtype != dtype), None)
    if given is None and error is not None and "type" in str(error).lower():
        given = next((t.dtype for t in tensors(inputs) if not (t.is_floating_point() or t.is_complex())), None)
    if dtype is None or given is None:
        return ""
    scaled = "" if given.is_floating_point else ", scaled as the model expects"
    return (f"the inputs are {str(given).removeprefix('torch.')}, the model's parameters "
            f"{str(dtype).removeprefix('torch.')}: convert the inputs (x.to({dtype}){scaled})")


def map_tensors(function: Callable[[Tensor], Tensor], inputs: Inputs) -> Inputs:
    """`inputs` with `function` applied to each tensor, in the same structure."""
    if isinstance(inputs, Tensor):
        return function(inputs)
    if isinstance(inputs, dict):
        return {key: function(value) for key, value in inputs.items()}
    mapped = [function(value) for value in inputs]
    return tuple(mapped) if isinstance(inputs, tuple) else mapped


def detached(inputs: Inputs) -> Inputs:
    """`inputs` without autograd history: tensors that require grad detached (a view, no copy), the others as they
    are (the same objects)."""
    return map_tensors(lambda value: value.detach() if value.requires_grad else value, inputs)


def rows(inputs: Inputs) -> int:
    """Samples in the batch: the first dimension of its tensors."""
    return int(tensors(inputs)[0].shape[0])


def names(inputs: Inputs) -> tuple[str | int, ...]:
    """What names each tensor of a batch: a dict's keys, a tuple's or list's positions; none for one tensor."""
    if isinstance(inputs, Tensor):
        return ()
    return tuple(inputs) if isinstance(inputs, dict) else tuple(range(len(inputs)))


def names_problem(expected: tuple[str | int, ...], inputs: Inputs) -> str | None:
    """Why a batch does not give the inputs a host was traced with (`expected`, its example's `names`), or None.

    A host reads the inputs its example gave and fixed the others at their defaults while tracing: an input the
    example left out would be ignored without a word (an attention mask), and one it gave would be missing."""
    given = names(inputs)
    if not expected or not given or set(given) == set(expected):
        return None
    if isinstance(inputs, dict):
        extra = [key for key in given if key not in expected]
        if extra:
            return (f"the inputs hold {', '.join(map(repr, extra))}, which the host's example_input did not give: "
                    "it was traced without them and would ignore them; build the host with an example_input of "
                    "every input the data gives (or leave them out of the data)")
        missing = [key for key in expected if key not in given]
        return (f"the inputs lack {', '.join(map(repr, missing))}, which the host's example_input gave; give the "
                "host every input it was built with")
    return (f"the inputs are {len(given)} tensors, but the host's example_input gave {len(expected)}: build the "
            "host with an example_input of as many inputs as the data gives")


def refuse_other_names(expected: tuple[str | int, ...], inputs: Inputs) -> None:
    """A `ValueError` (`names_problem`) where a batch of several inputs does not give those the host was traced with;
    a lone tensor has nothing to name."""
    problem = None if isinstance(inputs, Tensor) else names_problem(expected, inputs)
    if problem is not None:
        raise ValueError(problem)


def take_rows(inputs: Inputs, index: slice | Tensor) -> Inputs:
    """The rows `index` (a slice, or a tensor of row indices) of every tensor."""
    if isinstance(index, slice):
        return map_tensors(lambda value: value[index], inputs)
    return map_tensors(lambda value: value.index_select(0, index), inputs)


def repeat_rows(inputs: Inputs, times: int) -> Inputs:
    """Every tensor repeated `times` along the sample dimension, block after block ((times*B, ...))."""
    return map_tensors(lambda value: value.repeat(times, *([1] * (value.dim() - 1))), inputs)


def to_device(inputs: Inputs, device: torch.device | str, *, non_blocking: bool = False) -> Inputs:
    """`inputs` on `device`; tensors already there are not copied."""
    return map_tensors(lambda value: value.to(device, non_blocking=non_blocking), inputs)


def call(function: Callable[..., object], inputs: Inputs) -> object:
    """`function` called as a model is called with `inputs`: positionally for a tuple or list, by name for a dict."""
    if isinstance(inputs, Tensor):
        return function(inputs)
    if isinstance(inputs, dict):
        return function(**inputs)
    return function(*inputs)


@dataclass(frozen=True)
class InputSpec:
    """The shapes and dtypes of a batch's inputs, without their values: what FLOP counts are keyed by and made on.

    `rows` is the batch's samples; `samples` holds one sample's shape and the dtype of each tensor, in argument
    order; `kind` is the structure ("tensor", "tuple", "list" or "dict", with `keys`). Hashable.
    """

    rows: int
    samples: tuple[tuple[tuple[int, ...], torch.dtype], ...]
    kind: str = "tensor"
    keys: tuple[str, ...] = ()

    @classmethod
    def of(cls, inputs: Inputs) -> InputSpec:
        """The spec of a batch (reads shapes only: no sync)."""
        kind = "tensor" if isinstance(inputs, Tensor) else "dict" if isinstance(inputs, dict) else type(
            inputs).__name__
        keys = tuple(inputs) if isinstance(inputs, dict) else ()
        return cls(rows(inputs), tuple((tuple(value.shape[1:]), value.dtype) for value in tensors(inputs)), kind,
                   keys)

    @classmethod
    def tensor(cls, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> InputSpec:
        """The spec of one tensor of `shape` (samples first) and `dtype`."""
        return cls(int(shape[0]), ((tuple(shape[1:]), dtype),))

    @property
    def per_sample(self) -> tuple[object, ...]:
        """Everything but the number of rows: equal for batches whose counts scale with their size."""
        return (self.samples, self.kind, self.keys)

    def with_rows(self, rows: int) -> InputSpec:
        return InputSpec(rows, self.samples, self.kind, self.keys)

    def zeros(self, device: torch.device | str | None = None) -> Inputs:
        """A batch of zeros of this spec (FLOP counts do not depend on the values)."""
        values = [torch.zeros((self.rows, *shape), dtype=dtype, device=device) for shape, dtype in self.samples]
        if self.kind == "tensor":
            return values[0]
        if self.kind == "dict":
            return dict(zip(self.keys, values, strict=True))
        return tuple(values) if self.kind == "tuple" else values


def batch_differences(batch: tuple[Inputs, Tensor], reference: tuple[Inputs, Tensor]) -> list[str]:
    """How `batch` (inputs, targets) differs from `reference` in structure, dtypes and shapes after the batch
    dimension, for people ("inputs float64 [8, 8, 3], not float32 [3, 8, 8]"); empty where they agree."""
    (inputs, targets), (expected_inputs, expected_targets) = batch, reference
    given, expected = InputSpec.of(inputs), InputSpec.of(expected_inputs)
    if (given.kind, given.keys) != (expected.kind, expected.keys):
        return [f"inputs are a {given.kind}{_keys_of(given)}, not a {expected.kind}{_keys_of(expected)}"]
    if len(given.samples) != len(expected.samples):
        return [f"inputs are a {given.kind} of {len(given.samples)} tensors, not of {len(expected.samples)}"]

    def described(shape: tuple[int, ...], dtype: torch.dtype) -> str:
        return f"{str(dtype).removeprefix('torch.')} {list(shape)}"

    differences = [f"{'inputs' if len(given.samples) == 1 else f'input {index}'} {described(*sample)}, not "
                   f"{described(*wanted)}"
                   for index, (sample, wanted) in enumerate(zip(given.samples, expected.samples, strict=False))
                   if sample != wanted]
    if (targets.dtype, targets.shape[1:]) != (expected_targets.dtype, expected_targets.shape[1:]):
        differences.append(f"targets {described(tuple(targets.shape[1:]), targets.dtype)}, not "
                           f"{described(tuple(expected_targets.shape[1:]), expected_targets.dtype)}")
    return differences


def _keys_of(spec: InputSpec) -> str:
    return f" of {', '.join(map(repr, spec.keys))}" if spec.keys else ""
