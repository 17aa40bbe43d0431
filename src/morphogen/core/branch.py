"""Branch growth: width beside a segment, reading what enters it and adding to what leaves it at the slot.

A deepening seed reads the activation at its slot and adds to it: after a residual block, that is a
new block on the main path. A *branch* seed reads the activation that enters the segment ending at its
slot (the slot before it, or the host's input) and adds its output at the slot, so on a host cut after
every block it runs beside each block, as the parallel paths of a wide or multi-branch network do.
Measured on a CIFAR-layout ResNet (benchmarks/late_width.py), a wide branch beside every block gained
more than the same branch after it.

A slot's *branch site* (`find_branch_site`) is the pair of shapes around that segment, which a shape probe
measures (`host_from_module` records them with its example input; the built-in hosts have none): the
branch maps the segment's input channels to the slot's, with the stride that takes the input's positions to
the slot's. Like a widening seed, it is blended by adding (`h + alpha * branch(tap)`), its last layer starts
at zero so it is the identity at birth, and the model's walk hands it its input (`SeedSlot.tap`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from morphogen.core.width import NoWidthSiteError

Device = torch.device | str | None
#: Channels inside a wide branch, as a multiple of the slot's.
BRANCH_EXPANSION = 4
#: Spatial dimensions of the activations per topology that has branch sites.
_SPATIAL_DIMS = {"cnn": 2, "cnn1d": 1, "mlp": 0}
#: Kernel of a branch's convolutions per spatial dimensions (the convolutional seeds' own).
_KERNEL = {1: 5, 2: 3}


class NoBranchSiteError(NoWidthSiteError):
    """A branch blueprint germinated in a slot whose segment's input shape is not known or cannot be mapped."""


@dataclass(frozen=True)
class BranchSite:
    """What a branch beside the segment that ends at a slot maps: from `in_channels` to `channels`, `stride`."""

    dims: int
    """Spatial dimensions: 2 for images [N, C, H, W], 1 for sequences [N, C, L], 0 for features [N, F]."""
    in_channels: int
    """Channels (or features) of the activation entering the segment: the branch's input."""
    channels: int
    """The slot's channels: the branch's output."""
    stride: int
    """How many input positions per output position along each spatial dimension (1: same resolution)."""


def find_branch_site(topology: str, entering: tuple[int, ...] | None, at_slot: tuple[int, ...]) -> BranchSite | str:
    """The branch site of a slot whose segment maps per-sample shape `entering` to `at_slot`, or why it has none.

    `entering` None: the host did not measure it (only `host_from_module` runs a shape probe).
    """
    dims = _SPATIAL_DIMS.get(topology)
    if dims is None:
        return f"a {topology} host's segments already add to their input; branches grow convolutional and MLP hosts"
    if entering is None:
        return ("the input of the segment before it is not one tensor of values whose shape the host measured "
                "(host_from_module measures it; a model's several inputs or integer ids cannot feed a branch)")
    if len(entering) != dims + 1 or len(at_slot) != dims + 1:
        return f"the segment maps {entering} to {at_slot}; a branch needs both in the {topology} layout"
    if dims == 0:
        return BranchSite(0, entering[0], at_slot[0], 1)
    strides = {size_in // size_out if size_out else 0 for size_in, size_out in zip(entering[1:], at_slot[1:],
                                                                                     strict=True)}
    stride = strides.pop() if len(strides) == 1 else 0
    kernel = _KERNEL[dims]
    fits = stride >= 1 and all((size_in + 2 * (kernel // 2) - kernel) // stride + 1 == size_out
                               for size_in, size_out in zip(entering[1:], at_slot[1:], strict=True))
    if not fits:
        return f"no strided convolution maps the segment's input {entering} to the slot's {at_slot}"
    return BranchSite(dims, entering[0], at_slot[0], stride)


def wide_branch(site: BranchSite, *, device: Device = None, dtype: torch.dtype | None = None) -> nn.Module:
    """A wide path beside the segment: conv (strided as the segment) to `BRANCH_EXPANSION` times the slot's
    channels, one-group GroupNorm, ReLU, conv back to the slot's channels, zero at birth (a linear layer in
    place of each conv for features)."""
    hidden = BRANCH_EXPANSION * site.channels
    first: nn.Module
    last: nn.Module
    if site.dims == 0:
        first = nn.Linear(site.in_channels, hidden, device=device, dtype=dtype)
        last = nn.Linear(hidden, site.channels, device=device, dtype=dtype)
    else:
        conv = nn.Conv2d if site.dims == 2 else nn.Conv1d
        kernel = _KERNEL[site.dims]
        first = conv(site.in_channels, hidden, kernel, stride=site.stride, padding=kernel // 2, device=device,
                     dtype=dtype)  # (N, e*C, ...) at the slot's resolution
        last = conv(hidden, site.channels, kernel, padding=kernel // 2, device=device, dtype=dtype)
    for parameter in last.parameters():
        nn.init.zeros_(parameter)  # the identity at birth; the zero weights get a gradient from the first batch
    # One group, as for a width seed's new channels (core/width.py): the channels' relative means survive.
    return nn.Sequential(first, nn.GroupNorm(1, hidden, device=device, dtype=dtype), nn.ReLU(), last)
