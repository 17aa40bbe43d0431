"""SeedSlot: one named injection point of a host, holding at most one seed through its lifecycle.

What a slot runs is its `SlotMode`, named by its stage:
- `IDENTITY` (no seed, or a seed that is not running): the slot returns its input; the seed is not executed.
- `SHADOW` (a TRAINING seed): identity on the host path, which is exactly that of a model without the
  seed (outputs, gradients and state bit-identical). The seed learns in closed loop on its *shadow*
  (`SeedSlot.shadow`): the network with the seed blended in at alpha 1 on the detached activation,
  which `MorphogeneticModel.forward_with_shadow` runs next to the host forward and
  `counterfactual_forward` evaluates at validation. An open-loop `h + (s - s.detach())` instead would
  hand the seed the host's gradient at the slot without its output ever reaching the loss; seeds
  trained that way overshot and hurt when blended (shadow contributions of -40 to -75 points).
- `BLENDED` (BLENDING / HOLDING / FOSSILIZED): `blend(h, s, alpha)`. With `detach_input` the seed reads
  `h.detach()`, and `s + (h - h.detach())` restores the identity part of the residual seed for the
  host's gradient: the host still gets its full gradient through the skip path, never through the
  seed's internals. Without that term, a detached seed at alpha = 1 would cut the host's gradient
  at the slot.

Alpha lives in a 0-dim buffer that is refilled once per epoch, so a compiled forward does not
specialize (and recompile) on every new alpha value. What a compiled forward does specialize on is
the slot's `plan()` (a `SlotPlan`: its mode, and for a running seed its blueprint, options, blend and
detach setting), passed to it as an argument rather than read from the lifecycle (see
`morphogen.core.compilation`).
Lifecycle calls either make a legal transition or raise `IllegalTransitionError` and change nothing.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from morphogen.core.alpha import AlphaController, AlphaCurve, AlphaMode
from morphogen.core.blend import Blend, BlendKind, add_blend, gate_blend, multiply_blend
from morphogen.core.blueprints import CHANNEL_DIM, BlueprintKind, build_seed, copy_of_layer, get_blueprint
from morphogen.core.branch import BranchSite, NoBranchSiteError
from morphogen.core.lifecycle import (
    NEXT_STAGE,
    PRUNABLE_STAGES,
    RUNNING_STAGES,
    SEED_STAGES,
    GateConfig,
    GateResult,
    IllegalTransitionError,
    SeedLifecycle,
    SeedSignals,
    Stage,
    evaluate_gate,
)
from morphogen.core.width import NoWidthSiteError, WidthSite


class SlotMode(enum.Enum):
    """What a slot runs in the forward pass (module docstring)."""

    IDENTITY = "identity"
    """No seed runs; the slot returns its input."""
    SHADOW = "shadow"
    """A TRAINING seed: the host path is the identity, the seed runs only in the shadow pass."""
    BLENDED = "blended"
    """A BLENDING, HOLDING or FOSSILIZED seed blended in at its alpha."""


class SlotPlan(NamedTuple):
    """A slot's part of a model's execution plan: what a compiled forward specializes on (`SeedSlot.plan`).

    Plain, hashable values only. An idle slot is `SlotPlan(SlotMode.IDENTITY)` whatever seed it holds.
    """

    mode: SlotMode
    blueprint: str = ""
    #: The blueprint's options, as a sorted repr (dicts are not hashable).
    options: str = ""
    blend: BlendKind | None = None
    detach_input: bool = False
    #: The seed widens the layers around the slot: it runs at their injection point, not at the slot.
    widens: bool = False
    #: The seed is a branch beside the segment before the slot: it reads that segment's input.
    branches: bool = False


IDLE = SlotPlan(SlotMode.IDENTITY)
"""The plan of a slot whose seed, if any, does not run."""

#: Whether a seed keeps reading a detached input after TRAINING, per topology. CNN seeds (2D and 1D)
#: stay isolated (the host's features are not bent towards the seed); transformer seeds co-adapt, since
#: their residual stream is shared by every later layer and joint training converges faster there. MLP
#: feature seeds co-adapt too: on an MNIST-1D MLP (benchmarks/your_model.py, 5 seeds) growth gained
#: +1.04 ± 0.47 points over no growth with it and +0.30 ± 0.14 with the input kept detached.
DETACH_AFTER_TRAINING = {"cnn": True, "cnn1d": True, "transformer": False, "mlp": False}


@dataclass(frozen=True)
class SlotConfig:
    """How every slot of a model blends, ramps and is gated."""

    #: Blend operator of a seed whose controller names none (the heuristic's, the library's): add, multiply or
    #: gate. A learned policy chooses its own; a widening or branch seed always adds.
    blend: BlendKind = BlendKind.ADD
    #: Keep the seed input detached after TRAINING; None uses the topology default (DETACH_AFTER_TRAINING).
    detach_input: bool | None = None
    #: Epochs a slot is unusable after a prune.
    embargo_epochs: int = 5
    #: Epochs of the alpha ramp 0 -> 1 when a seed enters BLENDING, for a seed whose controller names no ramp of its
    #: own (the heuristic's, the library's `germinate` without `blend_epochs`); a learned policy chooses its own.
    blend_epochs: int = 3
    #: Curve of that default ramp.
    blend_curve: AlphaCurve = AlphaCurve.LINEAR
    #: Gate thresholds, mode and auto-advance set.
    gates: GateConfig = field(default_factory=GateConfig)

    def __post_init__(self) -> None:
        if self.embargo_epochs < 0:
            raise ValueError(f"embargo_epochs must be >= 0, got {self.embargo_epochs}")
        if self.blend_epochs < 0:
            raise ValueError(f"blend_epochs must be >= 0, got {self.blend_epochs}")


@dataclass(frozen=True)
class TransitionRecord:
    """A stage change of a slot, kept until the episode drains it into telemetry."""

    epoch: int
    slot: str
    blueprint: str
    from_stage: Stage
    to_stage: Stage
    reason: str


class SeedSlot(nn.Module):
    """A named injection point of width `channels` that can hold one seed of topology `topology`."""

    alpha_value: Tensor  # 0-dim buffer mirroring `alpha.alpha`, read by the forward pass

    def __init__(self, slot_id: str, channels: int, topology: str, config: SlotConfig | None = None) -> None:
        super().__init__()
        self.slot_id, self.channels, self.topology = slot_id, channels, topology
        self.config = config or SlotConfig()
        detach = self.config.detach_input
        self.detach_input = DETACH_AFTER_TRAINING[topology] if detach is None else detach
        self.seed: nn.Module | None = None
        self.blend: Blend | None = None
        self.blueprint: str | None = None
        self.blueprint_options: dict[str, Any] = {}
        self.blend_kind = self.config.blend
        self.blend_epochs = self.config.blend_epochs
        self.lifecycle = SeedLifecycle()
        self.alpha = AlphaController()
        self.signals = SeedSignals()
        self.transitions: list[TransitionRecord] = []
        self.register_buffer("alpha_value", torch.zeros(()), persistent=False)
        #: The layers around the slot that a widening seed widens (set by `MorphogeneticModel`), or None.
        self.width_site: WidthSite | None = None
        #: Why the slot has no width site (shown when a widening blueprint is refused).
        self.width_problem = "it is not part of a model (MorphogeneticModel finds the layers around a slot)"
        #: What a branch beside the segment before the slot maps (set by `MorphogeneticModel`), or None.
        self.branch_site: BranchSite | None = None
        #: Why the slot has no branch site (shown when a branch blueprint is refused).
        self.branch_problem = "it is not part of a model (MorphogeneticModel reads the host's measured shapes)"
        # The host's layer before the slot (`SegmentedHost.layer_before`, set by `MorphogeneticModel`), in a tuple:
        # a module attribute would register the host's layer as the slot's too.
        self._layer_before: tuple[nn.Module, ...] = ()
        #: The one head count of the host's attention layers (`blueprints.layer_heads` of the host, set by
        #: `MorphogeneticModel`), None where it has none or several: a new attention's where the layer before has none.
        self.host_heads: int | None = None
        #: The input of a widening or branch seed (the producer's input, or the input of the segment before the
        #: slot), handed over by the model's walk just before the slot runs.
        self.tap: Tensor | None = None

    # ---------------------------------------------------------------- read-only views
    @property
    def stage(self) -> Stage:
        return self.lifecycle.stage

    @property
    def is_running(self) -> bool:
        return self.lifecycle.stage in RUNNING_STAGES

    def seed_parameters(self) -> list[nn.Parameter]:
        """Parameters of the seed and of its blend gate (empty when the slot holds no seed)."""
        modules = [m for m in (self.seed, self.blend) if m is not None]
        return [p for m in modules for p in m.parameters()]

    def seed_parameter_count(self) -> int:
        return sum(p.numel() for p in self.seed_parameters())

    @property
    def widens(self) -> bool:
        """Whether the slot holds a widening seed (new channels of the layers around it)."""
        return self._holds(BlueprintKind.WIDEN)

    @property
    def branches(self) -> bool:
        """Whether the slot holds a branch seed (a path beside the segment before it)."""
        return self._holds(BlueprintKind.BRANCH)

    @property
    def reads_tap(self) -> bool:
        """Whether the slot's seed reads `tap` (widening and branch seeds) rather than the activation at the slot."""
        return self.widens or self.branches

    def _holds(self, kind: BlueprintKind) -> bool:
        return self.seed is not None and get_blueprint(self.topology, str(self.blueprint)).kind is kind

    @property
    def layer_before(self) -> nn.Module | None:
        """The host's layer just before this slot, which a seed of a copying blueprint (`block_copy`) copies."""
        return self._layer_before[0] if self._layer_before else None

    def set_layer_before(self, layer: nn.Module | None) -> None:
        """Tell the slot the host's layer before it (a method, not a setter: `nn.Module` would register a module
        assigned as an attribute as the slot's own)."""
        self._layer_before = () if layer is None else (layer,)

    def site_for(self, blueprint: str) -> WidthSite | BranchSite | None:
        """The site a seed of `blueprint` needs here: the width site for a widening one, the branch site for a
        branch, None for a deepening one (or where the slot has no site of that kind)."""
        recipe = get_blueprint(self.topology, blueprint)
        if recipe.kind is BlueprintKind.WIDEN:
            site = self.width_site
            return site if site is not None and (site.inside or not recipe.inside_only) else None
        return self.branch_site if recipe.kind is BlueprintKind.BRANCH else None

    def site_problem(self, blueprint: str) -> str:
        """Why `blueprint` cannot grow here for want of a site; "" when it can."""
        recipe = get_blueprint(self.topology, blueprint)
        kind = recipe.kind
        if recipe.copies_layer_before:
            return "" if self.layer_before is not None else (
                f"{blueprint!r} copies the host's layer just before slot {self.slot_id}, and the host has none there "
                "(a TransformerHost's block, or a layer of your model that maps the slot's activation to one tensor "
                "of its shape; a block that returns a tuple, such as (x, attention weights), cannot be copied)")
        if kind is BlueprintKind.DEEPEN or self.site_for(blueprint) is not None:
            return ""
        if kind is BlueprintKind.WIDEN and self.width_site is not None:  # around the slot, and it needs inside
            return (f"slot {self.slot_id} widens the layers around it, not inside a block before it, which "
                    f"{blueprint!r} needs")
        if kind is BlueprintKind.WIDEN:
            return f"slot {self.slot_id} cannot widen the layers around it: {self.width_problem}"
        return f"slot {self.slot_id} cannot grow a branch beside the segment before it: {self.branch_problem}"

    # ---------------------------------------------------------------- forward
    @property
    def mode(self) -> SlotMode:
        """What the forward pass runs here, by the stage (module docstring)."""
        if self.seed is None or self.stage not in RUNNING_STAGES:
            return SlotMode.IDENTITY
        return SlotMode.SHADOW if self.stage is Stage.TRAINING else SlotMode.BLENDED

    def plan(self) -> SlotPlan:
        """This slot's part of a model's execution plan: plain values a compiled forward specializes on.

        A slot that does not run contributes `IDLE` whatever seed it holds, so a GERMINATED seed costs no
        compile; a running one adds what shapes its graph (blueprint and options, blend, detach).
        """
        mode = self.mode
        if mode is SlotMode.IDENTITY:
            return IDLE
        options = repr(sorted(self.blueprint_options.items()))
        return SlotPlan(mode, str(self.blueprint), options, self.blend_kind, self.detach_input, self.widens,
                        self.branches)

    def forward(self, h: Tensor, alpha: Tensor | float | None = None) -> Tensor:
        """The slot on the host path in its current mode; `alpha` overrides a blended seed's alpha."""
        return self.run(self.mode, h, alpha)

    def run(self, mode: SlotMode, h: Tensor, alpha: Tensor | float | None = None) -> Tensor:
        """The slot on the host path in `mode` (compiled callers pass the mode of their plan): `h` itself,
        except for a blended seed, whose output is blended in at its alpha or at `alpha` (a scalar, or one
        value per sample: [N])."""
        if mode is not SlotMode.BLENDED:
            return h
        assert self.blend is not None
        blended: Tensor = self.blend(h, self.seed_output(h), self.alpha_value if alpha is None else alpha)
        return blended

    def shadow(self, h: Tensor, alpha: Tensor | float = 1.0) -> Tensor:
        """A TRAINING seed's shadow: its output on `h` blended into `h` at `alpha` (1: fully in).

        The shadow pass calls it on the host's detached activation, so the seed's gradient comes only
        from what its own output does to the loss; validation calls it at the alphas of the `with:`
        configurations (one per sample: [N]).
        """
        assert self.blend is not None and self.seed is not None
        seeded = h + self.seed(self._tap()) if self.reads_tap else self.seed(h)
        shadow: Tensor = self.blend(h, seeded, alpha)
        return shadow

    def _tap(self) -> Tensor:
        assert self.tap is not None, "a widening or branch seed runs inside the model's walk, which hands it its input"
        return self.tap

    def seed_output(self, h: Tensor) -> Tensor:
        """The seed's output `s` for a blended stage, before blending (input detached per `detach_input`).

        A widening seed's `h` is the consumer's output; `s` adds what the new channels bring to it (a branch's
        what the branch brings to the activation at the slot).
        """
        assert self.seed is not None
        if self.reads_tap:
            tap = self._tap()
            added: Tensor = self.seed(tap.detach() if self.detach_input else tap)
            return h + added
        if self.detach_input:
            s: Tensor = self.seed(h.detach())
            return s + (h - h.detach())  # value unchanged; gives the host its skip-path gradient back
        out: Tensor = self.seed(h)
        return out

    def blend_configurations(self, h: Tensor, s: Tensor, alphas: Tensor) -> Tensor:
        """Blend one batch `h`, `s` ([B, ...]) at K alphas ([K]) at once: [K, B, ...].

        The seed ran once on the B samples; only the blend, which is what alpha changes, is done K times.
        """
        assert self.blend is not None
        alpha = alphas.to(h.dtype).view(-1, *([1] * h.dim()))  # (K, 1, ..., 1)
        h_k, s_k = h.unsqueeze(0), s.unsqueeze(0)  # (1, B, ...)
        if self.blend.kind is BlendKind.ADD:
            return add_blend(h_k, s_k, alpha)
        if self.blend.kind is BlendKind.MULTIPLY:
            return multiply_blend(h_k, s_k, alpha)
        assert self.blend.gate is not None
        return gate_blend(h_k, s_k, alpha, self.blend.gate(h).unsqueeze(0))

    # ---------------------------------------------------------------- lifecycle
    def _move(self, target: Stage, epoch: int, reason: str) -> None:
        previous = self.lifecycle.stage
        self.lifecycle.transition(target, epoch)
        self.signals.accuracy_at_stage_start = self.signals.accuracy
        self.signals.loss_at_stage_start = self.signals.loss
        self.transitions.append(TransitionRecord(epoch, self.slot_id, self.blueprint or "", previous, target, reason))

    def _sync_alpha(self) -> None:
        self.alpha_value.fill_(self.alpha.alpha)

    def germinate(self, blueprint: str, epoch: int = 0, *, blend: BlendKind | None = None,
                  blend_epochs: int | None = None, device: torch.device | str | None = None,
                  dtype: torch.dtype | None = None, **options: Any) -> None:
        """Build a seed from `blueprint` in this empty slot (DORMANT -> GERMINATED).

        `blend` and `blend_epochs` choose this seed's blend operator and the length of its ramp into
        the host; by default they come from the slot config.
        """
        if blend_epochs is not None and blend_epochs < 0:
            raise ValueError(f"blend_epochs must be >= 0, got {blend_epochs}")
        if not self.lifecycle.can_transition(Stage.GERMINATED):
            raise IllegalTransitionError(f"slot {self.slot_id} is {self.stage.name}; germinate needs DORMANT")
        device = device if device is not None else self.alpha_value.device
        blend_kind = blend or self.config.blend
        # Build everything before touching the slot, so a refused blueprint or option changes nothing.
        recipe = get_blueprint(self.topology, blueprint)
        if recipe.options_from_host is not None:
            options = {**recipe.options_from_host(self.layer_before, self.channels, self.host_heads), **options}
        seed = self._build_seed(blueprint, blend_kind, device, dtype, options)
        blend_module = Blend(blend_kind, self.channels, channel_dim=CHANNEL_DIM[self.topology], device=device,
                             dtype=dtype)
        # New modules start in training mode; a seed germinated in an evaluating model evaluates as well.
        seed.train(self.training)
        blend_module.train(self.training)
        self.seed, self.blend, self.blend_kind = seed, blend_module, blend_kind
        self.blend_epochs = self.config.blend_epochs if blend_epochs is None else blend_epochs
        self.blueprint, self.blueprint_options = blueprint, dict(options)
        detach = self.config.detach_input  # a seed installed or grafted before may have changed it
        self.detach_input = DETACH_AFTER_TRAINING[self.topology] if detach is None else detach
        self.alpha = AlphaController(steepness=self.alpha.steepness)
        self.signals = SeedSignals(accuracy=self.signals.accuracy, loss=self.signals.loss)
        self._sync_alpha()
        self._move(Stage.GERMINATED, epoch, f"germinated {blueprint}")

    def graft(self, blueprint: str, epoch: int = 0, *, blend: BlendKind | None = None,
              blend_epochs: int | None = None, device: torch.device | str | None = None,
              dtype: torch.dtype | None = None, **options: Any) -> None:
        """Germinate `blueprint` to train with the host from the start: BLENDING at once, no TRAINING behind it.

        How depth growth adds a layer (the GROW action): the new layer learns jointly with the host, as in
        the depth-growth work whose compute savings morphogen measures (Gstack, LiGO, bert2BERT), rather than
        behind it (on `text`, seeds trained behind the host captured under a tenth of what the same capacity
        gives trained with it). A seed that is the identity at birth enters at alpha 1: it changes nothing
        yet, and a ramp would only scale its gradient down. One that is not (`block_copy`) ramps from alpha 0
        to 1 over `blend_epochs` epochs, the first of them already at 1 / `blend_epochs`. Its input is not
        detached, and the fossilize gate still judges it in HOLDING.
        """
        self.germinate(blueprint, epoch, blend=blend, blend_epochs=blend_epochs, device=device, dtype=dtype,
                       **options)
        self.detach_input = False
        reason = f"grafted {blueprint}: trains with the host from the start"
        self._move(Stage.TRAINING, epoch, reason)
        self._move(Stage.BLENDING, epoch, reason)
        identity = get_blueprint(self.topology, blueprint).identity_at_birth
        self.alpha.retarget(1.0, 0 if identity else self.blend_epochs, self.config.blend_curve)
        self.alpha.tick()  # the first epoch of the ramp already blends the seed in
        self._sync_alpha()
        self._finish_ramp(epoch)

    def _build_seed(self, blueprint: str, blend: BlendKind, device: torch.device | str | None,
                    dtype: torch.dtype | None, options: dict[str, Any]) -> nn.Module:
        """The seed module of `blueprint` (`seed_module`); a widening or branch one blended by adding."""
        kind = get_blueprint(self.topology, blueprint).kind
        if kind is not BlueprintKind.DEEPEN and blend is not BlendKind.ADD:
            what = "widening seed adds its channels'" if kind is BlueprintKind.WIDEN else "branch seed adds its"
            raise ValueError(f"a {what} output ({blueprint!r} blends by add, got {blend.value})")
        return self.seed_module(blueprint, device=device, dtype=dtype, **options)

    def seed_module(self, blueprint: str, *, device: torch.device | str | None = None,
                    dtype: torch.dtype | None = None, **options: Any) -> nn.Module:
        """The module a seed of `blueprint` would be in this slot, not placed in it: a widening or branch one at
        this slot's site of its kind, a copying one (`block_copy`) a copy of the host's layer before the slot.

        Raises `NoWidthSiteError` or `NoBranchSiteError` where the slot has no site for it, `ValueError` where
        there is no layer to copy."""
        recipe = get_blueprint(self.topology, blueprint)
        problem = self.site_problem(blueprint)
        if problem:
            if recipe.kind is BlueprintKind.BRANCH:
                raise NoBranchSiteError(problem)
            raise NoWidthSiteError(problem) if recipe.kind is BlueprintKind.WIDEN else ValueError(problem)
        if recipe.copies_layer_before:
            layer = self.layer_before
            assert layer is not None  # else a problem above
            return copy_of_layer(blueprint, layer, device=device, dtype=dtype, **options)
        return build_seed(self.topology, blueprint, self.channels, device=device, dtype=dtype,
                          site=self.site_for(blueprint), **options)

    def install(self, blueprint: str, epoch: int = 0, *, blend: BlendKind | None = None,
                device: torch.device | str | None = None, dtype: torch.dtype | None = None, **options: Any) -> None:
        """Place a seed as a fixed part of the architecture: FOSSILIZED at alpha 1 from the start.

        Its input is not detached, so it trains with the host like any other layer. This is how a grown
        model's final architecture is trained from scratch for comparison (`morphogen run`).
        """
        self.germinate(blueprint, epoch, blend=blend, device=device, dtype=dtype, **options)
        for stage in (Stage.TRAINING, Stage.BLENDING, Stage.HOLDING, Stage.FOSSILIZED):
            self._move(stage, epoch, f"installed {blueprint} as part of the architecture")
        self.alpha.retarget(1.0, 0)
        self._sync_alpha()
        self.detach_input = False

    def gate(self, target: Stage) -> GateResult:
        """Evaluate the gate for moving to `target` now, without moving."""
        return evaluate_gate(target, self.lifecycle, self.signals, self.config.gates)

    def advance(self, epoch: int) -> GateResult:
        """Move to the next stage of the forward path if its gate passes; otherwise change nothing."""
        target = NEXT_STAGE.get(self.stage)
        if target is None:
            raise IllegalTransitionError(f"slot {self.slot_id} is {self.stage.name}; nothing to advance to")
        result = self.gate(target)
        if result.passed:
            self._enter(target, epoch, result.reason)
        return result

    def _enter(self, target: Stage, epoch: int, reason: str) -> None:
        self._move(target, epoch, reason)
        if target is Stage.BLENDING:
            # From here on contribution means acc(with) - acc(without) at the real alpha, not the shadow.
            self.signals.contribution = self.signals.loss_contribution = None
        if target is Stage.BLENDING and not self.alpha.ramping:
            self.alpha.retarget(1.0, self.blend_epochs, self.config.blend_curve)
            self._sync_alpha()
            self.signals.alpha_ramp_finished = False
            # A zero-epoch ramp has already finished: settle it now (and auto-enter HOLDING if configured).
            self._finish_ramp(epoch)

    def fossilize(self, epoch: int) -> GateResult:
        """Keep a HOLDING seed for good if the fossilize gate passes."""
        if self.stage is not Stage.HOLDING:
            raise IllegalTransitionError(f"slot {self.slot_id} is {self.stage.name}; fossilize needs HOLDING")
        return self.advance(epoch)

    def prune(self, epoch: int, reason: str = "pruned") -> None:
        """Remove the seed now (module freed); the slot then sits out its embargo."""
        if self.stage not in PRUNABLE_STAGES:
            allowed = ", ".join(sorted(s.name for s in PRUNABLE_STAGES))
            raise IllegalTransitionError(f"slot {self.slot_id} is {self.stage.name}; prune needs one of {allowed}")
        self._move(Stage.PRUNED, epoch, reason)
        self.seed, self.blend = None, None
        self.alpha = AlphaController(steepness=self.alpha.steepness)
        self.signals = SeedSignals(accuracy=self.signals.accuracy, loss=self.signals.loss)
        self._sync_alpha()
        self.lifecycle.embargo_remaining = self.config.embargo_epochs

    def set_alpha_target(self, target: float, steps: int, epoch: int, curve: AlphaCurve | None = None,
                         steepness: float | None = None) -> None:
        """Retarget the blend weight of a BLENDING (not ramping) or HOLDING seed.

        From HOLDING the seed goes back to BLENDING. Ramping down freezes the seed's parameters;
        a ramp that reaches 0 completes a prune.
        """
        if self.stage not in (Stage.BLENDING, Stage.HOLDING):
            raise IllegalTransitionError(f"slot {self.slot_id} is {self.stage.name}; "
                                         "set_alpha_target needs BLENDING or HOLDING")
        if self.alpha.ramping:
            raise IllegalTransitionError(f"slot {self.slot_id} alpha is ramping {self.alpha.mode.name}; "
                                         "retarget only from HOLD")
        trial = dataclasses.replace(self.alpha)
        trial.retarget(target, steps, curve, steepness)  # validates before anything changes
        if self.stage is Stage.HOLDING:
            if trial.alpha == 1.0 and not trial.ramping:
                return
            self._move(Stage.BLENDING, epoch, f"alpha retargeted to {target:.2f}")
        self.alpha = trial
        self.signals.alpha_ramp_finished = False
        self._sync_alpha()
        self._freeze_if_ramping_down()
        self._finish_ramp(epoch)

    def _freeze_if_ramping_down(self) -> None:
        frozen = self.alpha.mode is AlphaMode.DOWN
        for parameter in self.seed_parameters():
            parameter.requires_grad_(not frozen)

    def _finish_ramp(self, epoch: int) -> None:
        """React to a ramp that has stopped: 0 completes a prune, 1 may auto-advance to HOLDING."""
        if self.alpha.ramping or self.stage is not Stage.BLENDING:
            return
        if self.alpha.alpha == 0.0:
            self.prune(epoch, "alpha ramped down to 0")
            return
        self._freeze_if_ramping_down()
        self.signals.alpha_ramp_finished = self.alpha.alpha == 1.0
        if Stage.HOLDING in self.config.gates.auto_advance and self.gate(Stage.HOLDING).passed:
            self._enter(Stage.HOLDING, epoch, "alpha ramp reached 1.0")

    def step_epoch(self, epoch: int) -> None:
        """End-of-epoch bookkeeping: stage clocks, alpha tick, embargo countdown and auto-advances."""
        self.lifecycle.epochs_in_stage += 1
        if self.stage in SEED_STAGES:
            self.lifecycle.seed_age += 1
        if self.stage is Stage.BLENDING and self.alpha.ramping:
            self.alpha.tick()
            self._sync_alpha()
            self._finish_ramp(epoch)
        elif self.stage is Stage.PRUNED:
            self._move(Stage.EMBARGOED, epoch, f"embargo for {self.lifecycle.embargo_remaining} epochs")
            if self.lifecycle.embargo_remaining <= 0:  # embargo_epochs == 0: no epoch spent embargoed
                self._move(Stage.RESETTING, epoch, "embargo over")
        elif self.stage is Stage.EMBARGOED:
            self.lifecycle.embargo_remaining -= 1
            if self.lifecycle.embargo_remaining <= 0:
                self._move(Stage.RESETTING, epoch, "embargo over")
        elif self.stage is Stage.RESETTING:
            self._move(Stage.DORMANT, epoch, "slot reset")
        self._auto_advance(epoch)

    def auto_advance(self, epoch: int) -> None:
        """Take the next forward stage now if the config auto-advances into it and its gate passes."""
        self._auto_advance(epoch)

    def _auto_advance(self, epoch: int) -> None:
        target = NEXT_STAGE.get(self.stage)
        if target is None or target is Stage.HOLDING or target not in self.config.gates.auto_advance:
            return
        result = self.gate(target)
        if result.passed:
            self._enter(target, epoch, f"auto: {result.reason}")

    def record_signals(self, *, accuracy: float | None = None, gradient_health: float | None = None,
                       gradient_ratio: float | None = None, contribution: float | None = None,
                       loss: float | None = None, loss_contribution: float | None = None) -> None:
        """Store the latest measurements the gates read; a None argument leaves that signal as it was."""
        if accuracy is not None:
            self.signals.accuracy = accuracy
            if self.signals.accuracy_at_stage_start is None:
                self.signals.accuracy_at_stage_start = accuracy
        if loss is not None:
            self.signals.loss = loss
            if self.signals.loss_at_stage_start is None:
                self.signals.loss_at_stage_start = loss
        if loss_contribution is not None:
            self.signals.loss_contribution = loss_contribution
        if gradient_health is not None:
            self.signals.gradient_health = gradient_health
        if gradient_ratio is not None:
            self.signals.gradient_ratio = gradient_ratio
        if contribution is not None:
            self.signals.contribution = contribution

    def drain_transitions(self) -> list[TransitionRecord]:
        records, self.transitions = self.transitions, []
        return records

    # ---------------------------------------------------------------- state
    def get_extra_state(self) -> dict[str, Any]:
        # The seed's dtype, so that `set_extra_state` rebuilds it in that dtype (e.g. float64 hosts).
        first_parameter = None if self.seed is None else next(self.seed.parameters(), None)
        seed_dtype = None if first_parameter is None else str(first_parameter.dtype).removeprefix("torch.")
        return {
            "blueprint": self.blueprint,
            "seed_dtype": seed_dtype,
            "blueprint_options": dict(self.blueprint_options),
            "blend_kind": self.blend_kind.value,
            "blend_epochs": self.blend_epochs,
            "detach_input": self.detach_input,
            "lifecycle": self.lifecycle.state_dict(),
            "alpha": self.alpha.state_dict(),
            "signals": dataclasses.asdict(self.signals),
        }

    def set_extra_state(self, state: dict[str, Any]) -> None:
        """Restore lifecycle state and rebuild the seed module so its parameters can be loaded next.

        `load_state_dict` visits a module before its children, so the seed rebuilt here receives its
        saved weights right after.
        """
        self.lifecycle = SeedLifecycle.from_state_dict(state["lifecycle"])
        self.alpha = AlphaController.from_state_dict(state["alpha"])
        self.signals = SeedSignals(**state["signals"])
        self.blueprint, self.blueprint_options = state["blueprint"], dict(state["blueprint_options"])
        self.blend_kind, self.blend_epochs = BlendKind(state["blend_kind"]), int(state["blend_epochs"])
        self.detach_input = bool(state["detach_input"])
        if self.stage in SEED_STAGES:
            assert self.blueprint is not None
            device = self.alpha_value.device
            dtype = _dtype_from_name(state["seed_dtype"])
            self.seed = self._build_seed(self.blueprint, self.blend_kind, device, dtype, self.blueprint_options)
            self.blend = Blend(self.blend_kind, self.channels, channel_dim=CHANNEL_DIM[self.topology], device=device,
                               dtype=dtype)
            self.seed.train(self.training)
            self.blend.train(self.training)
            self._freeze_if_ramping_down()
        else:
            self.seed, self.blend = None, None
        self._sync_alpha()


def _dtype_from_name(name: object) -> torch.dtype | None:
    """The torch dtype saved as its name (e.g. "float64"); None (a seed without parameters) means the default."""
    if name is None:
        return None
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"saved seed dtype {name!r} is not a torch dtype")
    return dtype
