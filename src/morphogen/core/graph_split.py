"""A traced model split into segments at its slots: the main path, the values that cross a cut, each slot's layer."""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from itertools import pairwise

import torch
from torch import fx, nn

from morphogen.core.host_errors import HostBuildError
from morphogen.core.hosts import CarriedValues, SideInputs
from morphogen.core.training_mode import ModeDependentCall

#: Where segments hand values across slots, and the name of each value (by its key), for the shape probe's messages.
Carried = tuple[CarriedValues, list[str]]


def is_block(module: nn.Module) -> bool:
    """Whether `module` is made of layers (a block), not one linear map or norm, which a copy stacks little of."""
    return next(module.children(), None) is not None


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


def split_graph(traced: fx.GraphModule, names: Sequence[str], given: dict[str, int | str | None], carry: bool
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
        block = is_block(traced.get_submodule(str(call.target)))
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
