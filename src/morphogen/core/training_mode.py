"""A traced forward that reads `self.training`: fx fixes the flag at the value it had while tracing.

`F.dropout(x, 0.1, training=self.training)` traced in training mode becomes a dropout that always drops, even
while the host validates or after export; traced in eval mode, one that never does. `trace_in_both_modes`
traces the model once in each mode and compares the two graphs: where they differ only in the `training`
argument of a functional dropout, that call becomes the matching `torch.nn` dropout module, which reads the
mode each time it runs, as the model's own `self.training` did. Any other difference (a branch on
`self.training`, a functional batch norm given it) is refused in one line: no single graph computes both.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from torch import fx, nn

#: Functional dropouts and the module that computes the same while reading the mode it runs in.
DROPOUT_MODULES: dict[Callable[..., object], type[nn.Module]] = {
    nn.functional.dropout: nn.Dropout, nn.functional.dropout1d: nn.Dropout1d, nn.functional.dropout2d: nn.Dropout2d,
    nn.functional.dropout3d: nn.Dropout3d, nn.functional.alpha_dropout: nn.AlphaDropout,
    nn.functional.feature_alpha_dropout: nn.FeatureAlphaDropout,
}


class TrainingModeError(ValueError):
    """A forward whose trace depends on `self.training` otherwise than through a functional dropout's argument."""


def trace_in_both_modes(model: nn.Module, trace: Callable[[], fx.Graph]) -> fx.GraphModule:
    """`model` traced by `trace()` in training mode, each functional dropout whose `training` argument follows the
    mode replaced by its module (`DROPOUT_MODULES`). Every module's mode is restored afterwards.

    Raises `TrainingModeError` where the graphs of the two modes differ otherwise."""
    modes = [module.training for module in model.modules()]
    try:
        model.train()
        training = trace()
        model.eval()
        evaluating = trace()
    finally:
        for module, mode in zip(model.modules(), modes, strict=True):
            module.training = mode
    traced = fx.GraphModule(model, training)
    differing = _differing_nodes(training, evaluating)
    for node in differing:
        _as_dropout_module(traced, node)
    if differing:
        traced.graph.lint()
        traced.recompile()
    return traced


def _differing_nodes(training: fx.Graph, evaluating: fx.Graph) -> list[fx.Node]:
    """The nodes of `training` that differ from `evaluating`'s only in a functional dropout's `training` argument;
    raises `TrainingModeError` for any other difference."""
    nodes, others = list(training.nodes), list(evaluating.nodes)
    if [(n.op, n.target) for n in nodes] != [(n.op, n.target) for n in others]:
        first = next((n for n, o in zip(nodes, others, strict=False) if (n.op, n.target) != (o.op, o.target)),
                     nodes[min(len(nodes), len(others)) - 1])
        raise TrainingModeError(f"its forward runs other code in training than in eval mode (from {first.name}): a "
                                "traced host runs one graph in both; keep what depends on self.training in a module "
                                "(as nn.Dropout does)")
    differing = []
    for node, other in zip(nodes, others, strict=True):
        if _arguments(node) == _arguments(other):
            continue
        if node.op != "call_function" or node.target not in DROPOUT_MODULES or \
                _arguments(node, without_training=True) != _arguments(other, without_training=True):
            raise TrainingModeError(f"its forward reads self.training in {node.name} ({_name(node.target)}): a "
                                    "traced host fixes it at one value; keep it in a module (as nn.Dropout does)")
        differing.append(node)
    return differing


def _arguments(node: fx.Node, *, without_training: bool = False) -> str:
    """`node`'s arguments (other nodes by their names), for comparing two traces of one forward; by parameter name
    and without `training` for a functional dropout."""
    if without_training and node.target in DROPOUT_MODULES:
        named = _bound(node)
        named.pop("training", None)
        arguments: tuple[object, ...] = tuple(named.items())
    else:
        arguments = (node.args, tuple(node.kwargs.items()))
    return repr(_named(arguments))


def _named(value: object) -> object:
    """`value` with every node in it replaced by its name."""
    if isinstance(value, fx.Node):
        return value.name
    if isinstance(value, (tuple, list)):
        return tuple(_named(item) for item in value)
    if isinstance(value, dict):
        return tuple((key, _named(item)) for key, item in value.items())
    return value


def _bound(node: fx.Node) -> dict[str, object]:
    """A functional dropout call's arguments by parameter name, defaults filled in."""
    function = node.target
    assert callable(function)
    bound = inspect.signature(function).bind(*node.args, **node.kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def _as_dropout_module(traced: fx.GraphModule, node: fx.Node) -> None:
    """Replace the functional dropout `node` of `traced` by a call of its module, registered under a new name."""
    arguments = _bound(node)
    probability, inplace = arguments["p"], arguments["inplace"]
    if not isinstance(probability, (int, float)) or not isinstance(inplace, bool):
        raise TrainingModeError(f"its forward reads self.training in {node.name} ({_name(node.target)}), whose "
                                "probability is computed in the forward; keep it in a module (as nn.Dropout does)")
    name = f"functional_{node.name}"
    while hasattr(traced, name):
        name += "_"
    module_class = DROPOUT_MODULES[node.target]  # type: ignore[index]
    traced.add_submodule(name, module_class(float(probability), inplace))
    entering = arguments["input"]
    assert isinstance(entering, fx.Node)  # the tensor the dropout drops from
    with traced.graph.inserting_before(node):
        call = traced.graph.call_module(name, (entering,))
    node.replace_all_uses_with(call)
    traced.graph.erase_node(node)


def _name(target: object) -> str:
    return str(getattr(target, "__name__", target))
