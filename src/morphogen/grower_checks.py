"""The checks of what a user hands a `Grower`: its optimizer, its batches' inputs and targets, a saved state."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from morphogen.core.hosts import SegmentedHost
from morphogen.core.model import MorphogeneticModel
from morphogen.env.episode import class_index_dtype_problem
from morphogen.env.play import Controller
from morphogen.env.snapshot import EpisodeSnapshot, snapshot_from_state
from morphogen.inputs import Inputs, names_problem


def check_optimizer(optimizer: object, host: SegmentedHost) -> None:
    """Refuse an `optimizer=` that is not the host's torch optimizer (a scheduler, a class, one over other
    parameters), which a rollback would otherwise meet only epochs later."""
    if optimizer is None:
        return
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"Grower's optimizer= is your host's torch.optim optimizer (its state is cleared on a "
                        f"rollback), got {getattr(optimizer, '__name__', type(optimizer).__name__)}")
    optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
    if not any(id(p) in optimized for p in host.parameters()):
        raise ValueError("Grower's optimizer= holds none of the host's parameters: build it on host.parameters() "
                         "(the host shares your model's)")


def kind_problem(host: SegmentedHost, inputs: Inputs) -> str | None:
    """Why `inputs` are not of the kind the host was built for (one tensor, or several, named as its example's),
    or None."""
    expected = getattr(host, "input_kind", "tensor")
    given = "tensor" if isinstance(inputs, Tensor) else "dict" if isinstance(inputs, dict) else "tuple"
    if (expected == "tensor") == (given == "tensor"):
        return names_problem(getattr(host, "input_names", ()), inputs)
    wanted = "one tensor" if expected == "tensor" else f"a {expected} of tensors"
    return f"a {type(inputs).__name__} where the host takes {wanted}"


def targets_dtype_problem(objective: str, outputs: Tensor, targets: Tensor) -> str:
    """Why a classification's cross-entropy refused a training batch's `targets` for their dtype (float or int32
    labels where the loss takes int64 class indices), or "". On a failure's path only: it reads the targets."""
    if objective != "classification" or targets.shape == outputs.shape:
        return ""  # not class indices for a cross-entropy, or class probabilities shaped as the outputs
    problem = class_index_dtype_problem(targets)
    if problem or not targets.is_floating_point():
        return problem
    return (f"the targets are {str(targets.dtype).removeprefix('torch.')} of shape {tuple(targets.shape)} against "
            f"outputs {tuple(outputs.shape)}: cross-entropy takes class indices as int64 (y.long()), or class "
            "probabilities shaped as the outputs")


def state_problem(state: dict[str, Any], controller: Controller, snapshot: EpisodeSnapshot,
                  model: MorphogeneticModel) -> str:
    """Why `state` cannot go on in this Grower (its controller's kind, epochs, slots or host parameters
    differ), or ""."""
    kind = state.get("controller_kind")  # states saved before the kind was recorded go without the check
    if kind is not None and kind != type(controller).__name__:
        return f"it was saved by a {str(kind)[:80]!r} controller, this one has {type(controller).__name__!r}"
    saved = snapshot_from_state(state["episode"]["snapshot"])
    if saved.max_epochs != snapshot.max_epochs:
        return f"it was saved with epochs={saved.max_epochs}, this one has epochs={snapshot.max_epochs}"
    slots = [slot.slot_id for slot in saved.slots]
    if slots != list(model.slot_ids):
        return f"it was saved with slots {', '.join(slots)}, this one has {', '.join(model.slot_ids)}"
    weights = state["episode"]["model"]
    for name, value in model.host.state_dict(prefix="host.").items():
        kept = weights.get(name)
        if not isinstance(kept, Tensor) or kept.shape != value.shape:
            found = "nothing" if not isinstance(kept, Tensor) else f"shape {tuple(kept.shape)}"
            return f"its host holds {found} for {name[len('host.'):]}, this one shape {tuple(value.shape)}"
    return ""
