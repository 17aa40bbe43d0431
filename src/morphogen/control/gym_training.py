"""`train_gym`: the PPO agent of `ppo.py` on any Gymnasium environment with a Box observation and a
Discrete or MultiDiscrete action space.

Action masks: an env that says which actions are legal has them obeyed. Where the reset's `info` holds
`"action_mask"` (Gymnasium's convention: one array for a Discrete space, one per head for a MultiDiscrete one),
every step's masks are read from there; else, where the env has an `action_masks()` method (sb3-contrib's
`MaskablePPO` convention: one flat vector, the heads' masks one after the other), from it. The masks of each step
are stored with the rollout, so acting and the update's log-probabilities use the same masked logits. A head whose
mask allows nothing is drawn from all its values alike (the env ignores it: in morphogen's, no legal op reads it) and
learns nothing from that step. An env that gives neither is trained unmasked.
"""

from __future__ import annotations

import enum
import math
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import gymnasium
import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from torch import Tensor

from morphogen.control.normalization import RewardNormalizer, RunningMeanStd
from morphogen.control.policy import FactoredLSTMPolicy
from morphogen.control.ppo import PPOConfig, build_optimizer, ppo_update
from morphogen.control.rollout import RolloutBatch, RolloutBuffer

RECENT_EPISODES = 20
"""The progress bar of `train_gym` shows the mean return of this many latest episodes."""


class GymTraining(NamedTuple):
    """What `train_gym` learned and how it got there."""

    returns: list[float]
    """The return of every finished episode, in the order they ended."""
    end_steps: list[int]
    """The env steps taken (over all envs) when each of those episodes ended."""
    policy: FactoredLSTMPolicy
    """The trained policy (it acts on observations standardized by `observation_normalizer`)."""
    observation_normalizer: RunningMeanStd


def _space_layout(env: gymnasium.Env[Any, Any], env_id: str) -> tuple[int, tuple[int, ...], np.ndarray]:
    """(observation size, action sizes, action offsets) of a Box-observation, (Multi)Discrete-action env."""
    observation_space = env.observation_space
    if not isinstance(observation_space, gymnasium.spaces.Box):
        raise ValueError(
            f"train_gym needs a Box observation space, but {env_id} has {observation_space}; register a "
            "version of the env wrapped in gymnasium.wrappers.FlattenObservation"
        )
    action_space = env.action_space
    if isinstance(action_space, gymnasium.spaces.Discrete):
        return int(np.prod(observation_space.shape)), (int(action_space.n),), np.array([action_space.start])
    if isinstance(action_space, gymnasium.spaces.MultiDiscrete) and action_space.nvec.ndim == 1:
        sizes = tuple(int(size) for size in action_space.nvec)
        return int(np.prod(observation_space.shape)), sizes, np.asarray(action_space.start, dtype=np.int64)
    raise ValueError(
        f"train_gym supports Discrete and one-dimensional MultiDiscrete action spaces, but {env_id} has "
        f"{action_space}; discretize continuous actions with a wrapper, or use a continuous-control algorithm"
    )


class _MaskSource(enum.Enum):
    """Where an env's action masks come from (`_mask_source`)."""

    INFO = "info"
    """`info["action_mask"]` of every reset and step."""
    METHOD = "method"
    """The env's `action_masks()`, called after every reset and step."""


def _mask_source(env: gymnasium.Env[Any, Any], reset_info: Mapping[str, Any]) -> _MaskSource | None:
    """Where `env` (just reset, with `reset_info`) gives its action masks; None where it gives none."""
    if "action_mask" in reset_info:
        return _MaskSource.INFO
    if env.has_wrapper_attr("action_masks"):
        return _MaskSource.METHOD
    return None


def _head_masks(env: gymnasium.Env[Any, Any], info: Mapping[str, Any], source: _MaskSource,
                action_sizes: Sequence[int], env_id: str) -> list[np.ndarray]:
    """The env's masks of this step, one bool array [n_i] per head, read from `source`."""
    if source is _MaskSource.INFO:
        if "action_mask" not in info:
            raise ValueError(f"{env_id} gave info['action_mask'] at reset but not after a step; give it every step")
        given = info["action_mask"]
        one_array = len(action_sizes) == 1 and np.ndim(given) == 1  # a Discrete space's one mask
        masks = [np.asarray(given)] if one_array else [np.asarray(mask) for mask in given]
    else:
        flat = np.asarray(env.get_wrapper_attr("action_masks")()).reshape(-1)
        if flat.size != sum(action_sizes):
            raise ValueError(f"{env_id}.action_masks() must give {sum(action_sizes)} entries (the heads' sizes "
                             f"{tuple(action_sizes)} one after the other), got {flat.size}")
        masks = np.split(flat, np.cumsum(action_sizes)[:-1])
    shapes = tuple(mask.shape for mask in masks)
    if shapes != tuple((size,) for size in action_sizes):
        raise ValueError(f"{env_id}'s info['action_mask'] must hold one array per head of sizes "
                         f"{tuple(action_sizes)}, got shapes {shapes}")
    return [mask.astype(bool) for mask in masks]


class _GymCollector:
    """Steps a list of Gymnasium envs with the policy and fills a RolloutBuffer.

    Envs are reset by hand when an episode ends rather than by a vector env's autoreset: the final
    observation of a truncated episode is at hand to bootstrap from, and the transitions do not
    depend on the autoreset mode of the installed gymnasium (1.x vector envs default to NEXT_STEP,
    which would insert a step whose action is ignored after every episode end).
    Observations are standardized and rewards scaled by running statistics; the episode returns
    it records are the raw ones. Where the envs give action masks (the module docstring), acting
    obeys them and every row of the rollout stores them.
    """

    def __init__(
        self,
        envs: Sequence[gymnasium.Env[Any, Any]],
        policy: FactoredLSTMPolicy,
        action_offsets: np.ndarray,
        config: PPOConfig,
        seed: int,
        env_id: str,
    ) -> None:
        self.envs = envs
        self.policy = policy
        self.action_offsets = action_offsets
        self.config = config
        self.env_id = env_id
        self.discrete = isinstance(envs[0].action_space, gymnasium.spaces.Discrete)
        self.observation_normalizer = RunningMeanStd((policy.observation_size,))
        self.reward_normalizer = RewardNormalizer(len(envs), gamma=config.gamma)
        resets = [env.reset(seed=seed + index) for index, env in enumerate(envs)]
        self.mask_source = _mask_source(envs[0], resets[0][1])
        #: Each env's masks of the step to come, one bool array per head (empty lists without masks).
        self.env_masks = [self._masks_of(env, info) for env, (_, info) in zip(envs, resets, strict=True)]
        self.observation = self._observe([raw for raw, _ in resets], update=True)  # [B, obs], normalized
        self.state = policy.initial_state(len(envs))
        self.episode_starts = torch.ones(len(envs), dtype=torch.bool)
        self.running_returns = np.zeros(len(envs))
        self.episode_returns: list[float] = []
        self.episode_end_steps: list[int] = []
        self.steps = 0

    def _observe(self, raw_observations: Sequence[Any], *, update: bool) -> Tensor:
        """Raw observations stacked to [B, obs] float32 and standardized (updating the statistics if asked)."""
        stacked = np.stack([np.asarray(o, dtype=np.float32).reshape(-1) for o in raw_observations])
        observation = torch.from_numpy(stacked)
        if update:
            self.observation_normalizer.update(observation)
        return self.observation_normalizer.normalize(observation)

    @property
    def mask_shapes(self) -> list[tuple[int, ...]] | None:
        """The shape of one env's mask per head, as a RolloutBuffer stores them; None without masks."""
        return None if self.mask_source is None else [(size,) for size in self.policy.action_sizes]

    def _masks_of(self, env: gymnasium.Env[Any, Any], info: Mapping[str, Any]) -> list[np.ndarray]:
        """`env`'s masks after the reset or step that gave `info`; [] where the envs give none."""
        if self.mask_source is None:
            return []
        return _head_masks(env, info, self.mask_source, self.policy.action_sizes, self.env_id)

    def _stacked_masks(self) -> tuple[Tensor, ...] | None:
        """The envs' masks as one bool tensor [B, n_i] per head; None without masks."""
        if self.mask_source is None:
            return None
        return tuple(torch.from_numpy(np.stack([masks[head] for masks in self.env_masks]))
                     for head in range(len(self.policy.action_sizes)))

    def _step_envs(self, actions: Tensor) -> tuple[list[Any], np.ndarray, np.ndarray, np.ndarray]:
        """Step each env with its row of ``actions [B, H]`` and keep its masks for the next step; return (next raw
        observations, rewards, terminated, truncated)."""
        env_actions = actions.numpy() + self.action_offsets  # [B, H], in the action space's own range
        steps = [
            env.step(int(chosen[0]) if self.discrete else chosen)
            for env, chosen in zip(self.envs, env_actions, strict=True)
        ]
        self.env_masks = [self._masks_of(env, step[4]) for env, step in zip(self.envs, steps, strict=True)]
        return (
            [step[0] for step in steps],
            np.array([float(step[1]) for step in steps]),
            np.array([bool(step[2]) for step in steps]),
            np.array([bool(step[3]) for step in steps]),
        )

    def collect(self, buffer: RolloutBuffer, generator: torch.Generator) -> RolloutBatch:
        """Run ``buffer.rollout_length`` steps of every env and return the finished batch."""
        buffer.reset(self.state)
        for _ in range(buffer.rollout_length):
            masks = self._stacked_masks()
            action = self.policy.act(
                self.observation, self.state, masks, generator=generator, episode_starts=self.episode_starts
            )
            next_raw, rewards, terminated, truncated = self._step_envs(action.actions)
            done = terminated | truncated
            truncation_values = None
            if truncated.any():
                # V(final observation), seen with the state that continued the cut episode.
                final = self._observe(next_raw, update=False)
                truncation_values = self.policy.predict_value(final, action.state)
            buffer.add(
                self.observation,
                self.episode_starts,
                action,
                self.reward_normalizer.update(torch.from_numpy(rewards), torch.from_numpy(done)),
                torch.from_numpy(terminated),
                torch.from_numpy(truncated),
                truncation_values=truncation_values,
                action_masks=masks,
            )
            self.running_returns += rewards
            self.steps += len(self.envs)
            for index in np.flatnonzero(done):
                self.episode_returns.append(float(self.running_returns[index]))
                self.episode_end_steps.append(self.steps)
                self.running_returns[index] = 0.0
                env = self.envs[int(index)]
                next_raw[index], info = env.reset()
                self.env_masks[index] = self._masks_of(env, info)
            self.observation = self._observe(next_raw, update=True)
            self.state = action.state
            self.episode_starts = torch.from_numpy(done)
        last_value = self.policy.predict_value(self.observation, self.state, episode_starts=self.episode_starts)
        return buffer.finish(last_value, gamma=self.config.gamma, gae_lambda=self.config.gae_lambda)


def train_gym(
    env_id: str,
    total_steps: int,
    seed: int = 0,
    *,
    config: PPOConfig | None = None,
    n_envs: int = 4,
    rollout_length: int = 128,
    hidden_size: int = 64,
    bptt_length: int | None = None,
    recurrent: bool = True,
    progress: bool | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
) -> GymTraining:
    """Train a FactoredLSTMPolicy with PPO on ``n_envs`` copies of a Gymnasium env; return it with its episodes.

    The env needs a Box observation space and a Discrete or MultiDiscrete action space. Observations
    are standardized by running statistics and rewards divided by the running std of the discounted
    return (both clipped to 10), so one configuration suits envs of any reward scale. Training runs whole rounds of
    ``n_envs * rollout_length`` env steps until at least ``total_steps`` were taken. Everything is
    seeded from ``seed``; the returns of completed episodes come back in the order they ended.
    ``bptt_length`` cuts every rollout into sequences of that many steps for the update (truncated BPTT, each
    re-run from the LSTM state acting had at its start): shorter, more numerous sequences make cheaper and
    more minibatches (``config.minibatches`` counts them); None re-runs whole rollouts.
    ``recurrent=False`` trains a feed-forward policy (two tanh layers, no LSTM) for tasks whose observation
    is the whole state: on Acrobot it learned on every seed where the LSTM policy sometimes never reached the
    goal (`benchmarks/ppo_vs_sb3.py`).
    ``env_kwargs`` go to every ``gymnasium.make`` (``{"task": "digits", "max_train_samples": 500}`` for morphogen's
    own env). An env that gives action masks (``info["action_mask"]`` or ``action_masks()``, as morphogen's own
    does) has them obeyed in acting and in the update (the module docstring). ``progress`` draws a bar with ETA
    and the recent mean return on stderr; None draws it only when stderr is a terminal, so logs and notebooks'
    captured output stay clean.
    """
    for name, value in (
        ("total_steps", total_steps),
        ("n_envs", n_envs),
        ("rollout_length", rollout_length),
        ("hidden_size", hidden_size),
    ):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if bptt_length is not None and (bptt_length < 1 or rollout_length % bptt_length):
        raise ValueError(f"bptt_length must divide rollout_length ({rollout_length}), got {bptt_length}")
    config = PPOConfig() if config is None else config
    envs: list[gymnasium.Env[Any, Any]] = []
    try:
        # Made inside the `try`: when one fails, those made before it are closed.
        envs.extend(gymnasium.make(env_id, **dict(env_kwargs or {})) for _ in range(n_envs))
        observation_size, action_sizes, action_offsets = _space_layout(envs[0], env_id)
        # Seed the initialization without disturbing the caller's global RNG.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            policy = FactoredLSTMPolicy(observation_size, action_sizes, hidden_size=hidden_size, recurrent=recurrent)
        generator = torch.Generator().manual_seed(seed)
        optimizer = build_optimizer(policy, config)
        collector = _GymCollector(envs, policy, action_offsets, config, seed, env_id)
        buffer = RolloutBuffer(rollout_length, n_envs, observation_size, len(action_sizes), hidden_size,
                               mask_shapes=collector.mask_shapes)
        n_rounds = math.ceil(total_steps / (n_envs * rollout_length))
        show = sys.stderr.isatty() if progress is None else progress
        with Progress(TextColumn("train_gym {task.description}"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("{task.fields[recent]}"), TimeRemainingColumn(),
                      console=Console(stderr=True, force_terminal=show), disable=not show, transient=True) as bar:
            rounds = bar.add_task(env_id, total=n_rounds, recent="")
            for round_index in range(n_rounds):
                batch = collector.collect(buffer, generator)
                if bptt_length is not None:
                    batch = batch.in_chunks(bptt_length)
                ppo_update(policy, optimizer, batch, config, round_index / n_rounds, generator=generator)
                recent = collector.episode_returns[-RECENT_EPISODES:]
                bar.update(rounds, advance=1, recent=f"return {np.mean(recent):.1f}" if recent else "")
        return GymTraining(collector.episode_returns, collector.episode_end_steps, policy,
                           collector.observation_normalizer)
    finally:
        for env in envs:
            env.close()
