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
import itertools
from collections.abc import Sequence

from torch import Tensor, nn

from morphogen.core.host_cut import cut_model
from morphogen.core.host_errors import HostBuildError
from morphogen.core.host_probe import guess_topology, probe_segments
from morphogen.core.hosts import SegmentedHost
from morphogen.core.several_outputs import pick_in
from morphogen.inputs import Inputs, InputSpec
from morphogen.inputs import names as input_names
from morphogen.inputs import problem as inputs_problem

__all__ = ["TOPOLOGY_RANKS", "HostBuildError", "ModuleHost", "host_from_module", "slot_id_for", "slot_points"]

#: The layout of each topology's activations, by rank: what a shape probe accepts for it.
TOPOLOGY_RANKS = {"cnn": 4, "cnn1d": 3, "transformer": 3, "mlp": 2}


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
    segments, ordered, side_inputs, layer_calls, carried, untraced = cut_model(model, names, example_input, carry_skips)
    if output is not None:
        pick_in(segments[-1], output)
    outputs, layers = probe_segments(model, segments, ordered, example_input, layer_calls, output, carried, untraced)
    chosen = topology or guess_topology(model, outputs, ordered)
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
