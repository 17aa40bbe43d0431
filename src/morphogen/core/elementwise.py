"""Modules whose forward is an element-wise function of their one input, recognised by what they compute.

A width site's new neurons go through a copy of what follows the producer, so a module there must act on each
element alone. torch's activations are listed by class (`core/width.ELEMENTWISE`); a user's or a library's own
activation module (Hugging Face's `NewGELUActivation`, GPT-2's tanh GELU written out with `torch.tanh` and
`torch.pow`) is recognised here without importing its library, by tracing it.

The test is structural, not by name: the module holds no parameters, buffers or submodules, and `torch.fx` traces
its forward to a graph of one input and one output in which every call is an element-wise operation of
`ELEMENTWISE_FUNCTIONS` or `ELEMENTWISE_METHODS` whose other arguments are values computed from that input or
constants (numbers, strings such as GELU's `approximate`, None). Every value of such a graph has the input's shape,
and each output element depends on the input element at its place alone. Anything else (a reduction, a reshape, a
tensor attribute, an in-place method, code fx cannot trace) is not recognised.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable

import torch
from torch import fx, nn
from torch.nn import functional

#: Functions that map tensors of one shape (and numbers) to a tensor of that shape, element by element.
ELEMENTWISE_FUNCTIONS: frozenset[object] = frozenset({
    operator.add, operator.sub, operator.mul, operator.truediv, operator.neg, operator.pow,
    torch.add, torch.sub, torch.mul, torch.div, torch.neg, torch.pow, torch.square, torch.sqrt, torch.rsqrt,
    torch.exp, torch.abs, torch.tanh, torch.sigmoid, torch.erf, torch.relu, torch.clamp, torch.clip,
    functional.gelu, functional.silu, functional.relu, functional.relu6, functional.leaky_relu, functional.elu,
    functional.selu, functional.celu, functional.mish, functional.softplus, functional.hardswish,
    functional.hardsigmoid, functional.hardtanh, functional.sigmoid, functional.tanh,
})
#: Tensor methods of the same kind (not the in-place ones: they would write into the module's input).
ELEMENTWISE_METHODS = frozenset({"add", "sub", "mul", "div", "neg", "pow", "square", "sqrt", "rsqrt", "exp", "abs",
                                 "tanh", "sigmoid", "erf", "relu", "clamp", "clip"})
#: Constants an element-wise call may take besides its tensors.
_CONSTANTS = (int, float, bool, str, type(None))


def is_elementwise_module(module: nn.Module) -> bool:
    """Whether `module` holds no state and its forward traces to element-wise operations of its one input alone."""
    if _holds_state(module):
        return False
    try:
        graph = fx.Tracer().trace(module)
    except Exception:  # fx raises many kinds on code it cannot trace: not recognised
        return False
    return _is_elementwise_graph(graph)


def _holds_state(module: nn.Module) -> bool:
    """Whether `module` has a parameter, a buffer or a submodule."""
    return any(True for _ in module.parameters()) or any(True for _ in module.buffers()) or any(module.children())


def _is_elementwise_graph(graph: fx.Graph) -> bool:
    """Whether `graph` takes one input and returns one value computed by element-wise calls alone."""
    nodes = list(graph.nodes)
    inputs = [node for node in nodes if node.op == "placeholder"]
    outputs = [node for node in nodes if node.op == "output"]
    if len(inputs) != 1 or len(outputs) != 1 or not isinstance(outputs[0].args[0], fx.Node):
        return False
    return all(_is_elementwise_call(node) for node in nodes if node.op not in ("placeholder", "output"))


def _is_elementwise_call(node: fx.Node) -> bool:
    """Whether `node` applies a listed element-wise operation to values of the graph and constants."""
    listed = (node.op == "call_function" and node.target in ELEMENTWISE_FUNCTIONS) or (
        node.op == "call_method" and node.target in ELEMENTWISE_METHODS)
    return listed and _only_values_or_constants((*node.args, *node.kwargs.values()))


def _only_values_or_constants(arguments: Iterable[object]) -> bool:
    return all(isinstance(argument, (fx.Node, *_CONSTANTS)) for argument in arguments)
