"""Many episodes stepped in lockstep on one shared batch stream (docs/architecture.md#one-step).

Every env trains on the same training batches in the same order (they differ in host seed and in
what their controllers grow), so data is loaded and augmented once per batch, not once per env, and
the controller sees all envs at once: one batched policy call per step.

CUDA rules (docs/architecture.md#devices-and-cuda-streams): each env trains on its own persistent stream. A batch
produced on the current stream and read on an env's stream is marked with `record_stream`, so the caching allocator
does not hand its memory to someone else while that stream may still read it. The input batch and every tensor derived
from it on the producing stream (the augmented images) are recorded, not only the derived ones. One synchronize per
phase (per device), before the epoch's metrics are read.

Several devices (`devices`): env i runs on `devices[i % len(devices)]`; the batch is produced on the
first and copied once per other device (`env/placement.py` says what lives where).

Paired baselines (`baselines=True`): every env gets a twin, the same host (same seed) trained on the
same batches without growth. Each step's result carries the twin's reward for that epoch
(`StepResult.baseline_reward`): what the epoch would have earned without growth, whatever the
controller did. Subtracting it removes from an episode's return the part that the host's seed decides
(how well this initialization trains at all), which no action can change. Twins emit no telemetry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import torch
from torch import Tensor

from morphogen.data import Task
from morphogen.env.actions import Action
from morphogen.env.batched import train_epoch_batched
from morphogen.env.episode import EpisodeConfig, MorphogenesisEpisode, StepResult
from morphogen.env.placement import DevicePlacement
from morphogen.env.seeding import TRAINING_RNG_STREAM, derive_seed, seeded
from morphogen.env.snapshot import EpisodeSnapshot
from morphogen.inputs import Inputs, tensors
from morphogen.telemetry.anomalies import AnomalyDetector
from morphogen.telemetry.profiler import PhaseTimer
from morphogen.telemetry.sinks import Telemetry


class VectorEpisodes:
    """`n_envs` episodes of one task, reset and stepped together."""

    def __init__(self, task: Task, config: EpisodeConfig, n_envs: int, *, seed: int = 0,
                 slots: Sequence[str] | None = None, telemetry: Telemetry | None = None,
                 pool_slots: bool = False, first_env: int = 0,
                 devices: Sequence[str | torch.device] | None = None, baselines: bool = False,
                 round_epochs: int | None = None) -> None:
        """`first_env` is the global index of this vector's first env: a distributed rank owning envs
        `first_env .. first_env + n_envs - 1` of a larger run gives them the seeds and ids they have there.
        `devices` spreads the envs over devices (the task's data must be on the first); None: the task's device.
        `baselines` trains a no-growth twin beside every env (see the module docstring). `round_epochs` (default
        the episode length) is how far the env-epoch clock of telemetry advances per episode index."""
        if n_envs < 1:
            raise ValueError(f"n_envs must be >= 1, got {n_envs}")
        if first_env < 0:
            raise ValueError(f"first_env must be >= 0, got {first_env}")
        self.task, self.config, self.seed, self.first_env = task, config, seed, first_env
        self.placement = DevicePlacement(task, n_envs, devices)
        self.episodes = [
            MorphogenesisEpisode(self.placement.task_for(i), config, seed=seed, slots=slots, telemetry=telemetry,
                                 env_id=first_env + i, pool_slots=pool_slots)
            for i in range(n_envs)
        ]
        #: The no-growth twin of each env (empty without `baselines`).
        self.twins = [
            MorphogenesisEpisode(self.placement.task_for(i), config, seed=seed, slots=slots, env_id=first_env + i,
                                 pool_slots=pool_slots)
            for i in range(n_envs if baselines else 0)
        ]
        self.device = task.train.device
        self.streams = self.placement.streams
        self.batch_size = config.batch_size or task.batch_size
        self.generator = torch.Generator(device="cpu")
        self.telemetry = telemetry or Telemetry(None, level="off")
        self.episode_index = 0
        self.round_epochs = config.max_epochs if round_epochs is None else round_epochs

    def attach(self, telemetry: Telemetry, timer: PhaseTimer, detector: AnomalyDetector | None = None) -> None:
        """Send every env's events to `telemetry`, time their phases with one shared `timer`."""
        self.telemetry = telemetry
        for episode in self.episodes:
            episode.telemetry, episode.timer, episode.detector = telemetry, timer, detector

    @property
    def n_envs(self) -> int:
        return len(self.episodes)

    def reset(self, episode_index: int) -> list[EpisodeSnapshot]:
        """Fresh hosts for every env; seeds and the batch order are derived from (seed, episode_index, env),
        env being the global index (`first_env + i`)."""
        self.generator.manual_seed(derive_seed(self.seed, episode_index, 1_000_003))
        self.episode_index = episode_index
        snapshots = []
        for i, episode in enumerate(self.episodes):
            episode.seed = derive_seed(self.seed, episode_index, self.first_env + i)
            snapshots.append(episode.reset())
        for twin, episode in zip(self.twins, self.episodes, strict=False):
            twin.seed = episode.seed
            twin.compile_settings = episode.compile_settings
            twin.reset()
        return snapshots

    def masks(self) -> list[list[np.ndarray]]:
        return [episode.masks() for episode in self.episodes]

    def step(self, actions: Sequence[Action]) -> list[StepResult]:
        """Apply one action per env, train every env one epoch on the shared batches, finish the epoch."""
        if len(actions) != self.n_envs:
            raise ValueError(f"expected {self.n_envs} actions, got {len(actions)}")
        outcomes = [episode.apply_action(action) for episode, action in zip(self.episodes, actions, strict=True)]
        waits = [twin.apply_action(Action()) for twin in self.twins]
        epoch_seed = derive_seed(self.seed, self.episode_index, self.episodes[0].epoch, TRAINING_RNG_STREAM)
        with seeded(epoch_seed, *self.placement.devices):
            batches: Iterable[tuple[Inputs, Tensor]] = self.task.train.iterate_batches(
                self.batch_size, generator=self.generator, augment=self.task.augment)
            if self.twins:
                batches = self._training_twins(batches)
            if self.config.batch_identical:
                train_epoch_batched(self.episodes, batches, self._train_all, self.streams,
                                    copy_batch=self.placement.copy_batch)
            else:
                for inputs, targets in batches:
                    self._train_all(inputs, targets)
        self.placement.synchronize()  # one sync per phase and CUDA device: env streams done before reading metrics
        results = [episode.finish_epoch(action, succeeded, reason)
                   for episode, action, (succeeded, reason) in zip(self.episodes, actions, outcomes, strict=True)]
        if self.twins:
            twin_results = [twin.finish_epoch(Action(), succeeded, reason)
                            for twin, (succeeded, reason) in zip(self.twins, waits, strict=True)]
            results = [dataclasses.replace(result, baseline_reward=twin.reward.total)
                       for result, twin in zip(results, twin_results, strict=True)]
        # Once per vector step, on the env-epoch clock that keeps rising across episodes.
        self.telemetry.end_epoch(self.episode_index * self.round_epochs + self.episodes[0].epoch)
        return results

    def _training_twins(self, batches: Iterable[tuple[Inputs, Tensor]]) -> Iterator[tuple[Inputs, Tensor]]:
        """`batches`, each first trained on by every no-growth twin (on its env's device)."""
        for inputs, targets in batches:
            copies = self.placement.copy_batch(inputs, targets)
            for twin, device in zip(self.twins, self.placement.env_devices, strict=False):
                twin.train_shared_batch(*copies[device])
            yield inputs, targets

    def _train_all(self, inputs: Inputs, targets: Tensor, indices: Sequence[int] | None = None) -> None:
        """Train every env (or those at `indices`) on one shared batch, timed under each env's "train" phase
        (on CUDA that is the time to queue the work; the device time lands in the phase's one synchronize)."""
        batches = self.placement.copy_batch(inputs, targets)  # one copy per device, not per env
        streams = self.streams or [None] * self.n_envs
        for index in range(self.n_envs) if indices is None else indices:
            episode, stream, device = self.episodes[index], streams[index], self.placement.env_devices[index]
            device_inputs, device_targets = batches[device]
            with episode.timer.phase("train"):
                if stream is None:
                    episode.train_shared_batch(device_inputs, device_targets)
                    continue
                # The batch is produced (copied/augmented) on the current stream of the env's device.
                stream.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(stream):
                    for tensor in (*tensors(device_inputs), device_targets):
                        tensor.record_stream(stream)
                    episode.train_shared_batch(device_inputs, device_targets)
