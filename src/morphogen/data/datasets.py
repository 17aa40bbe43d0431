"""Device-resident datasets and batched, on-device image augmentation.

An epoch over a `DeviceDataset` is one permutation of the sample indices and a slice of it per
batch: no DataLoader, no worker processes, no Python work per sample. Everything stays on the
dataset's device, so a training epoch on a GPU never waits for the host.

Randomness rules:
- The permutation is drawn when `iterate_batches` is called, from the generator passed in (or the
  device's global generator when none is). A generator on the dataset's device permutes there; a
  CPU generator permutes on the CPU and the permutation is moved to the device once per epoch.
- An augmentation receives the same generator, once per batch, so one seeded generator makes the
  whole epoch (order and augmentation) reproducible.

Synchronization: none. Nothing here calls `.item()` or reads a tensor back to the host.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from morphogen.inputs import Inputs, detached, rows, take_rows, tensors, to_device
from morphogen.inputs import problem as inputs_problem

Augmentation = Callable[[Tensor, torch.Generator | None], Tensor]
"""A batched train-time transform: (inputs [B, ...], generator or None) -> inputs of the same shape."""

PaddingMode = Literal["reflect", "zeros"]


class DeviceDataset:
    """Inputs and targets held as tensors on one device; an epoch is a permutation and slices.

    The inputs are one tensor or, for a model of several inputs, a tuple or dict of tensors (`morphogen.inputs`).
    """

    def __init__(self, inputs: Inputs, targets: Tensor) -> None:
        values = (list(inputs.values()) if isinstance(inputs, dict)
                  else inputs if isinstance(inputs, (tuple, list)) else [inputs])
        if not isinstance(targets, Tensor) or not all(isinstance(value, Tensor) for value in values):
            raise TypeError(
                f"DeviceDataset needs torch tensors, got {type(inputs).__name__} and "
                f"{type(targets).__name__}; "
                "convert with torch.as_tensor"
            )
        problem = inputs_problem(inputs)
        if problem is not None or targets.dim() == 0:
            raise ValueError(
                "DeviceDataset needs inputs (a tensor, or a tuple or dict of tensors) and targets with a leading "
                f"sample dimension; got {problem or 'scalar targets'}"
            )
        if rows(inputs) != targets.shape[0]:
            raise ValueError(
                f"DeviceDataset needs as many targets as inputs: got {rows(inputs)} inputs and "
                f"{targets.shape[0]} targets; pass tensors with the same first dimension"
            )
        if any(value.device != targets.device for value in tensors(inputs)):
            raise ValueError(
                f"DeviceDataset needs inputs and targets on one device: got {tensors(inputs)[0].device} and "
                f"{targets.device}; move both with .to(device) first"
            )
        # Data, not a graph: tensors computed with autograd on (an encoder's features outside torch.no_grad) would
        # tie every training step to that graph, which the first backward frees, and send gradients into it.
        self.inputs = detached(inputs)
        self.targets = targets.detach() if targets.requires_grad else targets

    def __len__(self) -> int:
        return int(self.targets.shape[0])

    def __repr__(self) -> str:
        shapes = ", ".join(f"{tuple(value.shape[1:])} {value.dtype}" for value in tensors(self.inputs))
        return (
            f"DeviceDataset(samples={len(self)}, inputs={shapes}, "
            f"targets={tuple(self.targets.shape[1:])} {self.targets.dtype}, device={self.device})"
        )

    @property
    def device(self) -> torch.device:
        """The device all tensors live on."""
        return self.targets.device

    def to(self, device: str | torch.device) -> DeviceDataset:
        """A dataset with all tensors on `device` (the same tensors when they already are)."""
        return DeviceDataset(to_device(self.inputs, device), self.targets.to(device))

    def iterate_batches(
        self,
        batch_size: int,
        *,
        generator: torch.Generator | None = None,
        shuffle: bool = True,
        augment: Augmentation | None = None,
        drop_last: bool = False,
    ) -> Iterator[tuple[Inputs, Tensor]]:
        """One epoch of (inputs, targets) batches; every sample appears exactly once.

        Arguments are checked and the permutation is drawn now, not at the first `next()`.
        `shuffle=False` yields the samples in stored order as views (use it for validation).
        `augment` is applied to each batch's inputs with `generator`; targets are never changed.
        """
        _check_batch_size(batch_size)
        order = self._permutation(generator) if shuffle else None
        return self._batches(batch_size, order, generator, augment, drop_last)

    def _permutation(self, generator: torch.Generator | None) -> Tensor:
        """A random order of the sample indices, on the dataset's device."""
        count = len(self)
        if generator is None:
            return torch.randperm(count, device=self.device)
        if generator.device == self.device:
            return torch.randperm(count, generator=generator, device=self.device)
        if generator.device.type == "cpu":
            # One host-to-device copy per epoch; batches then slice the device-resident permutation.
            return torch.randperm(count, generator=generator).to(self.device)
        raise ValueError(
            f"iterate_batches got a generator on {generator.device} for a dataset on {self.device}; "
            f"pass torch.Generator(device={str(self.device)!r}) or a CPU generator"
        )

    def _batches(
        self,
        batch_size: int,
        order: Tensor | None,
        generator: torch.Generator | None,
        augment: Augmentation | None,
        drop_last: bool,
    ) -> Iterator[tuple[Inputs, Tensor]]:
        if augment is not None and not isinstance(self.inputs, Tensor):
            raise ValueError("an augmentation transforms one input tensor; this dataset holds several")
        stop = len(self) - len(self) % batch_size if drop_last else len(self)
        for start in range(0, stop, batch_size):
            end = min(start + batch_size, stop)
            if order is None:
                inputs, targets = take_rows(self.inputs, slice(start, end)), self.targets[start:end]
            else:
                indices = order[start:end]
                inputs = take_rows(self.inputs, indices)  # (B, ...)
                targets = self.targets.index_select(0, indices)  # (B, ...)
            if augment is not None:
                assert isinstance(inputs, Tensor)
                inputs = augment(inputs, generator)
            yield inputs, targets


def random_crop_flip(
    images: Tensor,
    generator: torch.Generator | None = None,
    padding: int = 4,
    *,
    padding_mode: PaddingMode = "reflect",
) -> Tensor:
    """Pad each image by `padding`, take a random same-size crop and flip half of them horizontally.

    Batched: one crop offset (uniform in [0, 2 * padding] per axis) and one fair flip per image, drawn
    from `generator` (which may live on the CPU while the images live elsewhere), and a single gather
    for the whole batch. `padding_mode` is "reflect" (the default: no artificial border) or "zeros"
    (on standardized images zero is the mean colour). Output has the input's shape, dtype and device.
    """
    if images.dim() != 4:
        raise ValueError(
            f"random_crop_flip needs images shaped [B, C, H, W], got shape {tuple(images.shape)}"
        )
    batch, channels, height, width = images.shape
    if padding < 0:
        raise ValueError(f"random_crop_flip needs padding >= 0, got {padding}")
    if padding_mode not in ("reflect", "zeros"):
        raise ValueError(f"random_crop_flip padding_mode must be 'reflect' or 'zeros', got {padding_mode!r}")
    if padding_mode == "reflect" and padding >= min(height, width):
        raise ValueError(
            f"reflect padding must be smaller than the image ({height}x{width}), got padding={padding}; "
            "use a smaller padding or padding_mode='zeros'"
        )
    draw_device = generator.device if generator is not None else images.device
    offsets = torch.randint(0, 2 * padding + 1, (2, batch), generator=generator, device=draw_device)
    flips = torch.randint(0, 2, (batch,), generator=generator, device=draw_device).bool()
    offsets, flips = offsets.to(images.device), flips.to(images.device)

    torch_mode = "reflect" if padding_mode == "reflect" else "constant"
    padded = F.pad(images, (padding, padding, padding, padding), mode=torch_mode)  # (B, C, H+2p, W+2p)
    rows = offsets[0, :, None] + torch.arange(height, device=images.device)  # (B, H)
    columns = offsets[1, :, None] + torch.arange(width, device=images.device)  # (B, W)
    # Flipping the crop is reading its columns right to left.
    columns = torch.where(flips[:, None], columns.flip(1), columns)  # (B, W)
    sample_index = torch.arange(batch, device=images.device)[:, None, None, None]  # (B, 1, 1, 1)
    channel_index = torch.arange(channels, device=images.device)[None, :, None, None]  # (1, C, 1, 1)
    crops = padded[sample_index, channel_index, rows[:, None, :, None], columns[:, None, None, :]]
    return crops  # (B, C, H, W)


def _check_batch_size(batch_size: int) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
