"""Calls between a block's two convolutions that act on positions, not channels, so new channels can go through them.

A causal temporal convolution network trims the padding a convolution added (`x[:, :, :-chomp]`, torch's
`Chomp1d` pattern, or `conv(x)[..., :x.size(-1)]`, back to the length of the convolution's input) or pads on the
left only (`F.pad(x, (pad, 0))`) between the convolutions of its block. Such a call treats every channel alike, so
a width seed's new channels (`core/width.py`) take the same call: `spatial_call` says whether a traced call is one,
and returns it as a module the seed applies. Its other arguments must be constants or sizes of the first
convolution's input (the seed's tap, which the seed reads too, `TapSize`); a length computed otherwise would have
to be recomputed for the new channels, and is refused.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor, fx, nn

#: Padding modes of `F.pad` that pad each channel by itself (reflect and replicate do too; circular as well).
_PAD_MODES = (None, "constant", "reflect", "replicate", "circular")


@dataclass(frozen=True)
class TapSize:
    """An argument of a `BoundCall` that is the size of the seed's tap (the first convolution's input) along
    `dim`: read from the tap each call, as the block reads it from its own."""

    dim: int


class BoundCall(nn.Module):
    """A call of a traced block on one tensor with the block's own other arguments (constants, or sizes of the tap):
    what a width seed's new channels go through where the block's channels do (a slice of positions, a padding,
    `contiguous()`)."""

    def __init__(self, function: Callable[..., Tensor] | str, arguments: tuple[Any, ...],
                 keywords: dict[str, Any]) -> None:
        super().__init__()
        self.function, self.arguments, self.keywords = function, arguments, keywords
        self.reads_tap = _holds_tap_size((arguments, keywords))

    def forward(self, x: Tensor, tap: Tensor | None = None) -> Tensor:
        """The call on `x`; `tap` gives the sizes the arguments read (needed only where `reads_tap`)."""
        arguments, keywords = self.arguments, self.keywords
        if self.reads_tap:
            if tap is None:
                raise ValueError("this call reads sizes of the tap: give it as tap=")
            arguments, keywords = _resolved(arguments, tap), _resolved(keywords, tap)
        if isinstance(self.function, str):  # a tensor method
            result: Tensor = getattr(x, self.function)(*arguments, **keywords)
            return result
        return self.function(x, *arguments, **keywords)


def _mapped(value: Any, leaf: type, function: Callable[[Any], Any]) -> Any:
    """`value` (arguments: tuples, lists, dicts and slices of values) with `function` applied to each `leaf`."""
    if isinstance(value, leaf):
        return function(value)
    if isinstance(value, slice):
        return slice(*(_mapped(part, leaf, function) for part in (value.start, value.stop, value.step)))
    if isinstance(value, (tuple, list)):
        return type(value)(_mapped(part, leaf, function) for part in value)
    if isinstance(value, dict):
        return {key: _mapped(part, leaf, function) for key, part in value.items()}
    return value


def _holds_tap_size(value: object) -> bool:
    found: list[TapSize] = []
    _mapped(value, TapSize, found.append)
    return bool(found)


def _resolved(value: Any, tap: Tensor) -> Any:
    """`value` with each `TapSize` replaced by that size of `tap`."""
    return _mapped(value, TapSize, lambda size: tap.size(size.dim))


def spatial_call(node: fx.Node, spatial_dims: int, tap: fx.Node | None = None) -> BoundCall | None:
    """`node` as a `BoundCall` where it acts on the positions of a `[N, C, *positions]` tensor of `spatial_dims`
    position dimensions alone, its other arguments constants or sizes of `tap` (a slice, a padding,
    `contiguous()`); else None."""
    if not node.args:
        return None
    try:
        rest, keywords = _with_tap_sizes(tuple(node.args[1:]), tap), _with_tap_sizes(dict(node.kwargs), tap)
    except _ReadsAnotherValue:
        return None
    if node.op == "call_method" and node.target == "contiguous" and not rest and not keywords:
        return BoundCall("contiguous", (), {})
    if node.op != "call_function" or spatial_dims < 1:
        return None
    if node.target is operator.getitem and len(rest) == 1 and _slices_positions(rest[0], spatial_dims):
        return BoundCall(operator.getitem, rest, keywords)
    if node.target is nn.functional.pad and _pads_positions(rest, keywords, spatial_dims):
        return BoundCall(nn.functional.pad, rest, keywords)
    return None


class _ReadsAnotherValue(Exception):
    """An argument is computed from another value than the tap's size."""


def _with_tap_sizes(value: Any, tap: fx.Node | None) -> Any:
    """`value` (arguments of a traced call) with each node that reads a size of `tap` as a `TapSize`; raises
    `_ReadsAnotherValue` for any other node."""
    def as_tap_size(node: fx.Node) -> TapSize:
        dim = _tap_size_dim(node, tap)
        if dim is None:
            raise _ReadsAnotherValue
        return TapSize(dim)

    return _mapped(value, fx.Node, as_tap_size)


def _tap_size_dim(node: fx.Node, tap: fx.Node | None) -> int | None:
    """The dimension `node` reads the size of `tap` along (`tap.size(d)`, `tap.shape[d]`, `tap.size()[d]`), or None."""
    if tap is None or len(node.args) != 2 or not isinstance(dim := node.args[1], int):
        return None
    source = node.args[0]
    if node.op == "call_method" and node.target == "size":
        return dim if source is tap else None
    if node.op == "call_function" and node.target is operator.getitem and isinstance(source, fx.Node):
        return dim if _is_whole_shape_of(source, tap) else None
    return None


def _is_whole_shape_of(node: fx.Node, tap: fx.Node) -> bool:
    """Whether `node` is `tap.shape` or `tap.size()`."""
    if node.op == "call_function" and node.target is getattr:
        return node.args == (tap, "shape")
    return node.op == "call_method" and node.target == "size" and node.args == (tap,)


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
