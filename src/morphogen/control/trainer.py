"""The PPO round loop: collect -> advantages -> update -> log -> checkpoint (docs/architecture.md#controller).

One round runs `n_envs` whole episodes side by side (`VectorEpisodes`, one batched policy call per
step), then one PPO update over those episodes as sequences (BPTT from the stored initial state).
Every random choice of a round is drawn from generators seeded by (seed, round), so a run stopped
after round k and resumed gives the same policy as an uninterrupted run.

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

from morphogen.control.checkpoint import CheckpointError, check_layout, save_checkpoint
from morphogen.control.heuristic import HeuristicController
from morphogen.control.imitation import ImitationConfig, ImitationStatistics, concatenate_batches, imitation_fit
from morphogen.control.integrity import non_finite_entries
from morphogen.control.learned import PolicyAgent, PolicyInputs, build_policy
from morphogen.control.normalization import RewardNormalizer, RunningMeanStd, ValueNormalizer
from morphogen.control.policy import ActionOutput, LSTMState
from morphogen.control.ppo import OneProcess, PPOConfig, PPOStatistics, UpdateProcesses, build_optimizer, ppo_update
from morphogen.control.rollout import RolloutBatch, RolloutBuffer
from morphogen.core.compilation import CompileSettings
from morphogen.core.lifecycle import GateConfig, GateMode
from morphogen.core.slot import SlotConfig
from morphogen.data import Task
from morphogen.env.actions import HEADS, Action, ActionSpace
from morphogen.env.counterfactual import CounterfactualSchedule
from morphogen.env.episode import EpisodeConfig
from morphogen.env.governor import DivergenceError
from morphogen.env.observation import ObservationEncoder
from morphogen.env.play import Controller
from morphogen.env.seeding import derive_seed, seeded
from morphogen.env.snapshot import EpisodeSnapshot
from morphogen.env.vector import VectorEpisodes
from morphogen.limits import MAX_ENVS, MAX_HIDDEN_SIZE, MAX_ROUNDS, check_count
from morphogen.run_directory import CHECKPOINT_NAME, PROFILE_DIRNAME
from morphogen.session import DEFAULT_DEVICE, SessionOptions
from morphogen.telemetry import events
from morphogen.telemetry.anomalies import Anomaly, AnomalyDetector, PPODiagnostics
from morphogen.telemetry.events import ALL_ENVS
from morphogen.telemetry.profiler import PhaseTimer, TraceProfiler
from morphogen.telemetry.sinks import Telemetry

#: PPO updates in a row that may be undone for leaving NaN/Inf in the policy before training gives up.
MAX_POLICY_ROLLBACKS = 3


def _training_episode() -> EpisodeConfig:
    return EpisodeConfig(max_epochs=25, slots=SlotConfig(gates=GateConfig(mode=GateMode.PERMISSIVE)),
                         counterfactuals=CounterfactualSchedule.EVERY_EPOCH)  # the policy observes them all


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

    def __post_init__(self) -> None:
        super().__post_init__()
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

    @property
    def policy_device(self) -> str:
        """Where the policy, the training data and the shared batch stream live: the first of `devices`,
        else `device` (as configured; `morphogen.devices.resolve_device` resolves `auto`)."""
        return self.devices[0] if self.devices else self.device


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
    #: Each rank's times in a distributed run (`DistributedTrainer`), None in one process.
    rank_times: events.RankTimes | None = None


class EpisodeMeans(NamedTuple):
    """Means over the episodes of one round of envs."""

    mean_return: float
    mean_final_accuracy: float
    mean_parameters_added: float
    #: Seeds fossilized and pruned per episode.
    fossilized: float
    pruned: float


class Rollout(NamedTuple):
    """What `PPOTrainer.collect` played: the batch the update learns from, and what the round reports of it."""

    batch: RolloutBatch
    summary: EpisodeMeans
    #: The policy's LSTM state after the last step (its health is checked once per round).
    final_state: LSTMState
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


class PPOTrainer:
    """Owns the vector of episodes, the agent and the optimizer; `run_round` does one full round."""

    def __init__(self, config: TrainConfig, task: Task, telemetry: Telemetry | None = None, *,
                 first_env: int = 0, devices: list[str] | None = None) -> None:
        """`first_env` is the global index of the first env (not 0 only on a distributed rank, whose
        `config.n_envs` is its own share of the envs). `devices` (resolved device strings, e.g. `auto`
        resolved by `morphogen.devices.resolve_device`; the task's data on the first) spreads the envs over them;
        None uses `config.devices` as they are."""
        self.config, self.task = config, task
        episode_config = dataclasses.replace(config.episode, gamma=config.ppo.gamma)
        self.vector = VectorEpisodes(task, episode_config, config.n_envs, seed=config.seed, slots=config.slots,
                                     pool_slots=config.pool_slots, first_env=first_env,
                                     devices=config.devices if devices is None else devices)
        #: The processes taking part in each PPO update (a data-parallel run's ranks; here: this one alone).
        self.processes: UpdateProcesses = OneProcess()
        #: Escalation state read from a checkpoint, applied when the run's telemetry is attached.
        self._resumed_telemetry: dict[str, Any] | None = None
        self.detector = AnomalyDetector()  # replaced (keeping its state) by every `attach_telemetry`
        self.attach_telemetry(telemetry or Telemetry(None, level="off"))
        #: Called with the number of epochs every env has finished in the current round, after each
        #: lockstep step (progress displays); None calls nothing.
        self.on_step: Callable[[int], None] | None = None
        probe = self.vector.episodes[0].build_model()
        self.slot_ids = probe.slot_ids
        self.encoder = ObservationEncoder(self.slot_ids, task.topology)
        self.space = ActionSpace(self.slot_ids, task.topology)
        device = task.train.device
        with seeded(derive_seed(config.seed, 7), device):
            policy = build_policy(self.encoder, self.space, config.hidden_size, device=device)
        normalizer = RunningMeanStd((self.encoder.size,), device=device)
        self.state = TrainingState(
            agent=PolicyAgent(policy, self.encoder, self.space, normalizer),
            optimizer=build_optimizer(policy, config.ppo),
            reward_normalizer=RewardNormalizer(config.n_envs, gamma=config.ppo.gamma, device=device),
            value_normalizer=ValueNormalizer(device=device),
        )
        self.compile(config.compile_settings)
        mask_shapes = [(len(self.space.choices["op"]),)] + [
            (len(self.space.choices["op"]), len(self.space.choices[head])) for head in HEADS[1:]]
        self.buffer = RolloutBuffer(config.episode_length, config.n_envs, self.encoder.size, len(HEADS),
                                    config.hidden_size, mask_shapes=mask_shapes, n_slots=len(self.slot_ids),
                                    device=device)

    def compile(self, settings: CompileSettings | None) -> None:
        """Run the policy's forward and every env's host training forward under `torch.compile` (None: eagerly)."""
        self.state.agent.policy.compile_forward(settings)
        for episode in self.vector.episodes:
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
        self.vector.attach(telemetry, self.timer, self.detector)
        # The trace window is shifted to the end of the first round so that it contains a PPO update:
        # a round is `episode_length` env steps followed by the update step.
        config = telemetry.config
        shift = max(0, self.config.episode_length + 1 - config.profile_warmup - config.profile_active)
        self.profiler = TraceProfiler(
            (run_dir or Path(".")) / PROFILE_DIRNAME, enabled=config.profile and run_dir is not None,
            wait=config.profile_wait + shift, warmup=config.profile_warmup, active=config.profile_active)

    # ---------------------------------------------------------------- layout and checkpoints
    def layout(self) -> dict[str, Any]:
        return {"task": self.task.name, "slot_ids": tuple(self.slot_ids), "observation_size": self.encoder.size,
                "action_sizes": tuple(self.space.sizes), "hidden_size": self.config.hidden_size}

    def state_dict(self) -> dict[str, Any]:
        agent = self.state.agent
        return {
            **{k: list(v) if isinstance(v, tuple) else v for k, v in self.layout().items()},
            "episode_length": self.config.episode_length,
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
            if "anomaly_detector" in state:
                self.detector.load_state_dict(state["anomaly_detector"])
            # Applied to the run's telemetry when `attach_telemetry` connects it.
            self._resumed_telemetry = state.get("telemetry")
            self.state.policy_rollbacks_in_a_row = int(state.get("policy_rollbacks_in_a_row", 0))
            self.state.imitated = bool(state["imitated"])
            self.state.next_round = int(state["round"])
        except (RuntimeError, KeyError, TypeError, ValueError) as error:
            raise CheckpointError(f"checkpoint {source} does not fit this trainer: "
                                  f"{str(error).strip().splitlines()[0]}") from None

    def save(self, run_dir: Path) -> None:
        save_checkpoint(self.state_dict(), run_dir / CHECKPOINT_NAME)

    # ---------------------------------------------------------------- one round
    def collect(self, round_index: int, demonstrators: Sequence[Controller] | None = None) -> Rollout:
        """Play `n_envs` whole episodes with the current policy into the rollout buffer.

        With `demonstrators` (one per env) they choose the actions instead, and the buffer stores their
        actions; the policy still runs on every observation (its LSTM state, values and the observation
        statistics evolve as in a PPO round), but its log-probs in the batch are those of its own samples.
        """
        config, agent, vector = self.config, self.state.agent, self.vector
        generator = torch.Generator(device=agent.device).manual_seed(derive_seed(config.seed, round_index, 11))
        snapshots = vector.reset(round_index)
        self.state.reward_normalizer.reset()
        state = agent.policy.initial_state(config.n_envs)
        self.buffer.reset(state)
        n = config.n_envs
        starts = torch.ones(n, dtype=torch.bool, device=agent.device)
        returns = np.zeros(n)
        results = []
        # No torch.no_grad() here: the hosts train inside vector.step; the policy call is grad-free itself.
        for step in range(config.episode_length):
            with self.timer.phase("policy"):
                inputs, observations, output, actions = self.act_step(snapshots, state, generator, starts)
                if demonstrators is not None:
                    env_masks = vector.masks()
                    actions = [d.act(s, m) for d, s, m in zip(demonstrators, snapshots, env_masks, strict=True)]
                    encoded = torch.tensor([self.space.encode(action) for action in actions], device=agent.device)
                    output = output._replace(actions=encoded)
            results = vector.step(actions)
            self.profiler.step()
            if self.on_step is not None:
                self.on_step(step + 1)
            raw_rewards = np.array([r.reward.total for r in results], dtype=np.float32)
            returns += raw_rewards
            done = step == config.episode_length - 1
            dones = torch.full((n,), done, dtype=torch.bool, device=agent.device)
            rewards = torch.from_numpy(raw_rewards).to(agent.device)
            if config.normalize_rewards:
                rewards = self.state.reward_normalizer.update(rewards, dones).float()
            self.buffer.add(observations, starts, output, rewards, dones, torch.zeros_like(dones),
                            action_masks=inputs.masks, blueprint_ids=inputs.blueprint_ids)
            snapshots = [r.snapshot for r in results]
            state, starts = output.state, torch.zeros_like(starts)
        values = self.state.value_normalizer
        if config.normalize_values:
            # The value head speaks in standardized returns; GAE needs them in reward units.
            self.buffer.values.copy_(values.denormalize(self.buffer.values))
        batch = self.buffer.finish(torch.zeros(n, device=agent.device), gamma=config.ppo.gamma,
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
        )
        return Rollout(batch, summary, state)

    def act_step(self, snapshots: list[EpisodeSnapshot], state: LSTMState, generator: torch.Generator,
                 starts: torch.Tensor) -> tuple[PolicyInputs, torch.Tensor, ActionOutput, list[Action]]:
        """One batched policy call for every env of this trainer (updating the observation statistics)."""
        agent = self.state.agent
        inputs = agent.inputs(snapshots, self.vector.masks())
        observations, output, actions = agent.act(inputs, state, generator=generator, episode_starts=starts,
                                                  update_normalizer=True)
        return inputs, observations, output, actions

    def imitate(self, on_round: Callable[[int, EpisodeMeans], None] | None = None) -> ImitationStatistics:
        """Watch `config.imitation.rounds` rounds of heuristic-driven episodes, then fit the policy to them.

        The episodes use indices past every PPO round (`MAX_ROUNDS + i`), so their hosts and batch orders
        are never those of a PPO round. `on_round(i, summary)` is called after each round of episodes.
        """
        config = self.config.imitation
        batches = []
        for index in range(config.rounds):
            controllers = [HeuristicController(self.space, self.task.topology) for _ in self.vector.episodes]
            rollout = self.collect(MAX_ROUNDS + index, demonstrators=controllers)
            batches.append(rollout.batch)
            if on_round is not None:
                on_round(index + 1, rollout.summary)
        with self.timer.phase("update"):
            statistics = imitation_fit(self.state.agent.policy, concatenate_batches(batches), config)
        self.state.imitated = True
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
                              fossilized=rollout.summary.fossilized, pruned=rollout.summary.pruned)
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
        self.telemetry.report_anomalies([anomaly], epoch=round_number * self.config.episode_length)
        if self.state.policy_rollbacks_in_a_row >= MAX_POLICY_ROLLBACKS:
            raise DivergenceError(f"training stopped in round {round_number}: {MAX_POLICY_ROLLBACKS} PPO updates in "
                                  "a row left NaN/Inf in the policy and were undone; lower ppo.learning_rate "
                                  f"(the checkpoint holds the last finite policy, of round {round_number - 1})")

    def _report_round(self, summary: RoundSummary, rollout: Rollout) -> None:
        """PPO, LSTM and phase-time events, and the anomaly check of this round's update."""
        stats, telemetry = summary.statistics, self.telemetry
        epoch = summary.round * self.config.episode_length  # the env-epoch clock escalation counts in
        lstm = self.detector.lstm_health.check(*rollout.final_state)  # one sync
        # Heads no sampled op needed have no entropy to judge (one sync).
        ops = rollout.batch.actions[..., 0]
        heads_used = self.state.agent.policy.relevant_heads(ops).flatten(0, 1).any(0).tolist()
        used = [i for i, flag in enumerate(heads_used) if flag and self.space.sizes[i] > 1]
        diagnostics = PPODiagnostics(
            ratio_max=stats.ratio_max, ratio_min=stats.ratio_min, value_std=stats.value_std,
            return_std=stats.return_std, entropy_per_head=tuple((HEADS[i], stats.entropy_per_head[i]) for i in used),
            max_entropy_per_head=tuple((HEADS[i], math.log(self.space.sizes[i])) for i in used),
            approx_kl=stats.approx_kl, target_kl=self.config.ppo.target_kl, grad_norm=stats.grad_norm, lstm=lstm)
        telemetry.report_anomalies(self.detector.check(diagnostics), epoch=epoch)
        telemetry.emit(events.PPOUpdateCompleted(
            epoch=epoch, env_id=ALL_ENVS, round=summary.round, policy_loss=stats.policy_loss,
            value_loss=stats.value_loss, entropy_loss=stats.entropy_loss,
            entropy_per_head=tuple(zip(HEADS, stats.entropy_per_head, strict=True)), approx_kl=stats.approx_kl,
            clip_fraction=stats.clip_fraction, explained_variance=stats.explained_variance,
            grad_norm=stats.grad_norm, epochs_completed=stats.epochs_completed, early_stopped=stats.early_stopped))
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


def format_round(summary: RoundSummary) -> str:
    """The one line printed per round (about 120 columns); the entropy of every head is in telemetry and the report."""
    stats = summary.statistics
    return (f"round {summary.round:3d}  return {summary.mean_return:+7.3f}  acc {summary.mean_final_accuracy:6.2f}%  "
            f"added {summary.mean_parameters_added:>7,.0f}  "
            f"fossil {summary.fossilized:.1f} pruned {summary.pruned:.1f}  "
            f"kl {stats.approx_kl:.4f}  vloss {stats.value_loss:.4f}  ev {stats.explained_variance:+.2f}  "
            f"{summary.seconds:5.1f}s")


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
