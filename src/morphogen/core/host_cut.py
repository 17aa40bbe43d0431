"""A user's model cut at its slots: between an nn.Sequential's children, or traced by fx with the slots kept whole."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from itertools import pairwise

from torch import Tensor, fx, nn

from morphogen.core.graph_split import Carried, is_block, split_graph
from morphogen.core.host_errors import HostBuildError, first_line
from morphogen.core.hosts import SideInputs
from morphogen.core.tracing import traceable_factories, traced_buffers_as_values_if_needed
from morphogen.core.training_mode import TrainingModeError, trace_in_both_modes
from morphogen.inputs import Inputs


def cut_model(model: nn.Module, names: Sequence[str], example: Inputs, carry: bool = False
         ) -> tuple[list[nn.Module], list[str], SideInputs | None, list[nn.Module | None], Carried | None, str]:
    """The segments, the slot names in execution order, where later segments read the model's inputs, each named
    submodule as a module of the slot's activation alone (None: it reads more of the main path), where values
    cross slots (with `carry`; None where none does), and why fx could not trace the model where it was cut
    between its children instead ("" where it traced, or is a sequence)."""
    children = [name for name, _ in model.named_children()]
    several = not isinstance(example, Tensor)
    if isinstance(model, nn.Sequential):
        if several:
            raise HostBuildError(f"an nn.Sequential takes one tensor, but example_input is a {type(example).__name__} "
                                 "of several; give the model's inputs as one tensor")
        if not all(name in children for name in names):
            nested = next(name for name in names if name not in children)
            raise HostBuildError(f"slot after {nested!r}: an nn.Sequential is cut between its children; name one of "
                                 f"{', '.join(children)}")
        return (*_children_cut(model, names), None, "")
    given, defaults = _arguments(model, example)
    try:
        traced = _trace(model, names, defaults)
    except HostBuildError:
        raise
    except Exception as error:  # fx raises many kinds (TraceError, TypeError, ...) on untraceable code
        if not several and all(name in children for name in names):
            return (*_children_cut(model, names), None, first_line(error))
        raise HostBuildError(f"cannot trace {type(model).__name__} with torch.fx ({first_line(error)}); "
                             + ("a model of several inputs must trace" if several else "put the slots on its direct "
                                "children if its forward runs them in order")) from None
    return (*split_graph(traced, names, given, carry), "")


def _arguments(model: nn.Module, example: Inputs) -> tuple[dict[str, int | str | None], dict[str, object]]:
    """Which parameters of `model.forward` the example gives (name -> its key in the inputs: a position, a
    name, or None for the one tensor), and the defaults of the others, with which the model is traced."""
    try:
        parameters = [p for p in inspect.signature(model.forward).parameters.values()
                      if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    except (TypeError, ValueError):  # no signature to read: fx traces what it finds
        return {}, {}
    given = _given(type(model).__name__, parameters, example)
    defaults: dict[str, object] = {}
    for parameter in parameters:
        if parameter.name in given:
            continue
        if parameter.default is not parameter.empty:
            defaults[parameter.name] = parameter.default
        elif not isinstance(example, Tensor):  # one tensor: refused once traced, with the inputs the model takes
            raise HostBuildError(f"{type(model).__name__}.forward's parameter {parameter.name!r} has no default, "
                                 "and example_input does not give it")
    return given, defaults


def _given(model_name: str, parameters: list[inspect.Parameter], example: Inputs) -> dict[str, int | str | None]:
    """The parameters `example` gives: the first one (a tensor), the first positional ones (a tuple or list), or
    those named by the dict's keys."""
    positional = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if isinstance(example, Tensor):
        return {positional[0]: None} if positional else {}
    if isinstance(example, dict):
        by_name = [p.name for p in parameters if p.kind is not p.POSITIONAL_ONLY]
        unknown = [key for key in example if key not in by_name]
        if unknown:
            raise HostBuildError(f"example_input names {unknown[0]!r}, which {model_name}.forward does not take; its "
                                 f"parameters: {', '.join(by_name) or 'none'}")
        return {key: key for key in example}
    if len(example) > len(positional):
        raise HostBuildError(f"example_input gives {len(example)} inputs, but {model_name}.forward takes "
                             f"{len(positional)} positional parameters")
    return {name: index for index, name in enumerate(positional[:len(example)])}


def _children_cut(model: nn.Module,
                  names: Sequence[str]) -> tuple[list[nn.Module], list[str], None, list[nn.Module | None]]:
    """A cut between children run in order: each named child is called on the activation alone."""
    segments, ordered = _cut_children(model, names)
    modules = dict(model.named_children())
    return segments, ordered, None, [modules[name] if is_block(modules[name]) else None for name in ordered]


def _cut_children(model: nn.Module, names: Sequence[str]) -> tuple[list[nn.Module], list[str]]:
    children = list(model.named_children())
    cuts = sorted(i for i, (name, _) in enumerate(children) if name in names)
    bounds = [0, *(cut + 1 for cut in cuts), len(children)]
    segments: list[nn.Module] = [nn.Sequential(*(module for _, module in children[start:end]))
                                 for start, end in pairwise(bounds)]
    return segments, [children[i][0] for i in cuts]


class _SlotLeafTracer(fx.Tracer):
    """Traces through the model but keeps the slot submodules whole, so each is one node to cut after."""

    def __init__(self, leaves: Sequence[str]) -> None:
        super().__init__()
        self.leaves = set(leaves)

    def trace(self, root: nn.Module | Callable[..., object], concrete_args: dict[str, object] | None = None
              ) -> fx.Graph:
        with traceable_factories(self):
            return super().trace(root, concrete_args)

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if module_qualified_name in self.leaves:
            return True
        # A torch.nn container of a slot's submodule (nn.TransformerEncoder holding `encoder.layers.0`) is traced
        # through, not kept whole as fx keeps torch.nn modules.
        return not self._holds_slot(module_qualified_name) and super().is_leaf_module(m, module_qualified_name)

    def _holds_slot(self, name: str) -> bool:
        return any(leaf.startswith(name + ".") for leaf in self.leaves)

    def call_module(self, m: nn.Module, forward: Callable[..., object], args: tuple[object, ...],
                    kwargs: dict[str, object]) -> object:
        if isinstance(m, nn.TransformerEncoder) and self._holds_slot(self.path_of_module(m)):
            return self._encoder_layers(m, args, kwargs)
        if isinstance(m, nn.TransformerDecoder) and self._holds_slot(self.path_of_module(m)):
            return self._decoder_layers(m, args, kwargs)
        return super().call_module(m, forward, args, kwargs)

    def _encoder_layers(self, encoder: nn.TransformerEncoder, args: tuple[object, ...],
                        kwargs: dict[str, object]) -> object:
        """What `nn.TransformerEncoder.forward` computes outside its inference fast path, as calls of its layers:
        its forward branches on its inputs' values (mask checks, nested tensors), which fx cannot trace. Each layer
        reads the masks as given (it converts them as the encoder would), and `is_causal` only where the caller
        said it: the encoder's guess from the mask's values is a hint for speed, never needed for the result."""
        bound = inspect.signature(nn.TransformerEncoder.forward).bind(encoder, *args, **kwargs)
        bound.apply_defaults()
        given = bound.arguments
        return self._layers_then_norm(encoder, given["src"], (), {
            "src_mask": given["mask"], "src_key_padding_mask": given["src_key_padding_mask"],
            "is_causal": given["is_causal"] is True})

    def _decoder_layers(self, decoder: nn.TransformerDecoder, args: tuple[object, ...],
                        kwargs: dict[str, object]) -> object:
        """`nn.TransformerDecoder.forward` as calls of its layers, each reading the encoder's output (`memory`,
        which crosses the slots between them: `carry_skips=True`) and the masks as given: its forward guesses
        `tgt_is_causal` from the mask's values, which fx cannot trace and the result never needs."""
        bound = inspect.signature(nn.TransformerDecoder.forward).bind(decoder, *args, **kwargs)
        bound.apply_defaults()
        given = bound.arguments
        masks = ("tgt_mask", "memory_mask", "tgt_key_padding_mask", "memory_key_padding_mask")
        return self._layers_then_norm(decoder, given["tgt"], (given["memory"],), {
            **{name: given[name] for name in masks}, "tgt_is_causal": given["tgt_is_causal"] is True,
            "memory_is_causal": given["memory_is_causal"] is True})

    def _layers_then_norm(self, stack: nn.TransformerEncoder | nn.TransformerDecoder, output: object,
                          others: tuple[object, ...], kwargs: dict[str, object]) -> object:
        """Each layer of `stack` called on the output of the one before (and `others`, the encoder's output a
        decoder layer reads) with `kwargs`, then the stack's norm where it has one."""
        for layer in stack.layers:
            output = self.call_module(layer, layer.forward, (output, *others), kwargs)
        if stack.norm is not None:
            output = self.call_module(stack.norm, stack.norm.forward, (output,), {})
        return output


def _trace(model: nn.Module, names: Sequence[str], defaults: dict[str, object]) -> fx.GraphModule:
    """`model` traced with the slot submodules kept whole and the parameters in `defaults` fixed at them; a call
    given constants chosen by `self.training` (a functional dropout) follows the mode (`core/training_mode.py`).

    fx hands the forward its buffers as plain tensors, so a buffer sliced by a traced size (a positional encoding's
    `self.pe[:, :x.size(1)]`) cannot trace; where the model fails to trace so, it is traced again with its buffers
    as traced values too (not always: a forward may read a buffer's size in Python, `range(self.pe.size(0))`)."""

    def traced(buffers_traced: bool) -> fx.GraphModule:
        def trace() -> fx.Graph:
            tracer = _SlotLeafTracer(names)
            tracer.proxy_buffer_attributes = buffers_traced
            return tracer.trace(model, concrete_args=defaults or None)
        return trace_in_both_modes(model, trace)

    try:
        return traced_buffers_as_values_if_needed(model, traced)
    except TrainingModeError as error:
        raise HostBuildError(f"cannot cut {type(model).__name__}: {error}") from None
