"""A user's own task: their tensors, `Dataset` or `DataLoader`s, with their loss and metric.

`task_from_data(name, train, validation, ...)` accepts for each split
- a pair `(inputs, targets)` of tensors: held on the device as a `DeviceDataset` (the fast path);
- a `torch.utils.data.Dataset` of `(input, target)` samples: batched by a `DataLoader` each epoch, in an
  order drawn from the episode's generator, so runs are reproducible;
- a `DataLoader` (or any iterable that can be iterated once per epoch) of `(inputs, targets)` batches:
  used as it is, its own batch size and order, streamed batch by batch (nothing forces it into memory).
Batches of the last two are moved to the task's device as they come. The inputs of a model of several inputs
are a tuple (its positional arguments) or a dict (by name) of tensors (`morphogen.inputs`), in every form above.
With `target_key`, a split or batch may instead be one dict of tensors (as a Hugging Face dataset in torch
format gives them): the entry under that key is the targets, the others the model's inputs by name.
A batch that is neither, or whose targets do not match its inputs in number, is a `DataError` naming the split.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, default_collate

from morphogen.data.datasets import Augmentation, DeviceDataset
from morphogen.data.errors import DataError
from morphogen.data.tasks import CLASS_DIMS, BatchSource, Task
from morphogen.devices import unavailable
from morphogen.inputs import Inputs, detached, rows, tensors, to_device
from morphogen.inputs import problem as inputs_problem
from morphogen.telemetry.story import NEGATIVE_LOSS

DEFAULT_BATCH_SIZE = 64
IGNORE_INDEX = -100
"""The target that the built-in cross-entropy leaves out (torch's default `ignore_index`: padding's usual label);
validation leaves it out of the loss's mean and of the accuracy too, and it is never a class index to check."""
#: Topologies a user's host may have (see `morphogen.core.module_host`); the data layer names them as strings.
USER_TOPOLOGIES = ("cnn", "cnn1d", "transformer", "mlp")
LossFunction = Callable[[Tensor, Tensor], Tensor]
_CHECKED_VALUES_PER_CHUNK = 1 << 24
"""Values read at once where `task_from_data` checks a split's targets or inputs (16M: 128 MiB of int64)."""


class StreamedBatches:
    """Batches from a user's `Dataset` or loader, moved to `device` one at a time."""

    def __init__(self, data: Dataset[Any] | Iterable[Any], device: torch.device, split: str,
                 target_key: str | None = None) -> None:
        self.data, self.split, self.target_key = data, split, target_key
        self._device = device

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def is_dataset(self) -> bool:
        """A `Dataset` of samples (batched here: map-style shuffled, an `IterableDataset` in its own order) rather
        than a loader (batched by its owner). Every `Dataset` has `__getitem__`, an `IterableDataset` too."""
        return isinstance(self.data, Dataset) and not isinstance(self.data, DataLoader)

    def __len__(self) -> int:
        """Samples per epoch when the data can say (a loader of unknown length counts 0)."""
        data = self.data.dataset if isinstance(self.data, DataLoader) else self.data
        try:
            return len(data)  # type: ignore[arg-type]
        except TypeError:
            return 0

    def iterate_batches(self, batch_size: int, *, generator: torch.Generator | None = None, shuffle: bool = True,
                        augment: Augmentation | None = None,
                        drop_last: bool = False) -> Iterator[tuple[Inputs, Tensor]]:
        """One epoch of batches on the task's device. A `Dataset` is batched by `batch_size` (shuffled with
        `generator` when `shuffle`); a loader keeps its own batching."""
        if self.is_dataset and not isinstance(self.data, IterableDataset) and len(self) == 0:
            return  # no samples: no batch (torch's samplers refuse an empty Dataset with a ValueError)
        if self.is_dataset:
            cpu_generator = generator if generator is not None and generator.device.type == "cpu" else None
            ordered = isinstance(self.data, IterableDataset)  # a stream: DataLoader cannot shuffle it
            batches: Iterable[Any] = DataLoader(self.data, batch_size=batch_size,  # type: ignore[arg-type]
                                                shuffle=shuffle and not ordered,
                                                generator=None if ordered else cpu_generator, drop_last=drop_last,
                                                collate_fn=functools.partial(_collated, split=self.split))
        else:
            batches = cast(Iterable[Any], self.data)  # not a Dataset: a loader or another iterable of batches
        for index, batch in enumerate(batches):
            inputs, targets = self._checked(batch, index)
            # Detached as a DeviceDataset's tensors are: a sample computed with autograd on is data, not a graph.
            inputs = to_device(detached(inputs), self._device, non_blocking=True)
            targets = targets.detach().to(self._device, non_blocking=True)
            if augment is not None:
                if not isinstance(inputs, Tensor):
                    raise DataError(f"{self.split}: an augmentation transforms one input tensor; its batches hold "
                                    "several")
                inputs = augment(inputs, generator)
            yield inputs, targets

    def _checked(self, batch: object, index: int) -> tuple[Inputs, Tensor]:
        if isinstance(batch, Mapping):
            batch = _split_targets(batch, self.target_key, f"{self.split} batch {index}")
        if not isinstance(batch, (tuple, list)) or len(batch) != 2 or not isinstance(batch[1], Tensor):
            kind = (f"{len(batch)}-item {type(batch).__name__}" if isinstance(batch, (tuple, list))
                    else type(batch).__name__)
            raise DataError(f"{self.split} batch {index}: expected a pair (inputs, targets) of tensors, got a "
                            f"{kind}{_pair_hint(batch)}")
        inputs, targets = batch
        problem = inputs_problem(inputs)
        if problem is not None:
            raise DataError(f"{self.split} batch {index}: its inputs are {problem}")
        if targets.dim() == 0 or rows(inputs) != targets.shape[0]:
            shape = tuple(inputs.shape) if isinstance(inputs, Tensor) else f"{rows(inputs)} samples of"
            single = "" if targets.dim() != 0 else self._single_sample_hint()
            raise DataError(f"{self.split} batch {index}: {shape} inputs but {tuple(targets.shape)} "
                            f"targets; both need the same leading sample dimension{single}")
        return inputs, targets

    def _single_sample_hint(self) -> str:
        """Why a batch may be one sample: a DataLoader that yields samples one by one, or samples given bare."""
        unbatched = isinstance(self.data, DataLoader) and self.data.batch_size is None and \
            self.data.batch_sampler is None
        return (" (one sample, not a batch: the DataLoader has batch_size=None, which yields samples one by one; give "
                "it a batch_size)" if unbatched else " (one sample, not a batch? pass your samples in a DataLoader)")


def _pair_hint(batch: object) -> str:
    """What a batch that is no (inputs, targets) pair of tensors probably is, as a hint after the error ('' if
    nothing is likely)."""
    if type(batch).__module__ == "numpy":
        return "; numpy arrays are read as batches of rows: give torch tensors (torch.from_numpy)"
    if not isinstance(batch, (tuple, list)):
        return ""
    if len(batch) == 2 and not isinstance(batch[1], Tensor):
        return "; a list of samples is read as a list of batches: give a Dataset, or stack the samples into tensors"
    if len(batch) > 2 and all(isinstance(item, Tensor) for item in batch):
        return "; a model of several inputs takes them as one tuple, the targets last: ((tokens, mask), targets)"
    return ""


class CheckedAugmentation:
    """A user's augmentation, whatever goes wrong in it one `DataError` line: an exception it raises, or a result
    that is not a tensor of the batch's rows (it runs as batches are drawn, outside the steps that report errors)."""

    def __init__(self, function: Augmentation) -> None:
        self.function = function

    def __call__(self, inputs: Tensor, generator: torch.Generator | None) -> Tensor:
        try:
            result = self.function(inputs, generator)
        except Exception as error:  # the user's code: any exception is theirs to fix, reported as one line
            lines = str(error).strip().splitlines()
            raise DataError(f"augment raised {type(error).__name__}: {lines[0][:300] if lines else ''} (on a "
                            f"training batch of shape {tuple(inputs.shape)})") from None
        if not isinstance(result, Tensor) or result.dim() == 0 or result.shape[0] != inputs.shape[0]:
            got = f"a tensor of shape {tuple(result.shape)}" if isinstance(result, Tensor) else type(result).__name__
            raise DataError(f"augment returned {got} for a batch of shape {tuple(inputs.shape)}; return the batch's "
                            "inputs transformed, one row per sample")
        return result


def _collated(samples: list[Any], split: str) -> Any:
    """A batch of a user's `Dataset` samples, stacked as torch's default collate stacks them; samples it cannot
    stack (images torchvision left as PIL images, tensors of different shapes) are one `DataError` line saying why."""
    try:
        return default_collate(samples)
    except (TypeError, RuntimeError) as error:
        message = str(error).strip().splitlines()[0][:300] if str(error).strip() else type(error).__name__
        hint = ("; a torchvision dataset gives tensors with transform=torchvision.transforms.ToTensor()"
                if "PIL." in message else "; samples of different shapes: bring them to one in the Dataset (pad or "
                "crop), or batch them yourself in a DataLoader with a collate_fn" if "equal size" in message
                else "; return (inputs, target) of tensors, numbers or numpy arrays")
        raise DataError(f"{split}: the Dataset's samples cannot be batched ({type(error).__name__}: {message}){hint}") \
            from None


def _available_device(device: str | torch.device) -> torch.device:
    """`device` as a torch device this machine has; one it lacks is a `DataError` line before any data moves (torch
    raises from deep inside the first copy to it)."""
    try:
        target = torch.device(device)
    except (RuntimeError, TypeError):
        raise DataError(f"task_from_data: device={device!r} is not a torch device; use 'cpu', 'cuda', 'cuda:N' or "
                        "'mps'") from None
    if target.type == "meta":
        raise DataError("task_from_data: device='meta' holds shapes but no values, and a task's data must be read "
                        "(its targets checked, its batches trained on); use 'cpu', 'cuda', 'cuda:N' or 'mps'")
    missing = unavailable(target, fix="device='cpu'")
    if missing is not None:
        raise DataError(f"task_from_data: device={str(target)!r}, but {missing}")
    return target


def task_from_data(name: str, train: object, validation: object, *, loss: LossFunction | None = None,
                   metric: LossFunction | None = None, metric_name: str | None = None,
                   num_classes: int | None = None, batch_size: int = DEFAULT_BATCH_SIZE, host: object = None,
                   device: str | torch.device = "cpu", augment: Augmentation | None = None,
                   target_key: str | None = None, class_dim: int | None = None) -> Task:
    """A task from your own data (see the module docstring for what `train` and `validation` may be).

    `loss(outputs, targets)` returns the batch's mean loss (default: cross-entropy); `metric(outputs, targets)`
    the batch's mean score, higher is better (default: accuracy in percent with the default loss, else the
    negative loss). The gates judge seeds by the validation loss: in nats where it is a cross-entropy (the
    default, `torch.nn.functional.cross_entropy` or an `nn.CrossEntropyLoss`), otherwise by the share of it a
    seed removes (`GateConfig.criterion` chooses otherwise).
    The default loss takes class scores on the outputs' last dimension ([B, C], [B, T, C]) or on dimension 1
    ([B, C, H, W] against targets [B, H, W], a segmentation's), whichever lines up with the targets; `class_dim`
    (1 or -1) says which where both would. Accuracy then counts every position (a segmentation's pixels) whose
    target is not -100, cross-entropy's `ignore_index`, which the loss leaves out too.
    `host` is the model to grow (`morphogen.host_from_module`), or a function of no arguments that builds it;
    it can also be given to `morphogen.grow`. `target_key` names the targets' entry where a split or its batches
    are dicts of tensors. Raises `DataError` for what cannot work.
    """
    _check_task_arguments(name, batch_size, num_classes, loss, metric, target_key)
    _check_augment_and_class_dim(augment, class_dim)
    target = _available_device(device)
    # The validation split first: a `Grower` gives its one split as both, and it is named validation there.
    validation_source = _source(validation, target, "validation", target_key)
    train_source = _source(train, target, "train", target_key)
    for split, source in (("validation", validation_source), ("train", train_source)):
        if isinstance(source, DeviceDataset):  # streamed batches are not read before training
            _check_held_split(source, split, num_classes if loss is None else None)
    # The gates judge the loss: a cross-entropy (the default, torch's function or module) in nats, as a
    # classifier's; any other loss, whose scale is unknown, by the shares of it a seed removes (`criterion_for`).
    cross_entropy = loss is None or loss is nn.functional.cross_entropy or isinstance(loss, nn.CrossEntropyLoss)
    return Task(
        name=name.strip(), topology=_topology_of(host), host_kwargs={}, train=train_source,
        validation=validation_source, batch_size=batch_size,
        augment=None if augment is None else CheckedAugmentation(augment),
        objective="classification" if cross_entropy else "custom", loss=loss, metric=metric,
        metric_name=metric_name or ("accuracy" if metric is None and loss is None else
                                    NEGATIVE_LOSS if metric is None else "metric"),
        num_classes=num_classes, class_dim=class_dim, host=host, source="python")


def _check_augment_and_class_dim(augment: object, class_dim: object) -> None:
    """Raise `DataError` where `augment` is no function or `class_dim` names no class dimension."""
    if augment is not None and not callable(augment):
        raise DataError(f"augment must be a function (inputs, generator) -> inputs, got {type(augment).__name__}")
    if class_dim is not None and (isinstance(class_dim, bool) or class_dim not in CLASS_DIMS):
        raise DataError(f"class_dim must be 1, -1 or None (whichever lines up with the targets), got {class_dim!r}")


def _check_held_split(source: DeviceDataset, split: str, num_classes: int | None) -> None:
    """Refuse class targets outside `num_classes` (where the default loss reads them); warn of NaN inputs."""
    if num_classes is not None:
        check_class_indices(source.targets, num_classes, split, f"num_classes={num_classes}")
    sample = _first_non_finite_sample(source.inputs)
    if sample is not None:
        # A warning, not a refusal: a model may read NaN as "missing" and replace it itself.
        warnings.warn(f"task_from_data: {split}: the inputs hold NaN or infinite values (the first in sample "
                      f"{sample}); unless your model replaces them, its losses and gradients will be NaN",
                      stacklevel=3)


def _check_task_arguments(name: object, batch_size: object, num_classes: object, loss: object,
                          metric: object, target_key: object) -> None:
    """Raise `DataError` naming the first argument of `task_from_data` that cannot work."""
    if not isinstance(name, str) or not name.strip() or len(name) > 100:
        raise DataError(f"task name must be a non-empty string of at most 100 characters, got {name!r}")
    if not _is_positive_int(batch_size):
        raise DataError(f"batch_size must be a positive integer, got {batch_size!r}")
    if num_classes is not None and not _is_positive_int(num_classes):
        raise DataError(f"num_classes must be a positive integer or None, got {num_classes!r}")
    for what, function in (("loss", loss), ("metric", metric)):
        if function is not None and not callable(function):
            raise DataError(f"{what} must be a function (outputs, targets) -> scalar tensor, "
                            f"got {type(function).__name__}")
        reduction = _reduction_of(function)
        if reduction not in (None, "mean", "batchmean"):
            raise DataError(f"{what} has reduction={reduction!r}; give one that returns the batch's mean "
                            "(reduction='mean'): anything else grows with the batch size, in the gradients and in "
                            "the validation loss the gates judge")
    if target_key is not None and (not isinstance(target_key, str) or not target_key):
        raise DataError(f"target_key must be the name of the targets' entry in a dict batch, got {target_key!r}")


def check_class_indices(targets: Tensor, num_classes: int, split: str, counted: str) -> None:
    """A `DataError` where integer `targets` of the default cross-entropy hold a class outside 0..num_classes-1 (the
    classes of `counted`: "num_classes=10", "the model's 10 class scores")
    (`IGNORE_INDEX` aside): on a GPU the loss meets one as a device-side assert that ends the CUDA context. Read in
    chunks, so that a large split's check needs little memory beside it (one sync per chunk, once per task)."""
    if targets.is_floating_point() or targets.is_complex() or targets.dtype == torch.bool:
        return  # class probabilities (or not class targets at all): the loss judges them
    if targets.device.type == "meta":
        return  # shapes without values (the stand-in for another device in tests): nothing to read
    flat = targets.reshape(-1)
    for start in range(0, flat.numel(), _CHECKED_VALUES_PER_CHUNK):
        chunk = flat[start:start + _CHECKED_VALUES_PER_CHUNK]
        outside = ((chunk < 0) & (chunk != IGNORE_INDEX)) | (chunk >= num_classes)
        if bool(outside.any()):
            raise DataError(f"{split}: targets hold class {int(chunk[outside][0])}, outside 0..{num_classes - 1} of "
                            f"{counted} ({IGNORE_INDEX}, cross-entropy's ignore_index, marks a target to leave out)")


def _first_non_finite_sample(inputs: Inputs) -> int | None:
    """The index of the first sample whose floating-point inputs hold a NaN or an infinity; None where none does.
    Read in chunks of rows, as `check_class_indices` reads the targets."""
    for value in tensors(inputs):
        if not value.is_floating_point() or value.numel() == 0:
            continue
        rows_per_chunk = max(1, _CHECKED_VALUES_PER_CHUNK // max(1, value[0].numel()))
        for start in range(0, value.shape[0], rows_per_chunk):
            chunk = value[start:start + rows_per_chunk]
            finite = torch.isfinite(chunk).reshape(chunk.shape[0], -1).all(dim=1)  # (rows,)
            if not bool(finite.all()):
                return start + int((~finite).nonzero()[0, 0])
    return None


def _reduction_of(function: object) -> object:
    """The `reduction` a torch loss module (`nn.MSELoss(reduction="sum")`) or a `functools.partial` of a loss
    function was given; None where it names none."""
    if isinstance(function, functools.partial):
        return function.keywords.get("reduction")
    return getattr(function, "reduction", None) if isinstance(function, nn.Module) else None


def _split_targets(batch: Mapping[Any, Any], target_key: str | None, where: str) -> tuple[object, object]:
    """A dict batch or split as (inputs by name, targets): its `target_key` entry is the targets."""
    keys = ", ".join(map(repr, list(batch)[:8]))
    if target_key is None:
        raise DataError(f"{where}: a dict (keys {keys}); name its targets' entry with task_from_data(..., "
                        "target_key=...)")
    if target_key not in batch:
        raise DataError(f"{where}: no {target_key!r} entry for the targets (keys {keys})")
    return {key: value for key, value in batch.items() if key != target_key}, batch[target_key]


def _is_positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _source(data: object, device: torch.device, split: str, target_key: str | None) -> BatchSource:
    if isinstance(data, DeviceDataset):
        return data.to(device)
    _refuse_numpy_or_flat_tuple(data, split)
    if isinstance(data, Mapping):
        data = _split_targets(data, target_key, split)
        problem = inputs_problem(data[0])
        if problem is not None or not isinstance(data[1], Tensor):
            raise DataError(f"{split}: its inputs are {problem}" if problem else
                            f"{split}: its {target_key!r} entry is a {type(data[1]).__name__}, not a tensor")
    pair = _tensor_pair(data, device, split)
    if pair is not None:
        return pair
    if isinstance(data, Dataset) or (isinstance(data, Iterable) and not isinstance(data, (str, bytes, Tensor))):
        return StreamedBatches(data, device, split, target_key)
    raise DataError(f"{split}: expected (inputs, targets) tensors, a Dataset or a DataLoader, "
                    f"got {type(data).__name__}")


def _refuse_numpy_or_flat_tuple(data: object, split: str) -> None:
    """A `DataError` where a split is numpy arrays rather than tensors, or a tuple of tensors that is not one
    (inputs, targets) pair: either would be read as a sequence of batches and fail only once training starts.
    numpy is refused, not converted: its float64 and (on Windows) int32 defaults are dtypes to choose on purpose."""
    if _holds_numpy(data):
        raise DataError(f"{split}: numpy arrays where torch tensors belong: convert them with torch.as_tensor (the "
                        "inputs to the model's dtype, e.g. dtype=torch.float32; class indices to torch.int64)")
    if isinstance(data, (tuple, list)) and len(data) != 2 and data and isinstance(data[-1], Tensor):
        raise DataError(f"{split}: a split is (inputs, targets), got a {type(data).__name__} of {len(data)}"
                        f"{_pair_hint(data)}")


def _holds_numpy(data: object) -> bool:
    """Whether a split is numpy arrays: one itself, a dict of them, or a pair whose inputs or targets are (or hold)
    one."""
    if isinstance(data, Mapping):
        return any(_is_numpy(value) for value in data.values())
    if not (isinstance(data, (tuple, list)) and len(data) == 2):
        return _is_numpy(data)
    inputs = data[0]
    parts = list(inputs.values()) if isinstance(inputs, Mapping) else list(inputs) if isinstance(
        inputs, (tuple, list)) else [inputs]
    return any(_is_numpy(part) for part in (*parts, data[1]))


def _is_numpy(value: object) -> bool:
    """Whether `value` is a numpy array or scalar (read by its type's module: numpy need not be imported here)."""
    return type(value).__module__ == "numpy"


def _tensor_pair(data: object, device: torch.device, split: str) -> DeviceDataset | None:
    """`data` as a dataset on `device` where it is one (inputs, targets) pair of tensors (its inputs one tensor, or
    a tuple, list or dict of them); None where it is something else (a sequence of samples, a loader)."""
    if not (isinstance(data, (tuple, list)) and len(data) == 2 and isinstance(data[1], Tensor)):
        return None
    problem = None if isinstance(data[0], Tensor) else inputs_problem(data[0])
    if problem is not None and _tensors_of_several_inputs(data[0]):
        # Inputs that are several tensors: a problem with them (rows that differ) is this split's, not a sign
        # that the pair is a sequence of two samples.
        raise DataError(f"{split}: its inputs are {problem}")
    if problem is not None:
        return None
    try:
        return DeviceDataset(data[0], data[1]).to(device)
    except (TypeError, ValueError) as error:
        raise DataError(f"{split}: {error}") from None


def _tensors_of_several_inputs(inputs: object) -> bool:
    """Whether `inputs` is a tuple, list or dict of two or more tensors, and nothing else."""
    values = list(inputs.values()) if isinstance(inputs, dict) else inputs if isinstance(inputs, (tuple, list)) else []
    return len(values) >= 2 and all(isinstance(value, Tensor) for value in values)


def _topology_of(host: object) -> str:
    """The topology of a user's host when it is already built; empty for none or a function that builds one."""
    if host is None or (callable(host) and not isinstance(host, nn.Module)):
        return ""
    topology = getattr(host, "topology", "")
    if not isinstance(host, nn.Module) or topology not in USER_TOPOLOGIES:
        raise DataError(f"host must come from morphogen.host_from_module (or be a function building one), got "
                        f"{type(host).__name__}")
    return str(topology)


def task_on_device(task: Task, device: str | torch.device) -> Task:
    """`task` with its data on `device` (tensors moved once; streamed batches moved as they come)."""
    target = torch.device(device)
    return dataclasses.replace(task, train=source_on_device(task.train, target),
                               validation=source_on_device(task.validation, target))


def source_on_device(source: BatchSource, device: torch.device) -> BatchSource:
    """`source` on `device`: a `DeviceDataset` copied there, streamed batches moved there as they come."""
    if isinstance(source, DeviceDataset):
        return source.to(device)
    if isinstance(source, StreamedBatches):
        return StreamedBatches(source.data, device, source.split, source.target_key)
    return source
