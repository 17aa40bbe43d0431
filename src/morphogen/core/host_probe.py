"""The shape probe of a cut model: each slot's activation checked against the model's output, and its layout."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from morphogen.core.graph_split import Carried
from morphogen.core.host_errors import HostBuildError, first_line
from morphogen.core.several_outputs import output_choices, picked_output
from morphogen.core.training_mode import modes_kept
from morphogen.inputs import Inputs, call, dtype_mismatch, rows
from morphogen.inputs import problem as inputs_problem

#: Modules whose presence makes a three-dimensional activation read as tokens [N, T, D].
_TOKEN_MODULES = (nn.LayerNorm, nn.MultiheadAttention, nn.Embedding, nn.TransformerEncoderLayer,
                  nn.TransformerDecoderLayer, nn.RNNBase)


def probe_segments(model: nn.Module, segments: Sequence[nn.Module], names: Sequence[str], example: Inputs,
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
            expected = picked_output(type(model).__name__, expected, key)
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
        raise HostBuildError(f"running {what} on example_input failed: {first_line(error)}"
                             + (f" ({dtypes})" if dtypes else "")) from None


def guess_topology(model: nn.Module, activations: Sequence[Tensor], names: Sequence[str]) -> str:
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
                             f"one tensor: name the one your loss reads ({output_choices(expected)})")
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
        again = picked_output(type(model).__name__, again, key)
    if isinstance(again, Tensor) and not torch.equal(again, output):
        raise HostBuildError(f"{type(model).__name__} gives another output each time it runs in eval mode on the same "
                             "inputs: a dropout that is always on (F.dropout(x, p) without training=self.training), "
                             "a random draw, or a buffer its forward changes in place (a running statistic kept "
                             "outside a module such as nn.BatchNorm); a host validates in eval mode, where the model "
                             "must be deterministic")
