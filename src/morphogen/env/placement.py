"""Which device each env of a vector runs on, and the per-device copies of what its envs share.

One process can spread a vector's envs over several devices (`morphogen train --devices cuda:0,cuda:1`).
Env i runs on `devices[i % len(devices)]` (round robin: with envs that do not divide evenly, no device
holds more than one env more than another, and growing `--envs` by one adds to the next device).

What lives where:
- The training split stays on the vector's *primary* device (the task's device, which the caller makes
  `devices[0]`); the shared batch stream is produced there once per batch (permutation, slices,
  augmentation), then copied once per other device (`copy_batch`), never once per env.
- The validation split is copied once per device when the placement is built; every env on a device
  validates on that device's copy (`task_for`).
- Each env's model, optimizers and gradient monitor are built on its device by its episode.

CUDA rules (docs/architecture.md#devices-and-cuda-streams): every env on a CUDA device trains on its own
persistent stream on that device. A batch copied to a device is allocated on that device's current
stream, and the copy is ordered before that stream's later work (a peer copy synchronizes the source's
and destination's current streams); an env stream first waits for the current stream of its device, then
marks the batch it reads with `record_stream` (`VectorEpisodes._train_all`). After an epoch, one
synchronize per CUDA device (`synchronize`), before the envs' metrics are read.

Identical device strings are allowed (`cpu,cpu`): the envs then share one device and one copy of the
data, and the run is bitwise the run with that single device (tested).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch import Tensor

from morphogen.data import Task
from morphogen.data.user import source_on_device
from morphogen.inputs import Inputs, to_device


class DevicePlacement:
    """The device of every env of a vector, a task per device, and the CUDA streams of the envs."""

    def __init__(self, task: Task, n_envs: int, devices: Sequence[str | torch.device] | None = None) -> None:
        """`devices` None (or one device) puts every env on the task's device; else the task's data must be
        on `devices[0]`, where the shared batches are produced."""
        primary = task.train.device
        chosen = tuple(torch.device(device) for device in devices) if devices else (primary,)
        if not _same_device(chosen[0], primary):
            raise ValueError(f"the task's data is on {primary} but the first of devices is {chosen[0]}; load the "
                             "task on the first device (it holds the policy and produces the shared batches)")
        self.primary = primary
        self.devices = tuple(primary if _same_device(device, primary) else device for device in chosen)
        #: The device of each env, by its index in the vector.
        self.env_devices = [self.devices[i % len(self.devices)] for i in range(n_envs)]
        #: One task per distinct device, its validation split on that device (copied once, here).
        self.tasks: dict[torch.device, Task] = {}
        for device in dict.fromkeys(self.env_devices):
            self.tasks[device] = task if device == primary else dataclasses.replace(
                task, validation=source_on_device(task.validation, device))
        #: Each env's persistent CUDA stream on its device (None for an env on another kind of device);
        #: None when no env is on a CUDA device.
        self.streams: list[torch.cuda.Stream | None] | None = None
        if any(device.type == "cuda" for device in self.env_devices):
            self.streams = [torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]
                            if device.type == "cuda" else None
                            for device in self.env_devices]

    def task_for(self, env: int) -> Task:
        """The task env `env` (index in the vector) runs: its validation split is on the env's device."""
        return self.tasks[self.env_devices[env]]

    @property
    def cuda_devices(self) -> list[torch.device]:
        """The distinct CUDA devices envs run on."""
        return [device for device in self.tasks if device.type == "cuda"]

    def copy_batch(self, inputs: Inputs, targets: Tensor) -> dict[torch.device, tuple[Inputs, Tensor]]:
        """The batch on every device an env runs on: the tensors themselves on the primary device, one
        asynchronous copy on each other (never one per env)."""
        return {device: (inputs, targets) if device == self.primary else
                (to_device(inputs, device, non_blocking=True), targets.to(device, non_blocking=True))
                for device in self.tasks}

    def synchronize(self) -> None:
        """Wait for every CUDA device an env runs on: one synchronize per device per phase."""
        for device in self.cuda_devices:
            torch.cuda.synchronize(device)


def _same_device(device: torch.device, primary: torch.device) -> bool:
    """Whether `device` names `primary`; `cuda` without an index names the current CUDA device."""
    if device.type != primary.type:
        return False
    if device.index is None or primary.index is None:
        return True
    return device.index == primary.index
