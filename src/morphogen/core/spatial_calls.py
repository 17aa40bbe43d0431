"""Calls between a block's two convolutions that act on positions, not channels, so new channels can go through them.

A causal temporal convolution network trims the padding a convolution added (`x[:, :, :-chomp]`, torch's
`Chomp1d` pattern, or `x[..., :length]` with a constant length) or pads on the left only (`F.pad(x, (pad, 0))`)
between the convolutions of its block. Such a call treats every channel alike, so a width seed's new channels
(`core/width.py`) take the same call: `spatial_call` says whether a traced call is one, and returns it as a module
the seed applies. Only calls whose other arguments are constants qualify: a length computed from the input
(`x[..., :x.size(-1)]`) would have to be recomputed for the new channels, and is refused.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from torch import Tensor, fx, nn

#: Padding modes of `F.pad` that pad each channel by itself (reflect and replicate do too; circular as well).
_PAD_MODES = (None, "constant", "reflect", "replicate", "circular")


class BoundCall(nn.Module):
    """A call of a traced block on one tensor with the block's own constant arguments: what a width seed's new
    channels go through where the block's channels do (a slice of positions, a padding, `contiguous()`)."""

    def __init__(self, function: Callable[..., Tensor] | str, arguments: tuple[Any, ...],
                 keywords: dict[str, Any]) -> None:
        super().__init__()
        self.function, self.arguments, self.keywords = function, arguments, keywords

    def forward(self, x: Tensor) -> Tensor:
        if isinstance(self.function, str):  # a tensor method
            result: Tensor = getattr(x, self.function)(*self.arguments, **self.keywords)
            return result
        return self.function(x, *self.arguments, **self.keywords)


def spatial_call(node: fx.Node, spatial_dims: int) -> BoundCall | None:
    """`node` as a `BoundCall` where it acts on the positions of a `[N, C, *positions]` tensor of `spatial_dims`
    position dimensions alone, with constant arguments (a slice, a padding, `contiguous()`); else None."""
    if not node.args or _reads_other_nodes(node):
        return None
    rest, keywords = tuple(node.args[1:]), dict(node.kwargs)
    if node.op == "call_method" and node.target == "contiguous" and not rest and not keywords:
        return BoundCall("contiguous", (), {})
    if node.op != "call_function" or spatial_dims < 1:
        return None
    if node.target is operator.getitem and len(rest) == 1 and _slices_positions(rest[0], spatial_dims):
        return BoundCall(operator.getitem, rest, keywords)
    if node.target is nn.functional.pad and _pads_positions(rest, keywords, spatial_dims):
        return BoundCall(nn.functional.pad, rest, keywords)
    return None


def _reads_other_nodes(node: fx.Node) -> bool:
    """Whether any argument but the first is (or holds) another node's value."""
    found: list[fx.Node] = []
    fx.node.map_arg((node.args[1:], node.kwargs), found.append)
    return bool(found)


def _slices_positions(index: object, spatial_dims: int) -> bool:
    """Whether `index` keeps every sample and channel and slices positions only (no integer drops a dimension)."""
    entries = index if isinstance(index, tuple) else (index,)
    if entries and entries[0] is Ellipsis:
        positions = entries[1:]
    elif len(entries) >= 2 and all(entry == slice(None) for entry in entries[:2]):
        positions = entries[2:]
    else:
        return False
    return len(positions) <= spatial_dims and all(isinstance(entry, slice) for entry in positions)


def _pads_positions(rest: tuple[Any, ...], keywords: dict[str, Any], spatial_dims: int) -> bool:
    """Whether `F.pad(x, *rest, **keywords)` pads positions only: at most two sizes per position dimension."""
    if not rest or not isinstance(rest[0], (tuple, list)) or not all(isinstance(size, int) for size in rest[0]):
        return False
    mode = rest[1] if len(rest) > 1 else keywords.get("mode")
    return len(rest[0]) <= 2 * spatial_dims and mode in _PAD_MODES and set(keywords) <= {"mode", "value"}
