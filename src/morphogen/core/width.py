"""Width growth: new channels (or neurons) in the layers on both sides of a slot, function-preserving at birth.

A slot's *width site* is the pair of layers around it: the *producer*, the last convolution or linear layer
before the slot, and the *consumer*, the first one after it. Widening the site gives the producer `k` more
output channels and the consumer `k` more input channels. The new channels go through what follows the
producer (its activation; where the producer is followed by a norm, a norm of their own: a one-group
GroupNorm, or for `wider_inside` after a host BatchNorm a BatchNorm, `new_channel_norm`), then through what
lies between the slot and the consumer (pooling, flattening), and enter the consumer by new weights
that start at zero (as in GradMax, Evci et al. 2022): at birth the network computes exactly what it
computed before, and the new weights get a gradient from the first batch, after which the new producer
channels learn too.

The new weights live in a `WidthSeed`, held by the slot like any seed and taken through the same lifecycle:
it reads the producer's input (the *tap*) and adds its output to the consumer's output (the *injection*),
where the slot blends it in with its alpha. Mathematically the network is then the host with wider layers,
the weights from the old to the new channels (and back) held at zero.

Which slots have a site (`find_width_site`): the segment before the slot and the one after it are
`nn.Sequential`s (the built-in CNN and 1D-CNN hosts, a user's `nn.Sequential` cut by `host_from_module`);
the producer is followed only by norms, activations and dropout; only channel-wise modules (pooling,
flattening, activations, dropout) lie between the slot and the consumer; neither layer is grouped. An activation
is torch's, or a module of the user's or a library's whose forward `core/elementwise` finds element-wise (Hugging
Face's `NewGELUActivation`). A transformer's residual stream cannot be widened locally: its slots widen inside, the
MLP of the block before.

A segment that is a block of its own (a residual block, a traced user model's piece: anything but an
`nn.Sequential` of layers) gives its slot a site *inside* it instead (`find_inside_width_site`): the last
pair of layers in it that `torch.fx` traces as producer -> norms and activations -> consumer, such as a
residual block's two convolutions, or a transformer block's MLP (`core/tracing.PartialTracer` keeps an attention
layer fx cannot trace as one call). A gated MLP's product read by its consumer alone (SwiGLU's
`down(silu(gate(x)) * up(x))`, `up` reading what `gate` reads) is such a pair too: the new neurons get new rows of
`gate` (the producer) and of `up` (`WidthSite.multiplier`), multiplied as the block's are, and zero columns of
`down`. Element-wise modules and calls that mix no features may stand between the product and `down` (T5's
`wo(dropout(act(wi_0(x)) * wi_1(x)))`): the new neurons' products go through a copy of them; a norm there refuses
the site (the new features would change the old ones' statistics). An MLP's width is not the residual stream's,
so it can grow where the stream cannot. The tap and the injection are then both in that segment, which runs as a
traced copy of itself that calls the injection after the consumer (`WidthSite.instrumented`, sharing the segment's
modules).
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor, fx, nn

from morphogen.core.elementwise import is_elementwise_module
from morphogen.core.spatial_calls import BoundCall, spatial_call
from morphogen.core.tracing import trace_partially
from morphogen.core.training_mode import ModeDependentCall
from morphogen.inputs import Inputs

Device = torch.device | str | None
Layer = nn.Conv1d | nn.Conv2d | nn.Linear

#: Layers whose width a site grows.
LAYERS = (nn.Conv1d, nn.Conv2d, nn.Linear)
#: Norms that may follow a producer: the new channels get a GroupNorm of their own instead.
NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.GroupNorm, nn.LayerNorm)
#: Element-wise (or, for the channel dropouts, channel-by-channel) modules without parameters that may follow a
#: producer: the new channels go through a copy of them. (PReLU is not one: its slopes may be per channel.)
ELEMENTWISE = (nn.ReLU, nn.ReLU6, nn.GELU, nn.SiLU, nn.Mish, nn.Hardswish, nn.Hardsigmoid, nn.Hardtanh, nn.Tanh,
               nn.Sigmoid, nn.LeakyReLU, nn.ELU, nn.SELU, nn.CELU, nn.Softplus, nn.Dropout, nn.Dropout1d,
               nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout, nn.Identity)
#: Channel-wise modules that may lie between the slot and the consumer: applied to the new channels as they are.
CHANNELWISE = (*ELEMENTWISE, nn.MaxPool1d, nn.MaxPool2d, nn.AvgPool1d, nn.AvgPool2d, nn.AdaptiveAvgPool1d,
               nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.Flatten)

#: Element-wise functions (and tensor methods) that may follow a producer inside a traced block, and the module
#: the new channels go through instead.
ELEMENTWISE_CALLS: dict[object, Callable[..., nn.Module]] = {
    torch.relu: nn.ReLU, nn.functional.relu: nn.ReLU, "relu": nn.ReLU, torch.tanh: nn.Tanh, "tanh": nn.Tanh,
    torch.sigmoid: nn.Sigmoid, "sigmoid": nn.Sigmoid, nn.functional.gelu: nn.GELU, nn.functional.silu: nn.SiLU,
    nn.functional.relu6: nn.ReLU6, nn.functional.hardswish: nn.Hardswish, nn.functional.hardsigmoid: nn.Hardsigmoid,
    nn.functional.mish: nn.Mish, nn.functional.selu: nn.SELU,
}
#: Constant keyword arguments of an element-wise function in ELEMENTWISE_CALLS that its module takes by the same
#: name (`F.gelu(h, approximate="tanh")`, GPT-2's MLP, is `nn.GELU(approximate="tanh")`); `inplace` is dropped.
ELEMENTWISE_CALL_OPTIONS: dict[object, frozenset[str]] = {nn.functional.gelu: frozenset({"approximate"})}
#: Functional dropouts that a traced block may call between its producer and consumer with the model's mode
#: (`F.dropout(h, p, training=self.training)`, traced as a `ModeDependentCall`): the new channels drop the same way.
DROPOUT_CALLS = (nn.functional.dropout, nn.functional.dropout1d, nn.functional.dropout2d, nn.functional.dropout3d)


def _new_channels_copy(module: nn.Module) -> nn.Module:
    """A copy of `module` for a width seed's new channels; a mode-dependent call in it (a traced block's functional
    dropout) still follows the mode of the block whose forward made it, not of a copy of that block."""
    followed = [call.followed for call in module.modules() if isinstance(call, ModeDependentCall)]
    return copy.deepcopy(module, {id(block): block for block in followed if block is not None})


class BoundDropout(nn.Module):
    """A traced block's mode-dependent dropout called on one tensor with the block's own other arguments (its
    probability): what a width seed's new channels go through where the block's channels do."""

    def __init__(self, call: ModeDependentCall, arguments: tuple[object, ...], keywords: dict[str, object]) -> None:
        super().__init__()
        self.call, self.arguments, self.keywords = call, arguments, keywords

    def forward(self, x: Tensor) -> Tensor:
        dropped: Tensor = self.call(x, *self.arguments, **self.keywords)
        return dropped


Inject = Callable[[Tensor, Tensor], Tensor]
"""(consumer output, tap) -> what the segment goes on with: how a site's instrumented segment adds new channels."""


def _out_size(layer: Layer) -> int:
    """Output channels of a convolution, output features of a linear layer."""
    return layer.out_features if isinstance(layer, nn.Linear) else layer.out_channels


def _in_size(layer: Layer) -> int:
    """Input channels of a convolution, input features of a linear layer."""
    return layer.in_features if isinstance(layer, nn.Linear) else layer.in_channels


class NoWidthSiteError(ValueError):
    """A widening blueprint germinated in a slot whose surrounding layers cannot be widened; says why."""


@dataclass(frozen=True)
class WidthSite:
    """Where a slot's surrounding layers sit in the host's segments, and what a width seed copies from them."""

    tap_segment: int
    """Index of the segment that holds the producer (the segment before the slot)."""
    tap_cut: int
    """Position of the producer in that segment: its input is the tap."""
    inject_segment: int
    """Index of the segment that holds the consumer (the segment after the slot)."""
    inject_cut: int
    """Position just after the consumer in that segment: the injection adds to the consumer's output there."""
    producer: Layer
    after_producer: tuple[nn.Module, ...]
    """What follows the producer in its segment (norms, activations, dropout)."""
    before_consumer: tuple[nn.Module, ...]
    """What lies between the slot and the consumer (channel-wise modules); inside a gated MLP, between its product
    and the consumer (element-wise modules: T5's dropout)."""
    consumer: Layer
    channels: int
    """The width the site grows: the producer's output channels (the slot's, for a site around it)."""
    instrumented: fx.GraphModule | None = None
    """For a site inside the segment before the slot: that segment traced, taking `(x, inject)` and calling
    `inject(consumer output, tap)` after the consumer; it shares the segment's modules (None: a site around the
    slot, cut at `tap_cut` and `inject_cut`)."""
    multiplier: Layer | None = None
    """For a gated MLP inside a block (SwiGLU, GeGLU: `consumer(act(producer(x)) * multiplier(x))`), the layer
    whose output multiplies the activated producer's (`up`, the producer being the gate); None for a plain one."""

    @property
    def inside(self) -> bool:
        """Whether the site is inside the segment before its slot (its tap and injection both there)."""
        return self.instrumented is not None

    @property
    def consumer_channels(self) -> int:
        """Channels (or features) of the consumer's output, where the width seed's output is added."""
        return _out_size(self.consumer)

    @property
    def inputs_per_channel(self) -> int:
        """Consumer inputs fed by one slot channel: 1, or the positions a Flatten before a linear consumer lays out."""
        inputs = _in_size(self.consumer)
        return inputs // self.channels


def find_width_site(segments: Sequence[nn.Module] | nn.ModuleList, point: int, channels: int) -> WidthSite | str:
    """The width site of the slot at injection point `point` (after `segments[point]`), or why it has none: around
    the slot, else inside the segment before it."""
    around = _site_around(segments, point, channels)
    before = segments[point]
    if isinstance(around, WidthSite) or _ends_in_a_layer(before):
        return around  # a sequence of layers is widened around its slots, never inside
    found = find_inside_width_site(before, point)
    return found if isinstance(found, WidthSite) else f"{around}, and {found}"


def _ends_in_a_layer(segment: nn.Module) -> bool:
    """Whether `segment` is a sequence of layers: an `nn.Sequential` whose last child holding a convolution or linear
    layer is one. One that ends in a block of the user's (a stem convolution, then a residual block: the part before
    the slot after a model's first block) is widened inside that block, as a segment of the block alone is."""
    if not isinstance(segment, nn.Sequential):
        return False
    holding = [child for child in segment if any(isinstance(module, LAYERS) for module in child.modules())]
    return bool(holding) and isinstance(holding[-1], LAYERS)


def _site_around(segments: Sequence[nn.Module] | nn.ModuleList, point: int, channels: int) -> WidthSite | str:
    before, after = segments[point], segments[point + 1]
    if not isinstance(before, nn.Sequential) or not isinstance(after, nn.Sequential):
        return "the layers around it are not plain sequences of modules (nn.Sequential)"
    producers = [index for index, module in enumerate(before) if isinstance(module, LAYERS)]
    consumers = [index for index, module in enumerate(after) if isinstance(module, LAYERS)]
    if not producers or not consumers:
        return "no convolution or linear layer on both sides of it"
    tap_cut, inject_index = producers[-1], consumers[0]
    producer, consumer = before[tap_cut], after[inject_index]
    assert isinstance(producer, LAYERS) and isinstance(consumer, LAYERS)
    following = tuple(module for index, module in enumerate(before) if index > tap_cut)
    between = tuple(module for index, module in enumerate(after) if index < inject_index)
    problem = _site_problem(producer, following, between, consumer, channels)
    if problem:
        return problem
    return WidthSite(point, tap_cut, point + 1, inject_index + 1, producer, following, between, consumer, channels)


def find_inside_width_site(segment: nn.Module, point: int) -> WidthSite | str:
    """The width site inside `segment`, the segment before the slot at injection point `point`, or why it has none.

    The last producer -> consumer pair (by the consumer's place in the traced graph) whose producer output
    reaches the consumer only through norms and element-wise activations, each used once, with both layers
    called once and the layers' widths matching: in a residual block, its two convolutions.
    """
    try:
        traced = trace_partially(segment)
    except Exception as error:  # fx raises many kinds on code it cannot trace
        first_line = next(iter(str(error).splitlines()), "") or type(error).__name__
        return f"the segment before it cannot be traced with torch.fx ({first_line[:120]})"
    modules = dict(traced.named_modules())
    inputs = [node for node in traced.graph.nodes if node.op == "placeholder"]
    pairs = _layer_pairs(traced.graph, modules)
    if len(inputs) != 1 or not pairs:
        return ("no pair of convolution or linear layers joined by norms, activations, dropout and constant slices or "
                "paddings of positions inside the segment before it")
    producer_node, chain, consumer_node, multiplier_node, after_product = pairs[-1]
    producer, consumer = modules[str(producer_node.target)], modules[str(consumer_node.target)]
    multiplier = None if multiplier_node is None else modules[str(multiplier_node.target)]
    assert isinstance(producer, LAYERS) and isinstance(consumer, LAYERS)
    assert multiplier is None or isinstance(multiplier, LAYERS)
    tap = producer_node.args[0]
    assert isinstance(tap, fx.Node)  # a chain's producer reads a node (`_producer_chain`)
    following = tuple(_module_of(node, modules, _spatial_dims(consumer), tap) for node in chain)
    between = tuple(_module_of(node, modules, _spatial_dims(consumer), tap) for node in after_product)
    channels = _out_size(producer)
    problem = (_site_problem(producer, following, between, consumer, channels)
               or _multiplier_problem(producer, multiplier))
    if problem:
        return problem
    site = WidthSite(point, -1, point, -1, producer, following, between, consumer, channels,
                     instrumented=_instrumented(traced, inputs[0], producer_node, consumer_node),
                     multiplier=multiplier)
    return site


def _module_of(node: fx.Node, modules: dict[str, nn.Module], spatial_dims: int, tap: fx.Node) -> nn.Module:
    """The module a node of a chain between producer and consumer (whose input is `tap`) applies to the new
    channels."""
    call = spatial_call(node, spatial_dims, tap)
    if call is not None:
        return call
    if node.op != "call_module":
        options = ELEMENTWISE_CALL_OPTIONS.get(node.target, frozenset())
        return ELEMENTWISE_CALLS[node.target](**{key: value for key, value in node.kwargs.items() if key in options})
    module = modules[str(node.target)]
    if isinstance(module, ModeDependentCall):
        return BoundDropout(module, tuple(node.args[1:]), dict(node.kwargs))
    return module


def _passes_new_channels(node: fx.Node, modules: dict[str, nn.Module], spatial_dims: int, tap: fx.Node) -> bool:
    """Whether `node` may lie between a site's producer (whose input is `tap`) and consumer: a norm, an element-wise
    activation, a dropout given the model's mode, applied to its one input, or a call on its positions alone
    (`spatial_call`)."""
    if node.op == "call_module" and isinstance(modules[str(node.target)], NORMS):
        return True
    return spatial_call(node, spatial_dims, tap) is not None or _acts_elementwise(node, modules)


def _acts_elementwise(node: fx.Node, modules: dict[str, nn.Module]) -> bool:
    """Whether `node` computes each element of its one input alone: an element-wise activation (a module or a
    function), a dropout module or a functional dropout given the model's mode. No norm: it mixes features."""
    if node.op == "call_module" and _passes_elementwise(modules[str(node.target)], ()):
        return len(node.args) == 1 and not node.kwargs
    if node.op in ("call_function", "call_method") and node.target in ELEMENTWISE_CALLS:
        options = ELEMENTWISE_CALL_OPTIONS.get(node.target, frozenset())
        return (set(node.kwargs) <= {"inplace", *options} and len(node.args) == 1
                and not any(isinstance(value, fx.Node) for value in node.kwargs.values()))
    return _is_mode_dependent_dropout(node, modules)


def _is_mode_dependent_dropout(node: fx.Node, modules: dict[str, nn.Module]) -> bool:
    """Whether `node` calls a functional dropout given the model's mode on its first argument alone (the others
    constants, such as its probability)."""
    module = modules.get(str(node.target)) if node.op == "call_module" else None
    if not isinstance(module, ModeDependentCall) or module.function not in DROPOUT_CALLS or not node.args:
        return False
    return not any(isinstance(value, fx.Node) for value in (*node.args[1:], *node.kwargs.values()))


class _LayerPair(NamedTuple):
    """Nodes of a traced graph that a site inside a block widens: producer -> chain -> consumer, and in a gated MLP
    the layer whose output multiplies the chain's and the element-wise nodes between the product and the consumer
    (T5's dropout)."""

    producer: fx.Node
    chain: list[fx.Node]
    consumer: fx.Node
    multiplier: fx.Node | None
    after_product: list[fx.Node]


def _layer_pairs(graph: fx.Graph, modules: dict[str, nn.Module]) -> list[_LayerPair]:
    """Every (producer, chain, consumer, multiplier) of `graph` in the consumers' order, each layer called once."""
    nodes = list(graph.nodes)
    calls = [node.target for node in nodes if node.op == "call_module"]
    pairs = [pair for pair in (_producer_chain(node, modules) for node in nodes) if pair is not None]
    return [pair for pair in pairs
            if all(calls.count(layer.target) == 1 for layer in (pair.producer, pair.consumer, pair.multiplier)
                   if layer is not None)]


def _producer_chain(consumer: fx.Node, modules: dict[str, nn.Module]) -> _LayerPair | None:
    """(producer, the norms and activations between, `consumer`, the gated product's other layer or None) when
    `consumer` is a layer fed that way, else None."""
    if consumer.op != "call_module" or not isinstance(modules[str(consumer.target)], LAYERS):
        return None
    chain: list[fx.Node] = []
    node = consumer.args[0] if len(consumer.args) == 1 and not consumer.kwargs else None
    gated = _gated_product_before(node, modules)
    node, multiplier, after_product = gated if gated is not None else (node, None, [])
    while isinstance(node, fx.Node) and len(_value_users(node)) == 1:
        if node.op == "call_module" and isinstance(modules[str(node.target)], LAYERS):
            return _pair_at_producer(_LayerPair(node, chain[::-1], consumer, multiplier, after_product), modules)
        chain.append(node)
        node = node.args[0] if node.args else None
    return None


def _pair_at_producer(pair: _LayerPair, modules: dict[str, nn.Module]) -> _LayerPair | None:
    """`pair` where its chain passes new channels and its multiplier (if any) reads the producer's input, else None.

    Checked once the producer is known: a slice may read the size of its input, the seed's tap."""
    tap, dims = pair.producer.args[0] if pair.producer.args else None, _spatial_dims(modules[str(pair.consumer.target)])
    passing = isinstance(tap, fx.Node) and all(_passes_new_channels(link, modules, dims, tap) for link in pair.chain)
    same_input = pair.multiplier is None or (pair.multiplier.args == (tap,) and not pair.multiplier.kwargs)
    return pair if passing and same_input else None


def _gated_product_before(node: object, modules: dict[str, nn.Module]
                          ) -> tuple[fx.Node, fx.Node, list[fx.Node]] | None:
    """For a consumer's input `node`: a gated product reached back from it through element-wise nodes alone, each
    read once (`wo(dropout(act(wi_0(x)) * wi_1(x)))`, T5's MLP), as (the gate's side, the `up` layer's node, those
    nodes in the order they run); None where no such product feeds the consumer."""
    after_product: list[fx.Node] = []
    while isinstance(node, fx.Node):
        gated = _gated_product(node, modules)
        if gated is not None:
            return *gated, after_product[::-1]
        if len(_value_users(node)) != 1 or not _acts_elementwise(node, modules):
            return None
        after_product.append(node)
        node = node.args[0]
    return None


def _gated_product(node: object, modules: dict[str, nn.Module]) -> tuple[fx.Node, fx.Node] | None:
    """For a gated MLP's product `act(gate(x)) * up(x)` read by the consumer alone: the node on the gate's side and
    the `up` layer's node (read by the product alone); None for any other node."""
    if not isinstance(node, fx.Node) or len(node.args) != 2 or node.kwargs or len(_value_users(node)) != 1:
        return None
    product = (node.op == "call_function" and node.target in (operator.mul, torch.mul)) or (
        node.op == "call_method" and node.target == "mul")
    if not product:
        return None
    for gate_side, up in (node.args, node.args[::-1]):
        if (isinstance(gate_side, fx.Node) and isinstance(up, fx.Node) and up.op == "call_module"
                and isinstance(modules[str(up.target)], LAYERS) and len(_value_users(up)) == 1):
            return gate_side, up
    return None


def _value_users(node: fx.Node) -> list[fx.Node]:
    """The users of `node` that read its values, not only its size (`h.size(-1)`, `h.shape`): a size read by the
    block stays the host's, which the new channels share."""
    return [user for user in node.users if not (
        (user.op == "call_method" and user.target == "size") or
        (user.op == "call_function" and user.target is getattr and user.args[1:] == ("shape",)))]


def _spatial_dims(layer: nn.Module) -> int:
    """Position dimensions of what `layer` takes: 1 for a Conv1d's [N, C, L], 2 for a Conv2d's; 0 for a linear
    layer, whose inputs may hold positions anywhere before the features."""
    return 1 if isinstance(layer, nn.Conv1d) else 2 if isinstance(layer, nn.Conv2d) else 0


def _call_inject(inject: Inject, consumer_output: Tensor, tap: Tensor) -> Tensor:
    return inject(consumer_output, tap)


def _instrumented(traced: fx.GraphModule, entering: fx.Node, producer: fx.Node, consumer: fx.Node) -> fx.GraphModule:
    """`traced` taking `(x, inject)` and going on after `consumer` with `inject(consumer output, producer input)`."""
    graph = traced.graph
    with graph.inserting_after(entering):
        inject = graph.placeholder("inject")
    tap = producer.args[0]
    with graph.inserting_after(consumer):
        injected = graph.call_function(_call_inject, (inject, consumer, tap))
    consumer.replace_all_uses_with(injected, delete_user_cb=lambda user: user is not injected)
    graph.lint()
    return fx.GraphModule(traced, graph)


def _site_problem(producer: Layer, following: Sequence[nn.Module], between: Sequence[nn.Module], consumer: Layer,
                  channels: int) -> str:
    """Why a producer and a consumer cannot be widened together around a slot of `channels`; "" when they can."""
    if any(not _passes_elementwise(module, (*NORMS, BoundDropout, BoundCall)) for module in following):
        return f"{type(producer).__name__} before it is followed by other modules than norms and activations"
    if any(not isinstance(module, (*CHANNELWISE, BoundDropout)) and not is_elementwise_module(module)
           for module in between):
        return "other modules than pooling, flattening and activations lie between it and the next layer"
    grouped = [layer for layer in (producer, consumer) if not isinstance(layer, nn.Linear) and layer.groups != 1]
    if grouped:
        return f"its {type(grouped[0]).__name__} is grouped"
    outputs, inputs = _out_size(producer), _in_size(consumer)
    if outputs != channels or inputs % channels:
        return f"the layers' widths ({outputs} out, {inputs} in) do not match the slot's {channels} channels"
    return ""


def _multiplier_problem(producer: Layer, multiplier: Layer | None) -> str:
    """Why a gated MLP's `up` layer cannot grow with its gate, the producer: it must be a layer of the same kind,
    sizes and geometry, so that the new rows of both multiply element by element; "" when it can (or is None)."""
    if multiplier is None:
        return ""
    same = type(multiplier) is type(producer) and (_in_size(multiplier), _out_size(multiplier)) == (
        _in_size(producer), _out_size(producer))
    if same and not isinstance(producer, nn.Linear):
        assert not isinstance(multiplier, nn.Linear)
        same = all(getattr(multiplier, name) == getattr(producer, name)
                   for name in ("kernel_size", "stride", "padding", "dilation", "groups", "padding_mode"))
    if not same:
        return (f"the gated MLP's layers {type(producer).__name__} and {type(multiplier).__name__} differ in kind, "
                "size or geometry")
    return ""


def _passes_elementwise(module: nn.Module, also: tuple[type[nn.Module], ...]) -> bool:
    """Whether `module` is one of torch's element-wise modules, one of the classes `also`, or an activation module
    of the user's or a library's that computes element by element (`core/elementwise`)."""
    return isinstance(module, (*ELEMENTWISE, *also)) or is_elementwise_module(module)


def _layer_like(layer: Layer, in_size: int, out_size: int, *, bias: bool, device: Device,
                dtype: torch.dtype | None) -> Layer:
    """A layer of `layer`'s kind and geometry with other input and output sizes."""
    if isinstance(layer, nn.Linear):
        return nn.Linear(in_size, out_size, bias=bias, device=device, dtype=dtype)
    convolution: Callable[..., Layer] = type(layer)  # Conv1d or Conv2d: the geometry is the layer's own
    return convolution(in_size, out_size, layer.kernel_size, stride=layer.stride, padding=layer.padding,
                       dilation=layer.dilation, bias=bias, padding_mode=layer.padding_mode, device=device, dtype=dtype)


def new_channel_norm(norm: nn.Module, channels: int, *, batch_norm: bool, device: Device = None,
                     dtype: torch.dtype | None = None) -> nn.Module:
    """The norm of `channels` new channels where the host's producer is followed by `norm`.

    With `batch_norm`, new channels after a host BatchNorm get a BatchNorm of their own with its settings. Its
    statistics are per channel, so that is the host's norm made wider, and the seed depends on the batch only
    where the host already does; in eval mode (every validation, the fused counterfactual batch included) it
    uses its running statistics. A ResNet-20 made four times as wide inside its blocks at epoch 1, in a plain
    loop (`benchmarks/late_width.py`, 5 seeds), gained +0.78 +- 0.10 points so, +0.22 +- 0.16 with a GroupNorm.
    After a LayerNorm over the features (a transformer's MLP, `[N, T, D]`), a LayerNorm of the new features: a
    GroupNorm would normalize over dimension 1, the tokens.
    Otherwise one group: each sample's new channels are normalized together, so their means relative to one
    another survive as they do under a BatchNorm. One group per channel (an instance norm) erased them: on
    digits, 3 of 5 seeds grew a `wider` seed that way, 5 of 5 with one group.
    """
    if batch_norm and isinstance(norm, nn.modules.batchnorm._BatchNorm):
        return type(norm)(channels, eps=norm.eps, momentum=norm.momentum, affine=norm.affine,
                          track_running_stats=norm.track_running_stats, device=device, dtype=dtype)
    if isinstance(norm, nn.LayerNorm) and len(norm.normalized_shape) == 1:  # features last, as tokens [N, T, k]
        return nn.LayerNorm(channels, eps=norm.eps, elementwise_affine=norm.elementwise_affine, device=device,
                            dtype=dtype)
    return nn.GroupNorm(1, channels, device=device, dtype=dtype)


class WidthSeed(nn.Module):
    """`k` new channels of a width site: the producer's new rows, their norm and activation (in a gated MLP times
    the new rows of its `up` layer), and the consumer's new (zero-initialised) columns. `forward(tap)` is what they
    add to the consumer's output."""

    def __init__(self, site: WidthSite, channels: int, *, batch_norm: bool = False, device: Device = None,
                 dtype: torch.dtype | None = None) -> None:
        """`batch_norm`: where the producer is followed by a BatchNorm, the new channels get one of their own
        (`new_channel_norm`); otherwise, and by default, a one-group GroupNorm."""
        super().__init__()
        if channels < 1:
            raise ValueError(f"a width seed adds at least one channel, got channels={channels}")
        producer = site.producer
        producer_inputs = _in_size(producer)
        self.producer = _layer_like(producer, producer_inputs, channels, bias=producer.bias is not None,
                                    device=device, dtype=dtype)
        multiplier = site.multiplier
        # A gated MLP's new neurons: new rows of its `up` layer too, multiplying the new gate's activations.
        self.multiplier = None if multiplier is None else _layer_like(
            multiplier, producer_inputs, channels, bias=multiplier.bias is not None, device=device, dtype=dtype)
        following: list[nn.Module] = []
        for module in site.after_producer:
            if isinstance(module, NORMS):
                following.append(new_channel_norm(module, channels, batch_norm=batch_norm, device=device, dtype=dtype))
            else:
                following.append(_new_channels_copy(module))
        self.after_producer = nn.Sequential(*following)
        self.before_consumer = nn.Sequential(*(_new_channels_copy(module) for module in site.before_consumer))
        self.consumer = _layer_like(site.consumer, channels * site.inputs_per_channel, site.consumer_channels,
                                    bias=False, device=device, dtype=dtype)
        nn.init.zeros_(self.consumer.weight)  # function-preserving at birth; gets a gradient from the first batch

    def forward(self, tap: Tensor) -> Tensor:
        hidden: Tensor = self.producer(tap)  # (N, k, ...)
        for module in self.after_producer:  # a slice may read the tap's length, as the block's own does
            hidden = module(hidden, tap) if isinstance(module, BoundCall) else module(hidden)
        if self.multiplier is not None:
            hidden = hidden * self.multiplier(tap)  # (N, k, ...): the gated product
        added: Tensor = self.consumer(self.before_consumer(hidden))  # the consumer's output shape
        return added


def run_cut_segment(segment: nn.Module, index: int, x: Inputs, sites: Sequence[tuple[int, WidthSite]],
                    inject: Callable[[int, Tensor, Tensor | None], Tensor], taps: dict[int, Tensor]) -> Tensor:
    """Segment `index` of a host, cut where the widening seeds of `sites` ((key, site) pairs) read their tap or
    add their output inside it.

    A tap is stored in `taps[key]`; at an injection `inject(key, consumer output, tap)` gives the activation
    the segment goes on with. An injection after the consumer comes before a tap read at the same cut (the
    next slot's producer reads the consumer's output with the new channels in). Without a cut in this
    segment, it runs whole; with a site inside it, as that site's instrumented copy.
    """
    inside = [(key, site) for key, site in sites if site.inside and site.tap_segment == index]
    if inside:
        (key, site), = inside  # a segment holds the site of the slot after it only, and no cut of another site
        assert site.instrumented is not None

        def at_consumer(consumer_output: Tensor, tap: Tensor) -> Tensor:
            taps[key] = tap
            return inject(key, consumer_output, tap)

        assert isinstance(x, Tensor)  # no site inside the first segment of a model of several inputs
        instrumented: Tensor = site.instrumented(x, at_consumer)
        return instrumented
    events = sorted([(site.inject_cut, 0, key) for key, site in sites if site.inject_segment == index]
                    + [(site.tap_cut, 1, key) for key, site in sites if site.tap_segment == index])
    if not events:
        whole: Tensor = segment(x)
        return whole
    # A site around a slot is found only between nn.Sequential segments, which take one tensor.
    assert isinstance(segment, nn.Sequential) and isinstance(x, Tensor)
    h, done = x, 0
    for cut, order, key in events:
        h = _run_layers(segment, done, cut, h)
        done = cut
        if order == 1:
            taps[key] = h
        else:
            h = inject(key, h, taps.get(key))
    return _run_layers(segment, done, len(segment), h)


def _run_layers(segment: nn.Sequential, start: int, stop: int, h: Tensor) -> Tensor:
    """`segment[start:stop](h)`: a plain `nn.Sequential`'s layers called in turn, as its slice calls them, without
    building the slice (a new module at every cut of every forward); a subclass's slice, with its own forward."""
    if type(segment) is not nn.Sequential:
        sliced: Tensor = segment[start:stop](h)
        return sliced
    for layer in list(segment)[start:stop]:
        h = layer(h)
    return h
