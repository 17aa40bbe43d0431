"""Rollout storage for recurrent, factored-action PPO, and generalized advantage estimation.

Row ``t`` of a rollout holds what one step of B envs produced: the observation the policy saw, whether
it was the first of an episode (``episode_starts``; the LSTM state was zeroed before it), the action
and its log-probs, V(s), then the reward and whether that step ended the episode by termination
(a true end: nothing follows, the bootstrap is 0) or by truncation (a cut: the episode would have
gone on, so the bootstrap is V(final observation), which the caller passes as ``truncation_values``).

Rules:

- All storage is allocated once, on one device; ``add`` writes one row with tensor copies and
  never synchronizes with the host. ``finish`` makes one host sync (a check that every truncated
  step came with its bootstrap value) and returns copies, so the buffer can be refilled while the
  batch is still in use.
- A rollout is a segment of ``rollout_length`` steps that may cut through episodes; the LSTM state
  before its first step is stored so PPO can re-run each env's sequence from exactly that state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from morphogen.control.policy import ActionOutput, LSTMState, Observation, map_observation

__all__ = ["RolloutBatch", "RolloutBuffer", "generalized_advantage_estimation"]


def generalized_advantage_estimation(
    rewards: Tensor,
    values: Tensor,
    next_values: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[Tensor, Tensor]:
    """GAE(gamma, lambda) of Schulman et al. (2016) over ``[T, B]`` tensors; returns (advantages, returns).

    ``next_values[t]`` is V(s_{t+1}), except where the episode was truncated at step t: there it is
    V(final observation of the cut episode). With ``done = terminated | truncated``:

        delta_t = r_t + gamma * (1 - terminated_t) * next_values_t - values_t
        A_t     = delta_t + gamma * lambda * (1 - done_t) * A_{t+1}        (A_T = 0)
        returns = A + values

    So a terminated step bootstraps from 0, a truncated one from the value of its final
    observation, and in both cases no advantage flows back across the episode boundary.
    """
    shape = tuple(values.shape)
    if len(shape) != 2:
        raise ValueError(f"values must have shape [T, B], got {shape}")
    for name, tensor in (
        ("rewards", rewards),
        ("next_values", next_values),
        ("terminated", terminated),
        ("truncated", truncated),
    ):
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{name} must have the shape of values {shape}, got {tuple(tensor.shape)}")
    terminated = terminated.bool()
    not_terminated = (~terminated).to(values.dtype)
    continues = (~(terminated | truncated.bool())).to(values.dtype)
    deltas = rewards.to(values.dtype) + gamma * not_terminated * next_values - values  # [T, B]
    advantages = torch.empty_like(values)
    running = torch.zeros_like(values[0])  # [B]
    for step in range(shape[0] - 1, -1, -1):
        running = deltas[step] + gamma * gae_lambda * continues[step] * running
        advantages[step] = running
    return advantages, advantages + values


class RolloutBatch(NamedTuple):
    """One finished rollout of T steps of B envs, ready for a PPO update (all tensors on one device)."""

    observations: Observation
    """[T, B, obs], or a NamedTuple of tensors each [T, B, ...] (`GrowthInputs`)"""
    actions: Tensor
    """[T, B, H] long"""
    log_probs: Tensor
    """[T, B] joint log-prob at collection time"""
    log_prob_per_head: Tensor
    """[T, B, H] per-head log-probs at collection time (0 where a head did not matter)"""
    values: Tensor
    """[T, B] V(s) at collection time"""
    advantages: Tensor
    """[T, B] GAE advantages"""
    returns: Tensor
    """[T, B] value targets: advantages + values"""
    episode_starts: Tensor
    """[T, B] bool: the observation is the first of an episode"""
    initial_state: LSTMState
    """(h, c), each [1, B, hidden]: the LSTM state before step 0"""
    action_masks: tuple[Tensor, ...] | None
    """one bool tensor per head, [T, B, *mask shape], or None if nothing was masked"""
    step_states: LSTMState | None = None
    """(h, c), each [T, B, hidden]: the LSTM state before every step (row 0 is `initial_state`), as acting saw
    it; what `in_chunks` starts each chunk from. None when not kept."""

    @property
    def n_envs(self) -> int:
        """B, the number of env sequences."""
        return int(self.actions.shape[1])

    def in_chunks(self, length: int) -> RolloutBatch:
        """The batch cut into sequences of `length` steps (truncated BPTT): chunk k of env b becomes sequence
        ``k * B + b``, re-run from the LSTM state acting had before its first step. Advantages and returns were
        computed over the whole rollout and are only moved. `length` must divide T."""
        steps, envs = self.actions.shape[:2]
        if self.step_states is None:
            raise ValueError("this batch kept no step states: collect it with a RolloutBuffer (which keeps them)")
        if length < 1 or steps % length:
            raise ValueError(f"chunks of {length} steps must divide the rollout's {steps} steps")
        chunks = steps // length

        def cut(tensor: Tensor) -> Tensor:  # [T, B, ...] -> [length, chunks * B, ...]
            rest = tensor.shape[2:]
            return tensor.reshape(chunks, length, envs, *rest).transpose(0, 1).reshape(length, chunks * envs, *rest)

        def starts(tensor: Tensor) -> Tensor:  # [T, B, hidden] -> [1, chunks * B, hidden]
            return tensor[::length].reshape(1, chunks * envs, tensor.shape[-1])

        return RolloutBatch(
            observations=map_observation(self.observations, cut), actions=cut(self.actions),
            log_probs=cut(self.log_probs), log_prob_per_head=cut(self.log_prob_per_head), values=cut(self.values),
            advantages=cut(self.advantages), returns=cut(self.returns), episode_starts=cut(self.episode_starts),
            initial_state=(starts(self.step_states[0]), starts(self.step_states[1])),
            action_masks=None if self.action_masks is None else tuple(cut(mask) for mask in self.action_masks),
            step_states=(cut(self.step_states[0]), cut(self.step_states[1])),
        )

    def select_envs(self, env_indices: Tensor) -> RolloutBatch:
        """The whole sequences of the envs in ``env_indices`` (long, on the batch's device)."""
        masks = None
        if self.action_masks is not None:
            masks = tuple(mask.index_select(1, env_indices) for mask in self.action_masks)
        return RolloutBatch(
            observations=map_observation(self.observations, lambda tensor: tensor.index_select(1, env_indices)),
            actions=self.actions.index_select(1, env_indices),
            log_probs=self.log_probs.index_select(1, env_indices),
            log_prob_per_head=self.log_prob_per_head.index_select(1, env_indices),
            values=self.values.index_select(1, env_indices),
            advantages=self.advantages.index_select(1, env_indices),
            returns=self.returns.index_select(1, env_indices),
            episode_starts=self.episode_starts.index_select(1, env_indices),
            initial_state=(
                self.initial_state[0].index_select(1, env_indices),
                self.initial_state[1].index_select(1, env_indices),
            ),
            action_masks=masks,
            step_states=None if self.step_states is None else (self.step_states[0].index_select(1, env_indices),
                                                              self.step_states[1].index_select(1, env_indices)),
        )


class RolloutBuffer:
    """Pre-allocated storage for ``rollout_length`` steps of ``n_envs`` envs.

    Use: ``reset(state)`` with the LSTM state before the first step, then ``add`` once per step,
    then ``finish(last_value, gamma=..., gae_lambda=...)`` for the batch; ``reset`` again to refill.
    ``observation`` is the size of a flat observation, or an observation of one step of the B envs
    (a NamedTuple of tensors, each [B, ...]) whose shapes and dtypes every row takes.
    ``mask_shapes`` gives the per-env shape of each head's mask (e.g. ``(n_ops,)`` for the op and
    ``(n_ops, n_slots)`` for an op-conditioned slot mask); None if the env has no masks.
    """

    def __init__(
        self,
        rollout_length: int,
        n_envs: int,
        observation: int | Observation,
        n_heads: int,
        hidden_size: int,
        *,
        mask_shapes: Sequence[tuple[int, ...]] | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        for name, size in (
            ("rollout_length", rollout_length),
            ("n_envs", n_envs),
            ("n_heads", n_heads),
            ("hidden_size", hidden_size),
        ):
            if size < 1:
                raise ValueError(f"{name} must be >= 1, got {size}")
        if isinstance(observation, int) and observation < 1:
            raise ValueError(f"observation_size must be >= 1, got {observation}")
        if mask_shapes is not None and len(mask_shapes) != n_heads:
            raise ValueError(f"mask_shapes must have one shape per head ({n_heads}), got {len(mask_shapes)}")
        self.rollout_length = rollout_length
        self.n_envs = n_envs
        self.hidden_size = hidden_size
        steps_envs = (rollout_length, n_envs)
        if isinstance(observation, int):
            self.observations = torch.zeros((*steps_envs, observation), device=device, dtype=dtype)
        else:
            self.observations = map_observation(observation, lambda tensor: torch.zeros(
                (rollout_length, *tensor.shape), device=device,
                dtype=dtype if tensor.dtype.is_floating_point else tensor.dtype))
        self.actions = torch.zeros((*steps_envs, n_heads), device=device, dtype=torch.long)
        self.log_probs = torch.zeros(steps_envs, device=device, dtype=dtype)
        self.log_prob_per_head = torch.zeros((*steps_envs, n_heads), device=device, dtype=dtype)
        self.values = torch.zeros(steps_envs, device=device, dtype=dtype)
        self.rewards = torch.zeros(steps_envs, device=device, dtype=dtype)
        self.truncation_values = torch.zeros(steps_envs, device=device, dtype=dtype)
        self.terminated = torch.zeros(steps_envs, device=device, dtype=torch.bool)
        self.truncated = torch.zeros(steps_envs, device=device, dtype=torch.bool)
        self.episode_starts = torch.zeros(steps_envs, device=device, dtype=torch.bool)
        # Whether each row came with truncation values; checked against `truncated` in finish().
        self.truncation_values_given = torch.zeros(rollout_length, device=device, dtype=torch.bool)
        self.action_masks: tuple[Tensor, ...] | None = None
        if mask_shapes is not None:
            self.action_masks = tuple(
                torch.zeros((*steps_envs, *shape), device=device, dtype=torch.bool) for shape in mask_shapes
            )
        # The LSTM state before every step; row 0 is the state before the segment.
        self.step_hidden = torch.zeros((rollout_length, n_envs, hidden_size), device=device, dtype=dtype)
        self.step_cell = torch.zeros((rollout_length, n_envs, hidden_size), device=device, dtype=dtype)
        self.position = 0
        self._started = False

    @property
    def full(self) -> bool:
        """True when all ``rollout_length`` rows are written."""
        return self.position == self.rollout_length

    def reset(self, initial_state: LSTMState) -> None:
        """Start a new segment; ``initial_state`` ((h, c), [1, B, hidden]) is the state before step 0."""
        expected = (1, self.n_envs, self.hidden_size)
        for name, tensor in zip(("h", "c"), initial_state, strict=True):
            if tuple(tensor.shape) != expected:
                raise ValueError(f"initial_state {name} must have shape {expected}, got {tuple(tensor.shape)}")
        self.step_hidden[0].copy_(initial_state[0][0])
        self.step_cell[0].copy_(initial_state[1][0])
        self.truncation_values_given.zero_()
        self.position = 0
        self._started = True

    def add(
        self,
        observation: Observation,
        episode_starts: Tensor,
        action: ActionOutput,
        reward: Tensor,
        terminated: Tensor,
        truncated: Tensor,
        *,
        action_masks: Sequence[Tensor] | None = None,
        truncation_values: Tensor | None = None,
    ) -> None:
        """Write one step: ``observation`` (leading [B], as the policy saw it), ``episode_starts [B]``, the
        policy's ``action`` for it, and the env's ``reward``, ``terminated``, ``truncated`` (each [B]).
        ``action.state`` is kept as the state before the next step.

        ``truncation_values [B]`` is V(final observation) for envs truncated at this step (other
        entries are ignored); it may be None only if no env was truncated. ``action_masks`` (one per
        head, [B, *mask shape]) are required iff the buffer stores them.
        """
        if not self._started:
            raise RuntimeError("call reset(initial_state) before add(): the LSTM state before step 0 is needed")
        if self.full:
            raise RuntimeError(f"the buffer is full ({self.rollout_length} steps): call finish(), then reset()")
        if (action_masks is None) != (self.action_masks is None):
            raise ValueError("pass action_masks iff the buffer was built with mask_shapes")
        row = self.position
        if isinstance(self.observations, Tensor):
            self.observations[row].copy_(observation)
        else:
            for stored, given in zip(self.observations, observation, strict=True):
                stored[row].copy_(given)
        self.episode_starts[row].copy_(episode_starts)
        self.actions[row].copy_(action.actions)
        self.log_probs[row].copy_(action.log_prob)
        self.log_prob_per_head[row].copy_(action.log_prob_per_head)
        self.values[row].copy_(action.value)
        if row + 1 < self.rollout_length:
            self.step_hidden[row + 1].copy_(action.state[0][0])
            self.step_cell[row + 1].copy_(action.state[1][0])
        self.rewards[row].copy_(reward)
        self.terminated[row].copy_(terminated)
        self.truncated[row].copy_(truncated)
        if truncation_values is not None:
            self.truncation_values[row].copy_(truncation_values)
            self.truncation_values_given[row] = True
        if action_masks is not None and self.action_masks is not None:
            if len(action_masks) != len(self.action_masks):
                raise ValueError(f"action_masks must have one mask per head ({len(self.action_masks)})")
            for stored, mask in zip(self.action_masks, action_masks, strict=True):
                stored[row].copy_(mask)
        self.position += 1

    def finish(self, last_value: Tensor, *, gamma: float, gae_lambda: float) -> RolloutBatch:
        """Compute advantages and returns and return the batch (copies of the storage).

        ``last_value [B]`` is V of the observation after the last step (the first of a new episode
        where the last step ended one; it is then unused).
        """
        if not self.full:
            raise RuntimeError(
                f"finish() needs a full rollout: {self.position} of {self.rollout_length} steps were added"
            )
        # Host sync (one per rollout): a truncated step without its bootstrap value would silently
        # be treated as a termination.
        missing = self.truncated & ~self.truncation_values_given.unsqueeze(1)
        if bool(missing.any()):
            raise ValueError(
                "some envs were truncated at steps added without truncation_values; pass "
                "truncation_values=V(final observation) to add() whenever any env is truncated"
            )
        next_values = torch.cat([self.values[1:], last_value.to(self.values).unsqueeze(0)])  # [T, B]
        next_values = torch.where(self.truncated, self.truncation_values, next_values)
        advantages, returns = generalized_advantage_estimation(
            self.rewards, self.values, next_values, self.terminated, self.truncated, gamma, gae_lambda
        )
        self._started = False
        return RolloutBatch(
            observations=map_observation(self.observations, Tensor.clone),
            actions=self.actions.clone(),
            log_probs=self.log_probs.clone(),
            log_prob_per_head=self.log_prob_per_head.clone(),
            values=self.values.clone(),
            advantages=advantages,
            returns=returns,
            episode_starts=self.episode_starts.clone(),
            initial_state=(self.step_hidden[:1].clone(), self.step_cell[:1].clone()),
            action_masks=None if self.action_masks is None else tuple(mask.clone() for mask in self.action_masks),
            step_states=(self.step_hidden.clone(), self.step_cell.clone()),
        )
