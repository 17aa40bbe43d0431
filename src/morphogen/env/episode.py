"""One host-training episode: act -> train one epoch -> validate with counterfactuals -> reward -> observe.

`reset()` builds the model from the task and validates it untrained (epoch 0). Each `step(action)`
executes the controller's action on the slots, trains one epoch, evaluates the model and all of its
counterfactual configurations in one validation pass, lets the governor judge the epoch, advances
the slots' clocks, and returns the new snapshot and the reward for that transition. Acting before
training means the reward of an action already contains one epoch of its consequences.

Host syncs per step (the documented budget): one for the epoch's training loss, one for the
isolation monitor's gradient report, one for the validation metrics. None of them grows with the
number of parameters, layers or batches.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from morphogen.core.alpha import AlphaMode
from morphogen.core.blend import BlendKind
from morphogen.core.blueprints import BlueprintKind, get_blueprint
from morphogen.core.compilation import CompileSettings
from morphogen.core.flops import FlopCounter
from morphogen.core.hosts import SegmentedHost, build_host
from morphogen.core.isolation import IsolationMonitor, IsolationReport
from morphogen.core.lifecycle import BLENDED_STAGES, IllegalTransitionError, Stage
from morphogen.core.model import MorphogeneticModel
from morphogen.core.slot import SlotConfig
from morphogen.core.training_mode import modes_kept
from morphogen.data import DataError, Task
from morphogen.env.actions import Action, ActionSpace, Op
from morphogen.env.compute import ComputeAccount
from morphogen.env.counterfactual import MAIN, CounterfactualResult, CounterfactualSchedule, alpha_configurations
from morphogen.env.evaluation import (
    NO_BATCH_CAUSES,
    Objective,
    refuse_first_batch_classes,
    refuse_other_class_count,
    validate,
)
from morphogen.env.governor import DivergenceError, Governor, GovernorConfig, Rollback
from morphogen.env.growth_signals import CandidateSource, SlotGrowth, could_germinate, measure_growth
from morphogen.env.layout import ModelLayout, model_layout
from morphogen.env.optimizer import OptimizerConfig, task_optimizer_config
from morphogen.env.rewards import RewardBreakdown, RewardConfig, RewardMode, compute_reward
from morphogen.env.seeding import TRAINING_RNG_STREAM, derive_seed, seeded
from morphogen.env.snapshot import HISTORY_LENGTH, EpisodeSnapshot, SlotSnapshot, snapshot_from_state, snapshot_state
from morphogen.env.training import HostAndSeedTrainer, clear_stale_casts
from morphogen.inputs import (
    Inputs,
    InputSpec,
    batch_differences,
    dtype_mismatch,
    names_problem,
    rows,
    take_rows,
    to_device,
)
from morphogen.limits import MAX_BATCH_SIZE, MAX_EPOCHS, MAX_INTEGER_SETTING, check_count
from morphogen.telemetry import events
from morphogen.telemetry.anomalies import AnomalyDetector
from morphogen.telemetry.profiler import PhaseTimer
from morphogen.telemetry.sinks import Telemetry
from morphogen.telemetry.story import STORY_EVENTS

#: Host syncs (`.item()`, `.tolist()`, `.cpu()`) one `step` makes at telemetry `normal`, whatever the
#: model's size: the epoch's training loss, the gradient report, the validation metrics.
SYNCS_PER_STEP = 3


@dataclass(frozen=True)
class EpisodeConfig:
    """Everything that shapes one episode besides the task and the controller."""

    #: Epochs (= controller steps) in an episode.
    max_epochs: int = 30
    #: Training batch size; None uses the task's default.
    batch_size: int | None = None
    #: Validation batch size (larger is faster; memory grows with the number of counterfactuals).
    validation_batch_size: int = 512
    #: Optimizer of the host and seeds; None uses the task's default (`task_optimizer_config`: AdamW for
    #: `text` and a user's transformer, SGD for the image tasks and a user's other models).
    optimizer: OptimizerConfig | None = None
    slots: SlotConfig = field(default_factory=SlotConfig)
    governor: GovernorConfig = field(default_factory=GovernorConfig)
    reward_mode: RewardMode = RewardMode.CONTRIBUTION
    reward: RewardConfig = field(default_factory=RewardConfig)
    #: Discount used by potential-based shaping (match the PPO gamma).
    gamma: float = 0.995
    #: Which counterfactual configurations validation evaluates: "for_decisions" (only those a gate or the
    #: heuristic reads next: a TRAINING seed's shadow once it has nearly trained long enough to blend, the
    #: ablation of a seed in or about to enter HOLDING) or "every_epoch" (every seed's, every epoch, and all
    #: seeds off: what a learned policy observes; `morphogen train` uses it).
    counterfactuals: CounterfactualSchedule = CounterfactualSchedule.FOR_DECISIONS
    #: Under "for_decisions", seeds in or about to enter HOLDING ablated per epoch, the one measured least
    #: recently first (None: all of them). The heuristic judges one seed an epoch, the one measured: seeds
    #: grafted together (GROW) otherwise wait their turn ablated every epoch, which was 16-19% of the FLOPs of
    #: a ResNet grown late in every block (benchmarks/your_model.py).
    ablations_per_epoch: int | None = 1
    #: Fraction of each training batch (its first samples) that the TRAINING seeds' shadow pass runs on. The
    #: shadow pass runs every layer after the seed's slot forward and backward again, so it is the main
    #: cost of training a seed behind the host. On 5 seeds of digits and mnist1d (benchmarks/growth.py) 3/4
    #: of the batch grew as well as the whole batch; half of it grew less.
    shadow_fraction: float = 0.75
    #: Training samples (the first ones, in a fixed order) on which growth signals are measured, for a controller
    #: that chooses where and how to grow by them (`env/growth_signals.py`).
    probe_samples: int = 128
    #: In a `VectorEpisodes`, train the envs whose architectures are identical in one vmapped call per
    #: batch (`env/batched.py`) instead of one after another; results agree to float32 rounding. A lone
    #: episode has nothing to batch with and trains as always.
    batch_identical: bool = False

    def __post_init__(self) -> None:
        check_count("max_epochs", self.max_epochs, MAX_EPOCHS)
        if self.batch_size is not None:
            check_count("batch_size", self.batch_size, MAX_BATCH_SIZE)
        check_count("validation_batch_size", self.validation_batch_size, MAX_BATCH_SIZE)
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {self.gamma}")
        check_count("probe_samples", self.probe_samples, MAX_BATCH_SIZE)
        if self.ablations_per_epoch is not None:
            check_count("ablations_per_epoch", self.ablations_per_epoch, MAX_INTEGER_SETTING)
        if not 0.0 < self.shadow_fraction <= 1.0:
            raise ValueError(f"shadow_fraction must be in (0, 1], got {self.shadow_fraction}")


def task_host(task: Task, device: torch.device | str, *, pool_slots: bool = False) -> SegmentedHost:
    """A fresh host for `task` on `device`: the built-in host of its topology, or a copy of the user's host (the one
    given, or the one the function given returns; seed the global generator first for a seeded init)."""
    if task.host is None:
        host_kwargs: dict[str, int | bool] = dict(task.host_kwargs)
        if task.topology in ("cnn", "cnn1d") and pool_slots:
            host_kwargs["pool_slots"] = True
        return build_host(task.topology, device=device, **host_kwargs)
    given = isinstance(task.host, torch.nn.Module)
    if not given and not callable(task.host):
        raise DataError(f"task {task.name!r}: its host is a {type(task.host).__name__}, neither a host nor a function "
                        "that builds one (morphogen.host_from_module(model, slots=..., example_input=...))")
    try:
        built = task.host if given else task.host()
    except Exception as error:  # the user's own code: one line, as for a task function that raises
        raise DataError(f"task {task.name!r}: its host function raised {_error_line(error)}") from None
    if not isinstance(built, SegmentedHost):
        what = "host is" if given else "host function returned"
        raise DataError(f"task {task.name!r}: its {what} a {type(built).__name__}, not a host; "
                        f"{'pass' if given else 'return'} morphogen.host_from_module(model, slots=..., "
                        "example_input=...)")
    # Always a copy, of a function's host too: one that returns the same module every time (`lambda: host`)
    # would otherwise have each episode start from the weights the one before trained.
    return copy.deepcopy(built).to(device)


def task_with_host(task: Task, host: object = None) -> Task:
    """`task` with `host` (a `SegmentedHost`, or a function of no arguments that builds one) as its host, and its
    topology read from that host; with `host=None`, the task's own host. Raises `DataError` when there is none."""
    chosen = task.host if host is None else host
    if chosen is None:
        if task.topology:
            return task
        raise DataError(f"task {task.name!r} has no host: pass one (morphogen.host_from_module)")
    probe = dataclasses.replace(task, host=chosen)
    topology = chosen.topology if isinstance(chosen, SegmentedHost) else task_host(probe, "cpu").topology
    return dataclasses.replace(probe, topology=topology)


def class_index_dtype_problem(targets: Tensor) -> str:
    """Where the default cross-entropy's `targets` are class indices of another dtype than int64 (int32 from numpy,
    uint8, or whole numbers as floats), what to convert; else "". Reads the targets: on a failure's path only."""
    name = str(targets.dtype).removeprefix("torch.")
    if targets.dtype in (torch.int64, torch.bool) or targets.is_complex():
        return ""
    if not targets.is_floating_point():
        return f"the targets are {name}: cross-entropy takes class indices as int64 (y.long())"
    if targets.numel() and bool(torch.equal(targets, targets.round())):
        return (f"the targets are {name} whole numbers: cross-entropy takes class indices as int64 (y.long()), or "
                "class probabilities shaped as the outputs")
    return ""


def _error_line(error: BaseException) -> str:
    """An exception from the user's model or data as one line: its type and its message's first line, cut short."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:300] if lines else ''}"


def with_topology(task: Task) -> Task:
    """`task` with its host's topology: as it is where that is known, else read from the host its function builds
    (`task_from_data(..., host=make_host)`: built once on the CPU, the caller's global generator left where it was).
    Raises `DataError` for a task without a host."""
    if task.topology:
        return task
    with torch.random.fork_rng(devices=[]):
        return task_with_host(task)


@dataclass(frozen=True)
class StepResult:
    snapshot: EpisodeSnapshot
    reward: RewardBreakdown
    done: bool
    action_succeeded: bool
    reason: str
    rollback: Rollback | None
    #: The reward of the same epoch of the same host without growth (same seed, same batches), when a
    #: `VectorEpisodes` trains such a twin beside the episode; None otherwise.
    baseline_reward: float | None = None


class MorphogenesisEpisode:
    """An episode of growing a host on a task; the environment every controller acts in."""

    def __init__(self, task: Task, config: EpisodeConfig | None = None, *, seed: int = 0,
                 slots: Sequence[str] | None = None, telemetry: Telemetry | None = None, env_id: int = 0,
                 pool_slots: bool = False, timer: PhaseTimer | None = None,
                 detector: AnomalyDetector | None = None, architecture: Mapping[str, str] | None = None,
                 host: SegmentedHost | None = None, blends: Mapping[str, str] | None = None) -> None:
        task = with_topology(task)
        self.task, self.config, self.seed = task, config or EpisodeConfig(), seed
        #: A host the episode grows itself rather than a copy of the task's (the `Grower`'s: the optimizer of the
        #: user's loop holds its parameters). Every reset then starts from its weights as they stand.
        self.own_host = host
        #: Seeds (slot id -> blueprint) installed at reset as fixed parts of the model, trained from scratch
        #: with the host: how a grown model's final architecture is compared with growing it.
        self.architecture = dict(architecture or {})
        #: What the last action did, and why where its controller said ("waited: the model is still improving").
        self.last_reason = ""
        #: The blend kind of each seed of `architecture` not blended by adding (`MorphogeneticModel.blends`).
        self.blends = {slot_id: BlendKind(kind) for slot_id, kind in (blends or {}).items()}
        self.slot_request = None if slots is None else tuple(slots)
        self.telemetry = telemetry or Telemetry(None, level="off")
        self.env_id = env_id
        self.pool_slots = pool_slots
        #: Where the model lives: the device of the task's validation split (a vector spreading envs over
        #: devices hands each env a task whose validation split is on the env's device; see env/placement.py).
        self.device = task.validation.device
        self.batch_size = self.config.batch_size or task.batch_size
        #: The optimizer settings this episode trains with: the config's, else the task's default.
        self.optimizer_config = self.config.optimizer or task_optimizer_config(task.name, topology=task.topology)
        self.objective = Objective.of(task)
        #: The slots' config, its gates judging by what fits the task: the validation loss for a language model.
        self.slot_config = dataclasses.replace(self.config.slots,
                                               gates=self.config.slots.gates.judging(task.objective))
        #: Accuracy of guessing on a classification task scored by accuracy (None for a task's own metric).
        self.chance_accuracy = 100.0 / task.num_classes if task.num_classes and not self.objective.custom else None
        self.model: MorphogeneticModel | None = None
        #: Wall-clock time per phase (train, validate, act); shared with the caller when given.
        self.timer = timer or PhaseTimer()
        #: Sums a tensor over the processes that share one model's training (`Grower(distributed=True)`): the
        #: validation figures and the epoch's training loss are then the same in each. None: this process alone.
        self.sum_over_processes: Callable[[torch.Tensor], torch.Tensor] | None = None
        #: A streamed validation split's first batch passed its class check: later resets (same task) skip it.
        self.validation_classes_checked = False
        #: Judges each epoch's gradient norms for drift; None skips the check.
        self.detector = detector
        #: Every event of the current episode, whatever the telemetry level (for its summary and story).
        self.history: list[events.Event] = []
        #: `torch.compile` settings for every model this episode builds (`--compile`); None trains eagerly.
        self.compile_settings: CompileSettings | None = None
        #: FLOP counts per execution plan and batch shape, kept across episodes (every reset builds the same host).
        self.flop_counter = FlopCounter()
        #: FLOPs the current episode has spent so far.
        self.compute = ComputeAccount()
        #: The blueprints the controller compares by growth signals, by epoch (`Controller.growth_candidates`);
        #: None measures none.
        self.growth_candidates: CandidateSource | None = None
        #: Whether snapshots describe every blueprint in every slot (what it would add), as a learned policy
        #: reads them; `run_episode` turns it off for controllers that do not (`reads_blueprints = False`).
        self.describe_blueprints = True
        #: Empty slot -> its growth signals and candidate costs, measured after the last epoch when asked.
        self.growth: dict[str, SlotGrowth] = {}
        #: What a `DivergenceError` tells the user to change: the learning rates that stepped the model. A
        #: `Grower`'s host is stepped by the user's optimizer, not by `episode.optimizer.host_lr`.
        self.divergence_advice = "lower episode.optimizer.host_lr / seed_lr"

    # ---------------------------------------------------------------- setup
    def build_model(self) -> MorphogeneticModel:
        """The host for this task with slots, initialised from this episode's seed."""
        if self.own_host is not None:
            host = self.own_host
        else:
            with seeded(self.seed, self.device):
                host = task_host(self.task, self.device, pool_slots=self.pool_slots)
        model = MorphogeneticModel(host, self.slot_request, self.slot_config)
        for slot_id, blueprint in self.architecture.items():
            model.slot(slot_id)  # an unknown slot raises here, naming the valid ones
            with seeded(derive_seed(self.seed, 0, model.slot_ids.index(slot_id)), self.device):
                model.install(slot_id, blueprint, blend=self.blends.get(slot_id))
            model.slot(slot_id).drain_transitions()  # part of the architecture, not an event of this episode
        model.compile_forward(self.compile_settings)
        return model

    def reset(self) -> EpisodeSnapshot:
        """Build a fresh model and validate it untrained (epoch 0)."""
        self.model = self.build_model()
        self.action_space = ActionSpace(self.model.slot_ids, self.task.topology)
        self.monitor = IsolationMonitor(device=self.device)
        self.trainer = HostAndSeedTrainer(self.model, self.optimizer_config, self.monitor, self.objective,
                                          self.config.shadow_fraction)
        self.governor = Governor(self.model, self.config.governor, chance_accuracy=self.chance_accuracy)
        self.generator = torch.Generator(device="cpu").manual_seed(self.seed)
        self.epoch = 0
        self.accuracies: deque[float] = deque(maxlen=HISTORY_LENGTH)
        self.losses: deque[float] = deque(maxlen=HISTORY_LENGTH)
        self.contributions: dict[str, float | None] = {}
        self.previous_contributions: dict[str, float | None] = {}
        self.loss_contributions: dict[str, float | None] = {}
        self.gradients = IsolationReport(host_gradient_norm=float("nan"), batches=0, seeds={})
        self.episode_return = 0.0
        self.fossilized = self.pruned = 0
        self.history = []
        self.compute = ComputeAccount()
        self.growth = {}
        #: Waiting seed -> the epoch of its last ablation (`_due_for_ablation`).
        self.ablated_at: dict[str, int] = {}
        if self.detector is not None:
            # A fresh host's gradients are not a drift from the last episode's converged ones.
            self.detector.forget_gradients(f"env{self.env_id}/")
        result = self._first_validation()
        self.layout = self._measure_layout()
        self.initial_val_loss = result.loss(MAIN)
        self.governor.observe_validation(result.loss(MAIN), result.accuracy(MAIN))
        self.snapshot = self._make_snapshot(result, None, Op.WAIT, True, None)
        return self.snapshot

    @property
    def done(self) -> bool:
        return self.epoch >= self.config.max_epochs

    # ---------------------------------------------------------------- saving between epochs
    def state_dict(self) -> dict[str, Any]:
        """Everything a later epoch reads, between two epochs: the model (host, seeds and their stages), the seeds'
        optimizers, the governor, the histories and counters, the FLOPs spent. Plain values and tensors only.
        Of the events of the epochs played, those the seeds' stories are told from are kept (`STORY_EVENTS`)."""
        assert self.model is not None, "call reset() first"
        return {
            "model": self.model.state_dict(), "trainer": self.trainer.state_dict(),
            "governor": self.governor.state_dict(), "generator": self.generator.get_state(),
            "epoch": self.epoch, "accuracies": list(self.accuracies), "losses": list(self.losses),
            "contributions": dict(self.contributions), "previous_contributions": dict(self.previous_contributions),
            "loss_contributions": dict(self.loss_contributions), "episode_return": self.episode_return,
            "fossilized": self.fossilized, "pruned": self.pruned, "compute": dataclasses.asdict(self.compute),
            "ablated_at": dict(self.ablated_at), "initial_val_loss": self.initial_val_loss,
            "snapshot": snapshot_state(self.snapshot),
            "story_events": [event.to_dict() for event in self.history if isinstance(event, STORY_EVENTS)],
        }

    def load_state_dict(self, state: dict[str, Any]) -> EpisodeSnapshot:
        """Continue from `state_dict` on an episode reset on the same task and host (same slots, same config);
        returns the snapshot of the last epoch played, from which the next action is decided."""
        assert self.model is not None, "call reset() first"
        self.model.load_state_dict(state["model"])
        for slot in self.model.slots():
            slot.drain_transitions()  # stages restored, not entered
        self.trainer.load_state_dict(state["trainer"])
        self.governor.load_state_dict(state["governor"])
        self.generator.set_state(state["generator"])
        self.epoch = int(state["epoch"])
        self.accuracies = deque((float(x) for x in state["accuracies"]), maxlen=HISTORY_LENGTH)
        self.losses = deque((float(x) for x in state["losses"]), maxlen=HISTORY_LENGTH)
        self.contributions = _optional_floats(state["contributions"])
        self.previous_contributions = _optional_floats(state["previous_contributions"])
        self.loss_contributions = _optional_floats(state["loss_contributions"])
        self.episode_return = float(state["episode_return"])
        self.fossilized, self.pruned = int(state["fossilized"]), int(state["pruned"])
        self.compute = ComputeAccount(**{key: int(value) for key, value in state["compute"].items()})
        self.ablated_at = {str(k): int(v) for k, v in state["ablated_at"].items()}
        self.initial_val_loss = float(state["initial_val_loss"])
        self.snapshot = snapshot_from_state(state["snapshot"])
        # A state saved before stories were kept has none: the seeds' stories then start here.
        self.history = [events.event_from_dict(record) for record in state.get("story_events", [])]
        self.growth = {}
        return self.snapshot

    def masks(self) -> list[np.ndarray]:
        """Physical-validity masks of the action heads (see `ActionSpace.masks`)."""
        assert self.model is not None, "call reset() first"
        return self.action_space.masks(self.model)

    # ---------------------------------------------------------------- the step
    def step(self, action: Action) -> StepResult:
        """Act, train one epoch on this episode's own batch order, and finish the epoch."""
        succeeded, reason = self.apply_action(action)
        with seeded(derive_seed(self.seed, self.epoch, TRAINING_RNG_STREAM), self.device):
            batches: Iterable[tuple[Inputs, Tensor]] = self.task.train.iterate_batches(
                self.batch_size, generator=self.generator, augment=self.task.augment)
            if self.task.train.device != self.device:
                batches = ((to_device(inputs, self.device), targets.to(self.device)) for inputs, targets in batches)
            self.train_epoch(batches)
        return self.finish_epoch(action, succeeded, reason)

    def apply_action(self, action: Action) -> tuple[bool, str]:
        """Execute `action` on the slots; returns (took effect, why)."""
        assert self.model is not None, "call reset() first"
        if self.done:
            raise RuntimeError("episode is over; call reset()")
        with self.timer.phase("act"):
            self.trainer.start_epoch(self.epoch, self.config.max_epochs)
            try:
                succeeded, reason = self._execute(action)
            except (IllegalTransitionError, ValueError) as error:
                succeeded, reason = False, str(error)
            if succeeded and action.why:
                reason = f"{reason}: {action.why}"
            self.last_reason = reason
            for slot in self.model.slots():
                slot.auto_advance(self.epoch)
        self._emit(events.ActionTaken(
            epoch=self.epoch + 1, env_id=self.env_id, op=action.op.name, slot=action.slot,
            blueprint=action.blueprint, succeeded=succeeded, reason=reason))
        return succeeded, reason

    def _execute(self, action: Action) -> tuple[bool, str]:
        model, epoch = self.model, self.epoch
        assert model is not None
        if action.op is Op.WAIT:
            return True, "waited"
        if action.op is Op.GROW:
            return self._grow(action)
        if action.slot is None:
            raise ValueError(f"{action.op.name} needs a slot")
        slot = model.slot(action.slot)
        if action.op is Op.GERMINATE:
            return self._germinate(action)
        if action.op is Op.ADVANCE:
            result = slot.advance(epoch)
            return result.passed, result.reason
        if action.op is Op.FOSSILIZE:
            result = slot.fossilize(epoch)
            if result.passed:
                self.fossilized += 1
            return result.passed, result.reason
        if action.op is Op.PRUNE:
            slot.prune(epoch, action.why or "pruned by controller")
            self.pruned += 1
            return True, f"pruned {action.slot}"
        slot.set_alpha_target(action.alpha_target, action.alpha_speed, epoch, action.alpha_curve)
        if slot.stage is Stage.PRUNED:
            self.pruned += 1
        return True, f"alpha target {action.alpha_target:.2f}"

    def _grow(self, action: Action) -> tuple[bool, str]:
        """GROW: graft `action.blueprint` into every empty slot, each trained with the host from the start."""
        model, epoch = self.model, self.epoch
        assert model is not None
        if action.blueprint is None:
            raise ValueError("GROW needs a blueprint")
        if any(s.stage in (Stage.GERMINATED, Stage.TRAINING) for s in model.slots()):
            return False, "another seed is still germinated or training"
        empty = [slot.slot_id for slot in model.slots() if slot.stage is Stage.DORMANT]
        if not empty:
            return False, "no empty slot to grow into"
        # Checked for every slot before any graft, so that a refusal leaves no slot half grown.
        unfit = [slot_id for slot_id in empty if not model.can_graft(slot_id, action.blueprint)]
        if unfit:
            return False, (f"GROW adds layers; {action.blueprint} cannot be grafted into {', '.join(unfit)} "
                           "(a widening blueprint, or a copy of a layer this host lacks there)")
        for slot_id in empty:
            with seeded(derive_seed(self.seed, epoch, model.slot_ids.index(slot_id)), self.device):
                model.graft(slot_id, action.blueprint, epoch, blend_epochs=action.blend_epochs)
        return True, f"grew {action.blueprint} into {', '.join(empty)}"

    def _germinate(self, action: Action) -> tuple[bool, str]:
        """GERMINATE: a seed of the action's blueprint in its slot, unless another seed is still learning or the
        slot cannot take a widening or branch seed (refusals the factored action masks cannot express)."""
        model, epoch = self.model, self.epoch
        assert model is not None and action.slot is not None
        if action.blueprint is None:
            raise ValueError("GERMINATE needs a blueprint")
        if any(s.stage in (Stage.GERMINATED, Stage.TRAINING) for s in model.slots()):
            return False, "another seed is still germinated or training"
        slot = model.slot(action.slot)
        problem = slot.site_problem(action.blueprint)
        if problem:
            return False, problem
        adds = get_blueprint(self.task.topology, action.blueprint).kind is not BlueprintKind.DEEPEN
        # Seed weights come from (episode seed, epoch, slot), not from whatever the global RNG holds.
        with seeded(derive_seed(self.seed, epoch, model.slot_ids.index(action.slot)), self.device):
            # A widening or branch seed adds its output: the blend head does not apply to it.
            model.germinate(action.slot, action.blueprint, epoch, blend=BlendKind.ADD if adds else action.blend,
                            blend_epochs=action.blend_epochs)
        return True, f"germinated {action.blueprint} in {action.slot}"

    def train_shared_batch(self, inputs: Inputs, targets: Tensor) -> None:
        """One step on a batch a vector env shares: the episode's first goes through the first batch's checks."""
        if self.epoch == 0 and self.trainer.batches == 0:
            self._train_first_batch(inputs, targets)
        else:
            self.trainer.train_batch(inputs, targets)

    def train_epoch(self, batches: Iterable[tuple[Inputs, Tensor]]) -> None:
        """Train host and live seeds on `batches` (this episode's own, or a vector's shared stream)."""
        with self.timer.phase("train"):
            for index, (inputs, targets) in enumerate(batches):
                if index == 0 and self.epoch == 0:
                    self._train_first_batch(inputs, targets)
                else:
                    self._train_batch(inputs, targets)

    def _train_batch(self, inputs: Inputs, targets: Tensor) -> None:
        """One training step. A batch of one sample that the model's batch norm cannot train on (the last batch of a
        split one sample longer than a multiple of the batch size) is a `DataError` saying how to batch the split,
        where torch raises a ValueError from inside the model."""
        try:
            self.trainer.train_batch(inputs, targets)
        except ValueError as error:
            assert self.model is not None
            normed = any(isinstance(module, torch.nn.modules.batchnorm._BatchNorm) for module in self.model.modules())
            if rows(inputs) != 1 or not normed:
                raise
            raise DataError(f"task {self.task.name!r}: a training batch of one sample, on which the model's batch norm "
                            f"cannot train ({_error_line(error)}): the split's last batch holds the one sample left "
                            "over by the batch size; choose a batch_size that leaves more (task_from_data(..., "
                            "batch_size=...)), or give your DataLoader drop_last=True") from None

    def _train_first_batch(self, inputs: Inputs, targets: Tensor) -> None:
        """The episode's first training step; where the model or its loss fails on it, a `DataError` saying how the
        training batch differs from the validation data (which the first validation already ran without error). Its
        class indices are checked first, once (a streamed split is not read whole, and later batches are not read)."""
        self.refuse_first_training_classes(targets)
        try:
            self.trainer.train_batch(inputs, targets)
        except (RuntimeError, ValueError, TypeError, IndexError, KeyError) as error:
            raise self.first_batch_failure(inputs, targets, error) from None

    def refuse_first_training_classes(self, targets: Tensor) -> None:
        """A `DataError` where the first training batch names a class outside `num_classes`: one host sync, on the
        episode's first batch only (also called by the vector env's stacked path, which trains envs together)."""
        refuse_first_batch_classes(self.trainer.objective, self.task.num_classes, targets,
                                   f"task {self.task.name!r}: train (the first batch)")

    def first_batch_failure(self, inputs: Inputs, targets: Tensor, error: Exception) -> DataError:
        """The `DataError` for a first training batch the model or its loss failed on: how that batch differs from
        the validation data, which the first validation ran without error."""
        validation_inputs, validation_targets = self._first_batch("validation", 1)
        differences = batch_differences((inputs, targets), (validation_inputs, validation_targets))
        assert self.model is not None
        dtypes = dtype_mismatch(inputs, self.model.parameters())
        said = "; ".join(part for part in (", ".join(differences), dtypes) if part)
        return DataError(f"task {self.task.name!r}: the model and its loss failed on the first training batch, "
                         f"though not on the validation data: {_error_line(error)}"
                         + (f" (the training batch differs: {said})" if said else ""))

    def finish_epoch(self, action: Action, succeeded: bool, reason: str) -> StepResult:
        """After training: validation with counterfactuals, governor, slot clocks, growth signals, reward, telemetry."""
        assert self.model is not None
        self.epoch += 1
        # Charged before anything can change the plan the epoch trained in (a rollback, a stage change).
        self.compute.charge_training(self.flop_counter, self.model, self.trainer.take_batch_shapes(),
                                     self.config.shadow_fraction)
        train_loss = self._epoch_training_loss().item()  # sync 1/3: the governor judges this number
        self.gradients = self.monitor.materialize()  # sync 2/3
        self._report_gradients()
        result = self._validate()  # sync 3/3
        rollback = self.governor.check(train_loss, self.epoch, val_loss=result.loss(MAIN),
                                       val_accuracy=result.accuracy(MAIN))
        if rollback is not None:
            result = self._after_rollback(rollback)
        self._record_signals(result)
        if not self.done:
            # The slots' clocks set up the next epoch (a blending seed's next alpha, stages it moves into). After
            # the last there is none: the model stays the one just validated, which every reported figure, the
            # architecture trained from scratch and the export then describe.
            for slot in self.model.slots():
                slot.step_epoch(self.epoch)
        self._emit_transitions()
        self._measure_growth()
        previous = self.snapshot
        self.snapshot = self._make_snapshot(result, train_loss, action.op, succeeded, rollback)
        reward = compute_reward(self.config.reward_mode, previous, self.snapshot, action, succeeded,
                                self.done, self.config.reward, self.config.gamma)
        self.episode_return += reward.total
        self._emit_epoch(result, action, succeeded, reward)
        return StepResult(self.snapshot, reward, self.done, succeeded, reason, rollback)

    def _after_rollback(self, rollback: Rollback) -> CounterfactualResult:
        """Reset momentum, back off, record the rollback, stop if the governor gave up; validate the restored model."""
        self.trainer.reset_host_momentum()
        self.trainer.back_off(rollback.backed_off, self.config.governor.backoff)
        self.pruned += len(rollback.pruned_slots)
        self._emit(events.GovernorRollback(
            epoch=self.epoch, env_id=self.env_id, reason=rollback.reason, loss=rollback.loss,
            threshold=rollback.threshold, pruned_slots=rollback.pruned_slots))
        if rollback.gave_up:
            raise DivergenceError(
                f"env {self.env_id} epoch {self.epoch}: training diverged {rollback.in_a_row} epochs in a row "
                f"despite rollbacks and learning-rate back-off (last: {rollback.reason}); {self.divergence_advice}")
        return self._validate()

    # ---------------------------------------------------------------- measurements
    def _measure_layout(self) -> ModelLayout:
        """Where the slots sit and what each blueprint would add, measured on the first validation input."""
        assert self.model is not None
        inputs, _ = self._first_batch("validation", 1)
        return model_layout(self.model, to_device(take_rows(inputs, slice(0, 1)), self.device), self.flop_counter,
                            with_costs=self.describe_blueprints)

    def _first_batch(self, split: str, batch_size: int) -> tuple[Inputs, Tensor]:
        """The first batch of the task's "train" or "validation" split, in stored order; a `DataError` where the split
        yields none (a generator that an earlier pass ran out)."""
        source = self.task.train if split == "train" else self.task.validation
        batch = next(iter(source.iterate_batches(batch_size, shuffle=False)), None)
        if batch is None:
            what = "training" if split == "train" else "validation"
            raise DataError(f"task {self.task.name!r}: its {what} data yielded no batch {NO_BATCH_CAUSES}")
        return batch

    def _first_validation(self) -> CounterfactualResult:
        """Validate the untrained model; what the model or its loss cannot take is a `DataError`.

        This is the first time the task's data meets its model, before anything trains: a shape mismatch, a
        loss that is not finite, an exception in a user's metric is reported here as one line. Built-in and
        user tasks take the same path.
        """
        assert self.model is not None
        refuse_other_class_count(self.task, self.model)
        try:
            streamed = getattr(self.task.validation, "inputs", None) is None  # tensors: task_from_data read them
            check = streamed and not self.validation_classes_checked
            result = self._validate(check_first_targets=self._refuse_first_validation_classes if check else None)
        except DataError:
            raise
        except (RuntimeError, ValueError, TypeError, IndexError) as error:
            self._refuse_inputs_of_another_kind()
            assert self.model is not None
            inputs, targets = self._first_batch("validation", 1)
            model_error = self._model_error(inputs)
            dtypes = dtype_mismatch(inputs, self.model.parameters(), model_error)
            if dtypes:
                raise DataError(f"task {self.task.name!r}: {dtypes} (the model failed on the validation data: "
                                f"{_error_line(error)})") from None
            indices = "" if self.objective.custom or model_error is not None else class_index_dtype_problem(targets)
            if indices:
                raise DataError(f"task {self.task.name!r}: {indices} (the loss failed on the validation data: "
                                f"{_error_line(error)})") from None
            hint = "" if self.objective.custom else (
                " (the default loss, cross-entropy, reads class scores on dimension 1 or the last, [N, C], [N, T, C] "
                "or [N, C, H, W], and class indices as targets; a loss of your own: task_from_data(..., loss=...))")
            raise DataError(f"task {self.task.name!r}: the model and its loss failed on the validation data: "
                            f"{_error_line(error)}{hint}") from None
        if not math.isfinite(result.loss(MAIN)) or not math.isfinite(result.accuracy(MAIN)):
            raise DataError(f"task {self.task.name!r}: the loss or metric is not finite on the validation data before "
                            f"training (loss {result.loss(MAIN)}, {self.task.metric_name} {result.accuracy(MAIN)})")
        return result

    def _model_error(self, inputs: Inputs) -> Exception | None:
        """What the model alone (not its loss) raises on `inputs`, in eval mode without gradients; None if nothing."""
        assert self.model is not None
        with modes_kept(self.model), torch.no_grad():
            self.model.eval()
            try:
                self.model(to_device(inputs, self.device))
            except Exception as error:  # the user's model: whatever it raises is what the hint reads
                return error
        return None

    def _refuse_inputs_of_another_kind(self) -> None:
        """A `DataError` where the validation inputs are not of the kind the host was built for (one tensor, or a
        tuple or dict of them) or do not name the inputs it was built with: the model failed on them for that,
        whatever torch's message says."""
        assert self.model is not None
        expected = getattr(self.model.host, "input_kind", "tensor")
        inputs = getattr(self.task.validation, "inputs", None)
        if inputs is None:  # streamed: the kind shows only in a batch
            inputs, _ = self._first_batch("validation", 1)
        given = InputSpec.of(inputs).kind
        if given != expected:
            raise DataError(f"task {self.task.name!r}: its inputs are a {given}, but the host was built from an "
                            f"example_input that is a {expected}: give example_input as the data's batches are")
        problem = names_problem(self.model.host.input_names, inputs)
        if problem is not None:
            raise DataError(f"task {self.task.name!r}: {problem}")

    def _refuse_first_validation_classes(self, targets: Tensor) -> None:
        """The first validation's check of its first batch's class indices (a streamed split is not read whole):
        one host sync, once for the episode's task."""
        refuse_first_batch_classes(self.objective, self.task.num_classes, targets,
                                   f"task {self.task.name!r}: validation (the first batch)")
        self.validation_classes_checked = True

    def _validate(self, check_first_targets: Callable[[Tensor], None] | None = None) -> CounterfactualResult:
        assert self.model is not None
        alphas = {s.slot_id: s.alpha.alpha for s in self.model.slots()
                  if s.stage in BLENDED_STAGES and s.alpha.alpha > 0.0}
        training = [s.slot_id for s in self.model.slots() if s.stage is Stage.TRAINING and s.seed is not None]
        if self.config.counterfactuals is CounterfactualSchedule.EVERY_EPOCH:
            configurations = alpha_configurations(self.model.slot_ids, alphas, training)
        else:
            # The blending gate reads the shadow from the epoch the seed has trained `min_training_epochs`
            # (validation comes before the epoch is counted); the fossilize gate and the heuristic read the
            # ablation of a HOLDING seed, or of a BLENDING one whose ramp ends at this epoch's tick.
            training = [slot_id for slot_id in training if self.model.slot(slot_id).lifecycle.epochs_in_stage
                        >= self.model.slot(slot_id).config.gates.min_training_epochs - 1]
            holding = self._due_for_ablation([
                s.slot_id for s in self.model.slots() if s.stage is Stage.HOLDING
                or (s.stage is Stage.BLENDING and s.alpha.steps_done + 1 >= s.alpha.steps_total)])
            configurations = alpha_configurations(self.model.slot_ids, alphas, training, ablate=holding,
                                                  all_off=False)
        clear_stale_casts()  # under an enclosing autocast, the casts of the last batch predate its optimizer step
        with self.timer.phase("validate"):
            result = validate(self.model, self.task.validation, configurations, self.config.validation_batch_size,
                              self.objective, self.sum_over_processes, check_first_targets)
        self.compute.charge_validation(self.flop_counter, self.model, configurations.alphas,
                                       dict(result.batch_shapes))
        return result

    def _epoch_training_loss(self) -> torch.Tensor:
        """The epoch's mean training loss; with processes sharing the training, the mean of theirs."""
        if self.trainer.batches == 0 and self.sum_over_processes is None:
            raise DataError(f"task {self.task.name!r}: its training data yielded no batch in epoch {self.epoch} "
                            f"{NO_BATCH_CAUSES}")
        mean = self.trainer.take_epoch_loss()
        if self.sum_over_processes is None:
            return mean
        summed = self.sum_over_processes(torch.stack([mean.detach(), torch.ones_like(mean)]))
        return summed[0] / summed[1]

    def _due_for_ablation(self, waiting: list[str]) -> list[str]:
        """The seeds of `waiting` (slot order) to ablate this epoch: at most `ablations_per_epoch`, those measured
        in HOLDING least recently first (slot order among equals, the order the heuristic judges in), so that
        every waiting seed is measured in turn whether or not the controller judges the one measured."""
        assert self.model is not None
        self.ablated_at = {slot_id: epoch for slot_id, epoch in self.ablated_at.items() if slot_id in waiting}
        limit = self.config.ablations_per_epoch
        chosen = waiting if limit is None else sorted(waiting, key=lambda s: self.ablated_at.get(s, -1))[:limit]
        # A seed measured while its ramp ends is judged on a later figure: that one does not count as its turn.
        self.ablated_at.update({slot_id: self.epoch for slot_id in chosen
                                if self.model.slot(slot_id).stage is Stage.HOLDING})
        return [slot_id for slot_id in waiting if slot_id in chosen]

    def every_blueprint(self, epoch: int) -> tuple[str, ...]:
        """Every blueprint of the action space, whatever the epoch: the growth candidates of a controller that may
        germinate any of them (a `CandidateSource`)."""
        return self.action_space.blueprints

    def _measure_growth(self) -> None:
        """Growth signals and candidate costs for the controller, when it asks and a seed could be germinated."""
        assert self.model is not None
        self.growth = {}
        if self.growth_candidates is None or self.done or not could_germinate(self.model):
            return
        candidates = self.growth_candidates(self.epoch)
        if not candidates:
            return
        inputs, targets = self._first_batch("train", self.config.probe_samples)
        batch = (to_device(inputs, self.device), targets.to(self.device))
        with self.timer.phase("probe"):
            self.growth, flops = measure_growth(self.model, batch, self.objective, self.flop_counter, candidates)
        self.compute.probe += flops

    def _record_signals(self, result: CounterfactualResult) -> None:
        assert self.model is not None
        accuracy = result.accuracy(MAIN)
        contributions, loss_contributions = result.contributions, result.loss_contributions
        self.previous_contributions = dict(self.contributions)
        self.contributions = {}
        for slot in self.model.slots():
            health = self.gradients.seeds.get(slot.slot_id)
            slot.record_signals(
                accuracy=accuracy,
                gradient_health=None if health is None else health.health,
                gradient_ratio=None if health is None else health.gradient_ratio,
                contribution=contributions.get(slot.slot_id),
                loss=result.loss(MAIN),
                loss_contribution=loss_contributions.get(slot.slot_id),
            )
            self.contributions[slot.slot_id] = contributions.get(slot.slot_id)
        self.loss_contributions = {slot_id: loss_contributions.get(slot_id) for slot_id in self.model.slot_ids}

    def _slot_snapshot(self, slot_id: str) -> SlotSnapshot:
        assert self.model is not None
        slot = self.model.slot(slot_id)
        seeded = slot.seed is not None
        health = self.gradients.seeds.get(slot_id) if seeded else None
        norm, health_value, ratio = (None, None, None) if health is None else (
            health.gradient_norm, health.health, health.gradient_ratio)
        # What was measured of the seed: contribution, the previous one, loss contribution, and the accuracy and
        # loss when it entered its stage; nothing for an empty slot.
        contribution, previous, loss_contribution, accuracy_start, loss_start = (
            self.contributions.get(slot_id), self.previous_contributions.get(slot_id),
            self.loss_contributions.get(slot_id), slot.signals.accuracy_at_stage_start,
            slot.signals.loss_at_stage_start) if seeded else (None, None, None, None, None)
        growth = self.growth.get(slot_id)
        depth, width, costs = (None, None, ()) if growth is None else (growth.depth, growth.width, growth.costs)
        place = self.layout.places[slot_id]
        return SlotSnapshot(
            slot_id=slot_id, stage=slot.stage, blueprint=slot.blueprint if seeded else None,
            alpha=slot.alpha.alpha, alpha_target=slot.alpha.target, alpha_progress=slot.alpha.progress,
            alpha_ramping=slot.alpha.mode is not AlphaMode.HOLD, epochs_in_stage=slot.lifecycle.epochs_in_stage,
            seed_age=slot.lifecycle.seed_age, seed_parameters=slot.seed_parameter_count(),
            contribution=contribution, previous_contribution=previous, gradient_norm=norm,
            gradient_health=health_value, gradient_ratio=ratio, accuracy_at_stage_start=accuracy_start,
            loss_contribution=loss_contribution, loss_at_stage_start=loss_start,
            depth_signal=depth, width_signal=width, seed_costs=costs, width_fraction=place.width_fraction,
            resolution_fraction=place.resolution_fraction, depth_fraction=place.depth_fraction,
            can_branch=slot.branch_site is not None,
        )

    def _make_snapshot(self, result: CounterfactualResult, train_loss: float | None, op: Op, succeeded: bool,
                       rollback: Rollback | None) -> EpisodeSnapshot:
        assert self.model is not None
        self.accuracies.append(result.accuracy(MAIN))
        self.losses.append(result.loss(MAIN))
        return EpisodeSnapshot(
            epoch=self.epoch, max_epochs=self.config.max_epochs, train_loss=train_loss,
            val_loss=result.loss(MAIN), val_accuracy=result.accuracy(MAIN),
            accuracy_history=tuple(self.accuracies), loss_history=tuple(self.losses),
            host_parameters=self.model.host_param_count(), active_parameters=self.model.param_count(),
            slots=tuple(self._slot_snapshot(slot_id) for slot_id in self.model.slot_ids),
            accuracy_all_off=result.accuracy_all_off, last_op=int(op), last_action_succeeded=succeeded,
            rolled_back=rollback is not None, topology=self.task.topology, chance_accuracy=self.chance_accuracy,
            initial_val_loss=self.initial_val_loss, blueprints=self.layout.blueprints,
            blueprint_parameters=self.layout.blueprint_parameters, blueprint_flops=self.layout.blueprint_flops,
            host_flops=self.layout.host_flops, criterion=self.slot_config.gates.judged_by,
            fossilize_contribution=self.slot_config.gates.fossilize_contribution,
            blend_epochs=self.slot_config.blend_epochs, blend=self.slot_config.blend.value,
        )

    # ---------------------------------------------------------------- telemetry
    def _report_gradients(self) -> None:
        """Gradient health event, drift check against each group's moving average, debug layer stats."""
        report, epoch = self.gradients, self.epoch
        seeds = tuple((slot, h.gradient_norm, h.health, h.gradient_ratio) for slot, h in report.seeds.items())
        self._emit(events.GradientHealthMeasured(epoch=epoch, env_id=self.env_id,
                                                 host_norm=report.host_gradient_norm, seeds=seeds))
        if self.detector is not None and self.model is not None:
            norms = {f"env{self.env_id}/host": report.host_gradient_norm}
            for slot_id, norm, _, _ in seeds:
                # One series per seed and stage: blending in legitimately changes a seed's gradient scale.
                slot = self.model.slot(slot_id)
                born = epoch - slot.lifecycle.seed_age
                norms[f"env{self.env_id}/seed/{slot_id}/{born}/{slot.stage.value}"] = norm
            self.telemetry.report_anomalies(self.detector.check(gradient_norms=norms), epoch=epoch,
                                            env_id=self.env_id)
        if self.telemetry.layer_statistics_enabled and self.model is not None:
            from morphogen.telemetry.debug import layer_statistics_event  # loads torch's compiler: debug only

            self._emit(layer_statistics_event(self.model, name="model", epoch=epoch, env_id=self.env_id))

    def _emit(self, event: events.Event) -> None:
        self.history.append(event)
        self.telemetry.emit(event)

    def _emit_transitions(self) -> None:
        """Every transition of this step, numbered with the step's epoch like its action and its epoch event.

        The lifecycle counts a transition made by the action at the start of epoch e (before it trains)
        as e - 1, the number of epochs finished; telemetry says e, so that "epoch 7 ... GERMINATE" and
        the seed's "germinated@7" agree in every view.
        """
        assert self.model is not None
        for slot in self.model.slots():
            for record in slot.drain_transitions():
                self._emit(events.StageTransition(
                    epoch=self.epoch, env_id=self.env_id, slot=record.slot, blueprint=record.blueprint,
                    from_stage=record.from_stage.value, to_stage=record.to_stage.value, reason=record.reason))

    def _emit_epoch(self, result: CounterfactualResult, action: Action, succeeded: bool,
                    reward: RewardBreakdown) -> None:
        snapshot, emit = self.snapshot, self._emit
        if result.configurations.size > 1:
            emit(events.CounterfactualMeasured(
                epoch=self.epoch, env_id=self.env_id, configs=result.configurations.names, accuracies=result.accuracies,
                losses=result.losses, contributions=tuple(result.contributions.items())))
        emit(events.RewardComputed(epoch=self.epoch, env_id=self.env_id, total=reward.total,
                                   components=reward.components))
        emit(events.EpochCompleted(
            epoch=self.epoch, env_id=self.env_id, train_loss=snapshot.train_loss or float("nan"),
            val_loss=snapshot.val_loss, val_accuracy=snapshot.val_accuracy,
            param_count=snapshot.active_parameters,
            slots=tuple(events.SlotState(slot=s.slot_id, stage=s.stage.value, blueprint=s.blueprint, alpha=s.alpha)
                        for s in snapshot.slots),
            action=action.describe(), action_succeeded=succeeded))
        if self.done:
            emit(events.EpisodeCompleted(
                epoch=self.epoch, env_id=self.env_id, final_accuracy=snapshot.val_accuracy,
                param_count=snapshot.active_parameters, host_param_count=snapshot.host_parameters,
                fossilized=self.fossilized, pruned=self.pruned, episode_return=self.episode_return))


def _optional_floats(values: dict[str, Any]) -> dict[str, float | None]:
    """Slot id -> a measured value or None (not measured), as saved."""
    return {str(k): None if v is None else float(v) for k, v in values.items()}
