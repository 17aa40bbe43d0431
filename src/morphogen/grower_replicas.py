"""One growing model kept in step across the processes of a `torch.distributed` group (`Grower(distributed=True)`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from morphogen.core.model import MorphogeneticModel
from morphogen.env.actions import Action


class Replicas:
    """Keeps the copies of one growing model in the processes of the default `torch.distributed` group in step.

    Each process trains on its own batches: after `backward` the gradients of the host and of the live seeds are
    averaged over the processes (one all-reduce per dtype, as DistributedDataParallel does for a fixed set of
    parameters, which growth changes). Validation sums and the epoch's training loss are added up over the
    processes, so every gate, the governor and the controller read the same figures whatever share of the data
    each process holds. The first process's action is the one every process applies, and the first process's model
    (a new seed's initial weights, batch-norm statistics) is copied to the others after each decision, once an
    epoch; that also re-joins the copies after a rollback, which restores each process's own last good state.
    """

    def __init__(self) -> None:
        if not torch.distributed.is_available() or not torch.distributed.is_initialized():
            raise RuntimeError("Grower(distributed=True) needs torch.distributed.init_process_group(...) first")
        self.size = torch.distributed.get_world_size()

    def sum(self, values: Tensor) -> Tensor:
        """`values` summed over the processes, the same on each."""
        torch.distributed.all_reduce(values)
        return values

    def average_gradients(self, parameters: list[nn.Parameter]) -> None:
        """Average the gradients of `parameters` over the processes; a parameter without one counts zeros, as in
        DistributedDataParallel, so that every process exchanges the same tensors."""
        gradients = []
        for p in parameters:
            if p.requires_grad:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                gradients.append(p.grad)
        _flattened(gradients, lambda flat: torch.distributed.all_reduce(flat.div_(self.size)))

    def first_process_action(self, action: Action) -> Action:
        """The action the first process decided (each process's controller reads its own share of the data)."""
        shared = [action.state()]
        torch.distributed.broadcast_object_list(shared, src=0)
        return Action.from_state(shared[0])

    def copy_first_process_model(self, model: MorphogeneticModel) -> None:
        """The first process's parameters and buffers into every process's model."""
        with torch.no_grad():
            _flattened([*model.parameters(), *model.buffers()], lambda flat: torch.distributed.broadcast(flat, src=0))


def _flattened(tensors: list[Tensor], collective: Callable[[Tensor], object]) -> None:
    """Run `collective` on the tensors concatenated, one flat tensor per device and dtype, and copy its result back
    into them: one message per dtype instead of one per tensor."""
    groups: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
    for tensor in tensors:
        groups.setdefault((tensor.device, tensor.dtype), []).append(tensor)
    for group in groups.values():
        # torch's own (DistributedDataParallel's) flatten and unflatten, and one foreach copy: no per-tensor loop
        # in Python on a path that runs every step.
        flat: Tensor = _flatten_dense_tensors(group)  # type: ignore[no-untyped-call]
        collective(flat)
        torch._foreach_copy_(group, _unflatten_dense_tensors(flat, group))  # type: ignore[no-untyped-call]
