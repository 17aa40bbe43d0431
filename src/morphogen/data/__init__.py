"""Tasks for morphogen: datasets held on the training device, batch iterators, and host presets.

`load_task("digits" | "cifar10" | "text" | "mnist1d")` gives a `Task`: train and validation `DeviceDataset`s, the
host topology with its constructor kwargs, a batch size, an optional batched augmentation, and the
objective. An epoch is `task.train.iterate_batches(task.batch_size, generator=..., augment=task.augment)`:
one permutation and slices on the device, no DataLoader. This package is a leaf: it imports nothing
from morphogen's core, env or control layers.
"""

from morphogen.data.datasets import Augmentation, DeviceDataset, random_crop_flip
from morphogen.data.errors import DataError
from morphogen.data.tasks import (
    DEFAULT_HOST_SIZES,
    DEFAULT_OPTIMIZERS,
    TASK_NAMES,
    TASK_TOPOLOGIES,
    BatchSource,
    Task,
    host_size,
    load_task,
)
from morphogen.data.text import decode_characters

__all__ = [
    "DEFAULT_HOST_SIZES",
    "DEFAULT_OPTIMIZERS",
    "TASK_NAMES",
    "TASK_TOPOLOGIES",
    "Augmentation",
    "BatchSource",
    "DataError",
    "DeviceDataset",
    "Task",
    "decode_characters",
    "host_size",
    "load_task",
    "random_crop_flip",
]
