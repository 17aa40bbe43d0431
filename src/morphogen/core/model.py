"""MorphogeneticModel: a host with a SeedSlot at each chosen injection point.

Every forward pass is one walk over the host's segments (`_walk`) with the slots in between; the passes
differ only in what they do at a slot:
- `forward`: each slot in its current mode (`SlotMode`): identity, or a blended seed at its alpha.
- `forward_with_shadow`, the training forward: the host's output, bit-identical to a model without
  TRAINING seeds, plus the *shadow* outputs, one per TRAINING seed, of the network with that seed
  blended in at alpha 1 (`SeedSlot.shadow`). The shadow pass starts from the activations the host
  forward already computed (detached, so the host prefix never runs twice and receives nothing from
  it) and runs the layers after each TRAINING slot once for all of those seeds, as a [K*B] batch.
- `counterfactual_forward`: K alpha configurations in one pass. The host prefix up to the first slot
  whose alpha differs across configurations is computed once; only from there on is the batch expanded
  to K*B samples, each carrying its own per-sample alpha. The seed of that first differing slot also
  runs once, on B samples; only its blend is done K ways. Slots after it see K different inputs and
  run on all K*B samples.

`compile_forward(settings)` makes `forward_with_shadow` run under `torch.compile`, specialized on the
model's `execution_plan()` (a `SlotPlan` per slot: what it runs), never on lifecycle state: see
`morphogen.core.compilation` for what recompiles when. Compile through it, not with
`torch.compile(model)`, which would guard on the stages themselves.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import torch
from torch import Tensor, nn

from morphogen.core.blend import BlendKind
from morphogen.core.blueprints import BlueprintKind, get_blueprint, layer_heads
from morphogen.core.branch import BranchSite, find_branch_site
from morphogen.core.compilation import CompileSettings, compiled
from morphogen.core.hosts import SegmentedHost, UnknownSlotError
from morphogen.core.lifecycle import BLENDED_STAGES, Stage
from morphogen.core.slot import SeedSlot, SlotConfig, SlotMode, SlotPlan
from morphogen.core.width import WidthSite, find_width_site, run_cut_segment
from morphogen.inputs import Inputs, refuse_other_names, repeat_rows, rows, tensors

Captured = tuple[tuple[Tensor, Tensor | None], ...]
"""Per TRAINING slot, in execution order: the host's detached activation there, and for a widening seed the
detached input of the producer it widens (None for other seeds)."""
ExecutionPlan = tuple[SlotPlan, ...]
"""Every slot's `SlotPlan`, in execution order: what a compiled training forward specializes on."""
SlotStep = Callable[[int, SeedSlot, Tensor], Tensor]
"""What a pass does at a slot: (slot position, slot, activation there) -> the activation the walk goes on with."""


def shadow_rows(batch: int, fraction: float) -> int | None:
    """How many samples of a batch of `batch` the shadow pass runs on (`forward_with_shadow`): `fraction` of
    them, at least one; None for the whole batch."""
    return None if fraction >= 1.0 else max(1, math.ceil(batch * fraction))


class GrowthSignal(NamedTuple):
    """What growth could gain at an empty slot (`MorphogeneticModel.growth_signals`), as 0-dim device tensors."""

    depth: Tensor
    """At the slot's activation, where a deepening seed adds its output."""
    width: Tensor | None
    """At the consumer's output, where a widening seed adds its channels' contribution (None: no width site)."""


def _differentiable(h: Tensor) -> Tensor:
    """`h`, made to require grad where nothing before it learns (a frozen part of a user's model) by adding a zero
    that does: the loss's gradient at `h` is the same. Not a leaf copy, which FLOP counting's module hooks refuse."""
    return h if h.requires_grad else h + torch.zeros((), dtype=h.dtype, device=h.device, requires_grad=True)


def _signal(activation: Tensor, gradient: Tensor | None, batch: int) -> Tensor:
    """sqrt(mean ||dl/da||^2 * mean ||a||^2) over the samples, from the gradient of the batch's mean loss."""
    if gradient is None:  # the loss does not depend on this activation
        return activation.new_zeros(())
    per_sample = (gradient * batch).flatten(1).square().sum(1)  # (B,): a sample's own loss gradient, squared
    return (per_sample.mean() * activation.detach().flatten(1).square().sum(1).mean()).sqrt()


def _with_tap(step: SlotStep, position: int, slot: SeedSlot, tap: Tensor | None, x: Tensor) -> Tensor:
    """`step(position, slot, x)` with `slot.tap` set to `tap` for a widening seed, reset afterwards (no
    activation is kept).

    Configurations or shadow rows added to the batch since the tap was read repeat it, configuration-major
    as they were laid out ((K*B, ...)); rows that join at the slot itself bring their own tap.
    """
    if tap is not None and tap.shape[0] != x.shape[0] and x.shape[0] % tap.shape[0] == 0:
        tap = tap.repeat(x.shape[0] // tap.shape[0], *([1] * (tap.dim() - 1)))  # (K*B, ...)
    slot.tap = tap
    try:
        return step(position, slot, x)
    finally:
        slot.tap = None


@contextmanager
def running_statistics(norms: Sequence[nn.modules.batchnorm._BatchNorm]) -> Iterator[None]:
    """Batch norms normalize with their running statistics, as in evaluation, and write no buffer.

    In the shadow pass this makes the loss a TRAINING seed descends the same function of its output
    as the one validation measures its shadow contribution with (batch statistics there would fit the
    seed to a normalization that validation never applies), and it leaves the host's statistics and the
    buffers its own forward saved for backward untouched.
    """
    modes = [norm.training for norm in norms]
    for norm in norms:
        norm.training = False
    try:
        yield
    finally:
        for norm, mode in zip(norms, modes, strict=True):
            norm.training = mode


@dataclass(frozen=True)
class ShadowOutput:
    """What the network would output with each TRAINING seed blended in at alpha 1."""

    slot_ids: tuple[str, ...]
    """The TRAINING slots, in execution order; row k of `outputs` has only the seed of slot k blended in."""
    outputs: Tensor
    """(K, B, ...): one output per TRAINING seed for the same B inputs (the first B of the batch: `rows`)."""
    parameters: tuple[nn.Parameter, ...]
    """The trainable parameters of those seeds: the only ones a shadow loss may update
    (`loss.backward(inputs=list(parameters))`), so the layers after the slots learn nothing from it."""

    @property
    def rows(self) -> int:
        """How many samples of the batch the shadow ran on (the first ones): its targets are `targets[:rows]`."""
        return int(self.outputs.shape[1])


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
        reference = next(host.parameters())
        # On the host's device and in its dtype: a float64 host blends at its alpha, not at alpha rounded to float32.
        self.seed_slots = nn.ModuleDict(
            {slot_id: SeedSlot(slot_id, points[slot_id], host.topology, config).to(reference.device, reference.dtype)
             for slot_id in ordered}
        )
        self._slot_ids = tuple(ordered)
        #: Per injection point of the host, the position of its slot in `slot_ids` (None: no slot there).
        self._slot_at_point = [ordered.index(point) if point in chosen else None for point in points]
        #: Per slot position, the index of its injection point.
        self._point_of_slot = [list(points).index(slot_id) for slot_id in ordered]
        self._batch_norms = [m for m in host.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        self._compile_settings: CompileSettings | None = None
        self._find_sites()

    def _find_sites(self) -> None:
        """Each slot's width and branch sites, or why it has none; its layer before and the host's head count."""
        host = self.host
        heads = layer_heads(host)  # the host's architecture never changes: read once
        for position, slot in enumerate(self.slots()):
            site = find_width_site(host.segments, self._point_of_slot[position], slot.channels)
            if isinstance(site, WidthSite) and site.inside and site.tap_segment == 0 and host.input_kind != "tensor":
                site = "its layers to widen are in the first segment, which takes the model's several inputs"
            slot.width_site, slot.width_problem = (site, "") if isinstance(site, WidthSite) else (None, site)
            slot.set_layer_before(host.layer_before(slot.slot_id))
            slot.host_heads = heads
            entering, at_slot = host.measured_shapes.get(slot.slot_id, (None, ()))
            branch = find_branch_site(host.topology, entering, at_slot)
            slot.branch_site, slot.branch_problem = (branch, "") if isinstance(branch, BranchSite) else (None, branch)

    # ---------------------------------------------------------------- access
    @property
    def slot_ids(self) -> tuple[str, ...]:
        """Slot ids in execution order; this is the column order of `counterfactual_forward` alphas."""
        return self._slot_ids

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

    def graft(self, slot_id: str, blueprint: str, epoch: int = 0, **options: Any) -> SeedSlot:
        """Germinate `blueprint` in `slot_id` to train with the host from the start (see `SeedSlot.graft`)."""
        reference = next(self.host.parameters())
        slot = self.slot(slot_id)
        slot.graft(blueprint, epoch, device=reference.device, dtype=reference.dtype, **options)
        return slot

    def install(self, slot_id: str, blueprint: str, *, blend: BlendKind | None = None, **options: Any) -> SeedSlot:
        """Install `blueprint` in `slot_id` as a fixed part of the architecture (see `SeedSlot.install`)."""
        reference = next(self.host.parameters())
        slot = self.slot(slot_id)
        slot.install(blueprint, blend=blend, device=reference.device, dtype=reference.dtype, **options)
        return slot

    def can_graft(self, slot_id: str, blueprint: str) -> bool:
        """Whether `blueprint` can be grafted into `slot_id`: it adds a layer, a branch beside the segment before
        the slot where the slot has a branch site, or new channels inside that segment where it has a width site
        there (a residual block's inner width); a copy of the layer before the slot (`block_copy`) where this host
        has that layer.

        Widening the layers *around* a slot is left to GERMINATE, as before inside sites existed: policies trained
        then saw GROW masked for every widening blueprint on the built-in hosts, whose sites are all around."""
        recipe = get_blueprint(self.topology, blueprint)
        if recipe.kind is BlueprintKind.WIDEN:
            site = self.slot(slot_id).site_for(blueprint)
            return isinstance(site, WidthSite) and site.inside
        if recipe.kind is BlueprintKind.BRANCH:
            return self.slot(slot_id).branch_site is not None
        return not recipe.copies_layer_before or self.slot(slot_id).layer_before is not None

    def architecture(self) -> dict[str, str]:
        """Slot id -> blueprint of every seed that is part of the output now (BLENDING, HOLDING, FOSSILIZED)."""
        return {slot.slot_id: slot.blueprint for slot in self.slots()
                if slot.stage in BLENDED_STAGES and slot.blueprint is not None}

    def blends(self) -> dict[str, str]:
        """Slot id -> blend kind ("multiply", "gate") of every seed of `architecture` not blended by adding: what
        a rebuild of the architecture must install too (a gate has parameters of its own)."""
        return {slot.slot_id: slot.blend.kind.value for slot in self.slots()
                if slot.stage in BLENDED_STAGES and slot.blueprint is not None and slot.blend is not None
                and slot.blend.kind is not BlendKind.ADD}

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
    # Every pass is one walk over the host's segments (`_walk`); what differs is what each does at a slot.

    def _walk(self, x: Inputs, at_slot: SlotStep, start: int = 0, widening: frozenset[int] = frozenset(),
              at_point: SlotStep | None = None, entering: Callable[[int, Inputs], Inputs] | None = None) -> Tensor:
        """Run the host's segments to its output, mapping the activation at each slot with `at_slot`.

        `at_slot(position, slot, h)` gets the slot's position in `slot_ids` (its column in an execution plan
        or an alpha table). `x` is the input of segment `start` (0: the model's inputs, `morphogen.inputs`).

        The slots at `widening` hold running widening seeds (`morphogen.core.width`): `at_slot` runs for them
        at their injection point, the consumer's output inside the next segment (or inside the segment before
        them, for a site there), with `slot.tap` (the producer's input) set; at their own point the walk calls
        `at_point` (default: nothing happens there). Every other slot runs with `slot.tap` set to the input of
        the segment before it, which a branch seed reads (`morphogen.core.branch`; holding the reference costs
        nothing). `entering(index, x)`, if given, maps the input of each segment before it runs.
        """
        if start == 0:
            refuse_other_names(self.host.input_names, x)
        taps: dict[int, Tensor] = {}
        for index in range(start, len(self._slot_at_point)):
            if entering is not None:
                x = entering(index, x)
            segment_input = x if isinstance(x, Tensor) else None  # a model's several inputs are no branch's tap
            x = self._run_segment(index, x, at_slot, widening, taps)
            position = self._slot_at_point[index]
            if position is None:
                continue
            slot = self._slot_at(position)
            if position not in widening:
                x = _with_tap(at_slot, position, slot, segment_input, x)
            elif at_point is not None:
                x = _with_tap(at_point, position, slot, taps.get(position), x)
        return self._run_segment(len(self._slot_at_point), x, at_slot, widening, taps)

    def _run_segment(self, index: int, x: Inputs, at_slot: SlotStep, widening: frozenset[int],
                     taps: dict[int, Tensor]) -> Tensor:
        """Segment `index`, cut where a widening seed reads its tap or injects its output inside it."""
        def inject(position: int, h: Tensor, tap: Tensor | None) -> Tensor:
            return _with_tap(at_slot, position, self._slot_at(position), tap, h)

        sites = self._sites_in(widening)
        if not sites:
            return self.host.run_segment(index, x)
        return run_cut_segment(self.host.segments[index], index, x, sites, inject, taps)

    def _sites_in(self, widening: frozenset[int]) -> list[tuple[int, WidthSite]]:
        sites = [(position, self._slot_at(position).width_site) for position in sorted(widening)]
        return [(position, site) for position, site in sites if site is not None]

    def _widening(self, plan: ExecutionPlan) -> frozenset[int]:
        """Positions of the slots whose running seed widens the layers around them, in `plan`."""
        return frozenset(position for position, slot_plan in enumerate(plan)
                         if slot_plan.widens and slot_plan.mode is not SlotMode.IDENTITY)

    def _inside(self, positions: Iterator[int] | frozenset[int] | list[int]) -> dict[int, int]:
        """Segment index -> position, for the slots among `positions` whose width site is inside the segment
        before them: their seed changes that segment, so their rows must enter at its input."""
        return {self._point_of_slot[position]: position for position in positions
                if (site := self._slot_at(position).width_site) is not None and site.inside}

    def _slot_at(self, position: int) -> SeedSlot:
        return cast(SeedSlot, self.seed_slots[self._slot_ids[position]])  # ModuleDict is typed as holding any Module

    def forward(self, *args: Inputs, **kwargs: Tensor) -> Tensor:
        """The model's output, each slot in its current mode (the host's output when no seed is blended in).

        Called with a batch of the host's inputs as one argument: a tensor, or for a user's model of several inputs
        a tuple or dict of tensors (`morphogen.inputs`). A model of several inputs may also be called as the user's
        own is: `model(ids, padding)` for a tuple, `model(ids=..., padding=...)` for a dict."""
        x = self._inputs_of_call(args, kwargs)
        output = self._walk(x, lambda position, slot, h: slot(h), widening=self._widening(self.execution_plan()))
        self._release_carried()
        return output

    def _inputs_of_call(self, args: tuple[Inputs, ...], kwargs: dict[str, Tensor]) -> Inputs:
        """The one batch of inputs that `forward`'s arguments make, as the host takes it."""
        kind = self.host.input_kind
        if len(args) == 1 and not kwargs:
            return args[0]
        if kwargs and not args and kind == "dict":
            return dict(kwargs)
        if len(args) > 1 and not kwargs and kind == "tuple":
            return tuple(args)  # type: ignore[arg-type]  # each one tensor, as the host's example was
        how = {"tensor": "one tensor", "tuple": "its inputs as positional arguments (or one tuple of them)",
               "dict": "its inputs as keyword arguments (or one dict of them)"}[kind]
        raise TypeError(f"this model takes {how}; got {len(args)} positional and {len(kwargs)} keyword arguments")

    def _release_carried(self) -> None:
        """A pass is over: the values a user's host carries across slots (a U-Net's skips) are let go."""
        if self.host.carried_values is not None:
            self.host.carried_values.release()

    def forward_with_shadow(self, x: Inputs, shadow_rows: int | None = None) -> tuple[Tensor, ShadowOutput | None]:
        """The host forward and, when seeds are TRAINING, their shadow outputs (None when none is).

        The shadow pass runs on the first `shadow_rows` samples of the batch (None: all of them): the seeds'
        gradients then come from fewer samples, for a shadow pass that costs that fraction.

        Train a TRAINING seed by stepping its optimizer on `task_loss(shadow.outputs[k], targets)`
        backpropagated with `backward(inputs=list(shadow.parameters))`: the seed sees what its own
        output does to the loss (closed loop), and no host parameter, nor any other seed, gets a gradient
        from that path. The host's output and host gradients are exactly those of `forward(x)`. Batch
        norms after a slot normalize the shadow rows with the host's running statistics (see
        `running_statistics`), so the host's state is untouched too.

        After `compile_forward` this runs compiled, specialized on `execution_plan()`.
        """
        plan = self.execution_plan()
        host_forward, shadow_pass = MorphogeneticModel._host_forward, MorphogeneticModel._shadow_pass
        if self._compile_settings is not None:
            # Two graphs, two autograd nodes: the trainer backpropagates the host loss and the shadow loss
            # separately, and one compiled node would free its saved tensors at the first of them.
            device = tensors(x)[0].device
            host_forward = compiled(host_forward, self._compile_settings, device)
            shadow_pass = compiled(shadow_pass, self._compile_settings, device)
        output, captured = host_forward(self, x, plan)
        if not captured:
            self._release_carried()
            return output, None
        if shadow_rows is not None:
            captured = tuple((h[:shadow_rows], None if tap is None else tap[:shadow_rows])
                             for h, tap in captured)  # (rows, ...) each
            if self.host.side_inputs is not None:  # the layers after the slots read the inputs of those rows only
                self.host.side_inputs.narrow(shadow_rows)
        if self.host.carried_values is not None:  # values the shadow pass does not compute are the host pass's
            self.host.carried_values.begin_shadow(shadow_rows)
        with running_statistics(self._batch_norms):
            shadow_outputs = shadow_pass(self, captured, plan)
        self._release_carried()
        training = [position for position, slot_plan in enumerate(plan) if slot_plan.mode is SlotMode.SHADOW]
        parameters = tuple(p for position in training for p in self._slot_at(position).seed_parameters()
                           if p.requires_grad)
        return output, ShadowOutput(tuple(self._slot_ids[position] for position in training), shadow_outputs,
                                    parameters)

    def execution_plan(self) -> ExecutionPlan:
        """Every slot's `SeedSlot.plan()`, in execution order."""
        return tuple(slot.plan() for slot in self.slots())

    def compile_forward(self, settings: CompileSettings | None) -> None:
        """Run `forward_with_shadow` compiled with `settings` from now on (None: eagerly again).

        Nothing compiles here: the first call with each new execution plan does (`morphogen.core.compilation`).
        """
        self._compile_settings = settings

    def _host_forward(self, x: Inputs, plan: ExecutionPlan) -> tuple[Tensor, Captured]:
        """The model's output and, when grad is on, the detached activation at each TRAINING slot (with the
        detached tap of a widening or branch seed, None for the others).

        Reads slot behaviour from `plan`, never from the lifecycle, so a compiled copy specializes on it.
        """
        captured: list[tuple[Tensor, Tensor | None]] = []
        capture = torch.is_grad_enabled()
        widening = self._widening(plan)
        inside = self._inside([p for p in widening if plan[p].mode is SlotMode.SHADOW])

        def at_slot(position: int, slot: SeedSlot, h: Tensor) -> Tensor:
            mode = plan[position].mode
            if mode is SlotMode.SHADOW and capture and position not in widening:
                tap = slot.tap if plan[position].branches else None
                captured.append((h.detach(), None if tap is None else tap.detach()))
            return slot.run(mode, h)

        def at_point(position: int, slot: SeedSlot, h: Tensor) -> Tensor:
            if plan[position].mode is SlotMode.SHADOW and capture and position not in inside.values():
                assert slot.tap is not None  # its shadow rows will join the pass here
                captured.append((h.detach(), slot.tap.detach()))
            return h

        def entering(index: int, h: Inputs) -> Inputs:
            if capture and index in inside:  # a site inside this segment: its shadow rows join at its input
                assert isinstance(h, Tensor)  # no site inside the first segment of a model of several inputs
                captured.append((h.detach(), None))
            return h

        return self._walk(x, at_slot, widening=widening, at_point=at_point, entering=entering), tuple(captured)

    def _shadow_pass(self, captured: Captured, plan: ExecutionPlan) -> Tensor:
        """Run the layers after each TRAINING slot with that seed fully in, all seeds in one batch: (K, B, ...).

        `captured` holds the host's activation at each TRAINING slot of `plan`, in execution order. Rows
        join the batch at their own slot: before it, a row's activation would equal the host's, which
        `captured` already holds, so nothing upstream is recomputed. A widening seed's rows join at its slot
        too and get the seed at its injection point, inside the next segment, where they are the last B rows.
        """
        training = [position for position, slot_plan in enumerate(plan) if slot_plan.mode is SlotMode.SHADOW]
        widening, rows = self._widening(plan), captured[0][0].shape[0]
        inside = self._inside([position for position in training if position in widening])
        first = training[0]

        def at_slot(position: int, slot: SeedSlot, h: Tensor) -> Tensor:
            mode = plan[position].mode
            if position in widening and mode is SlotMode.SHADOW:
                # The walk resets the tap after this call. Inside a segment its rows ran through the producer
                # in this pass (the last ones); around a slot, the host forward captured their tap.
                tap = slot.tap if position in inside.values() else captured[training.index(position)][1]
                assert tap is not None
                slot.tap = tap[-rows:]
                return torch.cat([h[:-rows], slot.shadow(h[-rows:])])  # (k*B, ...): only its own rows get it
            h = slot.run(mode, h)  # the host's own behaviour at this slot for the rows already in
            if position not in training:
                return h
            activation, tap = captured[training.index(position)]
            slot.tap = tap  # a branch seed's own rows bring their input; the walk resets it after this call
            shadow = slot.shadow(activation)  # (B, ...): this seed fully in
            return torch.cat([h, shadow])  # (k*B, ...)

        def at_point(position: int, slot: SeedSlot, h: Tensor) -> Tensor:
            if plan[position].mode is not SlotMode.SHADOW or position in inside.values():
                return h
            return torch.cat([h, captured[training.index(position)][0]])  # (k*B, ...): seeded at the injection

        def entering(index: int, h: Inputs) -> Inputs:
            position = inside.get(index)
            if position is None or position == first:
                return h
            assert isinstance(h, Tensor)  # a later segment's input: an activation
            return torch.cat([h, captured[training.index(position)][0]])  # (k*B, ...): seeded inside this segment

        point = self._point_of_slot[first]
        if first in inside.values():
            start, segment = captured[0][0], point
        elif first in widening:
            start, segment = captured[0][0], point + 1
        else:
            start = _with_tap(lambda _, slot, h: slot.shadow(h), first, self._slot_at(first), captured[0][1],
                              captured[0][0])
            segment = point + 1
        x = self._walk(start, at_slot, segment, widening=widening, at_point=at_point, entering=entering)
        return x.reshape(len(captured), rows, *x.shape[1:])  # (K, B, ...)

    def counterfactual_forward(self, x: Inputs, alphas: Tensor | Sequence[Sequence[float]]) -> Tensor:
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
        columns = [[row[position] for row in table] for position in range(len(self._slot_ids))]
        batch = rows(x)
        expanded = False

        def at_slot(position: int, slot: SeedSlot, h: Tensor) -> Tensor:
            nonlocal expanded
            column, mode = columns[position], slot.mode
            # A TRAINING seed only runs here where a configuration blends it in (its shadow).
            if mode is SlotMode.IDENTITY or (mode is SlotMode.SHADOW and not any(column)):
                return h

            def blend(h: Tensor, alpha: Tensor | float) -> Tensor:
                return slot.shadow(h, alpha) if mode is SlotMode.SHADOW else slot.run(mode, h, alpha)

            if not expanded and all(value == column[0] for value in column):
                return blend(h, column[0])
            if not expanded:
                # First slot whose alpha differs: run its seed once on B samples, blend K ways.
                expanded = True
                alphas_k = torch.tensor(column, device=h.device, dtype=h.dtype)  # (K,)
                blended = slot.blend_configurations(h, slot.seed_output(h), alphas_k)  # (K, B, ...)
                return blended.reshape(k * batch, *h.shape[1:])  # (K*B, ...)
            return blend(h, torch.tensor(column, device=h.device, dtype=h.dtype).repeat_interleave(batch))  # (K*B,)

        widening = self._widening(self.execution_plan())
        inside = self._inside(widening)

        def entering(index: int, h: Inputs) -> Inputs:
            # A seed inside this segment whose alpha differs: every configuration runs the whole segment.
            nonlocal expanded
            position = inside.get(index)
            if expanded or position is None or all(value == columns[position][0] for value in columns[position]):
                return h
            if self._slot_at(position).mode is SlotMode.SHADOW and not any(columns[position]):
                return h
            expanded = True
            return repeat_rows(h, k)  # (K*B, ...), configuration-major

        x = self._walk(x, at_slot, widening=widening, entering=entering)
        self._release_carried()
        if not expanded:
            return x.unsqueeze(0).expand(k, *x.shape)  # (K, B, ...)
        return x.reshape(k, batch, *x.shape[1:])  # (K, B, ...)

    def stages(self) -> dict[str, Stage]:
        return {slot.slot_id: slot.stage for slot in self.slots()}

    def growth_signals(self, x: Inputs, loss: Callable[[Tensor], Tensor]) -> dict[str, GrowthSignal]:
        """How much the loss could gain from growth at each empty slot, measured on the batch `x`.

        Per empty slot: `depth`, at the slot's activation (where a deepening seed adds its output), and
        `width`, at the consumer's output (where a widening seed adds the new channels' contribution; None
        without a width site). Each is sqrt(mean ||dl/da||^2 * mean ||a||^2) over the samples, the gradient
        norm of a sample's loss at activation `a` times the activation's norm: the first-order loss change a
        perturbation of `a` in proportion to its size can make, whatever the activation's scale (a batch
        norm after it makes the loss blind to that scale). Tensors on the device: read them once (one sync).

        Runs in eval mode (batch norms read their running statistics, dropout is off) and with `autograd.grad`,
        so no parameter gradient, buffer or random generator of the training is touched.
        """
        was_training = self.training
        self.eval()
        empty = {position for position, slot in enumerate(self.slots()) if slot.seed is None}
        probed = frozenset(position for position in empty if self._slot_at(position).width_site is not None)
        depth: dict[int, Tensor] = {}
        width: dict[int, Tensor] = {}

        def at_slot(position: int, slot: SeedSlot, h: Tensor) -> Tensor:
            if position in empty:  # at the consumer's output for a slot with a width site, else at the slot
                h = _differentiable(h)
                (width if position in probed else depth)[position] = h
            output: Tensor = slot(h)
            return output

        def at_point(position: int, slot: SeedSlot, h: Tensor) -> Tensor:  # a widening seed's or empty slot's point
            if position in probed:
                h = depth[position] = _differentiable(h)
            return h

        try:
            with torch.enable_grad():
                output = self._walk(x, at_slot, widening=probed | self._widening(self.execution_plan()),
                                    at_point=at_point)
                points = [*depth.values(), *width.values()]
                gradients = torch.autograd.grad(loss(output), points, allow_unused=True) if points else ()
        finally:
            self.train(was_training)
            self._release_carried()
        batch = rows(x)
        measured = [_signal(h, g, batch) for h, g in zip(points, gradients, strict=True)]
        depths, widths = dict(zip(depth, measured[:len(depth)], strict=True)), dict(zip(width, measured[len(depth):],
                                                                                           strict=True))
        return {self._slot_ids[p]: GrowthSignal(depths[p], widths.get(p)) for p in sorted(depths)}
