"""Task presets: a dataset split into train/validation on a device, plus the host that fits it.

`load_task(name)` returns a `Task` whose `host_kwargs` are exactly the constructor arguments of the
host for its `topology`, so that `CNNHost(**task.host_kwargs)`, `Conv1dHost(...)` or
`TransformerHost(...)` builds a model for it. The data layer never imports the hosts: it is a leaf package.

Host size: each task has a default size (`DEFAULT_HOST_SIZES`: the constructor arguments that set
widths, blocks, layers, heads); `load_task(..., host={...})` overrides any of them by name (a `[host]`
config table). Arguments the data fixes (`num_classes`, `in_channels`, `vocab_size`) cannot be
overridden. The data layer checks names and that values are positive integers; the host constructor
judges the rest (an even kernel, heads that do not divide the width) when the host is built.

Splits are fixed: they never depend on `seed`. `seed` only chooses which training samples are kept
when `max_train_samples` is smaller than the training split. Normalization statistics never depend on
`seed` or the cap (they come from the full training split, or for mnist1d from its generator), so
validation data is identical whatever they are.

| task    | data                                       | train / validation     | host        |
|---------|--------------------------------------------|------------------------|-------------|
| digits  | scikit-learn 8x8 digits, no download       | 1437 / 360 images      | CNN         |
| cifar10 | CIFAR-10 python pickles in `data_dir`      | 50000 / 10000 images   | CNN         |
| text    | characters of stdlib sources or a file     | 90% / 10% by position  | transformer |
| mnist1d | MNIST-1D, generated offline (`mnist1d`)    | 4000 / 1000 signals    | 1D CNN      |
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from morphogen.data.catalog import DEFAULT_HOST_SIZES, TASK_NAMES, unknown_task_message
from morphogen.data.cifar import CIFAR10_NUM_CLASSES, EXPECTED_LAYOUT, read_cifar10, uint8_channel_mean_std
from morphogen.data.datasets import Augmentation, DeviceDataset, random_crop_flip
from morphogen.data.digits import read_digits, stratified_split
from morphogen.data.errors import DataError
from morphogen.data.mnist1d import MNIST1D_NUM_CLASSES, generate_mnist1d
from morphogen.data.text import (
    EncodedText,
    encode_characters,
    next_character_windows,
    read_default_corpus,
    read_text_file,
)
from morphogen.inputs import Inputs
from morphogen.limits import short_repr

__all__ = ["BatchSource", "DataError", "Task", "host_size", "load_task"]

DIGITS_VALIDATION_FRACTION = 0.2
DIGITS_SPLIT_SEED = 0
"""Seed of the stratified digits split; fixed so every run validates on the same 360 images."""
DIGITS_BATCH_SIZE = 64
"""~23 steps per epoch on 1437 images: enough updates per epoch for a small dataset."""
CIFAR10_BATCH_SIZE = 128
TEXT_BATCH_SIZE = 32
TEXT_TRAIN_FRACTION = 0.9
"""The first 90% of the characters train, the last 10% validate (no window straddles the cut)."""
MNIST1D_BATCH_SIZE = 100
"""40 steps per epoch on 4000 signals; the batch size of the MNIST-1D paper's reference models."""


class BatchSource(Protocol):
    """Where a task's batches come from: a `DeviceDataset`, or a user's `Dataset` / `DataLoader`
    (`morphogen.data.user`)."""

    @property
    def device(self) -> torch.device: ...

    def __len__(self) -> int: ...

    def iterate_batches(self, batch_size: int, *, generator: torch.Generator | None = ..., shuffle: bool = ...,
                        augment: Augmentation | None = ..., drop_last: bool = ...) -> Iterator[tuple[Inputs, Tensor]]:
        ...


CLASS_DIMS = (1, -1)
"""Where a classification's outputs may hold the class scores: dimension 1 (torch's layout for `cross_entropy`,
a segmentation's [B, C, H, W] against targets [B, H, W]) or the last (logits [B, C] against [B], a language
model's [B, T, V] against [B, T])."""


@dataclass(frozen=True)
class InputStandardization:
    """How a built-in task turns raw inputs into the ones its model reads: `(raw - mean) / std` per channel
    (dimension 1). What an exported model needs applied to new data, or folded in (`morphogen export --raw-inputs`)."""

    raw: str
    """What the raw values are, for people: "pixel values 0..255 (channels R, G, B)"."""
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def to_raw(self, inputs: Tensor) -> Tensor:
        """Standardized `inputs` [N, C, ...] back in raw values."""
        shape = (1, -1) + (1,) * (inputs.dim() - 2)
        return inputs * torch.tensor(self.std, dtype=inputs.dtype, device=inputs.device).view(shape) + \
            torch.tensor(self.mean, dtype=inputs.dtype, device=inputs.device).view(shape)

    def as_dict(self) -> dict[str, object]:
        return {"raw": self.raw, "mean": list(self.mean), "std": list(self.std)}


@dataclass(frozen=True)
class Task:
    """A dataset on a device, the host that fits it, and how to train on it."""

    name: str
    """One of TASK_NAMES, or the name a user gave their own task."""
    topology: str
    """"cnn", "cnn1d", "transformer" or "mlp": the layout of the host's activations (which seeds fit it)."""
    host_kwargs: dict[str, int]
    """A built-in task: exactly the keyword arguments of its host's constructor. Empty for a user's host."""
    train: BatchSource
    validation: BatchSource
    batch_size: int
    """A batch size that works well for this task."""
    augment: Augmentation | None
    """Batched train-time augmentation for `DeviceDataset.iterate_batches`, or None."""
    objective: str
    """"classification" (targets [N] long, logits [B, C]; or a user's task trained with a cross-entropy),
    "language_model" (targets [N, T] long, logits [B, T, V]) or "custom" (a user's task with a loss of its own):
    what the gates judge seeds by (`core.lifecycle.criterion_for`)."""
    vocabulary: tuple[str, ...] | None = None
    """For "text": the character of each token id (decode with `decode_characters`); None otherwise."""
    loss: Callable[[Tensor, Tensor], Tensor] | None = None
    """The training loss `loss(outputs, targets)` -> the batch mean, a scalar; None is cross-entropy."""
    metric: Callable[[Tensor, Tensor], Tensor] | None = None
    """The validation score `metric(outputs, targets)` -> the batch mean, higher is better; None is accuracy in
    percent with the built-in loss, and the negative loss with a task's own loss."""
    metric_name: str = "accuracy"
    """What the score is, for people: "accuracy", "negative loss" (`telemetry.story.NEGATIVE_LOSS`) or the user's
    name for their metric."""
    num_classes: int | None = None
    """Classes of a classification task (chance accuracy is 100 / num_classes); None when not one."""
    class_dim: int | None = -1
    """With the built-in loss: where the outputs hold the class scores, -1 (last: [B, C], [B, T, V]) or 1 ([B, C,
    H, W] against targets [B, H, W], as torch's `cross_entropy` takes them); None: whichever the shapes say."""
    host: Any = None
    """A user's host (`morphogen.host_from_module`): a `SegmentedHost` each episode copies, or a function of no
    arguments that builds a fresh one; None builds the built-in host of `topology` from `host_kwargs`."""
    source: str = "builtin"
    """Where the task came from: "builtin", "python" (built in a user's code) or the import path that made it."""
    input_standardization: InputStandardization | None = None
    """How a built-in task standardized its raw inputs (digits, cifar10); None where the inputs are the data's own."""


def load_task(
    name: str,
    *,
    device: str | torch.device = "cpu",
    data_dir: str | Path | None = None,
    text_file: str | Path | None = None,
    seed: int = 0,
    max_train_samples: int | None = None,
    host: Mapping[str, int] | None = None,
) -> Task:
    """Build the named task with all tensors on `device`.

    `data_dir` is read by cifar10 only, `text_file` by text only (default: stdlib sources).
    `max_train_samples` keeps that many training samples, chosen by `seed`; validation is unchanged.
    `host` overrides entries of the task's default host size (`host_size`); for text, `block_size`
    is also the length of the training windows.
    """
    size = host_size(name, host)
    if max_train_samples is not None and (
        isinstance(max_train_samples, bool) or not isinstance(max_train_samples, int) or max_train_samples < 1
    ):
        raise DataError(f"max_train_samples must be None or a positive int, got {short_repr(max_train_samples)}")
    _warn_unused(name, "data_dir", data_dir, "cifar10")
    _warn_unused(name, "text_file", text_file, "text")
    target = torch.device(device)
    if name == "digits":
        return _load_digits(target, seed, max_train_samples, size)
    if name == "cifar10":
        return _load_cifar10(target, data_dir, seed, max_train_samples, size)
    if name == "mnist1d":
        return _load_mnist1d(target, seed, max_train_samples, size)
    return _load_text(target, text_file, seed, max_train_samples, size)


def host_size(name: str, overrides: Mapping[str, object] | None = None) -> dict[str, int]:
    """Task `name`'s default host size with `overrides` applied: the size arguments of its host, resolved.

    Raises `DataError` for an unknown task, a name that is not one of the task's host size arguments
    (the message lists them) and a value that is not a positive integer, each naming its key `host.NAME`.
    """
    if name not in TASK_NAMES:
        raise DataError(unknown_task_message(name))
    size = dict(DEFAULT_HOST_SIZES[name])
    for key, value in (overrides or {}).items():
        if key not in DEFAULT_HOST_SIZES[name]:
            raise DataError(f"host.{key}: unknown key; accepted: {', '.join(DEFAULT_HOST_SIZES[name])}")
        if isinstance(value, bool) or not isinstance(value, int):
            raise DataError(f"host.{key}: expected an integer, got {short_repr(value)}")
        if value < 1:
            raise DataError(f"host.{key}: must be >= 1, got {value}")
        size[key] = value
    return size


def _warn_unused(task: str, argument: str, value: object, reader: str) -> None:
    if value is not None and task != reader:
        warnings.warn(
            f"load_task({task!r}) ignores {argument}={value!r}: only {reader!r} reads it", stacklevel=3
        )


def _kept_training_indices(count: int, max_train_samples: int | None, seed: int) -> np.ndarray | None:
    """Sorted indices of the training samples to keep, or None to keep all of them."""
    if max_train_samples is None or max_train_samples >= count:
        return None
    chosen = np.random.default_rng(seed).choice(count, size=max_train_samples, replace=False)
    return np.sort(chosen)


def _load_digits(device: torch.device, seed: int, max_train_samples: int | None, size: dict[str, int]) -> Task:
    """Pixels scaled to [0, 1], then one mean/std over all training pixels (the single channel)."""
    pixels, labels = read_digits()
    images = pixels.astype(np.float64)[:, None] / 16.0  # (N, 1, 8, 8), pixel values 0..16 -> [0, 1]
    train_indices, validation_indices = stratified_split(labels, DIGITS_VALIDATION_FRACTION, DIGITS_SPLIT_SEED)
    mean, std = images[train_indices].mean(), images[train_indices].std()
    standardized = ((images - mean) / std).astype(np.float32)
    kept = _kept_training_indices(len(train_indices), max_train_samples, seed)
    if kept is not None:
        train_indices = train_indices[kept]

    def split(indices: np.ndarray) -> DeviceDataset:
        dataset = DeviceDataset(torch.from_numpy(standardized[indices]), torch.from_numpy(labels[indices]))
        return dataset.to(device)

    return Task(
        name="digits",
        topology="cnn",
        host_kwargs={"num_classes": 10, "in_channels": 1, **size},
        train=split(train_indices),
        validation=split(validation_indices),
        batch_size=DIGITS_BATCH_SIZE,
        augment=None,
        objective="classification",
        num_classes=10,
        input_standardization=InputStandardization("scikit-learn's pixel values 0..16", (float(mean) * 16.0,),
                                                   (float(std) * 16.0,)),
    )


def _load_cifar10(
    device: torch.device, data_dir: str | Path | None, seed: int, max_train_samples: int | None,
    size: dict[str, int],
) -> Task:
    """Per-channel standardization with the training images' mean/std; test_batch validates."""
    if data_dir is None:
        raise DataError(f"task 'cifar10' needs data_dir=PATH; {EXPECTED_LAYOUT}")
    arrays = read_cifar10(data_dir)
    mean, std = uint8_channel_mean_std(arrays.train_images)
    if not std.all():  # standardizing would divide by zero: every input NaN or infinite
        channel = "RGB"[int(np.flatnonzero(std == 0)[0])]
        raise DataError(f"CIFAR-10 in {data_dir}: every training pixel of channel {channel} has the same value, so "
                        "the per-channel standardization would divide by zero; these are not CIFAR-10's images")
    train_images, train_labels = arrays.train_images, arrays.train_labels
    kept = _kept_training_indices(len(train_labels), max_train_samples, seed)
    if kept is not None:
        train_images, train_labels = train_images[kept], train_labels[kept]
    # Per-channel affine map from raw 0..255 values straight to standardized ones.
    shift = torch.tensor(mean * 255.0, dtype=torch.float32, device=device).view(1, -1, 1, 1)  # (1, 3, 1, 1)
    scale = torch.tensor(1.0 / (std * 255.0), dtype=torch.float32, device=device).view(1, -1, 1, 1)

    def split(images: np.ndarray, labels: np.ndarray) -> DeviceDataset:
        # uint8 crosses to the device (4x less traffic than float32); conversion happens there.
        pixels = torch.from_numpy(np.ascontiguousarray(images)).to(device).float()  # (N, 3, 32, 32)
        return DeviceDataset(pixels.sub_(shift).mul_(scale), torch.from_numpy(labels).to(device))

    return Task(
        name="cifar10",
        topology="cnn",
        host_kwargs={"num_classes": CIFAR10_NUM_CLASSES, "in_channels": 3, **size},
        train=split(train_images, train_labels),
        validation=split(arrays.test_images, arrays.test_labels),
        batch_size=CIFAR10_BATCH_SIZE,
        augment=random_crop_flip,
        objective="classification",
        num_classes=CIFAR10_NUM_CLASSES,
        input_standardization=InputStandardization("pixel values 0..255 (channels R, G, B)",
                                                   tuple(float(m) * 255.0 for m in mean),
                                                   tuple(float(s) * 255.0 for s in std)),
    )


def _load_mnist1d(device: torch.device, seed: int, max_train_samples: int | None, size: dict[str, int]) -> Task:
    """Signals [N, 1, 40] float32 as the generator standardized them; its test split validates."""
    arrays = generate_mnist1d()
    train_signals, train_labels = arrays.train_signals, arrays.train_labels
    kept = _kept_training_indices(len(train_labels), max_train_samples, seed)
    if kept is not None:
        train_signals, train_labels = train_signals[kept], train_labels[kept]

    def split(signals: np.ndarray, labels: np.ndarray) -> DeviceDataset:
        # astype copies: the tensors never alias the process-wide cached (read-only) arrays.
        inputs = torch.from_numpy(signals.astype(np.float32)[:, None, :])  # (N, 1, 40)
        return DeviceDataset(inputs, torch.from_numpy(labels.astype(np.int64))).to(device)

    return Task(
        name="mnist1d",
        topology="cnn1d",
        host_kwargs={"num_classes": MNIST1D_NUM_CLASSES, "in_channels": 1, **size},
        train=split(train_signals, train_labels),
        validation=split(arrays.test_signals, arrays.test_labels),
        batch_size=MNIST1D_BATCH_SIZE,
        augment=None,
        objective="classification",
        num_classes=MNIST1D_NUM_CLASSES,
    )


def _load_text(
    device: torch.device, text_file: str | Path | None, seed: int, max_train_samples: int | None,
    size: dict[str, int],
) -> Task:
    """Vocabulary from the whole text (so validation has no unknown ids), windows per split."""
    block_size = size["block_size"]
    encoded = _encoded_text(text_file, block_size)
    # One int64 copy of the ids, which embeddings and cross-entropy take; the windows are views of it.
    ids = torch.from_numpy(encoded.ids).long()  # (L,)
    cut = _text_cut(len(ids))
    train_inputs, train_targets = next_character_windows(ids[:cut], block_size)  # (N, T), (N, T)
    validation_inputs, validation_targets = next_character_windows(ids[cut:], block_size)
    kept = _kept_training_indices(train_inputs.shape[0], max_train_samples, seed)
    if kept is not None:
        index = torch.from_numpy(kept)
        train_inputs, train_targets = train_inputs[index], train_targets[index]
    return Task(
        name="text",
        topology="transformer",
        host_kwargs={"vocab_size": len(encoded.vocabulary), **size},
        train=DeviceDataset(train_inputs, train_targets).to(device),
        validation=DeviceDataset(validation_inputs, validation_targets).to(device),
        batch_size=TEXT_BATCH_SIZE,
        augment=None,
        objective="language_model",
        vocabulary=encoded.vocabulary,
        num_classes=len(encoded.vocabulary),
    )


def _encoded_text(text_file: str | Path | None, block_size: int) -> EncodedText:
    """The text task's corpus (the default one, or `text_file`) checked for length and encoded; the text itself
    is not kept, only its compact ids."""
    text = read_default_corpus() if text_file is None else read_text_file(text_file)
    _check_text_length(len(text), block_size, "the default corpus" if text_file is None
                       else f"text file {Path(text_file).expanduser()}")
    return encode_characters(text)


def _text_cut(length: int) -> int:
    """Where a text of `length` characters splits: the characters before it train, the rest validate."""
    return int(length * TEXT_TRAIN_FRACTION)


def _check_text_length(length: int, block_size: int, what: str) -> None:
    """A `DataError` where a text of `length` characters leaves a split shorter than one window of `block_size`
    + 1, naming the split and the shortest text that gives both a window."""
    window = block_size + 1

    def fits(total: int) -> bool:
        return min(_text_cut(total), total - _text_cut(total)) >= window

    if fits(length):
        return
    # The validation split holds at least a tenth of the text and less than a tenth plus one character, so no text
    # shorter than 10 * (window - 1) fits: the search starts there.
    needed = next(total for total in itertools.count(max(window, int(window / (1 - TEXT_TRAIN_FRACTION)) - 10))
                  if fits(total))
    train, validation = _text_cut(length), length - _text_cut(length)
    split, count = ("validation split (its last 10%)", validation) if validation < window else (
        "training split (its first 90%)", train)
    raise DataError(f"{what} holds {length} characters: the {split} gets {count}, fewer than the {window} of one "
                    f"window (host.block_size {block_size} + 1); give a text of at least {needed} characters, or a "
                    "smaller host.block_size")
