"""Host networks: the fixed architectures that carry slots.

A host is a chain of segments separated by named injection points. The host protocol
(`SegmentedHost`) is: `injection_points` (slot id -> channels, in execution order), `segments` (one
more than the points) run one at a time by `run_segment(index, h)`, and `forward(x)`, all segments in
order. The architecture never changes after construction; growth happens only in the slots that
`MorphogeneticModel` places at the points, whose passes walk the segments with `run_segment`.

Hosts: `CNNHost` (images [N, C, H, W]), `Conv1dHost` (sequences [N, C, L]) and `TransformerHost`
(token ids [N, T]), one per topology in `HOST_CLASSES`. A host's *size arguments* are its
constructor's positional parameters with a default (`host_size_arguments`); a `[host]` config table
sets them, and `check_host_size` judges such a table with the constructor itself. Constructors raise
`HostSizeError`, which names the argument at fault.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from typing import cast

import torch
from torch import Tensor, fx, nn

from morphogen.core.transformer_layers import TransformerBlock, init_gpt_
from morphogen.inputs import Inputs, refuse_other_names, take_rows
from morphogen.limits import short_repr

Device = torch.device | str | None


class UnknownSlotError(ValueError):
    """A slot id the host does not have."""


class SideInputs(nn.Module):
    """A model's inputs, held for the segments after the first that read them (a mask every block reads).

    The first segment binds the batch's inputs (`bind`); a later segment reads one of them (`read`, by position
    or name) with as many rows as the activation it runs on: the first rows where the pass runs on the first
    samples only (`narrow`, the shadow pass), repeated block after block where configurations or shadow rows
    were stacked on the batch ((K*B, ...), configuration-major, as the model lays them out).
    """

    def __init__(self) -> None:
        super().__init__()
        self._bound: list[Inputs] = []  # a list mutated in place: no module attribute is reassigned in a forward

    def bind(self, inputs: Inputs) -> Inputs:
        if isinstance(inputs, fx.Proxy):  # the first segment traced again (a width site inside it): keep the call
            return cast(Inputs, _traced_call("side_inputs", "bind", (), inputs))
        self._bound[:] = [inputs]
        return inputs

    def narrow(self, rows: int) -> None:
        """Keep the first `rows` samples of the bound inputs."""
        if self._bound:
            self._bound[:] = [take_rows(self._bound[0], slice(0, rows))]

    def read(self, key: int | str | None, like: Tensor) -> Tensor:
        """Input `key` (None: the one tensor) with `like`'s number of rows."""
        if isinstance(like, fx.Proxy):  # a segment traced again (a width site inside it): the call, not a value
            return _traced_call("side_inputs", "read", (key,), like)
        if not self._bound:
            raise RuntimeError("a segment after the first ran before the first segment bound the model's inputs")
        bound = self._bound[0]
        value = bound if key is None else bound[key]  # type: ignore[index]  # the structure the host was cut for
        assert isinstance(value, Tensor)
        return _repeated(value, like.shape[0], "the inputs hold")  # (K*B, ...)

    def release(self) -> None:
        """Drop the bound inputs (nothing holds the batch after the pass)."""
        self._bound.clear()


class CarriedValues(nn.Module):
    """Values of the main path that cross slots (a U-Net's skips, a residual connection around a slot): the segment
    that computes one holds it (`hold`), a later segment reads it (`read`) with as many rows as its own input.

    A pass lays its rows out as `SideInputs` describes: configurations stacked configuration-major ((K*B, ...))
    after the first slot whose alpha differs, so a value held before that is repeated K times. The shadow pass is
    the exception: it starts at the first TRAINING slot, and each TRAINING seed's rows join the batch at its own
    slot, after the rows already in. Before a row joins, it equals the host's, so a value the shadow pass did not
    compute (or computed for the rows already in) is completed with the host pass's value (`begin_shadow` keeps
    it) for each group of rows that joined later.
    """

    def __init__(self) -> None:
        super().__init__()
        # Dicts and a list mutated in place: no module attribute is reassigned in a forward (compiled passes).
        self._held: dict[int, Tensor] = {}
        self._host: dict[int, Tensor] = {}
        self._in_shadow: list[bool] = [False]

    def hold(self, key: int, value: Tensor) -> Tensor:
        if isinstance(value, fx.Proxy):  # a segment traced again (a width site inside it): the call, not a value
            return _traced_call("carried_values", "hold", (key,), value)
        self._held[key] = value
        return value

    def read(self, key: int, like: Tensor) -> Tensor:
        """Value `key` with `like`'s number of rows."""
        if isinstance(like, fx.Proxy):
            return _traced_call("carried_values", "read", (key,), like)
        wanted = like.shape[0]
        value = self._held.get(key)
        if value is not None and value.shape[0] == wanted:
            return value
        if not self._in_shadow[0]:
            if value is None:
                raise RuntimeError(f"a segment read carried value {key} before the segment computing it ran")
            return _repeated(value, wanted, "a carried value holds")  # (K*B, ...), configuration-major
        host = self._host[key]  # the rows that joined after this value was computed (or all) are the host's
        held = 0 if value is None else value.shape[0]
        joined = _repeated(host, wanted - held, "a carried value holds")
        return joined if value is None else torch.cat([value, joined])

    def rows_held(self) -> dict[int, int | None]:
        """The rows of each value held now (None: not a tensor with rows): what the host's shape probe checks."""
        return {key: value.shape[0] if isinstance(value, Tensor) and value.dim() > 0 else None
                for key, value in self._held.items()}

    def begin_shadow(self, rows: int | None) -> None:
        """The host pass is over and the shadow pass, on its first `rows` samples (None: all), begins."""
        self._host.clear()
        # Detached: the host's values are its own, and the shadow loss trains the TRAINING seeds only.
        self._host.update({key: (value if rows is None else value[:rows]).detach()
                           for key, value in self._held.items()})
        self._held.clear()
        self._in_shadow[0] = True

    def release(self) -> None:
        """The passes of a batch are over: nothing keeps its activations."""
        self._held.clear()
        self._host.clear()
        self._in_shadow[0] = False

    def __getstate__(self) -> dict[str, object]:
        """A copy or a pickle (a host sent to a worker process) never takes a pass's activations along."""
        state = self.__dict__.copy()
        state.update(_held={}, _host={}, _in_shadow=[False])
        return state


def _traced_call(holder: str, method: str, leading: tuple[int | str | None, ...], value: fx.Proxy) -> Tensor:
    """`method(*leading, value)` of the traced segment's `holder` (its `carried_values` or `side_inputs`) as a node
    of the trace (a segment is the tracer's root), not a call that would store or read a Proxy."""
    owner = value.tracer.create_proxy("get_attr", holder, (), {})
    traced = value.tracer.create_proxy("call_method", method, (owner, *leading, value), {})
    return cast(Tensor, traced)  # stands for the tensor while tracing


def _repeated(value: Tensor, wanted: int, holder: str) -> Tensor:
    """`value` repeated along its rows to `wanted` rows (a whole number of copies); `holder` names what holds it in
    the error."""
    held = value.shape[0]
    if wanted % held:
        raise RuntimeError(f"a segment runs on {wanted} rows, not a multiple of the {held} {holder}")
    return value if wanted == held else value.repeat(wanted // held, *([1] * (value.dim() - 1)))


class SegmentedHost(nn.Module):
    """A host whose forward pass is `segments[0] -> point 0 -> segments[1] -> ... -> segments[-1]`.

    Subclasses fill `self.segments` (len = number of injection points + 1) and `self._points`. The first
    segment takes the model's inputs (`morphogen.inputs`: a tensor, or a tuple or dict of tensors for a user's
    model of several inputs); every later one the activation at the point before it.
    """

    topology: str = ""

    def __init__(self) -> None:
        super().__init__()
        self.segments = nn.ModuleList()
        self._points: dict[str, int] = {}
        #: Slot id -> (per-sample shape entering the segment that ends at the slot, per-sample shape at the slot),
        #: where a shape probe measured them (`host_from_module`): what a branch seed beside that segment maps.
        self.measured_shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        #: Where the segments after the first read the model's inputs (`host_from_module`, for a model whose blocks
        #: read an input such as a mask); None where no segment does.
        self.side_inputs: SideInputs | None = None
        #: Where segments hand values of the main path across slots (`host_from_module(..., carry_skips=True)`:
        #: a U-Net's skips); None where nothing crosses a slot.
        self.carried_values: CarriedValues | None = None
        #: What the first segment takes (`morphogen.inputs.InputSpec.kind`): "tensor", "tuple", "list" or "dict".
        self.input_kind = "tensor"
        #: The names of the inputs the first segment reads (`morphogen.inputs.names` of the example): a batch that
        #: names others is refused, since the segments were traced without them.
        self.input_names: tuple[str | int, ...] = ()
        #: Slot ids the host would have, had it been built with an option it was not built with, and what that
        #: option is in words: an unknown slot's error names them (the conv hosts' pool slots).
        self._optional_slots: tuple[tuple[str, ...], str] = ((), "")

    @property
    def injection_points(self) -> dict[str, int]:
        """Slot id -> channels (or d_model) at that point, in execution order."""
        return dict(self._points)

    @property
    def slot_ids(self) -> tuple[str, ...]:
        return tuple(self._points)

    def point_index(self, slot: str) -> int:
        """Position of `slot` in execution order; raises `UnknownSlotError` listing the valid ids."""
        try:
            return list(self._points).index(slot)
        except ValueError:
            raise UnknownSlotError(self._unknown_slot_message(slot)) from None

    def _unknown_slot_message(self, slot: str) -> str:
        """The valid slot ids, and those an option of the host would place as well."""
        message = f"unknown slot {slot!r}; this host has: {', '.join(self._points)}"
        optional, option = self._optional_slots
        return f"{message} (and {', '.join(optional)} {option})" if optional else message

    def layer_before(self, slot: str) -> nn.Module | None:
        """The host's layer just before `slot`, as a module called on the slot's activation alone: what a seed that
        starts as a copy of it copies (`block_copy`, stacking). None where this host has no such layer there."""
        return None

    def run_segment(self, index: int, h: Inputs) -> Tensor:
        """Segment `index` maps the activation at point index-1 (or the inputs) to point `index` (or the output)."""
        output: Tensor = self.segments[index](h)
        return output

    def forward(self, x: Inputs) -> Tensor:
        refuse_other_names(self.input_names, x)
        for segment in self.segments:
            x = segment(x)
        if self.carried_values is not None:  # the pass is over: nothing keeps its activations
            self.carried_values.release()
        assert isinstance(x, Tensor)
        return x


class HostSizeError(ValueError):
    """A host constructor argument the host cannot be built with; `argument` names it, `problem` says why."""

    def __init__(self, host: str, argument: str, problem: str) -> None:
        super().__init__(f"{host} {argument}: {problem}")
        self.argument, self.problem = argument, problem


def _check_at_least_one(host: str, arguments: dict[str, int]) -> None:
    for name, value in arguments.items():
        if value < 1:
            raise HostSizeError(host, name, f"must be >= 1, got {value}")


class _ConvBlocksHost(SegmentedHost):
    """Blocks of conv -> batch norm -> ReLU (widths base*2^i), max-pool after each, then GAP + linear.

    One implementation for images (`CNNHost`) and sequences (`Conv1dHost`): the subclasses pick the
    layer classes of their dimensionality. Slots `r0c{i}` sit after block i; with `pool_slots=True`,
    slots `r1c{i}` also sit after pool i.
    """

    conv: type[nn.Conv1d | nn.Conv2d]
    batch_norm: type[nn.BatchNorm1d | nn.BatchNorm2d]
    max_pool: type[nn.MaxPool1d | nn.MaxPool2d]
    global_pool: type[nn.AdaptiveAvgPool1d | nn.AdaptiveAvgPool2d]

    def __init__(self, num_classes: int, in_channels: int, n_blocks: int, base_channels: int, kernel_size: int, *,
                 pool_slots: bool, device: Device, dtype: torch.dtype | None) -> None:
        super().__init__()
        host = type(self).__name__
        _check_at_least_one(host, {"num_classes": num_classes, "in_channels": in_channels, "n_blocks": n_blocks,
                                   "base_channels": base_channels})
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise HostSizeError(host, "kernel_size", f"must be odd and >= 1, got {kernel_size}")
        self.num_classes = num_classes
        pending: list[nn.Module] = []
        channels = in_channels
        for i in range(n_blocks):
            width = base_channels * 2**i
            pending += [self.conv(channels, width, kernel_size, padding=kernel_size // 2, bias=False, device=device,
                                  dtype=dtype),
                        self.batch_norm(width, device=device, dtype=dtype), nn.ReLU()]
            self._close_segment(pending, f"r0c{i}", width)
            pending.append(self.max_pool(2, ceil_mode=True))
            if pool_slots:
                self._close_segment(pending, f"r1c{i}", width)
            channels = width
        if not pool_slots:
            self._optional_slots = (tuple(f"r1c{i}" for i in range(n_blocks)),
                                    "after its pooling layers, with pool_slots=True: --pool-slots on the command line")
        pending += [self.global_pool(1), nn.Flatten(), nn.Linear(channels, num_classes, device=device, dtype=dtype)]
        self.segments.append(nn.Sequential(*pending))

    def _close_segment(self, pending: list[nn.Module], slot: str, channels: int) -> None:
        self.segments.append(nn.Sequential(*pending))
        self._points[slot] = channels
        pending.clear()


class CNNHost(_ConvBlocksHost):
    """Image classifier on [N, C, H, W]: blocks of 2D conv -> batch norm -> ReLU, max-pool after each.

    Slots `r0c{i}` sit after block i; with `pool_slots=True`, slots `r1c{i}` also sit after pool i.
    """

    topology = "cnn"
    conv, batch_norm, max_pool, global_pool = nn.Conv2d, nn.BatchNorm2d, nn.MaxPool2d, nn.AdaptiveAvgPool2d

    def __init__(self, num_classes: int, in_channels: int, n_blocks: int = 3, base_channels: int = 32,
                 kernel_size: int = 3, *, pool_slots: bool = False, device: Device = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__(num_classes, in_channels, n_blocks, base_channels, kernel_size, pool_slots=pool_slots,
                         device=device, dtype=dtype)


class Conv1dHost(_ConvBlocksHost):
    """Sequence classifier on [N, C, L] (MNIST-1D): the `CNNHost` blocks with 1D conv, norm and pooling.

    The default kernel of 5 taps sees two neighbours each side, about what a 3x3 kernel sees in an
    image; every block halves the length (ceil), so 40 samples pool down to 20, 10, 5.
    Slots `r0c{i}` sit after block i; with `pool_slots=True`, slots `r1c{i}` also sit after pool i.
    """

    topology = "cnn1d"
    conv, batch_norm, max_pool, global_pool = nn.Conv1d, nn.BatchNorm1d, nn.MaxPool1d, nn.AdaptiveAvgPool1d

    def __init__(self, num_classes: int, in_channels: int, n_blocks: int = 3, base_channels: int = 32,
                 kernel_size: int = 5, *, pool_slots: bool = False, device: Device = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__(num_classes, in_channels, n_blocks, base_channels, kernel_size, pool_slots=pool_slots,
                         device=device, dtype=dtype)


class TokenEmbedding(nn.Module):
    """Token + learned position embeddings: [N, T] ids -> [N, T, D]."""

    def __init__(self, vocab_size: int, d_model: int, block_size: int, *, device: Device = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.block_size = block_size
        self.token = nn.Embedding(vocab_size, d_model, device=device, dtype=dtype)
        self.position = nn.Embedding(block_size, d_model, device=device, dtype=dtype)

    def forward(self, ids: Tensor) -> Tensor:
        t = ids.shape[1]
        if t > self.block_size:
            raise ValueError(f"sequence length {t} exceeds block_size {self.block_size}")
        positions = torch.arange(t, device=ids.device)
        tokens: Tensor = self.token(ids)  # (N, T, D)
        places: Tensor = self.position(positions)  # (T, D)
        return tokens + places  # (N, T, D)


class LanguageModelHead(nn.Module):
    """Final layer norm and the output projection tied to the token embedding: [N, T, D] -> [N, T, V]."""

    def __init__(self, embedding: nn.Embedding, d_model: int, *, device: Device = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model, device=device, dtype=dtype)
        self.output = nn.Linear(d_model, embedding.num_embeddings, bias=False, device=device, dtype=dtype)
        self.output.weight = embedding.weight  # tied embeddings

    def forward(self, h: Tensor) -> Tensor:
        logits: Tensor = self.output(self.norm(h))  # (N, T, V)
        return logits


class TransformerHost(SegmentedHost):
    """Decoder-only pre-norm GPT with causal attention and tied embeddings.

    A slot (`r0c{i}`) sits after every `n_layers / n_segments` layers, the last one before the final norm.
    """

    topology = "transformer"

    def __init__(self, vocab_size: int, d_model: int = 64, n_heads: int = 4, n_layers: int = 4,
                 block_size: int = 64, n_segments: int = 2, *, device: Device = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        host = type(self).__name__
        _check_at_least_one(host, {"vocab_size": vocab_size, "d_model": d_model, "n_heads": n_heads,
                                   "block_size": block_size, "n_segments": n_segments})
        if n_layers < n_segments or n_layers % n_segments:
            raise HostSizeError(host, "n_layers", f"must be a positive multiple of n_segments ({n_segments}), "
                                                  f"got {n_layers}")
        if d_model % n_heads:
            raise HostSizeError(host, "d_model", f"must be divisible by n_heads ({n_heads}), got {d_model}")
        self.vocab_size, self.block_size = vocab_size, block_size
        embedding = TokenEmbedding(vocab_size, d_model, block_size, device=device, dtype=dtype)
        per_segment = n_layers // n_segments
        for i in range(n_segments):
            blocks: list[nn.Module] = [embedding] if i == 0 else []
            blocks += [TransformerBlock(d_model, n_heads, device=device, dtype=dtype) for _ in range(per_segment)]
            self.segments.append(nn.Sequential(*blocks))
            self._points[f"r0c{i}"] = d_model
        self.segments.append(LanguageModelHead(embedding.token, d_model, device=device, dtype=dtype))
        self._init_weights(n_layers)

    def layer_before(self, slot: str) -> nn.Module | None:
        """The last `TransformerBlock` of the segment that ends at `slot`."""
        blocks = [m for m in self.segments[self.point_index(slot)].modules() if isinstance(m, TransformerBlock)]
        return blocks[-1] if blocks else None

    def _init_weights(self, n_layers: int) -> None:
        # Residual projections scaled down with depth (GPT-2) so the residual stream starts near unit scale.
        init_gpt_(self, residual_std=0.02 / math.sqrt(2 * n_layers))


HOST_CLASSES: dict[str, type[SegmentedHost]] = {"cnn": CNNHost, "cnn1d": Conv1dHost, "transformer": TransformerHost}


def _host_class(topology: str) -> Callable[..., SegmentedHost]:
    try:
        # Seen as a callable: the base class takes no arguments, each concrete host its own.
        host_class: Callable[..., SegmentedHost] = HOST_CLASSES[topology]
    except KeyError:
        raise ValueError(f"unknown host topology {topology!r}; valid: {', '.join(HOST_CLASSES)}") from None
    return host_class


def build_host(topology: str, *, device: Device = None, **host_kwargs: int | bool) -> SegmentedHost:
    """Build the host for a topology from constructor keyword arguments (as a task describes them)."""
    return _host_class(topology)(**host_kwargs, device=device)


def host_size_arguments(topology: str) -> tuple[str, ...]:
    """The constructor arguments that set the size of a topology's host, in signature order.

    They are the positional parameters that have a default (`n_blocks`, `d_model`, ...). Those without
    one (`num_classes`, `in_channels`, `vocab_size`) are fixed by the data, and the keyword-only ones
    (`pool_slots`, `device`, `dtype`) are not sizes.
    """
    parameters = inspect.signature(_host_class(topology)).parameters.values()
    return tuple(p.name for p in parameters
                 if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and p.default is not inspect.Parameter.empty)


def check_host_size(topology: str, size: Mapping[str, object]) -> int:
    """Raise `HostSizeError` naming the first entry of `size` the topology's host cannot be built with;
    return the parameter count of the host it builds (with 1 class, channel or token: a lower bound).

    `size` holds host size arguments by name (a `[host]` config table). Unknown names and non-integers
    are caught here; values are judged by the constructor itself, so nothing can pass this check and
    then fail to build. The trial host is built on the meta device: it allocates no memory.
    """
    host_class, accepted = _host_class(topology), host_size_arguments(topology)
    host = HOST_CLASSES[topology].__name__
    for name, value in size.items():
        if name not in accepted:
            raise HostSizeError(host, name, f"unknown key; accepted: {', '.join(accepted)}")
        if not isinstance(value, int) or isinstance(value, bool):
            raise HostSizeError(host, name, f"expected an integer, got {short_repr(value)}")
    # Data-fixed arguments (class count, channels, vocabulary) get a placeholder of 1: any size is valid there.
    fixed = {p.name: 1 for p in inspect.signature(host_class).parameters.values()
             if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and p.default is inspect.Parameter.empty}
    trial = host_class(**fixed, **size, device="meta")
    return sum(parameter.numel() for parameter in trial.parameters())
