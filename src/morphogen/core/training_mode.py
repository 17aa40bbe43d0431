"""A traced forward that reads `self.training`: fx fixes the flag at the value it had while tracing.

`F.dropout(x, 0.1, training=self.training)` traced in training mode becomes a dropout that always drops, even
while the host validates and after export; traced in eval mode, one that never does. So does nanoGPT's
`F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0)`.
`trace_in_both_modes` traces the model once in each mode and compares the two graphs: where a function call
differs only in constant arguments, it becomes a `ModeDependentCall`, which passes the training or the eval
constants by the mode it runs in, as the model's own `self.training` chose them. Any other difference (a
branch on `self.training`) is refused in one line: no single graph computes both.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from torch import fx, nn


class TrainingModeError(ValueError):
    """A forward whose trace depends on `self.training` otherwise than through constant arguments of a call."""


class ModeDependentCall(nn.Module):
    """A call of `function` whose constant arguments the traced forward chose by `self.training`: it passes the
    training ones or the eval ones by this module's mode (no parameters, no state)."""

    def __init__(self, function: Callable[..., Any], differing: dict[int | str, tuple[object, object]]) -> None:
        """`differing`: position or keyword -> (value in training, value in eval)."""
        super().__init__()
        self.function, self.differing = function, differing
        # The module whose mode chooses the constants where it is not this one (`follow`); in a tuple, so that it is
        # no submodule of this one.
        self._mode_of: tuple[nn.Module, ...] = ()

    def follow(self, module: nn.Module) -> None:
        """Choose the constants by `module`'s mode rather than this module's own: the module whose forward made the
        call, where this call runs in a traced copy of it that its own `train()` and `eval()` do not reach."""
        self._mode_of = (module,)

    @property
    def followed(self) -> nn.Module | None:
        """The module whose mode chooses the constants (`follow`); None where it is this one."""
        return self._mode_of[0] if self._mode_of else None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        chosen = list(args)
        followed = self.followed
        training_mode = (self if followed is None else followed).training
        for key, (training, evaluating) in self.differing.items():
            value = training if training_mode else evaluating
            if isinstance(key, int):
                chosen[key] = value
            else:
                kwargs[key] = value
        return self.function(*chosen, **kwargs)

    def extra_repr(self) -> str:
        return f"{getattr(self.function, '__name__', self.function)}, training/eval: {self.differing}"


@contextlib.contextmanager
def modes_kept(*parts: nn.Module) -> Iterator[None]:
    """Every module of `parts` given back the mode (training or eval) it had on entry."""
    modules = [module for part in parts for module in part.modules()]
    modes = [module.training for module in modules]
    try:
        yield
    finally:
        for module, mode in zip(modules, modes, strict=True):
            module.training = mode


def left_in_eval(module: nn.Module) -> list[nn.Module] | None:
    """The modules of `module` in eval mode while some layer of it (a module with parameters or buffers of its own)
    trains: the parts a user froze by `.eval()`, such as a pretrained backbone whose batch norm must keep its
    running statistics. None when no layer trains (the whole model put in eval mode, to validate it)."""
    modules = list(module.modules())
    layers = [part for part in modules if next(part.parameters(recurse=False), None) is not None
              or next(part.buffers(recurse=False), None) is not None]
    if not any(layer.training for layer in layers):
        return None
    return [part for part in modules if not part.training]


def trace_in_both_modes(model: nn.Module, trace: Callable[[], fx.Graph]) -> fx.GraphModule:
    """`model` traced by `trace()` in training mode, each function call whose constant arguments differ from the
    eval-mode trace made a `ModeDependentCall`. Every module's mode is restored afterwards.

    Raises `TrainingModeError` where the graphs of the two modes differ otherwise."""
    with modes_kept(model):
        model.train()
        training = trace()
        model.eval()
        evaluating = trace()
    traced = fx.GraphModule(model, training)
    nodes, others = list(training.nodes), list(evaluating.nodes)
    if [(n.op, n.target) for n in nodes] != [(n.op, n.target) for n in others]:
        first = next((n for n, o in zip(nodes, others, strict=False) if (n.op, n.target) != (o.op, o.target)),
                     nodes[min(len(nodes), len(others)) - 1])
        raise TrainingModeError(f"its forward runs other code in training than in eval mode (from {first.name}): a "
                                "traced host runs one graph in both; keep what depends on self.training in a module "
                                "(as nn.Dropout does)")
    # Compared in full before any rewrite: a rewritten call gets another name, which later arguments would carry.
    differing = [(node, constants) for node, other in zip(nodes, others, strict=True)
                 if (constants := _differing_constants(node, other))]
    for node, constants in differing:
        _as_mode_dependent(traced, node, constants)
    if differing:
        traced.graph.lint()
        traced.recompile()
    return traced


def _differing_constants(node: fx.Node, other: fx.Node) -> dict[int | str, tuple[object, object]]:
    """Position or keyword -> (value in `node`, value in `other`) for each constant argument that differs between
    two traces of one call; raises `TrainingModeError` where they differ otherwise."""
    if _named(node.args) == _named(other.args) and _named(node.kwargs) == _named(other.kwargs):
        return {}
    same_layout = len(node.args) == len(other.args) and set(node.kwargs) == set(other.kwargs)
    pairs: list[tuple[int | str, object, object]] = [
        *((index, value, other.args[index]) for index, value in enumerate(node.args) if same_layout),
        *((key, value, other.kwargs[key]) for key, value in node.kwargs.items() if same_layout)]
    differing = {key: (value, twin) for key, value, twin in pairs if _named(value) != _named(twin)}
    constants = all(not _holds_node(value) and not _holds_node(twin) for value, twin in differing.values())
    if node.op != "call_function" or not same_layout or not constants:
        raise TrainingModeError(f"its forward reads self.training in {node.name}: a traced host fixes it at one "
                                "value; keep it in a module (as nn.Dropout does)")
    return differing


def _as_mode_dependent(traced: fx.GraphModule, node: fx.Node, differing: dict[int | str, tuple[object, object]]
                       ) -> None:
    """Replace the call `node` of `traced` by a call of a `ModeDependentCall`, registered under a new name."""
    function = node.target
    assert callable(function)
    name = f"mode_dependent_{node.name}"
    while hasattr(traced, name):
        name += "_"
    traced.add_submodule(name, ModeDependentCall(function, differing))
    with traced.graph.inserting_before(node):
        call = traced.graph.call_module(name, node.args, dict(node.kwargs))
    if "nn_module_stack" in node.meta:  # the modules whose forwards made the call (`core/tracing.trace_partially`)
        call.meta["nn_module_stack"] = node.meta["nn_module_stack"]
    node.replace_all_uses_with(call)
    traced.graph.erase_node(node)


def _named(value: Any) -> Any:
    """`value` with every node in it (in tuples, lists, dicts, slices) replaced by its name, to compare two
    traces."""
    return fx.node.map_aggregate(value, lambda item: ("node", item.name) if isinstance(item, fx.Node) else item)


def _holds_node(value: Any) -> bool:
    found: list[fx.Node] = []
    fx.node.map_arg(value, found.append)
    return bool(found)
