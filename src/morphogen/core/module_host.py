"""Any `nn.Module` as a host: cut a user's model after named submodules so that seeds can grow there.

`host_from_module(model, slots=["layer1", "layer2"], example_input=x)` returns a `ModuleHost`, a
`SegmentedHost` whose segments run the user's own submodules (shared, not copied: training the host
trains the user's model). Two ways to cut:

- an `nn.Sequential` is cut after the named children;
- any other model is traced with `torch.fx`, the named submodules kept whole (leaves of the trace), and
  the graph is split at their outputs. A cut is legal only where the named output is the one value that
  flows on: a submodule inside a residual branch (its input also flows past it) cannot hold a slot. Where the
  forward adds the submodule's output to the main path and reads it nowhere else (`x = x + block(x)` written
  in the model's own forward), the slot sits after that sum. fx fixes `self.training` at trace time: a call
  whose constant arguments the forward chose by it follows the host's mode (`core/training_mode.py`); a branch
  on it is refused.
  A model that `torch.fx` cannot trace, but whose forward runs its children in order, is cut as a sequence.

A shape probe with `example_input` then measures each slot's width and layout (and what enters each
segment, which a branch seed beside it maps), checks that the segments reproduce the model's output, and finds
each slotted block that a copy could stack (`ModuleHost.layer_before`).
Layouts: images [N, C, H, W] ("cnn"), sequences [N, C, L] ("cnn1d"), tokens [N, T, D] ("transformer") and
features [N, F] ("mlp"). A three-dimensional activation is read as tokens when the model holds an attention
layer, an embedding, an RNN or a LayerNorm over its last dimension, else as a sequence; `topology=` overrides
that guess. Whatever cannot work raises `HostBuildError` naming the submodule and why, before any training.
"""

from __future__ import annotations

import collections
import inspect
import itertools
import operator
import os
import traceback
from collections.abc import Callable, Mapping, Sequence
from itertools import pairwise
from pathlib import Path

import torch
from torch import Tensor, fx, nn

from morphogen.core.hosts import CarriedValues, SegmentedHost, SideInputs
from morphogen.core.tracing import traceable_factories, traced_buffers_as_values_if_needed
from morphogen.core.training_mode import ModeDependentCall, TrainingModeError, modes_kept, trace_in_both_modes
from morphogen.inputs import Inputs, InputSpec, call, dtype_mismatch, rows
from morphogen.inputs import names as input_names
from morphogen.inputs import problem as inputs_problem

#: The layout of each topology's activations, by rank: what a shape probe accepts for it.
TOPOLOGY_RANKS = {"cnn": 4, "cnn1d": 3, "transformer": 3, "mlp": 2}
#: Modules whose presence makes a three-dimensional activation read as tokens [N, T, D].
_TOKEN_MODULES = (nn.LayerNorm, nn.MultiheadAttention, nn.Embedding, nn.TransformerEncoderLayer,
                  nn.TransformerDecoderLayer, nn.RNNBase)


class HostBuildError(ValueError):
    """A model that cannot be made a host with the slots asked for; the message names the submodule and why."""


class ModuleHost(SegmentedHost):
    """A user's model cut into segments at named submodules; slot ids are the names with '.' as '_'."""

    def __init__(self, segments: Sequence[nn.Module], points: dict[str, int], topology: str,
                 submodules: dict[str, str], layers: dict[str, nn.Module] | None = None) -> None:
        super().__init__()
        self.segments.extend(segments)
        self._points = dict(points)
        self.topology = topology
        #: Slot id -> the qualified name of the submodule the slot sits after.
        self.submodules = dict(submodules)
        # Slot id -> that submodule, called as the model calls it but on the slot's activation (the other inputs it
        # reads, a mask, come from `side_inputs`). A plain dict: the modules are the segments' own, not registered
        # twice, so they appear once in state_dict and move with the host.
        self._layers = dict(layers or {})

    def layer_before(self, slot: str) -> nn.Module | None:
        """The submodule the slot sits after, where it has parameters, maps the slot's activation to the same shape
        and reads nothing else of the main path (what the shape probe found): a user's transformer block."""
        self.point_index(slot)  # raises UnknownSlotError
        return self._layers.get(slot)


def slot_id_for(name: str) -> str:
    """The slot id of the slot after submodule `name`: module dicts forbid '.', so `layer1.0` is `layer1_0`."""
    return name.replace(".", "_")


def host_from_module(model: nn.Module, slots: Sequence[str], example_input: Inputs, *,
                     topology: str | None = None, output: int | str | None = None,
                     carry_skips: bool = False) -> ModuleHost:
    """Make `model` a host with a slot after each submodule named in `slots` (qualified names, any order; one name
    may be given as a string).

    `example_input` is a small batch of real inputs (two samples suffice), given as the model takes them: a
    tensor, a tuple of tensors (positional arguments) or a dict of tensors (arguments by name); forward
    parameters it does not give keep their defaults. It is run once, in eval mode and without gradients, to
    measure the slots and to check the cut. `output` names the one output the loss reads where the forward
    returns several: its position in a tuple or list, its key in a dict, or the name of an attribute; the host
    (and the grown model, and its export) returns that one. `carry_skips=True` lets a slot sit where values
    computed before it also reach the code after it (a U-Net's skips, an encoder's output that a decoder reads, a
    residual connection around the slot): the segment that computes such a value holds it and the later one that
    reads it receives it, with the seed's effect where the value is taken after a slot. What `torch.compile`
    returns is taken as the module it compiled (compile the grown model's passes with the `compile` option).
    Raises `HostBuildError`.
    """
    model = _uncompiled(model)
    names = _checked_arguments(model, slots, example_input, topology, output)
    segments, ordered, side_inputs, layer_calls, carried, untraced = _cut(model, names, example_input, carry_skips)
    if output is not None:
        _pick_in(segments[-1], output)
    outputs, layers = _probe(model, segments, ordered, example_input, layer_calls, output, carried, untraced)
    chosen = topology or _guess_topology(model, outputs, ordered)
    slot_ids = [slot_id_for(name) for name in ordered]
    host = ModuleHost(segments, _widths(ordered, outputs, chosen), chosen, dict(zip(slot_ids, ordered, strict=True)),
                      {slot_id: layer for slot_id, layer in zip(slot_ids, layers, strict=True) if layer is not None})
    host.side_inputs, host.input_kind = side_inputs, InputSpec.of(example_input).kind
    host.input_names = input_names(example_input)
    host.carried_values = None if carried is None else carried[0]
    # What enters each segment, which a branch seed beside it maps: the first takes the model's inputs, which a
    # branch can read only where they are one tensor, and only values, not integer ids an embedding looks up.
    entering = [tuple(value.shape[1:]) if isinstance(value, Tensor) and value.is_floating_point() else None
                for value in (example_input, *outputs)]
    host.measured_shapes = {slot_id: (shape, tuple(outputs[index].shape[1:]))
                            for index, slot_id in enumerate(host.slot_ids)
                            if (shape := entering[index]) is not None}
    return host


def slot_points(model: nn.Module, example_input: Inputs, *, output: int | str | None = None,
                carry_skips: bool = False) -> dict[str, int]:
    """Where `host_from_module` can put a slot: each submodule's qualified name -> the slot's width (channels,
    features or d_model), for every submodule that a host with that one slot accepts, in the order the model
    defines them. It tries every submodule (a trace and a shape probe each), to choose slots by, not per step.

    A point inside a block's residual branch or a U-Net's skip (unless `carry_skips`, as `host_from_module`
    takes it), a submodule called twice, or one whose output is not one tensor is left out; so is one whose cut
    the probe finds changes the model's output. Raises `HostBuildError` for an `example_input` or `output` that
    no slot could work with, and where no submodule can hold one, with why."""
    model = _uncompiled(model)
    _checked_arguments(model, [], example_input, None, output, slots_needed=False)
    points: dict[str, int] = {}
    refusals: list[str] = []
    for name, _ in model.named_modules():  # a module registered twice is listed once, by its first name
        if not name:
            continue
        try:
            host = host_from_module(model, [name], example_input, output=output, carry_skips=carry_skips)
        except HostBuildError as error:
            refusals.append(str(error))
            continue
        points[name] = host.injection_points[slot_id_for(name)]
    if refusals and not points:  # the reason most submodules share is likely one about the model: say it
        common, count = collections.Counter(refusals).most_common(1)[0]
        shared = "" if count == len(refusals) else f"{count} of {len(refusals)}: "
        raise HostBuildError(f"no submodule of {type(model).__name__} can hold a slot ({shared}{common})")
    return points


def _uncompiled(model: nn.Module) -> nn.Module:
    """The module `torch.compile(module)` wraps, else `model`: fx cannot trace the wrapper, and it shares the
    module's parameters. Recognised by its name, so that building a host never imports torch's compiler."""
    original = getattr(model, "_orig_mod", None)
    if type(model).__name__ == "OptimizedModule" and isinstance(original, nn.Module):
        return original
    return model


def _checked_arguments(model: nn.Module, slots: Sequence[str], example_input: Inputs, topology: str | None,
                       output: object, *, slots_needed: bool = True) -> list[str]:
    """The slot names, once every argument of `host_from_module` is one it can work with (`slots_needed` False:
    every argument but the slots)."""
    if not isinstance(model, nn.Module):
        raise HostBuildError(f"host_from_module needs an nn.Module, got {type(model).__name__}")
    if any(tensor.is_meta for tensor in itertools.chain(model.parameters(), model.buffers())):
        raise HostBuildError("the model is on the meta device: host_from_module runs it on example_input to check "
                             "every cut, which needs real weights; build it on the CPU (or your GPU) and move the "
                             "host afterwards")
    problem = inputs_problem(example_input)
    if problem is not None:
        raise HostBuildError("example_input must be a batch of the model's inputs (a tensor, or a tuple or dict of "
                             f"tensors, each with a leading sample dimension); got {problem}")
    slots = [slots] if isinstance(slots, str) else slots  # one name given as a string, not its characters
    names = list(dict.fromkeys(slots))
    if slots_needed and (not names or len(names) != len(slots)):
        raise HostBuildError(f"slots must name one or more distinct submodules, got {list(slots)}")
    _check_names(model, names)
    if topology is not None and topology not in TOPOLOGY_RANKS:
        raise HostBuildError(f"unknown topology {topology!r}; valid: {', '.join(TOPOLOGY_RANKS)}")
    if output is not None and (isinstance(output, bool) or not isinstance(output, int | str)):
        raise HostBuildError(f"output must be a position (int) or a key or attribute name (str), got {output!r}")
    return names


class _PickOutput(nn.Module):
    """The one output named by `key` of the several a model's forward returns."""

    def __init__(self, key: int | str) -> None:
        super().__init__()
        self.key = key

    def forward(self, outputs: object) -> Tensor:
        return _pick_output(outputs, self.key)  # type: ignore[return-value]  # the shape probe checks it is a tensor


def _pick_in(part: nn.Module, key: int | str) -> None:
    """Make the model's last part return output `key`: a step at its end, with no parameters, so that its
    state_dict and the layers a width site reads stay as they are."""
    if isinstance(part, fx.GraphModule):
        part.add_submodule("picked_output", _PickOutput(key))
        end = next(node for node in part.graph.nodes if node.op == "output")
        with part.graph.inserting_before(end):
            picked = part.graph.call_module("picked_output", (end.args[0],))
        end.args = (picked,)
        part.recompile()
    else:
        assert isinstance(part, nn.Sequential)  # a cut between children
        part.append(_PickOutput(key))


def _pick_output(outputs: object, key: int | str) -> object:
    """Output `key` of several: a position in a tuple or list, a key of a dict, else the name of an attribute (a
    named tuple's or a dataclass's field)."""
    if isinstance(key, int):
        return outputs[key]  # type: ignore[index]  # not a sequence: TypeError, a user's mistake
    return outputs[key] if isinstance(outputs, Mapping) else getattr(outputs, key)


def _widths(names: Sequence[str], outputs: Sequence[Tensor], topology: str) -> dict[str, int]:
    """Slot id -> width of the slot after each named submodule, from its probed output in `topology`'s layout."""
    points: dict[str, int] = {}
    for name, activation in zip(names, outputs, strict=True):
        if activation.dim() != TOPOLOGY_RANKS[topology]:
            raise HostBuildError(f"slot after {name!r}: its output has shape {tuple(activation.shape)}, but a "
                                 f"{topology} host needs {TOPOLOGY_RANKS[topology]} dimensions (all slots of a host "
                                 "share one layout)")
        points[slot_id_for(name)] = int(activation.shape[1] if topology in ("cnn", "cnn1d") else activation.shape[-1])
    if len(points) != len(names):
        raise HostBuildError(f"slot names {list(names)} collide once '.' becomes '_'; name other submodules")
    return points


def _check_names(model: nn.Module, names: Sequence[str]) -> None:
    known = dict(model.named_modules())
    for name in names:
        if not isinstance(name, str):  # `slots=[1]` for an nn.Sequential's child '1'
            raise HostBuildError(f"slots are names of submodules, as strings: got {name!r} "
                                 f"({type(name).__name__}); write {str(name)!r}")
        if name not in known or not name:
            children = ", ".join(child for child, _ in model.named_children()) or "none"
            raise HostBuildError(f"no submodule named {name!r} in {type(model).__name__}; its children: {children} "
                                 "(morphogen.slot_points(model, example_input) lists where slots can go)")
    for name in names:
        for other in names:
            if other != name and other.startswith(name + "."):
                raise HostBuildError(f"slot after {other!r} lies inside {name!r}, which also holds a slot; "
                                     "choose one of them")


#: Where segments hand values across slots, and the name of each value (by its key), for the shape probe's messages.
Carried = tuple[CarriedValues, list[str]]


def _cut(model: nn.Module, names: Sequence[str], example: Inputs, carry: bool = False
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
            return (*_children_cut(model, names), None, _first_line(error))
        raise HostBuildError(f"cannot trace {type(model).__name__} with torch.fx ({_first_line(error)}); "
                             + ("a model of several inputs must trace" if several else "put the slots on its direct "
                                "children if its forward runs them in order")) from None
    return (*_split_graph(traced, names, given, carry), "")


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
    return segments, ordered, None, [modules[name] if _is_block(modules[name]) else None for name in ordered]


def _is_block(module: nn.Module) -> bool:
    """Whether `module` is made of layers (a block), not one linear map or norm, which a copy stacks little of."""
    return next(module.children(), None) is not None


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


class _Inputs:
    """The model's inputs in a traced graph: the placeholders the example gives (each with its key in the inputs)
    and the fixed ones (each with the value it was traced with)."""

    def __init__(self, placeholders: list[fx.Node], given: dict[str, int | str | None]) -> None:
        if not given and len(placeholders) == 1:  # a forward fx reads no signature of: its one input
            given = {str(placeholders[0].target): None}
        self.given = {node: given[str(node.target)] for node in placeholders if str(node.target) in given}
        self.fixed = {node: node.args[0] if node.args else None for node in placeholders if node not in self.given}
        self.several = any(key is not None for key in self.given.values())
        if not self.given or any(not node.args for node in self.fixed):  # an input neither given nor defaulted
            raise HostBuildError(f"the model's forward takes {len(placeholders)} inputs; give them all in "
                                 "example_input as a tuple (by position) or a dict (by name) of tensors")
        #: Nodes computed from the inputs, parameters and constants alone (filled by `derive`).
        self.derived: set[fx.Node] = set()
        #: Nodes that draw random numbers, or compute from such a draw by functions and methods.
        self.drawn: set[fx.Node] = set()

    def derive(self, nodes: list[fx.Node]) -> None:
        """Find the nodes computed from the inputs, parameters and constants alone by functions and methods (a
        mask made from the inputs, positions from their length): a later segment recomputes them rather than
        receive them. No module call is recomputed: its cost, or its state (dropout, batch-norm statistics),
        would change by running twice."""
        self.derived = {*self.given, *self.fixed}
        for node in nodes:
            computed = node.op in ("call_function", "call_method")
            if (computed and any(arg in self.drawn for arg in node.all_input_nodes)) or _draws(node):
                self.drawn.add(node)  # random: computed again, it would differ
            elif node.op == "get_attr" or (computed and all(arg in self.derived for arg in node.all_input_nodes)):
                self.derived.add(node)

    def read_by(self, node: fx.Node) -> bool:
        """Whether `node` takes an input, or a value computed from the inputs, as an argument."""
        return any(arg in self.derived and arg.op != "get_attr" and arg not in self.fixed
                   for arg in node.all_input_nodes)

    def read_after(self, cut: fx.Node, position: dict[fx.Node, int]) -> bool:
        """Whether code after `cut` reads an input or a value computed from one (a later segment then needs
        the inputs)."""
        return any(position[user] > position[cut] for node in self.derived if node.op != "get_attr"
                   and node not in self.fixed for user in node.users)


def _split_graph(traced: fx.GraphModule, names: Sequence[str], given: dict[str, int | str | None], carry: bool
                 ) -> tuple[list[nn.Module], list[str], SideInputs | None, list[nn.Module | None], Carried | None]:
    """Split the traced graph after each named submodule's call (or the residual sum it ends in, `_slot_end`);
    check that nothing but the model's inputs flows past a cut (a later segment reads those from the
    `SideInputs` the first one binds), or with `carry` hand the values that do to the segments that read them
    (`CarriedValues`). Also each slot's layer as a module of the activation before it alone, which reads its other
    inputs from the `SideInputs` too."""
    _erase_unread_items(traced.graph)
    nodes = list(traced.graph.nodes)
    position = {node: i for i, node in enumerate(nodes)}
    inputs = _Inputs([node for node in nodes if node.op == "placeholder"], given)
    inputs.derive(nodes)
    ordered, cuts, crossing = _cuts(traced, nodes, names, position, inputs, carry)
    layers = [_layer_nodes(traced, _only_call(nodes, name), cut, inputs, position)
              for name, cut in zip(ordered, cuts, strict=True)]
    reads = inputs.read_after(cuts[0], position) or any(
        inputs.read_by(node) for layer in layers if layer is not None for node in layer[1])
    side_inputs = SideInputs() if reads else None
    if side_inputs is not None:
        traced.side_inputs = side_inputs  # the segments' graphs read it as an attribute of their root
    keys, carried = _carried_values(traced, crossing, position)
    boundaries: list[fx.Node | None] = [None, *cuts, nodes[-1]]
    segments: list[nn.Module] = [_segment(traced, nodes, position, start, end, inputs, side_inputs is not None, keys)
                                 for start, end in pairwise(boundaries)]
    return segments, ordered, side_inputs, [_layer_call(traced, layer, inputs) for layer in layers], carried


def _carried_values(traced: fx.GraphModule, crossing: set[fx.Node], position: dict[fx.Node, int]
                    ) -> tuple[dict[fx.Node, int], Carried | None]:
    """Each value that crosses a cut by its key (in execution order), and the `CarriedValues` that hand them
    across, an attribute of the segments' root as `side_inputs` is (None where nothing crosses)."""
    keys = {node: key for key, node in enumerate(sorted(crossing, key=position.__getitem__))}
    if not keys:
        return keys, None
    traced.carried_values = CarriedValues()
    return keys, (traced.carried_values, [node.name for node in keys])


def _erase_unread_items(graph: fx.Graph) -> None:
    """Erase the items of several returned values that nothing reads (the `_` of `out, _ = lstm(x)`), so that a
    slot after the call sits after the one that is read."""
    for node in reversed(list(graph.nodes)):  # an unread item's own unread items go first
        if node.op == "call_function" and node.target is operator.getitem and not node.users:
            graph.erase_node(node)


def _cuts(traced: fx.GraphModule, nodes: list[fx.Node], names: Sequence[str], position: dict[fx.Node, int],
          inputs: _Inputs, carry: bool) -> tuple[list[str], list[fx.Node], set[fx.Node]]:
    """The slot names in execution order, the node each slot sits after (`_slot_end`), each checked to be on
    the main path, and (with `carry`) the values of the main path that cross a cut."""
    modules = dict(traced.named_modules())
    ends = {name: _slot_end(_only_call(nodes, name), inputs, modules) for name in names}
    ordered = sorted(names, key=lambda name: position[ends[name]])
    crossing: set[fx.Node] = set()
    for name in ordered:
        crossing.update(_check_nothing_flows_past(name, ends[name], nodes, position, inputs, carry))
    return ordered, [ends[name] for name in ordered], crossing


#: Modules that may lie between a branch's last layer and its residual sum: dropouts (a ReLU module does not: a
#: slot after the norm before it stays inside the branch, where the user named it).
_BRANCH_END_MODULES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout,
                       nn.Identity, ModeDependentCall)
#: Sums that end a residual connection written in the caller's forward (`x = x + block(x)`, `x += block(x)`).
_SUMS = {operator.add, operator.iadd, torch.add}


def _slot_end(call: fx.Node, inputs: _Inputs, modules: Mapping[str, nn.Module]) -> fx.Node:
    """Where the slot after submodule `call` sits: after the call, or where the forward adds its output to a value
    of the main path and nothing else reads it (a residual connection written in the caller: `x = x + block(x)`,
    also through a dropout, an activation function or a scale: `x + drop(block(x))`), after the sum, so that the
    slot sits on the main path. A sum with the inputs or a parameter only (position embeddings) is no such
    connection."""
    node = start = _element_read(call)
    while len(node.users) == 1:
        (user,) = node.users
        others = [argument for argument in user.all_input_nodes if argument is not node]
        main = [argument for argument in others if argument not in inputs.derived]
        if _is_residual_sum(user, main):
            return user
        passes = user.op in ("call_function", "call_method") or (
            user.op == "call_module" and isinstance(modules[str(user.target)], _BRANCH_END_MODULES))
        if main or not passes:
            break
        node = user  # on the branch's way to the sum: a dropout, an activation function, a scale by a parameter
    return start


def _element_read(call: fx.Node) -> fx.Node:
    """Where `call` returns several values and the forward reads one of them (`out, _ = lstm(x)`, the unread ones
    erased), that one: a slot after an LSTM sits after its output sequence. Otherwise `call`."""
    users = list(call.users)
    if len(users) == 1 and users[0].op == "call_function" and users[0].target is operator.getitem and \
            isinstance(users[0].args[1], int):
        return users[0]
    return call


def _is_residual_sum(node: fx.Node, main: list[fx.Node]) -> bool:
    """Whether `node` adds two values, one of them the one value of the main path in `main`."""
    return node.op == "call_function" and node.target in _SUMS and not node.kwargs and len(node.args) == 2 and \
        len(main) == 1 and main[0] in node.args


def _layer_nodes(traced: fx.GraphModule, call: fx.Node, end: fx.Node, inputs: _Inputs,
                 position: dict[fx.Node, int]) -> tuple[fx.Node, list[fx.Node]] | None:
    """The slot's layer as (the one value of the main path it takes, the nodes that compute the slot's activation
    from it): submodule `call`, or with a residual sum after it (`end`), the path from the value added to through
    the sum. None where it takes two values of the main path or none (the first layer takes the model's inputs), or
    where the submodule is no block (one linear map or norm, which a copy stacks little of)."""
    if end is _element_read(call) is not call:
        return None  # one value of several the submodule returns: no block to copy
    if end is call:
        main = [node for node in call.all_input_nodes if node not in inputs.derived]
        block = _is_block(traced.get_submodule(str(call.target)))
        return (main[0], [call]) if len(main) == 1 and block else None
    # The value added to: the sum's argument not computed from the call, on the main path (`_slot_end`).
    (added,) = [node for node in end.all_input_nodes if call not in _ancestors_after(node, position[call] - 1,
                                                                                       position)]
    computing = _ancestors_after(end, position[added], position)
    reads = {node for member in computing for node in member.all_input_nodes} - set(computing)
    if any(node is not added and node not in inputs.derived for node in reads):
        return None
    return added, sorted(computing, key=position.__getitem__)


def _ancestors_after(node: fx.Node, start: int, position: dict[fx.Node, int]) -> set[fx.Node]:
    """`node` and the nodes it is computed from that come after position `start`."""
    found, pending = set(), [node]
    while pending:
        current = pending.pop()
        if current not in found and position[current] > start:
            found.add(current)
            pending.extend(current.all_input_nodes)
    return found


def _layer_call(traced: fx.GraphModule, layer: tuple[fx.Node, list[fx.Node]] | None,
                inputs: _Inputs) -> fx.GraphModule | None:
    """A slot's layer (`_layer_nodes`) as a module of one input, the value on the main path it takes; its other
    arguments (a mask) read or recomputed from the model's inputs. None where there is none."""
    if layer is None:
        return None
    main, computing = layer
    graph = fx.Graph()
    x = graph.placeholder("x")
    values: dict[fx.Node, fx.node.Argument] = {**inputs.fixed, main: x}
    value_of = _value_reader(graph, values, inputs, x)
    for node in computing:
        values[node] = graph.node_copy(node, value_of)
    graph.output(values[computing[-1]])
    return fx.GraphModule(traced, graph)


def _only_call(nodes: list[fx.Node], name: str) -> fx.Node:
    """The one call of submodule `name` in the graph; a slot cannot follow a submodule called twice or never."""
    calls = [node for node in nodes if node.op == "call_module" and node.target == name]
    if len(calls) != 1:
        # A list of blocks your forward loops over (nanoGPT's `for block in self.h`) is never called itself.
        items = dict.fromkeys(f"{name}.{str(node.target)[len(name) + 1:].split('.')[0]}" for node in nodes
                              if node.op == "call_module" and str(node.target).startswith(f"{name}."))
        hint = f": it holds the submodules your forward calls, name them ({', '.join(items)})" if items and not calls \
            else ""
        raise HostBuildError(f"slot after {name!r}: forward calls it {len(calls)} times; a slot needs exactly one "
                             f"call on the main path{hint}")
    return calls[0]


#: Functions and tensor methods that draw random numbers: a later part cannot compute their values again.
_RANDOM_FUNCTIONS = {torch.rand, torch.randn, torch.randint, torch.rand_like, torch.randn_like, torch.randint_like,
                     torch.randperm, torch.bernoulli, torch.multinomial, torch.normal, torch.poisson,
                     nn.functional.dropout, nn.functional.dropout1d, nn.functional.dropout2d,
                     nn.functional.dropout3d, nn.functional.alpha_dropout, nn.functional.feature_alpha_dropout}
_RANDOM_METHODS = {"bernoulli", "bernoulli_", "uniform_", "normal_", "random_", "exponential_", "geometric_",
                   "cauchy_", "log_normal_", "multinomial"}


def _draws(node: fx.Node) -> bool:
    """Whether `node` draws random numbers."""
    if node.op == "call_function":
        return node.target in _RANDOM_FUNCTIONS
    return node.op == "call_method" and node.target in _RANDOM_METHODS


def _check_nothing_flows_past(name: str, cut: fx.Node, nodes: list[fx.Node], position: dict[fx.Node, int],
                              inputs: _Inputs, carry: bool) -> list[fx.Node]:
    """Refuse a cut that a value computed from the main path crosses: the segments would lose it (the model's
    inputs, and what is computed from them alone, may cross: later segments read or recompute them). With `carry`,
    the crossing values are returned instead, to be handed across, except values computed from sizes alone (a
    mask, no row per sample), which are refused still."""
    crossing = _crossing(cut, nodes, position, inputs)
    sized = [node for node in crossing if _from_sizes(node, inputs)]
    if carry and not sized:
        return crossing  # a value drawn before the cut crosses too: computed once, it is not drawn again
    if not carry:
        _refuse_drawn(name, [node.name for node in crossing if node in inputs.drawn])
    if sized and (carry or len(sized) == len(crossing)):
        flowing = ", ".join(node.name for node in sized)
        raise HostBuildError(f"slot after {name!r}: the code after it reads {flowing}, computed from the size of a "
                             "value on the main path, which a later part cannot read: compute it from the model's "
                             "inputs (the length of the token ids, not of their embeddings), or give it as an input")
    if crossing:
        flowing = ", ".join(node.name for node in crossing)
        raise HostBuildError(f"slot after {name!r}: it sits inside a branch: {flowing} "
                             "also reach the code after it (a residual connection, a U-Net's skip, branches joined "
                             "later by a concatenation); put the slot "
                             "after the block that joins them (morphogen.slot_points lists where slots can go), or "
                             "pass carry_skips=True to hand those values across the slot")
    return []


def _crossing(cut: fx.Node, nodes: list[fx.Node], position: dict[fx.Node, int], inputs: _Inputs) -> list[fx.Node]:
    """The values of the main path computed before `cut` that code after it reads."""
    return [node for node in nodes[:position[cut]] if node not in inputs.derived
            and any(position[user] > position[cut] for user in node.users)]


def _refuse_drawn(name: str, drawn: list[str]) -> None:
    """Refuse a cut crossed by values computed from random numbers drawn before it, which a later part would draw
    again (unless they are carried across)."""
    if drawn:
        raise HostBuildError(f"slot after {name!r}: the code after it reads {', '.join(drawn)}, computed from "
                             "random numbers drawn before it, which a later part would draw again: draw them in a "
                             "module (as nn.Dropout does) or give them as an input")


#: Tensor methods and attributes that read a tensor's size, not its values.
_SIZE_READS = {"size", "dim", "numel", "shape", "ndim"}


def _from_sizes(node: fx.Node, inputs: _Inputs, known: dict[fx.Node, bool] | None = None) -> bool:
    """Whether `node` is computed by functions and methods from sizes of tensors (and the inputs, parameters and
    constants) alone: `mask = causal_mask(x.size(1))` with `x` on the main path."""
    known = {} if known is None else known
    if node not in known:
        reads_size = (node.op == "call_method" and node.target in _SIZE_READS) or (
            node.op == "call_function" and node.target is getattr and str(node.args[1]) in _SIZE_READS)
        known[node] = node in inputs.derived or reads_size or (
            node.op in ("call_function", "call_method")
            and all(_from_sizes(argument, inputs, known) for argument in node.all_input_nodes))
    return known[node]


def _segment(traced: fx.GraphModule, nodes: list[fx.Node], position: dict[fx.Node, int], start: fx.Node | None,
             end: fx.Node | None, inputs: _Inputs, side: bool, carried: Mapping[fx.Node, int]) -> fx.GraphModule:
    """The nodes after `start` (None: the first segment) up to `end` as a module of one input: the value of
    `start`, or the model's inputs (one tensor, or a tuple or dict of them, which it binds when `side`). A value in
    `carried` (by its key) that a later segment reads is held where it is computed, except the segment's own end,
    which the next segment holds as it receives it (after the slot); one computed in an earlier segment is read."""
    graph = fx.Graph()
    values: dict[fx.Node, fx.node.Argument] = dict(inputs.fixed)
    if start is None:
        first = graph.placeholder("inputs" if inputs.several else "x")
        bound = graph.call_method("bind", (graph.get_attr("side_inputs"), first)) if side else first
        for node, key in inputs.given.items():
            values[node] = bound if key is None else graph.call_function(operator.getitem, (bound, key))
    else:  # the value after the slot, held where a later segment reads it: a seed there changes what it receives
        values[start] = _held(graph, carried, start, graph.placeholder("x"))
    value_of = _value_reader(graph, values, inputs, None if start is None else values[start], carried)
    assert end is not None  # only the first segment starts at None
    for node in nodes[0 if start is None else position[start] + 1:position[end] + 1]:
        if node.op == "output":
            graph.output(fx.map_arg(node.args[0], value_of))
        elif node.op != "placeholder":
            copied = graph.node_copy(node, value_of)
            values[node] = copied if node is end else _held(graph, carried, node, copied)
    if end.op != "output":
        graph.output(values[end])
    return fx.GraphModule(traced, graph)


def _held(graph: fx.Graph, carried: Mapping[fx.Node, int], node: fx.Node, value: fx.Node) -> fx.Node:
    """`value`, the copy of `node` in `graph`, held in the `CarriedValues` where `node` crosses a later cut."""
    if node not in carried:
        return value
    return graph.call_method("hold", (graph.get_attr("carried_values"), carried[node], value))


def _value_reader(graph: fx.Graph, values: dict[fx.Node, fx.node.Argument], inputs: _Inputs,
                  like: fx.node.Argument, carried: Mapping[fx.Node, int] | None = None
                  ) -> Callable[[fx.Node], fx.node.Argument]:
    """The value in `graph` of a node of the traced model: mapped in `values`, else an input read from the
    `SideInputs` with the rows of `like` (the part's own input), a value an earlier segment computed read from the
    `CarriedValues` (`carried`: their keys), or a value computed from the inputs again."""

    def value_of(node: fx.Node) -> fx.node.Argument:
        if node not in values:  # an input, a parameter or a value computed from them in an earlier segment
            if carried and node in carried:
                assert like is not None  # the first segment reads nothing from an earlier one
                values[node] = graph.call_method("read", (graph.get_attr("carried_values"), carried[node], like))
            elif node in inputs.given:
                assert like is not None  # the first segment maps every input before it runs
                values[node] = graph.call_method("read", (graph.get_attr("side_inputs"), inputs.given[node], like))
            else:  # read or computed here again
                assert node in inputs.derived, node
                values[node] = graph.node_copy(node, value_of)
        return values[node]

    return value_of


def _probe(model: nn.Module, segments: Sequence[nn.Module], names: Sequence[str], example: Inputs,
           layers: Sequence[nn.Module | None], key: int | str | None,
           carried: Carried | None = None, untraced: str = "") -> tuple[list[Tensor], list[nn.Module | None]]:
    """Run the segments on `example` (eval mode, no grad): the activation at every cut, checked against the model,
    and the `layers` (one per cut) that a copy could stand after their own: they map the activation at their cut
    to its shape. A value carried across slots must hold one row per sample, as the activations do. `untraced`:
    why fx could not trace the model, which was then cut between its children."""
    copyable: list[nn.Module | None] = []
    # The segments hold modules of their own (a functional dropout's module), which the model's mode does not set.
    with modes_kept(model, *segments), torch.no_grad():
        for part in (model, *segments):
            part.eval()
        with torch.enable_grad():  # as the model trains: no inference fast path (nested tensors drop padding)
            expected: object = _call(lambda inputs: _detached(call(model, inputs)), example, type(model).__name__,
                                   model)
        if key is not None:
            expected = _picked_output(type(model).__name__, expected, key)
        activations: list[Tensor] = []
        x: object = example
        for index, segment in enumerate(segments):
            what = f"the part ending at {names[index]!r}" if index < len(names) else f"the part after {names[-1]!r}"
            try:
                x = _call(segment, x, what, model)
            except HostBuildError as error:  # the model itself ran on the example: the cut is what fails
                if not untraced:
                    raise
                raise HostBuildError(f"torch.fx cannot trace {type(model).__name__} ({untraced}), and cutting it "
                                     f"between its children fails ({error}): its forward does not run them in order; "
                                     "write it so that fx traces it") from None
            activations.append(x)
            if index < len(names):  # checked before the next part runs on it (its inputs are bound now)
                _check_one_row_per_sample(names[index], x, rows(example), isinstance(example, Tensor)
                                          and example.dim() == 1, _is_batch_first_rnn(model, names[index]))
                copyable.append(layers[index] if _keeps_shape(layers[index], x) else None)
        if carried is not None:
            _check_carried_rows(carried, rows(example))
    _check_the_output(model, example, expected, activations.pop(), key, names, untraced)
    for name, activation in zip(names, activations, strict=True):
        if not isinstance(activation, Tensor):
            raise HostBuildError(f"slot after {name!r}: its output is a {type(activation).__name__}, not one tensor"
                                 + (f"; {_RNN_STATE_HINT}" if isinstance(model.get_submodule(name), nn.RNNBase)
                                    else ""))
        if activation.dim() < 2:
            raise HostBuildError(f"slot after {name!r}: its output has shape {tuple(activation.shape)}; a slot needs "
                                 "[N, channels, ...] or [N, ..., features]")
    return activations, copyable


def _check_carried_rows(carried: Carried, samples: int) -> None:
    """Stacked configurations and shadow rows are whole samples, in the values carried across slots too."""
    values, names = carried
    try:
        for key, rows_held in values.rows_held().items():
            if rows_held != samples:
                what = "is no tensor of rows" if rows_held is None else f"has {rows_held} rows"
                raise HostBuildError(f"{names[key]}, which crosses a slot, {what} for a batch of {samples} samples; a "
                                     "value carried across slots needs one row per sample")
    finally:
        values.release()


def _picked_output(model_name: str, outputs: object, key: int | str) -> object:
    try:
        return _pick_output(outputs, key)
    except (IndexError, KeyError, TypeError, AttributeError):
        raise HostBuildError(f"output={key!r}: {model_name}'s forward returns a {type(outputs).__name__} without "
                             f"it; {_output_choices(outputs)}") from None


def _output_choices(outputs: object) -> str:
    """How `output=` can name each of the several outputs a forward returned, for the message that asks for one."""
    if isinstance(outputs, Mapping):
        return f"its keys: {', '.join(f'output={key!r}' for key in outputs)}"
    fields = getattr(outputs, "_fields", None) or getattr(outputs, "__dataclass_fields__", None)
    if fields:
        return f"its fields: {', '.join(f'output={name!r}' for name in fields)}"
    if isinstance(outputs, tuple | list) and outputs:
        return f"its positions: output=0 to output={len(outputs) - 1}"
    return 'output=0 (a position) or output="logits" (a key or attribute)'


def _detached(output: object) -> object:
    return output.detach() if isinstance(output, Tensor) else output


def _keeps_shape(layer: nn.Module | None, activation: object) -> bool:
    """Whether `layer` has parameters to train and runs on `activation`, its own output, to the same shape."""
    if layer is None or not isinstance(activation, Tensor) or not any(p.requires_grad for p in layer.parameters()):
        return False
    try:
        output = layer(activation)
    except Exception:  # the user's code: it does not take its own output (an embedding, a projection to another width)
        return False
    return isinstance(output, Tensor) and output.shape == activation.shape


#: Why the value a forward reads of an RNN's state cannot hold a slot, and where one can go instead.
_RNN_STATE_HINT = ("an RNN's final state (h, or an LSTM's (h, c)) is [layers, N, D] whatever batch_first: put the slot "
                   "after the RNN where the forward reads its output (out, _ = rnn(x); out[:, -1]), or after a layer "
                   "that reads the state")


def _is_batch_first_rnn(model: nn.Module, name: str) -> bool:
    """Whether submodule `name` is one of torch's RNNs (nn.RNN, nn.LSTM, nn.GRU) built with batch_first=True."""
    module = model.get_submodule(name)
    return isinstance(module, nn.RNNBase) and module.batch_first


def _check_one_row_per_sample(name: str, activation: object, samples: int, flat_example: bool = False,
                              batch_first_rnn: bool = False) -> None:
    """Shadow rows and stacked configurations are whole samples: a slot's activation holds one row per sample.
    `flat_example`: the example input is one 1-D tensor, most often one sample given without its batch dimension;
    `batch_first_rnn`: the slot follows a batch-first RNN, whose output holds a row per sample but its final state
    does not."""
    if isinstance(activation, Tensor) and activation.dim() > 0 and activation.shape[0] != samples:
        if flat_example:
            hint = (f"; example_input is a batch, its first dimension the samples: was it one sample's {samples} "
                    "values (give x[:2], not x[0])?")
        elif batch_first_rnn:
            hint = f"; {_RNN_STATE_HINT}"
        elif activation.dim() > 1 and activation.shape[1] == samples:
            hint = (f"; its dimension 1 holds the {samples} samples, as in a sequence-first layout (torch's "
                    "transformer layers and RNNs with batch_first=False): build them with batch_first=True")
        else:
            hint = ""
        raise HostBuildError(f"slot after {name!r}: its output has {activation.shape[0]} rows for a batch of "
                             f"{samples} samples; a slot needs one row per sample (not tokens folded into the "
                             f"batch){hint}")


def _call(module: Callable[[Tensor], object], x: object, what: str, model: nn.Module) -> Tensor:
    try:
        return module(x)  # type: ignore[arg-type,return-value]  # checked by the caller
    except Exception as error:  # the user's code: any exception means the example does not fit
        dtypes = dtype_mismatch(x, model.parameters(), error) if inputs_problem(x) is None else ""  # type: ignore[arg-type]
        raise HostBuildError(f"running {what} on example_input failed: {_first_line(error)}"
                             + (f" ({dtypes})" if dtypes else "")) from None


def _guess_topology(model: nn.Module, activations: Sequence[Tensor], names: Sequence[str]) -> str:
    ranks = {activation.dim() for activation in activations}
    if len(ranks) > 1:
        shapes = ", ".join(f"{name} {tuple(a.shape)}" for name, a in zip(names, activations, strict=True))
        raise HostBuildError(f"slots have outputs of different ranks ({shapes}); all slots of a host share one layout")
    rank = ranks.pop()
    if rank == 4:
        return "cnn"
    if rank == 2:
        return "mlp"
    if rank == 3:
        tokens = any(_marks_tokens(module, activations) for module in model.modules())
        return "transformer" if tokens else "cnn1d"
    raise HostBuildError(f"slot outputs have {rank} dimensions; hosts grow [N, F], [N, C, L], [N, T, D] or "
                         "[N, C, H, W] activations")


def _marks_tokens(module: nn.Module, activations: Sequence[Tensor]) -> bool:
    """Whether `module` says the model's 3-D activations are tokens [N, T, D]: attention, an embedding, an RNN, a
    transformer layer, or a LayerNorm over the features of the activations' last dimension. A LayerNorm over the
    channels of [N, C, L] (a ConvNeXt-style 1-D convolution network, which transposes around it) does not."""
    if isinstance(module, nn.LayerNorm):
        return any(module.normalized_shape[-1] == activation.shape[-1] for activation in activations)
    return isinstance(module, _TOKEN_MODULES)


def _check_the_output(model: nn.Module, example: Inputs, expected: object, output: object, key: int | str | None,
                      names: Sequence[str], untraced: str) -> None:
    """Refuse a cut whose last segment does not give the model's output: several outputs and no `output=`, a
    model random in eval mode, or parts the forward does not run in order."""
    if not isinstance(expected, Tensor) or not isinstance(output, Tensor):
        raise HostBuildError(f"{type(model).__name__}'s forward returns {type(expected).__name__}; a host returns "
                             f"one tensor: name the one your loss reads ({_output_choices(expected)})")
    if output.shape != expected.shape or not torch.allclose(output, expected, rtol=1e-4, atol=1e-5):
        _refuse_a_random_eval_mode(model, example, expected, key)
        cause = (f"torch.fx cannot trace {type(model).__name__} ({untraced}), and cutting it between its children "
                 if untraced else f"cutting {type(model).__name__} ")
        raise HostBuildError(f"{cause}after {', '.join(names)} changes its output; its forward does not run those "
                             "parts in order")


def _refuse_a_random_eval_mode(model: nn.Module, example: Inputs, output: Tensor, key: int | str | None) -> None:
    """Refuse a model whose eval-mode output differs from call to call (a dropout left on, `F.dropout(x, p)`
    without `training=self.training`, a random draw, a buffer updated by the forward): no cut can compute what it
    computes."""
    with modes_kept(model), torch.enable_grad():  # as the probe ran it: no inference fast path
        again: object = _call(lambda inputs: _detached(call(model.eval(), inputs)), example,
                              type(model).__name__, model)
    if key is not None:
        again = _picked_output(type(model).__name__, again, key)
    if isinstance(again, Tensor) and not torch.equal(again, output):
        raise HostBuildError(f"{type(model).__name__} gives another output each time it runs in eval mode on the same "
                             "inputs: a dropout that is always on (F.dropout(x, p) without training=self.training), "
                             "a random draw, or a buffer its forward changes in place (a running statistic kept "
                             "outside a module such as nn.BatchNorm); a host validates in eval mode, where the model "
                             "must be deterministic")


def _first_line(error: BaseException) -> str:
    """The error's kind and first line, and the line of the user's code it came from (`_line_of_yours`)."""
    text = str(error).strip().splitlines()
    first = f"{type(error).__name__}: {text[0][:300]}" if text else type(error).__name__
    where = _line_of_yours(error)
    return f"{first}, at {where}" if where else first


#: Where torch's and morphogen's own code lies: a traceback's frames outside them are the user's.
_LIBRARY_FOLDERS = tuple(str(folder) + os.sep for folder in (Path(torch.__file__).resolve().parent,
                                                              Path(__file__).resolve().parents[1]))


def _line_of_yours(error: BaseException) -> str:
    """`FILE:LINE: `SOURCE`` of the innermost frame of `error`'s traceback outside torch and morphogen (the `assert`
    on a length that fx cannot trace, the embedding call an index overran); "" where there is none."""
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        path = frame.filename
        if path.startswith("<") or str(Path(path).resolve()).startswith(_LIBRARY_FOLDERS):
            continue  # fx's generated code, or a library's own
        source = (frame.line or "").strip()
        return f"{path}:{frame.lineno}" + (f": `{source[:120]}`" if source else "")
    return ""
