"""Rule-based growth controller (docs/architecture.md#controller).

Waits until the host has trained a few epochs and its learning slows down (validation loss improving
at most half as fast as just before, or the score flat), then grows: on a transformer host by depth
(GROW: a copy of each trained layer into the empty slot after it, all at once, trained with the host from
the start); elsewhere it germinates a seed: first a wide path beside a layer (`branch_wide`) where some slot of
a user's module has a site for one, then by default where growth signals per FLOP are best, deeper (the
next blueprint of its rotation) or wider (new channels of the layers around the slot)
(`control/growth_choice.py`); with `choice = "rotation"` (the default on an MLP host), or when no signal was
measured, the next slot and blueprint in turn. Blueprints pruned recently are skipped. It pushes the seed
through TRAINING and BLENDING, prunes a seed that never earns its way out of TRAINING or whose stage made the
model worse, and in HOLDING fossilizes a seed that contributes, else prunes it; one the fossilize gate refused
is asked again only when a later measurement passes what the gate asks (`EpisodeSnapshot.fossilize_contribution`;
above the one refused where the snapshot does not say), `fossilize_patience` times at most, else pruned. It
reads only the episode snapshot and the action masks.

It judges by what the gates judge (`EpisodeSnapshot.criterion`): the validation loss in nats for a language
model and a classifier, the log of the validation loss (and the share of it a seed removes) for a task with a
loss of its own, or the task's score where the gates' criterion is set to "score", each with its own
thresholds.

Why a slowing trend and not only a flat line: a language model's loss keeps improving slowly for
hundreds of epochs, so an accuracy plateau may never come; and a seed that starts while the host
still learns has more epochs to be trained behind it and to pay back its parameters.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from morphogen.control.growth_choice import best_growth
from morphogen.core.blend import BlendKind
from morphogen.core.blueprints import BlueprintKind, UnknownBlueprintError, get_blueprint
from morphogen.core.lifecycle import Criterion, Stage
from morphogen.env.actions import Action, ActionSpace, Op
from morphogen.env.snapshot import HISTORY_LENGTH, EpisodeSnapshot, SlotSnapshot
from morphogen.telemetry.story import share_of_loss

#: Blueprint order tried by default, per topology: the conv seeds that added most on small digits and
#: mnist1d hosts first (measured: +1.0 and +2.2 points over no growth), then widening and cheaper ones.
DEFAULT_ROTATION = {
    "cnn": ("conv_heavy", "conv_light", "widen_x4", "attention", "depthwise", "bottleneck", "conv_small", "norm",
            "widen_x2", "widen_x8"),
    "cnn1d": ("conv_heavy", "conv_light", "widen_x4", "attention", "depthwise", "bottleneck", "conv_small",
              "norm", "widen_x2", "widen_x8"),
    "transformer": ("lora", "mlp_small", "attention", "norm", "lora_large", "mlp"),
    "mlp": ("mlp", "mlp_small", "lora_large", "lora", "norm"),
}
#: The first seed of an episode grown seed by seed, per topology, wherever some empty slot has a site for it,
#: before `choice` decides: a wide path beside the layer before the slot (`branch_wide`). Only a user's module
#: has such sites (`host_from_module` measures each segment's input); the built-in hosts do not, and grow as
#: before. A learned policy chose it on the MLP of benchmarks/your_model.py: there +6.9 points over the rotation's
#: `mlp` seed (40 fresh seeds); on its 1-D and 2-D CNNs +8.3 and +1.3 over the seed the growth signals chose
#: (`wider`, which they favour per FLOP: weighed against each other, the signals picked the branch in 2 runs of 10).
DEFAULT_FIRST_SEED = {"mlp": "branch_wide", "cnn1d": "branch_wide", "cnn": "branch_wide"}
#: Blueprint of depth growth per topology (`HeuristicConfig.depth_blueprint` left to the default): a transformer
#: stacks copies of its trained layers (`block_copy`), the growth that saved most training compute on language
#: models in Gstack (Du et al. 2024). On the whole `text` corpus (benchmarks/lm_growth.py) 2 -> 4 copied layers
#: ended the FLOP budget ahead of the 2- and 4-layer models, zero-initialised blocks (`block`) behind both.
#: On a user's transformer the copies are of the user's own blocks: on the padded-sequence classifier of
#: `benchmarks/your_model.py` (AdamW, judged by loss, seeds 0-19) they ended +5.50 ± 1.62 points above no growth
#: and level with zero-initialised blocks (+0.45 ± 1.65) for 14% fewer parameters. Other topologies grow seed by
#: seed.
DEFAULT_DEPTH_BLUEPRINT = {"transformer": "block_copy"}
#: What the default depth growth grows where its blueprint has no layer to copy (a slot after one linear layer,
#: not a block): zero-initialised blocks of the host's width (`block`). On the padded-sequence classifier they
#: (4-head blocks then; now of its own 2 heads) ended +5.05 ± 1.73 points above no growth over seeds 0-19; the
#: seeds grown one by one were all pruned.
DEPTH_FALLBACK = {"block_copy": "block"}
#: The widening blueprint `choice = "signal"` weighs against the next deepening one, per topology (a
#: transformer's residual stream cannot be widened locally).
DEFAULT_WIDENING = {"cnn": "wider", "cnn1d": "wider", "mlp": "wider"}
#: How the heuristic picks the next seed: by measured growth signal per FLOP, or slots and blueprints in turn.
CHOICES = ("signal", "rotation")
#: The choice per topology (`HeuristicConfig.choice` left to the default); "signal" where none is named. An MLP
#: grows by the rotation: on benchmarks/your_model.py's MLP (40-32-32-10, mnist1d, 5 seeds) the signals chose
#: `wider` after the last hidden layer, then `mlp` there, and neither earned the blending gate (-0.08 +- 0.06
#: points over no growth), while the rotation's `mlp` seed after the first hidden layer gained +1.00 +- 0.35.
DEFAULT_CHOICE = {"mlp": "rotation"}


#: Stages of a seed that growth put in place and that a rollback leaves (a fossilized one) or prunes.
_GROWN_STAGES = frozenset({Stage.TRAINING, Stage.BLENDING, Stage.HOLDING, Stage.FOSSILIZED})


@dataclass(frozen=True)
class HeuristicConfig:
    """Thresholds of the rule-based controller."""

    #: Epochs the host trains before any seed is considered.
    warmup_epochs: int = 3
    #: ...and at least this fraction of the episode (the later of the two): a warmup that scales with the
    #: episode's length, as growing late for compute needs (the `grow_for_compute` preset: 0.5).
    warmup_fraction: float = 0.0
    #: The plateau test looks at the gain over this many epochs...
    plateau_epochs: int = 3
    #: ...and, judged by score, calls it a plateau when the gain is below this many points.
    plateau_threshold: float = 0.5
    #: The slowing test compares the validation-loss improvement over the last `slowing_window` epochs...
    slowing_window: int = 2
    #: ...with the improvement over the window before it: below this fraction of it, learning is slowing.
    slowing_ratio: float = 0.5
    #: Growth pays more the earlier a seed is in: when the loss has not slowed by this fraction of the episode,
    #: the first seed is germinated then anyway (on mnist1d that added about a point over waiting for the
    #: signal, which came only after 60-70% of the episode). 1.0 waits for the signal alone.
    first_growth_by: float = 0.33
    #: Epochs in TRAINING before the controller asks to blend (the gate has the final word).
    min_training_epochs: int = 5
    #: Epochs past `min_training_epochs` that a TRAINING seed may wait for the blending gate before it
    #: is pruned (its shadow contribution never reached what the gate asks), freeing the slot.
    training_patience: int = 3
    #: Times a HOLDING seed the fossilize gate refused is asked again, each only on a newer measured contribution
    #: that passes what the gate asks (a strict gate may want more than `fossilize_threshold`, and the seed may
    #: still be rising; where the snapshot does not say, one above the contribution refused), before it is pruned;
    #: 0 prunes it at the first refusal.
    fossilize_patience: int = 2
    #: Prune a blending/holding seed whose stage lost more than this many accuracy points.
    worse_threshold: float = 2.0
    #: Fossilize a holding seed whose contribution exceeds this many points, else prune it.
    fossilize_threshold: float = 0.5
    #: Epochs in HOLDING before that judgement: a seed enters HOLDING at the end of an epoch whose
    #: contribution was measured with alpha still below 1, so the first full-strength figure comes one epoch later.
    min_holding_epochs: int = 1
    #: Epochs a pruned blueprint is skipped by the rotation.
    prune_penalty_epochs: int = 10
    #: Blueprint order; None uses DEFAULT_ROTATION for the topology.
    rotation: tuple[str, ...] | None = None
    #: Depth growth: the blueprint GROW puts into every empty slot at once, trained with the host from the
    #: start, instead of germinating one seed at a time from the rotation ("block_copy": a copy of the layer
    #: before each slot, 2 -> 4 layers on the `text` host; "block": zero-initialised blocks; "conv_wide": a wide
    #: residual block after every block of a user's ResNet). "" never grows by depth. None:
    #: DEFAULT_DEPTH_BLUEPRINT for the topology ("block_copy" on transformers), else "".
    depth_blueprint: str | None = None
    #: Judged by loss (a language model or a classifier): it is a plateau when the validation loss fell by less
    #: than this many nats (per token, or per sample) over `plateau_epochs` epochs.
    loss_plateau_threshold: float = 0.01
    #: Judged by loss: prune a blending/holding seed whose stage raised the validation loss by more than this
    #: many nats per token.
    loss_worse_threshold: float = 0.05
    #: Judged by loss: fossilize a holding seed that lowers the validation loss by more than this many nats per
    #: token, else prune it.
    loss_fossilize_threshold: float = 0.005
    #: Judged by relative loss (a task with its own loss): it is a plateau when the log of the validation loss
    #: fell by less than this over `plateau_epochs` epochs (0.02: the loss fell by less than about 2%).
    relative_plateau_threshold: float = 0.02
    #: Judged by relative loss: prune a blending/holding seed whose stage raised the log of the validation loss
    #: by more than this (0.2: the loss rose by more than about 22%).
    relative_worse_threshold: float = 0.2
    #: Judged by relative loss: fossilize a holding seed that removes more than this share of the validation
    #: loss, else prune it.
    relative_fossilize_threshold: float = 0.01
    #: How the next seed is chosen. "signal": at every empty slot, the next deepening blueprint of the rotation
    #: and the widening blueprint are scored by measured growth signal over the FLOPs they would add
    #: (`control/growth_choice.py`), and the best one is germinated; "rotation": slots and blueprints in turn.
    #: None: DEFAULT_CHOICE for the topology ("rotation" on an MLP host), else "signal".
    choice: str | None = None
    #: The widening blueprint "signal" weighs; None uses DEFAULT_WIDENING for the topology (none for a
    #: transformer).
    widening: str | None = None
    #: The episode's first seed where some empty slot has a site for it, before `choice` decides; None uses
    #: DEFAULT_FIRST_SEED for the topology ("branch_wide" but on transformers), "" leaves it to `choice`.
    first_seed: str | None = None

    def __post_init__(self) -> None:
        for name in ("warmup_epochs", "min_training_epochs", "prune_penalty_epochs", "min_holding_epochs",
                     "training_patience", "fossilize_patience"):
            if getattr(self, name) < 0:
                raise ValueError(f"heuristic {name} must be >= 0, got {getattr(self, name)}")
        if not 1 <= self.plateau_epochs < HISTORY_LENGTH:
            # The snapshot keeps the last HISTORY_LENGTH accuracies; a longer plateau test could never pass.
            raise ValueError(f"heuristic plateau_epochs must be in [1, {HISTORY_LENGTH - 1}], "
                             f"got {self.plateau_epochs}")
        if not 1 <= self.slowing_window <= (HISTORY_LENGTH - 1) // 2:
            # Two windows of this many epochs need 2 * window + 1 losses from the snapshot's history.
            raise ValueError(f"heuristic slowing_window must be in [1, {(HISTORY_LENGTH - 1) // 2}], "
                             f"got {self.slowing_window}")
        self._check_fractions()
        if self.rotation is not None and not self.rotation:
            raise ValueError("heuristic rotation must name at least one blueprint (leave it out for the default)")
        for name in (f"{kind}_{threshold}_threshold" for kind in ("loss", "relative")
                     for threshold in ("plateau", "worse", "fossilize")):
            if not getattr(self, name) >= 0:  # NaN fails too
                raise ValueError(f"heuristic {name} must be >= 0, got {getattr(self, name)}")
        if self.choice is not None and self.choice not in CHOICES:
            raise ValueError(f"heuristic choice must be one of {', '.join(CHOICES)}, got {self.choice!r}")

    def _check_fractions(self) -> None:
        """Fractions of the episode or of an improvement, each in its range (NaN fails every comparison)."""
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise ValueError(f"heuristic warmup_fraction must be in [0, 1), got {self.warmup_fraction}")
        if not 0.0 < self.first_growth_by <= 1.0:
            raise ValueError(f"heuristic first_growth_by must be in (0, 1], got {self.first_growth_by}")
        if not 0.0 <= self.slowing_ratio < 1.0:
            raise ValueError(f"heuristic slowing_ratio must be in [0, 1), got {self.slowing_ratio}")


class _Measure(NamedTuple):
    """What the heuristic judges by, as numbers where higher is better, with the thresholds in their unit."""

    criterion: Criterion
    plateau_threshold: float
    worse_threshold: float
    fossilize_threshold: float

    @classmethod
    def of(cls, criterion: Criterion, config: HeuristicConfig) -> _Measure:
        """The score's points for `Criterion.SCORE`, nats of validation loss for `Criterion.LOSS`, the log of the
        validation loss (and shares of it) for `Criterion.RELATIVE_LOSS`."""
        if criterion is Criterion.LOSS:
            return cls(criterion, config.loss_plateau_threshold, config.loss_worse_threshold,
                       config.loss_fossilize_threshold)
        if criterion is Criterion.RELATIVE_LOSS:
            return cls(criterion, config.relative_plateau_threshold, config.relative_worse_threshold,
                       config.relative_fossilize_threshold)
        return cls(criterion, config.plateau_threshold, config.worse_threshold, config.fossilize_threshold)

    def amount(self, value: float) -> str:
        """`value` in the measure's unit, for a reason people read: "+1.25 points", "+0.0123 nats", "+4.1% of the
        loss"."""
        if self.criterion is Criterion.LOSS:
            return f"{value:+.4f} nats"
        if self.criterion is Criterion.RELATIVE_LOSS:
            return f"{100 * value:+.1f}% of the loss"
        return f"{value:+.2f} points"

    def history(self, snapshot: EpisodeSnapshot) -> Sequence[float]:
        """The recent validation scores, or negated losses or log losses (so that a falling loss is a rising
        score)."""
        if self.criterion is Criterion.LOSS:
            return [-loss for loss in snapshot.loss_history]
        if self.criterion is Criterion.RELATIVE_LOSS:
            return [-_log(loss) for loss in snapshot.loss_history]
        return snapshot.accuracy_history

    def lost_in_stage(self, slot: SlotSnapshot, snapshot: EpisodeSnapshot) -> float | None:
        """How much worse the model is now than when the seed entered its stage (None: not measured)."""
        if self.criterion is Criterion.SCORE:
            if slot.accuracy_at_stage_start is None:
                return None
            return slot.accuracy_at_stage_start - snapshot.val_accuracy
        if slot.loss_at_stage_start is None:
            return None
        if self.criterion is Criterion.RELATIVE_LOSS:
            return _log(snapshot.val_loss) - _log(slot.loss_at_stage_start)
        return snapshot.val_loss - slot.loss_at_stage_start

    def contribution(self, slot: SlotSnapshot, snapshot: EpisodeSnapshot) -> float | None:
        """What the seed adds: accuracy points, nats per token of validation loss it removes, or the share of the
        validation loss it removes."""
        if self.criterion is Criterion.LOSS:
            return slot.loss_contribution
        if self.criterion is Criterion.RELATIVE_LOSS:
            return share_of_loss(slot.loss_contribution, snapshot.val_loss)
        return slot.contribution


def _log(loss: float) -> float:
    """log(loss), NaN for a loss that is not positive: no plateau or loss is then found in it, and growth waits
    for `first_growth_by`."""
    return math.log(loss) if loss > 0.0 else math.nan


def has_plateaued(history: Sequence[float], epochs: int, threshold: float) -> bool:
    """True when the score (higher is better) gained over the last `epochs` epochs is below `threshold`."""
    if len(history) < epochs + 1:
        return False
    window = list(history)[-(epochs + 1):]
    return max(window[1:]) - window[0] < threshold


def is_slowing(losses: Sequence[float], window: int, ratio: float) -> bool:
    """True when the loss fell by less than `ratio` times as much over the last `window` epochs as over
    the `window` epochs before (a loss that rose recently counts as slowing; one still falling as fast does not).
    """
    if len(losses) < 2 * window + 1:
        return False
    recent = list(losses)[-(2 * window + 1):]
    earlier_gain = recent[0] - recent[window]
    recent_gain = recent[window] - recent[-1]
    return earlier_gain > 0.0 and recent_gain < ratio * earlier_gain


class HeuristicController:
    """Decides one `Action` per epoch from the episode snapshot."""

    #: It compares blueprints by growth signals (`growth_candidates`), not by the snapshot's descriptions.
    reads_blueprints = False

    def __init__(self, action_space: ActionSpace, topology: str, config: HeuristicConfig | None = None) -> None:
        self.space = action_space
        self.config = config or HeuristicConfig()
        rotation = DEFAULT_ROTATION[topology] if self.config.rotation is None else self.config.rotation
        unknown = [name for name in rotation if name not in action_space.blueprints]
        if unknown:
            raise UnknownBlueprintError(
                f"heuristic.rotation: unknown {topology} blueprint(s) {', '.join(map(repr, unknown))}; "
                f"valid: {', '.join(action_space.blueprints)}")
        self.rotation = tuple(rotation)
        depth = self.config.depth_blueprint
        self.depth_blueprint = self._known(
            "depth_blueprint", topology, DEFAULT_DEPTH_BLUEPRINT.get(topology, "") if depth is None else depth,
            ' (or "" to grow seed by seed)')
        widening = DEFAULT_WIDENING.get(topology) if self.config.widening is None else self.config.widening
        self.widening = self._known("widening", topology, widening) if widening is not None else None
        first = DEFAULT_FIRST_SEED.get(topology, "") if self.config.first_seed is None else self.config.first_seed
        self.first_seed = self._known("first_seed", topology, first, ' (or "" for none)')
        #: A branch first seed goes only where a branch has a site.
        self.first_seed_branches = bool(first) and get_blueprint(topology, first).kind is BlueprintKind.BRANCH
        self.choice = DEFAULT_CHOICE.get(topology, "signal") if self.config.choice is None else self.config.choice
        #: The depth blueprint each episode starts with (`_without_a_layer_to_copy` may fall back from it).
        self.configured_depth_blueprint = self.depth_blueprint
        self.reset()

    def _known(self, field: str, topology: str, blueprint: str, alternative: str = "") -> str:
        """`blueprint` if the action space has it ("" passes), else UnknownBlueprintError naming `field`."""
        if blueprint and blueprint not in self.space.blueprints:
            raise UnknownBlueprintError(f"heuristic.{field}: unknown {topology} blueprint {blueprint!r}; "
                                        f"valid: {', '.join(self.space.blueprints)}{alternative}")
        return blueprint

    def reset(self) -> None:
        self.depth_blueprint = self.configured_depth_blueprint
        self._depth_index = self.space.blueprints.index(self.depth_blueprint) if self.depth_blueprint else 0
        self.next_blueprint = 0
        self.next_slot = 0
        self.pruned_at: dict[str, int] = {}
        self.last_action = Action()
        #: Whether a seed was germinated (or GROWn) this episode: `first_growth_by` applies until then.
        self.has_grown = False
        #: HOLDING slots whose seed the fossilize gate refused (e.g. a strict gate wanting more contribution than
        #: `fossilize_threshold`), each with the contribution the last refusal was judged on (None: not known, in a
        #: state saved before it was kept) and how many times it was refused. Such a seed is asked again only on
        #: a newer measurement that passes the gate, at most `fossilize_patience` times; else it is pruned.
        self.fossilize_refused: dict[str, tuple[float | None, int]] = {}
        #: The contribution the last FOSSILIZE was asked on: what the gate judged, were it refused.
        self.fossilize_asked_on: float | None = None
        #: Whether it still grows by depth: a refused GROW (a host without the layer `block_copy` copies, a
        #: width the block's heads do not divide) turns it to growing seed by seed for the rest of the episode.
        self.grows_by_depth = bool(self.depth_blueprint)
        #: Whether a GROW succeeded: depth growth happens once an episode. A slot whose grafted block was pruned
        #: stays empty: grafted again later, beside blocks that had co-adapted with the host for longer, it was
        #: mostly pruned again, and each graft and prune shook a batch-norm host at a constant rate (on the
        #: ResNet of benchmarks/your_model.py, a prune two epochs before the end left one run at 63.61%).
        self.depth_grown = False
        #: The episode's length and its seeds' ramp, from the snapshots seen (None before the first): whether growth
        #: could be due at an epoch, which decides whether growth signals are worth measuring for it.
        self.episode_shape: tuple[int, int] | None = None
        #: The epoch from which growth may be considered again after a rollback undid it.
        self.growth_resumes_at = 0
        #: [n_blueprints]: those some empty slot had a site for when a germination was last legal (a branch needs
        #: a measured segment input, which a user's module has and the built-in hosts do not); None before.
        self.germinable: np.ndarray | None = None

    def state_dict(self) -> dict[str, object]:
        """What it remembers of the episode so far (plain values), for a run saved between epochs."""
        return {"depth_blueprint": self.depth_blueprint, "next_blueprint": self.next_blueprint,
                "next_slot": self.next_slot, "pruned_at": dict(self.pruned_at), "last_action": self.last_action.state(),
                "has_grown": self.has_grown, "fossilize_asked_on": self.fossilize_asked_on,
                "fossilize_refusals": {slot: list(refusal) for slot, refusal in self.fossilize_refused.items()},
                "grows_by_depth": self.grows_by_depth, "depth_grown": self.depth_grown,
                "growth_resumes_at": self.growth_resumes_at,
                "germinable": None if self.germinable is None else self.germinable.tolist(),
                "episode_shape": None if self.episode_shape is None else list(self.episode_shape)}

    def load_state_dict(self, state: dict[str, Any], space: ActionSpace) -> None:
        """Continue the episode `state_dict` was saved in (the same settings, in action space `space`)."""
        if (space.slot_ids, space.topology) != (self.space.slot_ids, self.space.topology):
            raise ValueError(f"the saved heuristic acted on slots {list(self.space.slot_ids)}, "
                             f"not {list(space.slot_ids)}")
        depth = str(state["depth_blueprint"])
        self.depth_blueprint = self._known("depth_blueprint", self.space.topology, depth)
        self._depth_index = self.space.blueprints.index(depth) if depth else 0
        self.next_blueprint, self.next_slot = int(state["next_blueprint"]), int(state["next_slot"])
        self.pruned_at = {str(k): int(v) for k, v in state["pruned_at"].items()}
        self.last_action = Action.from_state(state["last_action"])
        self.has_grown, self.depth_grown = bool(state["has_grown"]), bool(state["depth_grown"])
        self._load_refusals(state)
        self.grows_by_depth, self.growth_resumes_at = bool(state["grows_by_depth"]), int(state["growth_resumes_at"])
        shape = state.get("episode_shape")  # a state saved before it was kept: found again at the next snapshot
        self.episode_shape = None if shape is None else (int(shape[0]), int(shape[1]))
        germinable = state["germinable"]
        self.germinable = None if germinable is None else np.asarray(germinable, dtype=bool)

    def _load_refusals(self, state: dict[str, Any]) -> None:
        """The fossilize gate's refusals of `state`; one saved before their contributions were kept names only the
        slots, whose seeds are then pruned as they were then."""
        asked_on = state.get("fossilize_asked_on")
        self.fossilize_asked_on = None if asked_on is None else float(asked_on)
        if "fossilize_refusals" not in state:
            self.fossilize_refused = {str(slot): (None, 1) for slot in state["fossilize_refused"]}
            return
        self.fossilize_refused = {
            str(slot): (None if refused_on is None else float(refused_on), int(refusals))
            for slot, (refused_on, refusals) in state["fossilize_refusals"].items()}

    def act(self, snapshot: EpisodeSnapshot, masks: Sequence[np.ndarray]) -> Action:
        """The action for this epoch; always legal under `masks`."""
        if masks[0][Op.GERMINATE]:
            self.germinable = np.asarray(masks[2][Op.GERMINATE], dtype=bool)
        self._observe(snapshot)
        action = self._decide(snapshot, masks)
        self._commit(action, snapshot)
        return action

    def fork(self) -> HeuristicController:
        """A copy to propose from: what it decides changes nothing here (`HeuristicAdvisor`)."""
        twin = copy.copy(self)
        twin.pruned_at, twin.fossilize_refused = dict(self.pruned_at), dict(self.fossilize_refused)
        return twin

    def follow(self, snapshot: EpisodeSnapshot, action: Action) -> None:
        """Keep in step with an episode another controller acts in, as if this one had chosen `action` at
        `snapshot` (what it proposed there, from a copy, is forgotten): `HeuristicAdvisor` uses it."""
        self._observe(snapshot)
        self._commit(action, snapshot)

    def _observe(self, snapshot: EpisodeSnapshot) -> None:
        """What the outcome of the last action tells: a refused fossilize, a GROW that took, a rollback."""
        self.episode_shape = (snapshot.max_epochs, snapshot.blend_epochs)
        last = self.last_action
        if last.op is Op.FOSSILIZE and last.slot is not None and not snapshot.last_action_succeeded:
            refusals = self.fossilize_refused.get(last.slot, (None, 0))[1]
            self.fossilize_refused[last.slot] = (self.fossilize_asked_on, refusals + 1)
        holding = {slot.slot_id for slot in snapshot.slots if slot.stage is Stage.HOLDING}
        self.fossilize_refused = {slot: refusal for slot, refusal in self.fossilize_refused.items() if slot in holding}
        if last.op is Op.GROW:
            self.depth_grown |= snapshot.last_action_succeeded
            self.grows_by_depth &= snapshot.last_action_succeeded
        if snapshot.rolled_back and not any(slot.stage in _GROWN_STAGES for slot in snapshot.slots):
            # The governor undid the growth (it prunes every live seed): the episode has not grown yet. On the
            # ResNet of benchmarks/your_model.py one run's graft epoch fell to chance, and that run then
            # ended with the host alone. The restored host first trains for `warmup_epochs` again.
            self.depth_grown = False
            self.growth_resumes_at = snapshot.epoch + self.config.warmup_epochs

    def _commit(self, action: Action, snapshot: EpisodeSnapshot) -> None:
        """Remember the action taken at `snapshot`: the next epoch reads its outcome, a pruned blueprint waits."""
        self.last_action = action
        self.has_grown |= action.op in (Op.GERMINATE, Op.GROW)
        if action.op is Op.FOSSILIZE:
            # The gate judges the contribution measured at `snapshot`: a refusal is weighed against it.
            slot = next((slot for slot in snapshot.slots if slot.slot_id == action.slot), None)
            measure = _Measure.of(snapshot.criterion, self.config)
            self.fossilize_asked_on = None if slot is None else measure.contribution(slot, snapshot)
        if action.op is Op.PRUNE:
            blueprint = next((slot.blueprint for slot in snapshot.slots if slot.slot_id == action.slot), None)
            if blueprint is not None:
                self.pruned_at[blueprint] = snapshot.epoch

    def _decide(self, snapshot: EpisodeSnapshot, masks: Sequence[np.ndarray]) -> Action:
        slot_mask = {op: dict(zip(self.space.slot_ids, masks[1][op], strict=True)) for op in Op}
        for slot in snapshot.slots:
            action = self._manage_seed(slot, snapshot, slot_mask)
            if action is not None:
                return action
        return self._grow(snapshot, masks, slot_mask[Op.GERMINATE])

    def _without_a_layer_to_copy(self, growable: np.ndarray) -> None:
        """The depth blueprint cannot go in (no layer of the host's own class to copy, as in a user's transformer):
        the default grows zero-initialised blocks instead where it can (`DEPTH_FALLBACK`), else seed by seed."""
        fallback = DEPTH_FALLBACK.get(self.depth_blueprint, "")
        if self.config.depth_blueprint is None and fallback in self.space.blueprints and \
                growable[self.space.blueprints.index(fallback)]:
            self.depth_blueprint, self._depth_index = fallback, self.space.blueprints.index(fallback)
        else:
            self.grows_by_depth = False

    def _grow(self, snapshot: EpisodeSnapshot, masks: Sequence[np.ndarray], allowed: dict[str, bool]) -> Action:
        """GROW (by depth, once an episode), GERMINATE (seed by seed) or nothing, when growth is due."""
        if self.depth_grown:  # nor seed by seed afterwards
            return Action(why="the blocks grown by depth are this episode's growth")
        if self.grows_by_depth and masks[0][Op.GROW] and not masks[2][Op.GROW][self._depth_index]:
            self._without_a_layer_to_copy(masks[2][Op.GROW])
        can_grow = masks[0][Op.GROW] if self.grows_by_depth else masks[0][Op.GERMINATE]
        if not can_grow:
            return Action(why="no seed can be germinated now (one is training, or no slot is free)")
        due, why = self._growth_due(snapshot)
        if not due:
            return Action(why=why)
        if self.grows_by_depth:
            return Action(Op.GROW, blueprint=self.depth_blueprint, blend_epochs=snapshot.blend_epochs, why=why)
        chosen = self._germinate(snapshot, allowed)
        if chosen.op is not Op.GERMINATE:
            return Action(why="no blueprint fits an empty slot, or each that fits was pruned recently")
        # The seed blends as the slots are configured to ([episode.slots] blend and blend_epochs).
        return dataclasses.replace(chosen, blend=BlendKind(snapshot.blend), blend_epochs=snapshot.blend_epochs,
                                   why=why + (f"; {chosen.why}" if chosen.why else ""))

    def _manage_seed(self, slot: SlotSnapshot, snapshot: EpisodeSnapshot,
                     slot_mask: dict[Op, dict[str, bool]]) -> Action | None:
        """The first move this seed asks for that the masks allow; in HOLDING, the verdict on it."""
        measure = _Measure.of(snapshot.criterion, self.config)
        for op, why in self._seed_moves(slot, snapshot, measure):
            if slot_mask[op][slot.slot_id]:
                return Action(op, slot.slot_id, why=why)
        contribution = measure.contribution(slot, snapshot)
        if slot.stage is Stage.HOLDING and contribution is not None \
                and slot.epochs_in_stage >= self.config.min_holding_epochs:
            return self._judge_holding(slot, contribution, measure, slot_mask, snapshot.fossilize_contribution)
        return None

    def _seed_moves(self, slot: SlotSnapshot, snapshot: EpisodeSnapshot, measure: _Measure) -> list[tuple[Op, str]]:
        """The moves a seed asks for now, most urgent first, each with why."""
        config, moves = self.config, []
        if slot.stage is Stage.GERMINATED:
            moves.append((Op.ADVANCE, "to train behind the host"))
        if slot.stage is Stage.TRAINING:
            if slot.epochs_in_stage >= config.min_training_epochs + config.training_patience:
                # The blending gate kept refusing: this seed would not pay.
                moves.append((Op.PRUNE, f"still not allowed to blend {config.training_patience} epochs after its "
                                        f"{config.min_training_epochs} of training (heuristic.training_patience)"))
            if slot.epochs_in_stage >= config.min_training_epochs:
                moves.append((Op.ADVANCE, f"trained {slot.epochs_in_stage} epochs behind the host "
                                          f"(heuristic.min_training_epochs {config.min_training_epochs})"))
        if slot.stage is Stage.BLENDING and slot.alpha >= 1.0 and not slot.alpha_ramping:
            moves.append((Op.ADVANCE, "blended in fully"))  # only needed when the slots do not auto-advance
        lost = measure.lost_in_stage(slot, snapshot)
        if slot.stage in (Stage.BLENDING, Stage.HOLDING) and lost is not None and lost > measure.worse_threshold:
            moves.append((Op.PRUNE, f"the model lost {measure.amount(lost).lstrip('+')} since the seed entered "
                                    f"{slot.stage.value}"))  # its stage made the model worse
        return moves

    def _judge_holding(self, slot: SlotSnapshot, contribution: float, measure: _Measure,
                       slot_mask: dict[Op, dict[str, bool]], gate_asks: float | None) -> Action | None:
        """Fossilize a contributing seed; prune one that does not, or that the fossilize gate refused and that its
        newest measurement does not show passing now (or that was refused too many times).

        `gate_asks` is what the fossilize gate asks of a contribution (None where the snapshot does not say: then
        a refused seed is asked again only on a measurement above the one refused)."""
        slot_id = slot.slot_id
        measured = f"its ablation says it adds {measure.amount(contribution)}"
        if not contribution > measure.fossilize_threshold:
            why = f"{measured}, not more than {measure.amount(measure.fossilize_threshold)}"
            return Action(Op.PRUNE, slot_id, why=why) if slot_mask[Op.PRUNE][slot_id] else None
        refusal = self.fossilize_refused.get(slot_id)
        if refusal is None:
            why = f"{measured}, more than {measure.amount(measure.fossilize_threshold)}"
            return Action(Op.FOSSILIZE, slot_id, why=why) if slot_mask[Op.FOSSILIZE][slot_id] else None
        refused_on, refusals = refusal
        if gate_asks is not None:
            passes = contribution >= gate_asks
            newer = f"at least the {measure.amount(gate_asks)} the fossilize gate asks"
        else:
            passes = refused_on is not None and contribution > refused_on
            newer = f"more than the {measure.amount(refused_on or 0.0)} the fossilize gate refused"
        if passes and refusals <= self.config.fossilize_patience:
            # Measured since the refusal (the snapshot holds this epoch's ablation), and the gate may pass it now.
            why = f"{measured} now, {newer}"
            return Action(Op.FOSSILIZE, slot_id, why=why) if slot_mask[Op.FOSSILIZE][slot_id] else None
        why = self._why_refused(measured, measure, refusal, gate_asks) if not passes else \
            self._why_patience_ran_out(measure, refusal)
        return Action(Op.PRUNE, slot_id, why=why) if slot_mask[Op.PRUNE][slot_id] else None

    @staticmethod
    def _why_refused(measured: str, measure: _Measure, refusal: tuple[float | None, int],
                     gate_asks: float | None) -> str:
        """Why a refused seed is pruned: its newest measurement does not pass what the gate asks, or is no higher
        than the one refused."""
        refused_on = refusal[0]
        if gate_asks is not None:
            return f"the fossilize gate refused it, and {measured} now, less than the {measure.amount(gate_asks)} " \
                   f"it asks"
        if refused_on is None:
            return "the fossilize gate refused it"
        return f"the fossilize gate refused it on {measure.amount(refused_on)}, and {measured} now, no more"

    def _why_patience_ran_out(self, measure: _Measure, refusal: tuple[float | None, int]) -> str:
        """Why a refused seed whose newest measurement would pass is pruned all the same: `fossilize_patience`."""
        refused_on, refusals = refusal
        on = "" if refused_on is None else f" on {measure.amount(refused_on)}"
        if refusals == 1:
            return f"the fossilize gate refused it{on} (heuristic.fossilize_patience 0)"
        last = "" if refused_on is None else f", the last{on}"
        return f"the fossilize gate refused it {refusals} times{last} " \
               f"(heuristic.fossilize_patience {self.config.fossilize_patience})"

    def _growth_due(self, snapshot: EpisodeSnapshot) -> tuple[bool, str]:
        """Whether growth is due at `snapshot`, and why or why not, in words."""
        config = self.config
        warm_until = self._warm_until(snapshot.max_epochs)
        if snapshot.epoch < warm_until:
            return False, f"the host trains alone until epoch {warm_until} (heuristic warm-up)"
        needed, left = self._epochs_to_verdict(snapshot.blend_epochs), snapshot.max_epochs - snapshot.epoch
        if left < needed:
            purpose = "be judged" if self.has_grown and not self.grows_by_depth else "reach the output"
            return False, f"{left} epoch{'' if left == 1 else 's'} left, fewer than the {needed} a seed needs to " \
                          f"{purpose}"
        # The learning curve's reason first: the first seed's deadline is said only where the curve gave none.
        measure = _Measure.of(snapshot.criterion, config)
        if has_plateaued(measure.history(snapshot), config.plateau_epochs, measure.plateau_threshold):
            return True, f"the validation {'score' if measure.criterion is Criterion.SCORE else 'loss'} gained " \
                         f"less than {measure.amount(measure.plateau_threshold).lstrip('+')} in " \
                         f"{config.plateau_epochs} epochs"
        if is_slowing(snapshot.loss_history, config.slowing_window, config.slowing_ratio):
            return True, "the validation loss is falling more slowly"
        if not self.has_grown and snapshot.epoch >= config.first_growth_by * snapshot.max_epochs:
            return True, f"the first seed is due by {config.first_growth_by:.0%} of the episode (first_growth_by)"
        return False, "the model is still improving"

    def _warm_until(self, max_epochs: int) -> int:
        """The first epoch growth may be considered at in an episode of `max_epochs` (warm-up, or after a rollback)."""
        config = self.config
        return max(config.warmup_epochs, self.growth_resumes_at, math.ceil(config.warmup_fraction * max_epochs))

    def _growth_possible(self, epoch: int) -> bool:
        """Whether growth could be due at `epoch` of this episode, judged by the clock alone (warm-up, room for a
        seed's verdict); True where the episode's length is not known yet."""
        if self.episode_shape is None:
            return True
        max_epochs, blend_epochs = self.episode_shape
        return self._warm_until(max_epochs) <= epoch and max_epochs - epoch >= self._epochs_to_verdict(blend_epochs)

    def _epochs_to_verdict(self, blend_epochs: int) -> int:
        """Epochs a new seed needs before the end of the episode for its FLOPs to buy something.

        The first seed needs to reach the output: `min_training_epochs` behind the host, then its first
        blending epoch, so that a short run still grows. A further one must also be judged: blended over
        `blend_epochs` (the ramp it germinates with), held `min_holding_epochs` and judged the epoch after.
        Started later, it ended the episode in TRAINING or unjudged, or was pruned in its last epochs: on
        mnist1d and digits, 3% and 1% of a grown run's FLOPs for no accuracy (16 seeds each). A grafted one
        (GROW) is in the output from its first batch and needs only room to earn its cost."""
        config = self.config
        if self.grows_by_depth:
            return config.min_training_epochs // 2 + 2
        if not self.has_grown:
            return config.min_training_epochs + 2
        return config.min_training_epochs + blend_epochs + config.min_holding_epochs + 1

    def growth_candidates(self, epoch: int) -> tuple[str, ...]:
        """The blueprints `choice = "signal"` would compare at `epoch`, for the episode to measure (none in
        "rotation" mode)."""
        if self.choice != "signal" or self.grows_by_depth or self.depth_grown or self._first_seed_due(epoch):
            return ()  # growing by depth (GROW) or the first seed compares no seeds: measuring would buy nothing
        if not self._growth_possible(epoch):
            return ()  # in the warm-up, or too late for a seed to be judged: nothing would read the signals
        deepening = self._next_deepening(epoch)
        return tuple(name for name in (deepening, self.widening)
                     if name is not None and not self._held_back(name, epoch))

    def _held_back(self, blueprint: str, epoch: int) -> bool:
        """A blueprint pruned less than `prune_penalty_epochs` ago is not tried again yet."""
        pruned = self.pruned_at.get(blueprint)
        return pruned is not None and epoch - pruned < self.config.prune_penalty_epochs

    def _next_deepening(self, epoch: int) -> str | None:
        """The next blueprint of the rotation, other than the widening one, that is not held back and that some
        slot had a site for."""
        for offset in range(len(self.rotation)):
            name = self.rotation[(self.next_blueprint + offset) % len(self.rotation)]
            if name != self.widening and not self._held_back(name, epoch) and self._has_site(name):
                return name
        return None

    def _has_site(self, blueprint: str) -> bool:
        return self.germinable is None or bool(self.germinable[self.space.blueprints.index(blueprint)])

    def _first_seed_due(self, epoch: int) -> bool:
        """Whether the next germination is the configured first seed: none yet, and the masks seen said some slot
        has its site (before any, growth signals are measured as if it had none)."""
        first, known = self.first_seed, self.germinable is not None
        return bool(first) and known and not self.has_grown and self._has_site(first) and \
            not self._held_back(first, epoch)

    def _germinate(self, snapshot: EpisodeSnapshot, allowed: dict[str, bool]) -> Action:
        slots = [s for s in self.space.slot_ids if allowed[s]]
        if self._first_seed_due(snapshot.epoch):
            if self.first_seed_branches:
                # Only slots whose segment input was measured take a branch (not beside a model's several inputs).
                sited = {s.slot_id for s in snapshot.slots if s.can_branch}
                slots = [slot_id for slot_id in slots if slot_id in sited] or slots
            return Action(Op.GERMINATE, self._slot_in_turn(slots), self.first_seed)
        chosen = self._by_signal(snapshot, slots) if self.choice == "signal" else None
        return chosen if chosen is not None else self._by_rotation(snapshot, slots)

    def _slot_in_turn(self, slots: list[str]) -> str:
        """The next of the allowed `slots` in turn."""
        slot_id = slots[self.next_slot % len(slots)]
        self.next_slot += 1
        return slot_id

    def _by_signal(self, snapshot: EpisodeSnapshot, slots: list[str]) -> Action | None:
        """The candidate with the best measured signal per FLOP in `slots`; None where none was measured."""
        candidates = self.growth_candidates(snapshot.epoch)
        deepening = next((name for name in candidates if name != self.widening), None)
        widening = self.widening if self.widening in candidates else None
        best = best_growth(snapshot.slots, slots, deepening, widening)
        if best is None:
            return None
        if best.blueprint == deepening:
            self.next_blueprint = self.rotation.index(deepening) + 1
        return Action(Op.GERMINATE, best.slot, best.blueprint, why="the best growth signal per FLOP")

    def _by_rotation(self, snapshot: EpisodeSnapshot, slots: list[str]) -> Action:
        """Slots and blueprints in turn (no signals measured: another episode loop, or "rotation"), skipping a
        blueprint no empty slot has a site for (a branch where no segment input was measured)."""
        slot_id = self._slot_in_turn(slots)
        for offset in range(len(self.rotation)):
            name = self.rotation[(self.next_blueprint + offset) % len(self.rotation)]
            if self._has_site(name) and not self._held_back(name, snapshot.epoch):
                self.next_blueprint += offset + 1
                return Action(Op.GERMINATE, slot_id, name)
        return Action()
