"""The PPO round loop: collect -> advantages -> update -> log -> checkpoint (docs/architecture.md#controller).

One round runs `n_envs` whole episodes side by side (`VectorEpisodes`, one batched policy call per
step), then one PPO update over those episodes as sequences (BPTT from the stored initial state).
Every random choice of a round is drawn from generators seeded by (seed, round), so a run stopped
after round k and resumed gives the same policy as an uninterrupted run.

A run may train one policy over a mix of settings (`--tasks digits,mnist1d`, or `[[mix]]` entries of
task, host size, episode length and weight): each round draws one entry by weight from (seed, round)
and plays all its envs on that entry; the policy's inputs and outputs are the same for every entry
(`control/growth_policy.py`). With `paired_baseline`, every env trains a no-growth twin on the same
batches, and each step's reward is the env's minus the twin's (`env/vector.py`).

An episode ends at its fixed length and the observation carries the epoch fraction, so the last step
is treated as a termination (no bootstrap): the horizon is part of the task, not a cut-off.

A PPO update that leaves NaN or Inf in the policy (an exploding learning rate, a NaN reward) is undone
before anything is saved: policy and optimizer go back to their state before the update, the
learning rate is halved, and a `non_finite` anomaly says so. After `MAX_POLICY_ROLLBACKS` such rounds
in a row training stops with `DivergenceError`; the last checkpoint is the last finite policy.
Everything a resumed run needs to continue exactly (the anomaly detector's averages and hysteresis,
the telemetry escalation, that rollback count) is part of the checkpoint.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from morphogen.control.advice import HeuristicAdvisor, record_taken
from morphogen.control.checkpoint import CheckpointError, check_layout, save_checkpoint
from morphogen.control.growth_policy import GrowthInputs
from morphogen.control.heuristic import HeuristicController
from morphogen.control.imitation import ImitationConfig, ImitationStatistics, imitation_fit
from morphogen.control.integrity import non_finite_entries
from morphogen.control.learned import PolicyAgent, PolicyInputs, build_agent
from morphogen.control.normalization import RewardNormalizer, ValueNormalizer
from morphogen.control.policy import ActionOutput, LSTMState
from morphogen.control.ppo import OneProcess, PPOConfig, PPOStatistics, UpdateProcesses, build_optimizer, ppo_update
from morphogen.control.rollout import RolloutBatch, RolloutBuffer
from morphogen.core.compilation import CompileSettings
from morphogen.core.lifecycle import GateConfig, GateMode
from morphogen.core.slot import SlotConfig
from morphogen.data import TASK_NAMES, Task
from morphogen.env.actions import FIXED_CHOICES, HEADS, Action, ActionSpace
from morphogen.env.counterfactual import CounterfactualSchedule
from morphogen.env.episode import EpisodeConfig
from morphogen.env.governor import DivergenceError
from morphogen.env.observation import BLUEPRINT_SIZE, GLOBAL_SIZE, SLOT_SIZE
from morphogen.env.play import Controller
from morphogen.env.seeding import derive_seed, seeded
from morphogen.env.snapshot import EpisodeSnapshot
from morphogen.env.vector import VectorEpisodes
from morphogen.limits import MAX_ENVS, MAX_EPOCHS, MAX_HIDDEN_SIZE, MAX_ROUNDS, MAX_TRAIN_SAMPLES, check_count
from morphogen.run_directory import CHECKPOINT_NAME, PROFILE_DIRNAME
from morphogen.session import DEFAULT_DEVICE, SessionOptions, check_task_host, resolve_host_size
from morphogen.telemetry import events
from morphogen.telemetry.anomalies import Anomaly, AnomalyDetector, PPODiagnostics
from morphogen.telemetry.events import ALL_ENVS
from morphogen.telemetry.profiler import PhaseTimer, TraceProfiler
from morphogen.telemetry.sinks import Telemetry
from morphogen.telemetry.story import NEGATIVE_LOSS

#: PPO updates in a row that may be undone for leaving NaN/Inf in the policy before training gives up.
MAX_POLICY_ROLLBACKS = 3


#: Epochs per training episode unless the config says otherwise.
TRAINING_EPISODE_LENGTH = 25


def _training_episode() -> EpisodeConfig:
    return EpisodeConfig(max_epochs=TRAINING_EPISODE_LENGTH,
                         slots=SlotConfig(gates=GateConfig(mode=GateMode.PERMISSIVE)),
                         counterfactuals=CounterfactualSchedule.EVERY_EPOCH)  # the policy observes them all


@dataclass(frozen=True)
class MixEntry:
    """One setting of a training mix (`[[mix]]` in a config file): a task, its host size, an episode length,
    and how often a round plays it relative to the other entries."""

    #: A built-in task or `package.module:function`, as `task` of `morphogen run`.
    task: str
    #: Host size arguments changed from the task's defaults, as a `[host]` table.
    host: dict[str, int] = field(default_factory=dict)
    #: Epochs per episode; None uses the run's `episode.max_epochs`.
    episode_length: int | None = None
    #: Relative frequency: a round plays this entry with probability weight / (sum of the weights).
    weight: float = 1.0
    #: Cap on training samples of this entry's task; None uses the run's `max_train_samples`.
    max_train_samples: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.task, str) or not self.task:
            raise ValueError(f"task must name a task, got {self.task!r}")
        check_task_host(self.task, self.host, self.max_train_samples)
        if self.episode_length is not None:
            check_count("episode_length", self.episode_length, MAX_EPOCHS)
        if self.max_train_samples is not None:
            check_count("max_train_samples", self.max_train_samples, MAX_TRAIN_SAMPLES)
        if not (math.isfinite(self.weight) and self.weight > 0):
            raise ValueError(f"weight must be a finite number > 0, got {self.weight}")

    @property
    def label(self) -> str:
        """The entry as round lines name it: the task, then its host size values (``digits 2x8x3``)."""
        return f"{self.task} {'x'.join(str(value) for value in self.host.values())}".strip()


@dataclass(frozen=True)
class TrainConfig(SessionOptions):
    """Settings of `morphogen train` (file keys and CLI flags share these names)."""

    #: Episodes run side by side per round.
    n_envs: int = 4
    #: Devices to spread the envs over in this process, e.g. ["cuda:0", "cuda:1"]: env i runs on
    #: devices[i % len(devices)]; the policy, the training data and the shared batch stream live on the
    #: first. None runs every env on `device` (which must be left out, or equal devices[0], when this is set).
    devices: tuple[str, ...] | None = None
    #: PPO rounds (one update each).
    rounds: int = 20
    #: Width of the policy's trunk and LSTM.
    hidden_size: int = 512
    #: An LSTM policy, which remembers earlier epochs of the episode; False trains a feed-forward one (two tanh
    #: layers over this epoch's observation: README "The shipped policy" compares the two).
    recurrent: bool = True
    #: Scale rewards by the running std of the discounted return.
    normalize_rewards: bool = True
    #: Train the value head on returns standardized by their running mean/std (its outputs are
    #: de-standardized before GAE), so the value loss keeps one scale as returns grow or shrink.
    normalize_values: bool = True
    #: Episode settings; `max_epochs` is the episode length. Gates default to permissive for RL.
    episode: EpisodeConfig = field(default_factory=_training_episode)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    #: Rounds of watching the heuristic before PPO (behaviour cloning warm start); 0 by default.
    imitation: ImitationConfig = field(default_factory=ImitationConfig)
    #: Train over these built-in or user tasks, each with its default host (`--tasks digits,mnist1d`); None
    #: trains on `task` alone (or on `mix`).
    tasks: tuple[str, ...] | None = None
    #: Train over these settings (`[[mix]]` tables); empty uses `tasks`, else `task` with `host`.
    mix: tuple[MixEntry, ...] = ()
    #: Train a no-growth twin beside every env on the same batches and subtract its reward from the env's,
    #: so that returns measure what growth added, not how well the host's seed trains.
    paired_baseline: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tasks is not None or self.mix:
            _check_training_mix(self)
        ramp, ramps = self.episode.slots.blend_epochs, FIXED_CHOICES["blend_epochs"]
        if self.imitation.rounds and ramp not in ramps:  # the heuristic's seeds blend so; the policy's head must say it
            raise ValueError(f"episode.slots.blend_epochs = {ramp}: imitation fits the policy's ramp head to the "
                             f"heuristic's ramp, which must be one of its choices, {', '.join(map(str, ramps))}")
        check_count("n_envs", self.n_envs, MAX_ENVS)
        check_count("rounds", self.rounds, MAX_ROUNDS)
        check_count("hidden_size", self.hidden_size, MAX_HIDDEN_SIZE)
        if self.devices is not None:
            if not self.devices or not all(isinstance(d, str) and d.strip() for d in self.devices):
                raise ValueError(f"devices must name at least one device, none empty, got {list(self.devices)}")
            if self.device not in (DEFAULT_DEVICE, self.devices[0]):
                raise ValueError(f"device must be left out (or be {self.devices[0]}, the first of devices) when "
                                 f"devices is set, got {self.device}: the policy lives on the first of devices")
        if self.compile and self.episode.batch_identical:
            raise ValueError("compile does not combine with episode.batch_identical (--batch-envs) yet: the batched "
                             "path runs the eager forward under vmap; choose one")
        if self.ppo.minibatches > self.n_envs:
            raise ValueError(f"ppo.minibatches ({self.ppo.minibatches}) cannot exceed n_envs ({self.n_envs})")

    @property
    def episode_length(self) -> int:
        return self.episode.max_epochs

    def training_mix(self) -> tuple[MixEntry, ...]:
        """What the run trains on, every host size resolved and every episode length filled in."""
        if self.mix:
            entries = self.mix
        elif self.tasks is not None:
            entries = tuple(MixEntry(task) for task in self.tasks)
        else:
            entries = (MixEntry(self.task, dict(self.host)),)
        return tuple(dataclasses.replace(
            entry, episode_length=entry.episode_length or self.episode_length,
            host=resolve_host_size(entry.task, entry.host) if entry.task in TASK_NAMES else dict(entry.host),
        ) for entry in entries)

    def with_resolved_host(self) -> TrainConfig:
        """These options with every host size resolved, the mix's included (see `SessionOptions`)."""
        resolved = super().with_resolved_host()
        return dataclasses.replace(resolved, mix=self.training_mix()) if self.mix else resolved

    @property
    def policy_device(self) -> str:
        """Where the policy, the training data and the shared batch stream live: the first of `devices`,
        else `device` (as configured; `morphogen.devices.resolve_device` resolves `auto`)."""
        return self.devices[0] if self.devices else self.device


def _check_training_mix(config: TrainConfig) -> None:
    """Raise `ValueError` naming the key if the `tasks` or `mix` of `config` cannot be trained as configured."""
    if config.tasks is not None and config.mix:
        raise ValueError("tasks and mix both say what to train on; give one of them")
    if config.tasks is not None:
        if not config.tasks:
            raise ValueError("tasks must name at least one task")
        for task in config.tasks:
            check_task_host(task, {}, config.max_train_samples)
    for entry in config.mix:
        if entry.max_train_samples is None:  # the run's cap applies to the entry
            check_task_host(entry.task, entry.host, config.max_train_samples)
    _refuse_task_and_host_beside_the_mix(config)
    if config.mix:
        _refuse_lengths_and_caps_beside_the_mix(config)


def task_beside_the_mix(task: str, *, in_mix: bool) -> str:
    """The line refusing `task` given beside `[[mix]]` entries (`in_mix`) or `tasks`, which replace it."""
    given, where = ("mix", "name it in a [[mix]] entry") if in_mix else ("tasks", "add it to tasks")
    return f"task: {given} says what to train on, so task {task} would be ignored; {where} instead"


def length_beside_the_mix(length: int) -> str:
    """The line refusing an episode length that every `[[mix]]` entry replaces with its own `episode_length`."""
    return (f"episode.max_epochs: every mix entry sets its own episode_length, so episode.max_epochs = {length} "
            "(--episode-length) would be ignored; leave it out, or leave episode_length out of the entries that "
            "should play it")


def host_beside_the_mix(*, in_mix: bool) -> str:
    """The line refusing a `[host]` table given beside `[[mix]]` entries (`in_mix`) or `tasks`, which replace it."""
    given, where = ("mix", "give the entry a host table") if in_mix else \
        ("tasks", "use [[mix]] entries with host tables")
    return f"host: {given} trains each task on its own host size, so a [host] table would be ignored; {where} instead"


def _refuse_task_and_host_beside_the_mix(config: TrainConfig) -> None:
    """Raise `ValueError` naming the key if `config` sets, beside its `tasks` or `mix`, a task or host size, which
    the training mix replaces (values left at their default pass)."""
    if config.task != SessionOptions.task:
        raise ValueError(task_beside_the_mix(config.task, in_mix=bool(config.mix)))
    if config.host and config.task in TASK_NAMES and \
            resolve_host_size(config.task, config.host) != resolve_host_size(config.task, {}):
        raise ValueError(host_beside_the_mix(in_mix=bool(config.mix)))


def _refuse_lengths_and_caps_beside_the_mix(config: TrainConfig) -> None:
    """Raise `ValueError` naming the key if `config` sets, beside its `mix`, an episode length or training-sample
    cap that no entry of the mix takes: every entry sets its own, none the same (the default value passes)."""
    lengths = [entry.episode_length for entry in config.mix]
    if config.episode_length not in (TRAINING_EPISODE_LENGTH, *lengths) and None not in lengths:
        raise ValueError(length_beside_the_mix(config.episode_length))
    caps = [entry.max_train_samples for entry in config.mix]
    if config.max_train_samples is not None and config.max_train_samples not in caps and None not in caps:
        raise ValueError(f"max_train_samples: every mix entry sets its own max_train_samples, so max_train_samples = "
                         f"{config.max_train_samples} would be ignored; leave it out, or leave max_train_samples out "
                         "of the entries that should take it")


@dataclass(frozen=True)
class RoundSummary:
    """What one round did, for the log line and telemetry."""

    round: int
    mean_return: float
    mean_final_accuracy: float
    mean_parameters_added: float
    fossilized: float
    pruned: float
    statistics: PPOStatistics
    seconds: float
    collect_seconds: float
    update_seconds: float
    #: The mix entry the round played (`MixEntry.label`).
    setting: str = ""
    #: The score of the round's task (`Task.metric_name`): how to read `mean_final_accuracy`.
    metric_name: str = "accuracy"
    #: Each rank's times in a distributed run (`DistributedTrainer`), None in one process.
    rank_times: events.RankTimes | None = None


class EpisodeMeans(NamedTuple):
    """Means over the episodes of one round of envs."""

    mean_return: float
    #: The mean final score: accuracy in percent, or what `metric_name` says (a negated loss, a metric of the task's).
    mean_final_accuracy: float
    mean_parameters_added: float
    #: Seeds fossilized and pruned per episode.
    fossilized: float
    pruned: float
    #: The score of the round's task (`Task.metric_name`), which says how to read `mean_final_accuracy`.
    metric_name: str = "accuracy"


class Rollout(NamedTuple):
    """What `PPOTrainer.collect` played: the batch the update learns from, and what the round reports of it."""

    batch: RolloutBatch
    summary: EpisodeMeans
    #: The policy's LSTM state after the last step (its health is checked once per round).
    final_state: LSTMState
    #: The mix entry it played (`MixEntry.label`).
    setting: str = ""
    #: Seconds of the collection spent waiting for the other processes of a distributed run (0 in one process).
    waiting_seconds: float = 0.0


@dataclass
class TrainingState:
    """Everything that changes across rounds (and so goes into a checkpoint)."""

    agent: PolicyAgent
    optimizer: torch.optim.Optimizer
    reward_normalizer: RewardNormalizer
    value_normalizer: ValueNormalizer
    next_round: int = 0
    #: Rounds in a row whose PPO update was undone for leaving NaN/Inf in the policy.
    policy_rollbacks_in_a_row: int = 0
    #: True once the imitation warm start (if any) is done, so a resumed run does not repeat it.
    imitated: bool = False


class EnvGroup:
    """The envs of one mix entry: their vector of episodes and the rollout buffer of their rounds."""

    def __init__(self, entry: MixEntry, task: Task, config: TrainConfig, *, first_env: int,
                 devices: Sequence[str] | None, round_epochs: int) -> None:
        """`round_epochs` is the length of the mix's longest episode: the env-epoch clock of telemetry advances by
        it every round, whatever the entry played, so that it never runs backwards."""
        self.entry, self.task = entry, task
        assert entry.episode_length is not None, "TrainConfig.training_mix fills every episode length"
        episode = dataclasses.replace(config.episode, max_epochs=entry.episode_length, gamma=config.ppo.gamma)
        self.vector = VectorEpisodes(task, episode, config.n_envs, seed=config.seed, slots=config.slots,
                                     pool_slots=config.pool_slots, first_env=first_env, devices=devices,
                                     baselines=config.paired_baseline, round_epochs=round_epochs)
        for episode_of_env in self.vector.episodes:
            # The policy reads every blueprint's growth signal; the heuristic it watches first compares its own.
            episode_of_env.growth_candidates = episode_of_env.every_blueprint
        probe = self.vector.episodes[0].build_model()
        #: The slots and blueprints of this entry's models (every env of it has the same).
        self.action_space = ActionSpace(probe.slot_ids, task.topology)
        n_slots, n_blueprints = len(probe.slot_ids), len(self.action_space.blueprints)
        n_ops = len(FIXED_CHOICES["op"])
        device = task.train.device
        envs = config.n_envs
        template = GrowthInputs(
            globals=torch.zeros(envs, GLOBAL_SIZE), slots=torch.zeros(envs, n_slots, SLOT_SIZE),
            slot_valid=torch.zeros(envs, n_slots, dtype=torch.bool),
            blueprints=torch.zeros(envs, n_slots, n_blueprints, BLUEPRINT_SIZE),
            blueprint_valid=torch.zeros(envs, n_blueprints, dtype=torch.bool))
        sizes = {"slot": n_slots, "blueprint": n_blueprints, **{head: len(choices) for head, choices in
                                                                 FIXED_CHOICES.items()}}
        mask_shapes = [(n_ops,)] + [(n_ops, sizes[head]) for head in HEADS[1:]]
        self.buffer = RolloutBuffer(entry.episode_length, envs, template, len(HEADS), config.hidden_size,
                                    mask_shapes=mask_shapes, device=device)

    @property
    def episode_length(self) -> int:
        return self.buffer.rollout_length


class PPOTrainer:
    """Owns the envs of every mix entry, the agent and the optimizer; `run_round` does one full round."""

    def __init__(self, config: TrainConfig, tasks: Task | Sequence[Task], telemetry: Telemetry | None = None, *,
                 first_env: int = 0, devices: list[str] | None = None) -> None:
        """`tasks` are the loaded tasks of `config.training_mix()`, in its order (one `Task` for a one-entry mix).
        `first_env` is the global index of the first env (not 0 only on a distributed rank, whose
        `config.n_envs` is its own share of the envs). `devices` (resolved device strings, e.g. `auto`
        resolved by `morphogen.devices.resolve_device`; the tasks' data on the first) spreads the envs over
        them; None uses `config.devices` as they are."""
        self.config = config
        self.mix = config.training_mix()
        loaded = [tasks] if isinstance(tasks, Task) else list(tasks)
        if len(loaded) != len(self.mix):
            raise ValueError(f"{len(loaded)} tasks given for a mix of {len(self.mix)} entries; load one per entry")
        self.tasks = loaded
        self.longest_episode = max(entry.episode_length or 0 for entry in self.mix)
        """Epochs of the longest episode of the mix (one round on the env-epoch clock of telemetry)."""
        self.groups = [EnvGroup(entry, task, config, first_env=first_env,
                                devices=config.devices if devices is None else devices,
                                round_epochs=self.longest_episode)
                       for entry, task in zip(self.mix, loaded, strict=True)]
        #: The processes taking part in each PPO update (a data-parallel run's ranks; here: this one alone).
        self.processes: UpdateProcesses = OneProcess()
        #: Escalation state read from a checkpoint, applied when the run's telemetry is attached.
        self._resumed_telemetry: dict[str, Any] | None = None
        self.detector = AnomalyDetector()  # replaced (keeping its state) by every `attach_telemetry`
        self.attach_telemetry(telemetry or Telemetry(None, level="off"))
        #: Called with the number of epochs every env has finished in the current round, after each
        #: lockstep step (progress displays); None calls nothing.
        self.on_step: Callable[[int], None] | None = None
        device = loaded[0].train.device
        with seeded(derive_seed(config.seed, 7), device):
            agent = build_agent(config.hidden_size, device=device, recurrent=config.recurrent)
        self.state = TrainingState(
            agent=agent,
            optimizer=build_optimizer(agent.policy, config.ppo),
            reward_normalizer=RewardNormalizer(config.n_envs, gamma=config.ppo.gamma, device=device),
            value_normalizer=ValueNormalizer(device=device),
        )
        self.compile(config.compile_settings)

    def group_of(self, round_index: int) -> EnvGroup:
        """The mix entry round `round_index` plays, drawn by weight from (seed, round)."""
        if len(self.groups) == 1:
            return self.groups[0]
        weights = np.array([entry.weight for entry in self.mix])
        if weights.max() > np.finfo(weights.dtype).max / len(weights):  # their sum would overflow (1e308 twice)
            weights = weights / weights.max()  # the weights are relative: only their ratios matter
        chooser = np.random.default_rng(derive_seed(self.config.seed, round_index, 17))
        return self.groups[int(chooser.choice(len(self.groups), p=weights / weights.sum()))]

    def compile(self, settings: CompileSettings | None) -> None:
        """Run the policy's forward and every env's host training forward under `torch.compile` (None: eagerly)."""
        self.state.agent.policy.compile_forward(settings)
        for group in self.groups:
            for episode in group.vector.episodes:
                episode.compile_settings = settings  # applied to the model each reset builds

    def attach_telemetry(self, telemetry: Telemetry, run_dir: Path | None = None) -> None:
        """Route events to `telemetry`; set up the phase timer, anomaly detector and (with a run dir) profiler."""
        detector = AnomalyDetector(telemetry.config)
        # Resuming restores the detector before the run's telemetry is attached: carry its state over.
        detector.load_state_dict(self.detector.state_dict())
        if self._resumed_telemetry is not None:
            with contextlib.suppress(ValueError):  # a resume that shortened escalation_epochs starts afresh
                telemetry.load_state_dict(self._resumed_telemetry)
            self._resumed_telemetry = None
        self.telemetry = telemetry
        self.timer = PhaseTimer.from_config(telemetry.config)
        self.detector = detector
        for group in self.groups:
            group.vector.attach(telemetry, self.timer, self.detector)
        # The trace window is shifted to the end of the first round so that it contains a PPO update:
        # a round is `episode_length` env steps followed by the update step.
        config = telemetry.config
        shift = max(0, self.group_of(0).episode_length + 1 - config.profile_warmup - config.profile_active)
        self.profiler = TraceProfiler(
            (run_dir or Path(".")) / PROFILE_DIRNAME, enabled=config.profile and run_dir is not None,
            wait=config.profile_wait + shift, warmup=config.profile_warmup, active=config.profile_active)

    # ---------------------------------------------------------------- layout and checkpoints
    def layout(self) -> dict[str, Any]:
        return {"hidden_size": self.config.hidden_size}

    def state_dict(self) -> dict[str, Any]:
        agent = self.state.agent
        return {
            **self.layout(),
            "round": self.state.next_round,
            "policy": agent.policy.state_dict(),
            "optimizer": self.state.optimizer.state_dict(),
            "observation_normalizer": agent.observation_normalizer.state_dict(),
            "reward_normalizer": self.state.reward_normalizer.state_dict(),
            "value_normalizer": self.state.value_normalizer.state_dict(),
            "rng": {"torch": torch.get_rng_state()},
            "anomaly_detector": self.detector.state_dict(),
            "telemetry": self.telemetry.state_dict(),
            "policy_rollbacks_in_a_row": self.state.policy_rollbacks_in_a_row,
            "imitated": self.state.imitated,
            "config": json.dumps(_config_dict(self.config)),
        }

    def load_state_dict(self, state: dict[str, Any], source: str | Path) -> None:
        """Continue from a checkpoint; one built for another layout raises `CheckpointError` before any change."""
        check_layout(state, self.layout(), source)
        agent = self.state.agent
        try:
            agent.policy.load_state_dict(state["policy"])
            self.state.optimizer.load_state_dict(state["optimizer"])
            agent.observation_normalizer.load_state_dict(state["observation_normalizer"])
            self.state.reward_normalizer.load_state_dict(state["reward_normalizer"])
            self.state.value_normalizer.load_state_dict(state["value_normalizer"])
            torch.set_rng_state(state["rng"]["torch"])
            self.detector.load_state_dict(state["anomaly_detector"])
            # Applied to the run's telemetry when `attach_telemetry` connects it.
            self._resumed_telemetry = state.get("telemetry")
            self.state.policy_rollbacks_in_a_row = int(state["policy_rollbacks_in_a_row"])
            self.state.imitated = bool(state["imitated"])
            self.state.next_round = int(state["round"])
        except (RuntimeError, KeyError, TypeError, ValueError) as error:
            raise CheckpointError(f"checkpoint {source} does not fit this trainer: "
                                  f"{str(error).strip().splitlines()[0]}") from None

    def save(self, run_dir: Path) -> None:
        save_checkpoint(self.state_dict(), run_dir / CHECKPOINT_NAME)

    # ---------------------------------------------------------------- one round
    def collect(self, round_index: int, demonstrators: Sequence[Controller] | None = None) -> Rollout:
        """Play `n_envs` whole episodes of the round's mix entry with the current policy into its rollout buffer.

        With `demonstrators` (one per env) they choose the actions instead, and the buffer stores their
        actions; the policy still runs on every observation (its LSTM state, values and the observation
        statistics evolve as in a PPO round), but its log-probs in the batch are those of its own samples.
        """
        config, agent, group = self.config, self.state.agent, self.group_of(round_index)
        vector, buffer, length = group.vector, group.buffer, group.episode_length
        generator = torch.Generator(device=agent.device).manual_seed(derive_seed(config.seed, round_index, 11))
        snapshots = vector.reset(round_index)
        self.state.reward_normalizer.reset()
        state = agent.policy.initial_state(config.n_envs)
        buffer.reset(state)
        n = config.n_envs
        starts = torch.ones(n, dtype=torch.bool, device=agent.device)
        returns = np.zeros(n)
        advisors = [HeuristicAdvisor() for _ in range(n)]
        # No torch.no_grad() here: the hosts train inside vector.step; the policy call is grad-free itself.
        for step in range(length):
            with self.timer.phase("policy"):
                inputs, observations, output, actions = self.act_step(group, snapshots, state, generator, starts,
                                                                      advisors)
                if demonstrators is not None:
                    output, actions = _demonstrated(group, demonstrators, snapshots, output)
                record_taken(advisors, actions)
            results = vector.step(actions)
            self.profiler.step()
            if self.on_step is not None:
                self.on_step(step + 1)
            raw_rewards = np.array([r.reward.total - (r.baseline_reward or 0.0) for r in results], dtype=np.float32)
            returns += raw_rewards
            done = step == length - 1
            dones = torch.full((n,), done, dtype=torch.bool, device=agent.device)
            rewards = torch.from_numpy(raw_rewards).to(agent.device)
            if config.normalize_rewards:
                rewards = self.state.reward_normalizer.update(rewards, dones).float()
            buffer.add(observations, starts, output, rewards, dones, torch.zeros_like(dones),
                       action_masks=inputs.masks)
            snapshots = [r.snapshot for r in results]
            state, starts = output.state, torch.zeros_like(starts)
        values = self.state.value_normalizer
        if config.normalize_values:
            # The value head speaks in standardized returns; GAE needs them in reward units.
            buffer.values.copy_(values.denormalize(buffer.values))
        batch = buffer.finish(torch.zeros(n, device=agent.device), gamma=config.ppo.gamma,
                              gae_lambda=config.ppo.gae_lambda)
        if config.normalize_values:
            values.update(batch.returns)
            batch = batch._replace(values=values.normalize(batch.values), returns=values.normalize(batch.returns))
        episodes = vector.episodes
        summary = EpisodeMeans(
            mean_return=float(returns.mean()),
            mean_final_accuracy=float(np.mean([s.val_accuracy for s in snapshots])),
            mean_parameters_added=float(np.mean([s.added_parameters for s in snapshots])),
            fossilized=float(np.mean([e.fossilized for e in episodes])),
            pruned=float(np.mean([e.pruned for e in episodes])),
            metric_name=group.task.metric_name,
        )
        return Rollout(batch, summary, state, setting=group.entry.label)

    def act_step(self, group: EnvGroup, snapshots: list[EpisodeSnapshot], state: LSTMState,
                 generator: torch.Generator, starts: torch.Tensor, advisors: Sequence[HeuristicAdvisor],
                 ) -> tuple[PolicyInputs, GrowthInputs, ActionOutput, list[Action]]:
        """One batched policy call for every env of this trainer (updating the observation statistics); each
        env's advisor then expects the action taken."""
        agent = self.state.agent
        inputs = agent.inputs(snapshots, group.vector.masks(), advisors)
        observations, output = agent.act(inputs, state, generator=generator, episode_starts=starts,
                                         update_normalizer=True)
        return inputs, observations, output, agent.decode(output.actions, snapshots)

    def imitate(self, on_round: Callable[[int, EpisodeMeans], None] | None = None) -> ImitationStatistics:
        """Watch `config.imitation.rounds` rounds of heuristic-driven episodes, then fit the policy to them.

        The episodes use indices past every PPO round (`MAX_ROUNDS + i`), so their hosts and batch orders
        are never those of a PPO round. `on_round(i, summary)` is called after each round of episodes.
        """
        config = self.config.imitation
        batches = []
        for index in range(config.rounds):
            group = self.group_of(MAX_ROUNDS + index)
            controllers = [HeuristicController(group.action_space, group.task.topology) for _ in group.vector.episodes]
            rollout = self.collect(MAX_ROUNDS + index, demonstrators=controllers)
            batches.append(rollout.batch)
            if on_round is not None:
                on_round(index + 1, rollout.summary)
        with self.timer.phase("update"):
            statistics = imitation_fit(self.state.agent.policy, batches, config)
        self.state.imitated = True
        # Marks the end of the watched episodes' events (readers and `--resume` tell them from round 1's by it); the
        # trainer's epoch clock counts PPO rounds only, so it is still 0.
        self.telemetry.emit(events.ImitationCompleted(epoch=0, env_id=ALL_ENVS, rounds=config.rounds,
                                                      **dataclasses.asdict(statistics)))
        return statistics

    def run_round(self) -> RoundSummary:
        round_index = self.state.next_round
        started = time.perf_counter()
        rollout = self.collect(round_index)
        collected = time.perf_counter()
        update_generator = torch.Generator(device="cpu").manual_seed(derive_seed(self.config.seed, round_index, 13))
        before = self._policy_backup()
        with self.timer.phase("update"):
            statistics = ppo_update(self.state.agent.policy, self.state.optimizer, rollout.batch, self.config.ppo,
                                    progress=round_index / self.config.rounds, generator=update_generator,
                                    processes=self.processes)
        self._undo_non_finite_update(before, round_index + 1)
        self.profiler.step()
        finished = time.perf_counter()
        self.state.next_round = round_index + 1
        result = RoundSummary(round=round_index + 1, statistics=statistics, seconds=finished - started,
                              collect_seconds=collected - started, update_seconds=finished - collected,
                              mean_return=rollout.summary.mean_return,
                              mean_final_accuracy=rollout.summary.mean_final_accuracy,
                              mean_parameters_added=rollout.summary.mean_parameters_added,
                              fossilized=rollout.summary.fossilized, pruned=rollout.summary.pruned,
                              setting=rollout.setting, metric_name=rollout.summary.metric_name)
        result = self.combine_ranks(result, rollout)
        self._report_round(result, rollout)
        return result

    def combine_ranks(self, summary: RoundSummary, rollout: Rollout) -> RoundSummary:
        """The round's summary over every process of the run: in one process, `summary` itself."""
        return summary

    def _policy_backup(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Copies of the policy's and the optimizer's state, to undo an update that diverged."""
        policy = {name: tensor.detach().clone() for name, tensor in self.state.agent.policy.state_dict().items()}
        return policy, copy.deepcopy(self.state.optimizer.state_dict())

    def _undo_non_finite_update(self, backup: tuple[dict[str, torch.Tensor], dict[str, Any]],
                                round_number: int) -> None:
        """If the update left NaN/Inf in the policy, restore `backup`, halve the learning rate and report it.

        Raises `DivergenceError` after `MAX_POLICY_ROLLBACKS` undone updates in a row.
        """
        bad = non_finite_entries(self.state.agent.policy.state_dict())  # one sync
        if not bad:
            self.state.policy_rollbacks_in_a_row = 0
            return
        policy, optimizer = backup
        self.state.agent.policy.load_state_dict(policy)
        self.state.optimizer.load_state_dict(optimizer)
        for group in self.state.optimizer.param_groups:
            group["lr"] = group["lr"] / 2
        self.state.policy_rollbacks_in_a_row += 1
        rate = self.state.optimizer.param_groups[0]["lr"]
        anomaly = Anomaly("non_finite", f"the PPO update of round {round_number} left NaN/Inf in {len(bad)} policy "
                                        f"tensors ({bad[0]}, ...); it was undone and the learning rate halved to "
                                        f"{rate:.3g}", "lower ppo.learning_rate; check rewards and observations")
        self.telemetry.report_anomalies([anomaly], epoch=round_number * self.longest_episode)
        if self.state.policy_rollbacks_in_a_row >= MAX_POLICY_ROLLBACKS:
            raise DivergenceError(f"training stopped in round {round_number}: {MAX_POLICY_ROLLBACKS} PPO updates in "
                                  "a row left NaN/Inf in the policy and were undone; lower ppo.learning_rate "
                                  f"(the checkpoint holds the last finite policy, of round {round_number - 1})")

    def _report_round(self, summary: RoundSummary, rollout: Rollout) -> None:
        """PPO, LSTM and phase-time events, and the anomaly check of this round's update."""
        stats, telemetry = summary.statistics, self.telemetry
        epoch = summary.round * self.longest_episode  # the env-epoch clock escalation counts in
        # A feed-forward policy's state is the zeros it started from: no memory to judge.
        has_memory = self.state.agent.policy.lstm is not None
        lstm = self.detector.lstm_health.check(*rollout.final_state) if has_memory else None  # one sync
        # Heads no sampled op needed have no entropy to judge (one sync).
        ops = rollout.batch.actions[..., 0]
        heads_used = self.state.agent.policy.relevant_heads(ops).flatten(0, 1).any(0).tolist()
        assert rollout.batch.action_masks is not None, "growth rollouts store their masks"
        sizes = [mask.shape[-1] for mask in rollout.batch.action_masks]  # the round's choices per head
        used = [i for i, flag in enumerate(heads_used) if flag and sizes[i] > 1]
        if getattr(self.state.agent.policy, "advice_weight", None) is not None:
            # The op head adds the heuristic's advice to the advised op's logit: confident by design, it picks what
            # the advice says rather than always the same op, so its low entropy is no collapse.
            used = [i for i in used if HEADS[i] != "op"]
        diagnostics = PPODiagnostics(
            ratio_max=stats.ratio_max, ratio_min=stats.ratio_min, value_std=stats.value_std,
            return_std=stats.return_std, entropy_per_head=tuple((HEADS[i], stats.entropy_per_head[i]) for i in used),
            max_entropy_per_head=tuple((HEADS[i], math.log(sizes[i])) for i in used),
            approx_kl=stats.approx_kl, target_kl=self.config.ppo.target_kl, grad_norm=stats.grad_norm, lstm=lstm)
        telemetry.report_anomalies(self.detector.check(diagnostics), epoch=epoch)
        telemetry.emit(events.PPOUpdateCompleted(
            epoch=epoch, env_id=ALL_ENVS, round=summary.round, policy_loss=stats.policy_loss,
            value_loss=stats.value_loss, entropy_loss=stats.entropy_loss,
            entropy_per_head=tuple(zip(HEADS, stats.entropy_per_head, strict=True)), approx_kl=stats.approx_kl,
            clip_fraction=stats.clip_fraction, explained_variance=stats.explained_variance,
            grad_norm=stats.grad_norm, epochs_completed=stats.epochs_completed, early_stopped=stats.early_stopped))
        if lstm is not None:
            telemetry.emit(lstm.event(epoch=epoch, env_id=ALL_ENVS))
        if self.timer.enabled:
            telemetry.emit(self.timer.event(epoch=epoch, env_id=ALL_ENVS))
        if summary.rank_times is not None:
            telemetry.emit(summary.rank_times)
        telemetry.emit(events.RoundCompleted(
            epoch=epoch, env_id=ALL_ENVS, round=summary.round, mean_return=summary.mean_return,
            mean_final_accuracy=summary.mean_final_accuracy, mean_parameters_added=summary.mean_parameters_added,
            seconds=summary.seconds))


def _config_dict(config: TrainConfig) -> dict[str, Any]:
    from morphogen.config import config_to_dict

    return config_to_dict(config)  # type: ignore[no-any-return]


def format_round_score(score: float, metric_name: str) -> str:
    """A round's mean final score as its line shows it: accuracy in percent, a negated loss as the loss, another
    metric under its name (at most 16 characters of it)."""
    if metric_name == "accuracy":
        return f"acc {score:6.2f}%"
    if metric_name == NEGATIVE_LOSS:
        return f"loss {-score:7.4g}"
    return f"{metric_name[:16]} {score:7.4g}"


#: The columns of `train`'s rounds, headed once (by `ROUND_HEADER`) in the words of `report`'s rounds table, then
#: one row per round by `format_round`, each starting `round   N` (so the first column needs no header, and a grep
#: for the rounds finds the rows alone): (header, width) each.
ROUND_COLUMNS = (("", 9), ("return", 8), ("final score", 12), ("params added", 12), ("fossilized", 10),
                 ("pruned", 6), ("approx KL", 9), ("value loss", 10), ("explained variance", 18), ("seconds", 7))
ROUND_HEADER = "  ".join(f"{header:>{width}}" for header, width in ROUND_COLUMNS)


def format_round(summary: RoundSummary, *, setting: bool = False) -> str:
    """The row printed per round under `ROUND_HEADER` (within 120 columns; `setting` appends the mix entry the round
    played); the entropy of every head is in telemetry, the HTML report and the dashboard."""
    stats = summary.statistics
    cells = (f"round {summary.round:3d}", f"{summary.mean_return:+.3f}",
             format_round_score(summary.mean_final_accuracy, summary.metric_name),
             f"{summary.mean_parameters_added:,.0f}", f"{summary.fossilized:.1f}", f"{summary.pruned:.1f}",
             f"{stats.approx_kl:.4f}", f"{stats.value_loss:.4f}", f"{stats.explained_variance:+.2f}",
             f"{summary.seconds:.1f}")
    line = "  ".join(f"{cell:>{width}}" for cell, (_, width) in zip(cells, ROUND_COLUMNS, strict=True))
    return f"{line}  {summary.setting}" if setting else line


def train(trainer: PPOTrainer, run_dir: Path,
          on_round: Callable[[RoundSummary], None] | None = None) -> list[RoundSummary]:
    """Run rounds until `config.rounds`, checkpointing after each (and after the imitation warm start, if any)."""
    if trainer.config.imitation.rounds and not trainer.state.imitated:
        trainer.imitate()
        trainer.save(run_dir)
    summaries = []
    while trainer.state.next_round < trainer.config.rounds:
        summary = trainer.run_round()
        trainer.save(run_dir)
        summaries.append(summary)
        if on_round is not None:
            on_round(summary)
    return summaries


def _demonstrated(group: EnvGroup, demonstrators: Sequence[Controller], snapshots: Sequence[EpisodeSnapshot],
                  output: ActionOutput) -> tuple[ActionOutput, list[Action]]:
    """The demonstrators' actions for this step, and the policy's output carrying them in place of its own."""
    masks = group.vector.masks()
    actions = [d.act(s, m) for d, s, m in zip(demonstrators, snapshots, masks, strict=True)]
    encoded = [group.action_space.encode(action) for action in actions]
    return output._replace(actions=torch.tensor(encoded, device=output.actions.device)), actions
