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

from morphogen.control.policy import ActionOutput, LSTMState

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

    observations: Tensor
    """[T, B, obs]"""
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
    blueprint_ids: Tensor | None
    """[T, B, n_slots] long, or None for a policy without slots"""

    @property
    def n_envs(self) -> int:
        """B, the number of env sequences."""
        return int(self.actions.shape[1])

    def select_envs(self, env_indices: Tensor) -> RolloutBatch:
        """The whole sequences of the envs in ``env_indices`` (long, on the batch's device)."""
        masks = None
        if self.action_masks is not None:
            masks = tuple(mask.index_select(1, env_indices) for mask in self.action_masks)
        return RolloutBatch(
            observations=self.observations.index_select(1, env_indices),
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
            blueprint_ids=None if self.blueprint_ids is None else self.blueprint_ids.index_select(1, env_indices),
        )


class RolloutBuffer:
    """Pre-allocated storage for ``rollout_length`` steps of ``n_envs`` envs.

    Use: ``reset(state)`` with the LSTM state before the first step, then ``add`` once per step,
    then ``finish(last_value, gamma=..., gae_lambda=...)`` for the batch; ``reset`` again to refill.
    ``mask_shapes`` gives the per-env shape of each head's mask (e.g. ``(n_ops,)`` for the op and
    ``(n_ops, n_slots)`` for an op-conditioned slot mask); None if the env has no masks.
    """

    def __init__(
        self,
        rollout_length: int,
        n_envs: int,
        observation_size: int,
        n_heads: int,
        hidden_size: int,
        *,
        mask_shapes: Sequence[tuple[int, ...]] | None = None,
        n_slots: int = 0,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        for name, size in (
            ("rollout_length", rollout_length),
            ("n_envs", n_envs),
            ("observation_size", observation_size),
            ("n_heads", n_heads),
            ("hidden_size", hidden_size),
        ):
            if size < 1:
                raise ValueError(f"{name} must be >= 1, got {size}")
        if mask_shapes is not None and len(mask_shapes) != n_heads:
            raise ValueError(f"mask_shapes must have one shape per head ({n_heads}), got {len(mask_shapes)}")
        if n_slots < 0:
            raise ValueError(f"n_slots must be >= 0, got {n_slots}")
        self.rollout_length = rollout_length
        self.n_envs = n_envs
        self.hidden_size = hidden_size
        steps_envs = (rollout_length, n_envs)
        self.observations = torch.zeros((*steps_envs, observation_size), device=device, dtype=dtype)
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
        self.blueprint_ids: Tensor | None = None
        if n_slots > 0:
            self.blueprint_ids = torch.zeros((*steps_envs, n_slots), device=device, dtype=torch.long)
        self.initial_hidden = torch.zeros((1, n_envs, hidden_size), device=device, dtype=dtype)
        self.initial_cell = torch.zeros((1, n_envs, hidden_size), device=device, dtype=dtype)
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
        self.initial_hidden.copy_(initial_state[0])
        self.initial_cell.copy_(initial_state[1])
        self.truncation_values_given.zero_()
        self.position = 0
        self._started = True

    def add(
        self,
        observation: Tensor,
        episode_starts: Tensor,
        action: ActionOutput,
        reward: Tensor,
        terminated: Tensor,
        truncated: Tensor,
        *,
        action_masks: Sequence[Tensor] | None = None,
        blueprint_ids: Tensor | None = None,
        truncation_values: Tensor | None = None,
    ) -> None:
        """Write one step: ``observation [B, obs]`` (as the policy saw it), ``episode_starts [B]``, the
        policy's ``action`` for it, and the env's ``reward``, ``terminated``, ``truncated`` (each [B]).

        ``truncation_values [B]`` is V(final observation) for envs truncated at this step (other
        entries are ignored); it may be None only if no env was truncated. ``action_masks`` (one per
        head, [B, *mask shape]) and ``blueprint_ids [B, n_slots]`` are required iff the buffer stores them.
        """
        if not self._started:
            raise RuntimeError("call reset(initial_state) before add(): the LSTM state before step 0 is needed")
        if self.full:
            raise RuntimeError(f"the buffer is full ({self.rollout_length} steps): call finish(), then reset()")
        if (action_masks is None) != (self.action_masks is None):
            raise ValueError("pass action_masks iff the buffer was built with mask_shapes")
        if (blueprint_ids is None) != (self.blueprint_ids is None):
            raise ValueError("pass blueprint_ids iff the buffer was built with n_slots > 0")
        row = self.position
        self.observations[row].copy_(observation)
        self.episode_starts[row].copy_(episode_starts)
        self.actions[row].copy_(action.actions)
        self.log_probs[row].copy_(action.log_prob)
        self.log_prob_per_head[row].copy_(action.log_prob_per_head)
        self.values[row].copy_(action.value)
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
        if blueprint_ids is not None and self.blueprint_ids is not None:
            self.blueprint_ids[row].copy_(blueprint_ids)
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
            observations=self.observations.clone(),
            actions=self.actions.clone(),
            log_probs=self.log_probs.clone(),
            log_prob_per_head=self.log_prob_per_head.clone(),
            values=self.values.clone(),
            advantages=advantages,
            returns=returns,
            episode_starts=self.episode_starts.clone(),
            initial_state=(self.initial_hidden.clone(), self.initial_cell.clone()),
            action_masks=None if self.action_masks is None else tuple(mask.clone() for mask in self.action_masks),
            blueprint_ids=None if self.blueprint_ids is None else self.blueprint_ids.clone(),
        )
