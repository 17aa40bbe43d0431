"""Tasks for morphogen: datasets held on the training device, batch iterators, and host presets.

`load_task("digits" | "cifar10" | "text" | "mnist1d")` gives a `Task`: train and validation `DeviceDataset`s, the
host topology with its constructor kwargs, a batch size, an optional batched augmentation, and the
objective. An epoch is `task.train.iterate_batches(task.batch_size, generator=..., augment=task.augment)`:
one permutation and slices on the device, no DataLoader. This package is a leaf: it imports nothing
from morphogen's core, env or control layers.

The names below are imported on first use (PEP 562): `morphogen.data.catalog` (the task names) and
`morphogen.data.errors` load without torch, so the command line lists tasks without loading it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from morphogen.data.catalog import DEFAULT_HOST_SIZES, DEFAULT_OPTIMIZERS, TASK_NAMES, TASK_TOPOLOGIES
    from morphogen.data.datasets import Augmentation, DeviceDataset, random_crop_flip
    from morphogen.data.errors import DataError
    from morphogen.data.tasks import BatchSource, Task, host_size, load_task
    from morphogen.data.text import decode_characters

_HOMES = {
    "DEFAULT_HOST_SIZES": "morphogen.data.catalog", "DEFAULT_OPTIMIZERS": "morphogen.data.catalog",
    "TASK_NAMES": "morphogen.data.catalog", "TASK_TOPOLOGIES": "morphogen.data.catalog",
    "Augmentation": "morphogen.data.datasets", "DeviceDataset": "morphogen.data.datasets",
    "random_crop_flip": "morphogen.data.datasets",
    "DataError": "morphogen.data.errors",
    "BatchSource": "morphogen.data.tasks", "Task": "morphogen.data.tasks", "host_size": "morphogen.data.tasks",
    "load_task": "morphogen.data.tasks",
    "decode_characters": "morphogen.data.text",
}
"""Where each name of the package lives."""

__all__ = ["DEFAULT_HOST_SIZES", "DEFAULT_OPTIMIZERS", "TASK_NAMES", "TASK_TOPOLOGIES", "Augmentation",
    "BatchSource", "DataError", "DeviceDataset", "Task", "decode_characters", "host_size", "load_task",
    "random_crop_flip"]


def __getattr__(name: str) -> Any:
    """Import a name from its home on first use."""
    if name not in _HOMES:
        raise AttributeError(f"module 'morphogen.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value
