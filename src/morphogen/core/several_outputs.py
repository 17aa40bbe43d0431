"""The one output a host returns of the several a model's forward returns (`output=`), and how to name each."""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor, fx, nn

from morphogen.core.host_errors import HostBuildError


class _PickOutput(nn.Module):
    """The one output named by `key` of the several a model's forward returns."""

    def __init__(self, key: int | str) -> None:
        super().__init__()
        self.key = key

    def forward(self, outputs: object) -> Tensor:
        return _pick_output(outputs, self.key)  # type: ignore[return-value]  # the shape probe checks it is a tensor


def pick_in(part: nn.Module, key: int | str) -> None:
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


def picked_output(model_name: str, outputs: object, key: int | str) -> object:
    try:
        return _pick_output(outputs, key)
    except (IndexError, KeyError, TypeError, AttributeError):
        raise HostBuildError(f"output={key!r}: {model_name}'s forward returns a {type(outputs).__name__} without "
                             f"it; {output_choices(outputs)}") from None


def output_choices(outputs: object) -> str:
    """How `output=` can name each of the several outputs a forward returned, for the message that asks for one."""
    if isinstance(outputs, Mapping):
        return f"its keys: {', '.join(f'output={key!r}' for key in outputs)}"
    fields = getattr(outputs, "_fields", None) or getattr(outputs, "__dataclass_fields__", None)
    if fields:
        return f"its fields: {', '.join(f'output={name!r}' for name in fields)}"
    if isinstance(outputs, tuple | list) and outputs:
        return f"its positions: output=0 to output={len(outputs) - 1}"
    return 'output=0 (a position) or output="logits" (a key or attribute)'
