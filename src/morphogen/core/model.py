"""MorphogeneticModel: a host with a SeedSlot at each chosen injection point.

`counterfactual_forward` evaluates K alpha configurations in one pass. The host prefix up to the
first slot whose alpha differs across configurations is computed once; only from there on is the
batch expanded to K*B samples, each carrying its own per-sample alpha. The seed of that first
differing slot also runs once, on B samples; only its blend is done K ways. Slots after it see K
different inputs and run on all K*B samples.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, cast

import torch
from torch import Tensor, nn

from morphogen.core.hosts import SegmentedHost, UnknownSlotError
from morphogen.core.lifecycle import BLENDED_STAGES, Stage
from morphogen.core.slot import SeedSlot, SlotConfig


class MorphogeneticModel(nn.Module):
    """A host network plus one `SeedSlot` per named injection point in `slots` (default: all)."""

    def __init__(self, host: SegmentedHost, slots: Sequence[str] | None = None,
                 config: SlotConfig | None = None) -> None:
        super().__init__()
        points = host.injection_points
        chosen = list(points) if slots is None else list(slots)
        for slot_id in chosen:
            host.point_index(slot_id)  # raises UnknownSlotError naming the valid slots
        if len(set(chosen)) != len(chosen):
            raise ValueError(f"slot list has duplicates: {chosen}")
        self.host = host
        # Execution order, whatever order the caller listed them in.
        ordered = [slot_id for slot_id in points if slot_id in chosen]
        device = next(host.parameters()).device
        self.seed_slots = nn.ModuleDict(
            {slot_id: SeedSlot(slot_id, points[slot_id], host.topology, config).to(device) for slot_id in ordered}
        )
        self._slot_by_point: list[str | None] = [slot_id if slot_id in chosen else None for slot_id in points]

    # ---------------------------------------------------------------- access
    @property
    def slot_ids(self) -> tuple[str, ...]:
        """Slot ids in execution order; this is the column order of `counterfactual_forward` alphas."""
        return tuple(self.seed_slots.keys())

    @property
    def topology(self) -> str:
        return self.host.topology

    def slot(self, slot_id: str) -> SeedSlot:
        if slot_id not in self.seed_slots:
            raise UnknownSlotError(f"unknown slot {slot_id!r}; this model has: {', '.join(self.slot_ids)}")
        return cast(SeedSlot, self.seed_slots[slot_id])  # ModuleDict is typed as holding any Module

    def slots(self) -> Iterator[SeedSlot]:
        for slot in self.seed_slots.values():
            yield cast(SeedSlot, slot)

    def germinate(self, slot_id: str, blueprint: str, epoch: int = 0, **options: Any) -> SeedSlot:
        """Germinate `blueprint` in `slot_id` on the host's device and dtype."""
        reference = next(self.host.parameters())
        slot = self.slot(slot_id)
        slot.germinate(blueprint, epoch, device=reference.device, dtype=reference.dtype, **options)
        return slot

    def host_parameters(self) -> list[nn.Parameter]:
        return list(self.host.parameters())

    def seed_parameters(self, slot_id: str) -> list[nn.Parameter]:
        return self.slot(slot_id).seed_parameters()

    def param_count(self, active_only: bool = True) -> int:
        """Host parameters plus seed parameters; `active_only` counts only seeds blended into the output."""
        total = sum(p.numel() for p in self.host.parameters())
        for slot in self.slots():
            if slot.stage in BLENDED_STAGES or (not active_only and slot.seed is not None):
                total += slot.seed_parameter_count()
        return total

    def host_param_count(self) -> int:
        return sum(p.numel() for p in self.host.parameters())

    # ---------------------------------------------------------------- forward
    def forward(self, x: Tensor) -> Tensor:
        host = self.host
        for index, slot_id in enumerate(self._slot_by_point):
            x = host.run_segment(index, x)
            if slot_id is not None:
                x = self.seed_slots[slot_id](x)
        return host.run_segment(len(self._slot_by_point), x)

    def counterfactual_forward(self, x: Tensor, alphas: Tensor | Sequence[Sequence[float]]) -> Tensor:
        """Outputs for K alpha configurations at once: `alphas` is [K, n_slots] -> output [K, B, ...].

        `alphas` describes configurations, so it is read on the host: pass a CPU tensor or nested
        lists (a device tensor here would cost a sync). A column matters for a slot whose seed is blended
        in (BLENDING, HOLDING, FOSSILIZED) and for a TRAINING seed, which a non-zero alpha blends in as
        if it were already (its shadow); other slots behave as in `forward`.
        """
        table = alphas.tolist() if isinstance(alphas, Tensor) else [list(map(float, row)) for row in alphas]
        k = len(table)
        if k == 0 or any(len(row) != len(self.seed_slots) for row in table):
            raise ValueError(f"alphas must be [K >= 1, {len(self.seed_slots)}] (one column per slot "
                             f"{self.slot_ids}), got {k} rows")
        columns = {slot_id: [row[j] for row in table] for j, slot_id in enumerate(self.slot_ids)}
        batch = x.shape[0]
        expanded = False
        host = self.host
        for index, slot_id in enumerate(self._slot_by_point):
            x = host.run_segment(index, x)
            if slot_id is None:
                continue
            slot = self.slot(slot_id)
            column = columns[slot_id]
            # A TRAINING seed only runs here where a configuration blends it in (its shadow).
            shadow = slot.stage is Stage.TRAINING and any(value != 0.0 for value in column)
            if slot.seed is None or not (slot.stage in BLENDED_STAGES or shadow):
                x = slot(x)
                continue
            if not expanded and all(value == column[0] for value in column):
                x = slot(x, alpha_override=column[0])
                continue
            if not expanded:
                # First slot whose alpha differs: run its seed once on B samples, blend K ways.
                alphas_k = torch.tensor(column, device=x.device, dtype=x.dtype)  # (K,)
                blended = slot.blend_configurations(x, slot.seed_output(x), alphas_k)  # (K, B, ...)
                x = blended.reshape(k * batch, *x.shape[1:])  # (K*B, ...)
                expanded = True
                continue
            per_sample = torch.tensor(column, device=x.device, dtype=x.dtype).repeat_interleave(batch)  # (K*B,)
            x = slot(x, alpha_override=per_sample)
        x = host.run_segment(len(self._slot_by_point), x)
        if not expanded:
            return x.unsqueeze(0).expand(k, *x.shape)  # (K, B, ...)
        return x.reshape(k, batch, *x.shape[1:])  # (K, B, ...)

    def stages(self) -> dict[str, Stage]:
        return {slot.slot_id: slot.stage for slot in self.slots()}
