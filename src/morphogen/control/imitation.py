"""Warm start of the learned policy from the heuristic's decisions (behaviour cloning) before PPO.

A policy that starts from random weights spends its first rounds germinating, pruning and moving
alpha at random; on a small host most of those episodes end worse than not growing, and the
signal that would teach it what helps is buried in that noise. Imitation starts it where the
heuristic is: `PPOTrainer.imitate` plays rounds of episodes in which every env is driven by a
`HeuristicController` while the policy runs alongside on the same observations, then fits the
policy's heads to the heuristic's choices and its value head to the returns of those episodes.
PPO then improves on that policy with the reward instead of rediscovering it.

The fit maximizes the log-probability of the demonstrated joint action (the heads that matter for
its op, as in PPO) and regresses the value head on the episodes' returns (standardized when the
trainer normalizes values, as PPO's value loss is).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from morphogen.control.policy import FactoredLSTMPolicy
from morphogen.control.rollout import RolloutBatch
from morphogen.limits import MAX_ROUNDS, check_count

#: Upper bound on imitation epochs (each is one full pass over the demonstrations).
MAX_IMITATION_EPOCHS = 100_000


@dataclass(frozen=True)
class ImitationConfig:
    """How long the policy watches the heuristic before PPO starts (`[imitation]` in a config file)."""

    #: Rounds of heuristic-driven episodes (each `n_envs` episodes) before PPO; 0 starts PPO from scratch.
    rounds: int = 0
    #: Passes of the fit over all demonstrations.
    epochs: int = 200
    #: Adam learning rate of the fit (the PPO optimizer starts afresh afterwards).
    learning_rate: float = 1e-3
    #: Weight of the value regression next to the action log-likelihood.
    value_coef: float = 0.5
    #: Entropy bonus of the fit: keeps the heads from collapsing onto the heuristic's one choice, so that
    #: PPO still explores the alternatives (0 fits the demonstrations as sharply as it can).
    entropy_coef: float = 0.01
    #: Max global L2 norm of the fit's gradients.
    max_grad_norm: float = 5.0

    def __post_init__(self) -> None:
        check_count("rounds", self.rounds, MAX_ROUNDS, lower=0)
        check_count("epochs", self.epochs, MAX_IMITATION_EPOCHS)
        for name in ("learning_rate", "max_grad_norm"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value}")
        for name in ("value_coef", "entropy_coef"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")


@dataclass(frozen=True)
class ImitationStatistics:
    """How well the policy reproduces the demonstrations, before and after the fit."""

    #: Episodes the policy watched.
    episodes: int
    #: Mean negative log-likelihood per step of the demonstrated actions, before and after the fit.
    action_loss_before: float
    action_loss_after: float
    #: Mean probability the policy gives the demonstrated action at a step, after the fit.
    match_probability: float
    #: Fraction of steps whose demonstrated action is also the policy's most likely one, after the fit.
    agreement: float
    #: Mean squared error of the value head on the (standardized) returns, after the fit.
    value_loss: float


def concatenate_batches(batches: list[RolloutBatch]) -> RolloutBatch:
    """Rollouts of equal length side by side: envs of every batch along the env dimension."""
    if not batches:
        raise ValueError("no demonstrations to concatenate")
    return RolloutBatch(*(_joined([getattr(batch, name) for batch in batches]) for name in RolloutBatch._fields))


def _joined(values: list[Any]) -> Any:
    """One field of every batch, joined along the env dimension (dim 1 of every tensor: [T, B, ...] and the
    LSTM state's [1, B, hidden]); tuples of tensors item by item; None stays None."""
    if values[0] is None:
        return None
    if isinstance(values[0], Tensor):
        return torch.cat(values, dim=1)
    return tuple(_joined(list(items)) for items in zip(*values, strict=True))


def _fit_losses(policy: FactoredLSTMPolicy, batch: RolloutBatch) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-step log-prob of the demonstrated actions [T, B], the action loss, the value loss, and the mean
    entropy per step (summed over the heads that matter for the demonstrated op)."""
    evaluated = policy.evaluate_sequence(batch.observations, batch.initial_state, batch.episode_starts,
                                         batch.actions, batch.action_masks, batch.blueprint_ids)
    action_loss = -evaluated.log_prob.mean()
    value_loss = nn.functional.mse_loss(evaluated.value, batch.returns)
    return evaluated.log_prob, action_loss, value_loss, evaluated.entropy_per_head.sum(-1).mean()


def imitation_fit(policy: FactoredLSTMPolicy, batch: RolloutBatch, config: ImitationConfig) -> ImitationStatistics:
    """Fit `policy` to the demonstrations in `batch` (full-batch Adam, `config.epochs` passes).

    The whole demonstration set is one batch: it is small (rounds x envs episodes of a few dozen steps)
    and the LSTM is re-run over whole episodes from their initial state, as in PPO.
    """
    optimizer = torch.optim.Adam(policy.parameters(), lr=config.learning_rate, eps=1e-5)
    policy.train()
    with torch.no_grad():
        _, before, _, _ = _fit_losses(policy, batch)
    for _ in range(config.epochs):
        _, action_loss, value_loss, entropy = _fit_losses(policy, batch)
        loss = action_loss + config.value_coef * value_loss - config.entropy_coef * entropy
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        nn.utils.clip_grad_norm_(policy.parameters(), config.max_grad_norm, foreach=True)
        optimizer.step()
    with torch.no_grad():
        log_prob, action_loss, value_loss, _ = _fit_losses(policy, batch)
        # Heads that do not matter for the op hold 0 in both, so whole rows can be compared.
        agreement = (_greedy_actions(policy, batch) == batch.actions).all(dim=-1).float().mean()
        statistics = torch.stack([before, action_loss, log_prob.exp().mean(), agreement, value_loss]).tolist()
    return ImitationStatistics(episodes=batch.n_envs, action_loss_before=statistics[0],
                               action_loss_after=statistics[1], match_probability=statistics[2],
                               agreement=statistics[3], value_loss=statistics[4])


def _greedy_actions(policy: FactoredLSTMPolicy, batch: RolloutBatch) -> Tensor:
    """The actions [T, B, H] a deterministic policy takes at every stored step (same observations)."""
    steps = batch.observations.shape[0]
    state = batch.initial_state
    rows = []
    for step in range(steps):
        masks = None if batch.action_masks is None else [mask[step] for mask in batch.action_masks]
        blueprint_ids = None if batch.blueprint_ids is None else batch.blueprint_ids[step]
        output = policy.act(batch.observations[step], state, masks, blueprint_ids, deterministic=True,
                            episode_starts=batch.episode_starts[step])
        rows.append(output.actions)
        state = output.state
    return torch.stack(rows)
