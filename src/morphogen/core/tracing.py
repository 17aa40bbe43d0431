"""What `torch.fx` needs to trace the models users write: sizes taken from a traced shape, random draws, and
submodules it cannot trace at all.

`traceable_factories` lets `torch.ones(t, t)` with `t = x.shape[1]` trace (a causal mask made from the input's
length), and keeps `torch.rand(1)` a draw of every run rather than a constant of the trace. `PartialTracer`
traces into every submodule it can and keeps each one it cannot (an attention layer that unpacks `x.shape`, an
embedding that checks the length in Python) as one call, and so each element-wise activation module
(`core/elementwise`): the graph is then exact about the layers that matter to
a width site (a block's MLP) without fx having to trace all of the block.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

import torch
from torch import Tensor, fx, nn

from morphogen.core.elementwise import is_elementwise_module
from morphogen.core.training_mode import ModeDependentCall, TrainingModeError, trace_in_both_modes

#: Factories that take their size as separate numbers (`torch.ones(t, t)`), which fx cannot trace where a number
#: is traced (`t = x.shape[1]`); the same sizes as one tuple it traces (`traceable_factories`).
_SIZED_FACTORIES = ("ones", "zeros", "empty", "rand", "randn")
#: Factories that draw random numbers from sizes alone. fx runs a call without traced arguments once, while it
#: traces, so such a draw would be a constant of the graph: a stochastic-depth coin flip
#: (`if self.training and torch.rand(1) < p`) decided for good, or noise that never changes.
_RANDOM_FACTORIES = ("rand", "randn", "randint", "randperm", "normal")


@contextlib.contextmanager
def traceable_factories(tracer: fx.Tracer) -> Iterator[None]:
    """While `tracer` traces: `torch.ones(t, t)` and the like with a traced size call the factory with `(t, t)`,
    and a random draw from sizes alone (`torch.rand(1)`) is a call in the graph, drawn at every run. A forward
    that branches on such a draw then fails to trace, as any branch on a traced value does."""
    names = (*_SIZED_FACTORIES, *(name for name in _RANDOM_FACTORIES if name not in _SIZED_FACTORIES))
    originals = {name: getattr(torch, name) for name in names}

    def traceable(name: str, factory: Callable[..., Tensor]) -> Callable[..., Tensor]:
        def call(*size: object, **kwargs: object) -> Tensor:
            traced = any(isinstance(value, fx.Proxy) for value in (*size, *kwargs.values()))
            if traced and name in _SIZED_FACTORIES and all(isinstance(value, (int, fx.Proxy)) for value in size):
                return factory(tuple(size), **kwargs)
            if not traced and name in _RANDOM_FACTORIES:
                drawn: Tensor = tracer.create_proxy("call_function", factory, size, kwargs)  # type: ignore[assignment]
                return drawn
            return factory(*size, **kwargs)
        return call

    try:
        for name, factory in originals.items():
            setattr(torch, name, traceable(name, factory))
        yield
    finally:
        for name, factory in originals.items():
            setattr(torch, name, factory)


def _encoder_layer(layer: nn.TransformerEncoderLayer, src: Tensor, src_mask: Tensor | None = None,
                   src_key_padding_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
    """What `nn.TransformerEncoderLayer.forward` computes outside its inference fast path, written so fx can trace
    it: its forward checks its inputs' values for that path. The masks go to its attention as given (which converts
    them as the layer would), so its MLP (linear1 -> activation -> dropout -> linear2) is in the graph."""
    x = src
    if layer.norm_first:
        x = x + layer._sa_block(layer.norm1(x), src_mask, src_key_padding_mask, is_causal=is_causal)
        return x + layer._ff_block(layer.norm2(x))
    x = layer.norm1(x + layer._sa_block(x, src_mask, src_key_padding_mask, is_causal=is_causal))
    output: Tensor = layer.norm2(x + layer._ff_block(x))
    return output


#: torch.nn modules that fx keeps whole but whose forwards it can trace (the encoder layer's through
#: `_encoder_layer`): a transformer layer's MLP is in the graph, where a width site can widen it.
_TRACED_THROUGH = (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)


class PartialTracer(fx.Tracer):
    """Traces into each submodule where fx can, and records one whose forward it cannot trace as a call of it.

    A submodule that fails is traced no further: the nodes its attempt added are taken out of the graph again,
    and a `call_module` node stands in for them, computing exactly what the module computes. torch's
    `nn.TransformerEncoderLayer` and `nn.TransformerDecoderLayer`, which fx keeps whole as torch.nn modules, are
    traced through (the encoder layer by `_encoder_layer`).
    """

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if isinstance(m, _TRACED_THROUGH):
            return False
        # An activation module of the user's or a library's is one call, as torch's are: a width site can then pass
        # the new neurons through a copy of it (`core/elementwise`).
        return super().is_leaf_module(m, module_qualified_name) or is_elementwise_module(m)

    def trace(self, root: nn.Module | Callable[..., object], concrete_args: dict[str, object] | None = None
              ) -> fx.Graph:
        with traceable_factories(self):
            return super().trace(root, concrete_args)

    def call_module(self, m: nn.Module, forward: Callable[..., object], args: tuple[object, ...],
                    kwargs: dict[str, object]) -> object:
        name = self.path_of_module(m)
        if self.is_leaf_module(m, name):
            return super().call_module(m, forward, args, kwargs)
        if isinstance(m, nn.TransformerEncoderLayer):
            forward = functools.partial(_encoder_layer, m)
        nodes, depth = len(self.graph.nodes), len(self.module_stack)
        try:
            return super().call_module(m, forward, args, kwargs)
        except Exception:  # fx raises many kinds on code it cannot trace; the module is then kept whole
            while len(self.module_stack) > depth:  # fx pops its scope only when the forward returns
                self.module_stack.popitem()
            for node in reversed(list(self.graph.nodes)[nodes:]):  # users before what they use
                self.graph.erase_node(node)
            return self.create_proxy("call_module", name, args, kwargs)


def trace_partially(module: nn.Module) -> fx.GraphModule:
    """`module` traced by `PartialTracer`, as a `GraphModule` sharing its submodules; raises what fx raises
    where even that fails (a forward whose own code, outside any submodule, cannot be traced).

    It is traced in both modes, so a call whose constants the forward chose by `self.training` (a functional
    dropout) follows the mode of the module whose forward made it (`module` or one of its submodules), as in
    `module` itself, also where a training loop leaves that submodule in eval mode while the rest trains (a frozen
    block); a branch on `self.training` raises `TrainingModeError`. Where the module's own code fails to trace with
    its buffers as tensors (one sliced by a traced length: a positional-encoding table), it is traced again with
    its buffers as traced values."""

    def traced(buffers_traced: bool) -> fx.GraphModule:
        def trace() -> fx.Graph:
            tracer = PartialTracer()
            tracer.proxy_buffer_attributes = buffers_traced
            graph = tracer.trace(module)
            graph.lint()  # an erased node still in use (a weight tied across a kept call) fails here, not at run time
            return graph
        return trace_in_both_modes(module, trace)

    copy = traced_buffers_as_values_if_needed(module, traced)
    _follow_the_modes_of_their_modules(copy, module)
    return copy


def _follow_the_modes_of_their_modules(copy: fx.GraphModule, module: nn.Module) -> None:
    """Each mode-dependent call the trace of `module` made (`copy`'s own, not one `module` holds) set to follow the
    innermost module of `module` whose forward made it (fx's `nn_module_stack`), `module` itself where none."""
    held = {id(part) for part in module.modules()}
    for node in copy.graph.nodes:
        call = copy.get_submodule(str(node.target)) if node.op == "call_module" else None
        if isinstance(call, ModeDependentCall) and id(call) not in held:
            call.follow(_innermost_module(module, node.meta.get("nn_module_stack", {})))


def _innermost_module(module: nn.Module, stack: dict[str, tuple[str, type]]) -> nn.Module:
    """The innermost module of fx's `nn_module_stack` (scope -> (path in `module`, class)) that `module` holds;
    `module` itself for a call made by its own forward."""
    for path, _ in reversed(list(stack.values())):
        try:
            return module.get_submodule(path)
        except AttributeError:  # a scope fx named otherwise than by the module's path
            continue
    return module


def traced_buffers_as_values_if_needed(module: nn.Module,
                                       traced: Callable[[bool], fx.GraphModule]) -> fx.GraphModule:
    """`traced(False)` (fx hands the forward its buffers as tensors); where that fails on the module's own code
    and the module has buffers, `traced(True)` (buffers as traced values). Where both fail, the first error is
    raised, which names the code as the user wrote it; `TrainingModeError` is raised at once."""
    try:
        return traced(False)
    except TrainingModeError:
        raise
    except Exception as error:  # fx raises many kinds on untraceable code; the caller reports this first one
        if not any(True for _ in module.buffers()):
            raise
        try:
            return traced(True)
        except Exception:
            raise error from None
