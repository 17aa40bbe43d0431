"""The learned controller: a FactoredLSTMPolicy wired to morphogen's observations and actions.

`PolicyAgent` bundles what acting needs (encoder, action space, observation normalizer, policy) and
turns a batch of episode snapshots and masks into tensors, one batched policy call, and `Action`s.
`PolicyController` is the single-episode `Controller` used by `morphogen run --policy`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from morphogen.control.checkpoint import CheckpointError, check_layout
from morphogen.control.normalization import RunningMeanStd
from morphogen.control.policy import ActionOutput, FactoredLSTMPolicy, LSTMState
from morphogen.env.actions import HEAD_RELEVANCE, Action, ActionSpace
from morphogen.env.observation import ObservationEncoder
from morphogen.env.snapshot import EpisodeSnapshot


class PolicyInputs(NamedTuple):
    """A batch of observations as the policy sees them."""

    raw_features: Tensor  # [B, F] before normalization
    blueprint_ids: Tensor  # [B, n_slots] long
    masks: list[Tensor]  # per head: [B, n_ops] for the op, [B, n_ops, n_i] for the others


def build_policy(encoder: ObservationEncoder, space: ActionSpace, hidden_size: int,
                 device: torch.device | str | None = None) -> FactoredLSTMPolicy:
    """The factored LSTM actor-critic sized for this observation encoder and action space."""
    return FactoredLSTMPolicy(
        encoder.size, space.sizes, hidden_size=hidden_size, n_slots=encoder.n_slots,
        n_blueprints=encoder.n_blueprints, head_relevance=torch.as_tensor(HEAD_RELEVANCE), device=device,
    )


class PolicyAgent:
    """Encodes snapshots, normalizes observations, calls the policy once for all envs, decodes actions."""

    def __init__(self, policy: FactoredLSTMPolicy, encoder: ObservationEncoder, space: ActionSpace,
                 observation_normalizer: RunningMeanStd) -> None:
        self.policy, self.encoder, self.space = policy, encoder, space
        self.observation_normalizer = observation_normalizer
        self.device = next(policy.parameters()).device

    def inputs(self, snapshots: Sequence[EpisodeSnapshot], masks: Sequence[Sequence[np.ndarray]]) -> PolicyInputs:
        encoded = [self.encoder.encode(snapshot) for snapshot in snapshots]
        features = torch.from_numpy(np.stack([e.features for e in encoded])).to(self.device)  # (B, F)
        blueprint_ids = torch.from_numpy(np.stack([e.blueprint_ids for e in encoded])).to(self.device)  # (B, S)
        per_head = [torch.from_numpy(np.stack([env_masks[h] for env_masks in masks])).to(self.device)
                    for h in range(len(masks[0]))]
        return PolicyInputs(features, blueprint_ids, per_head)

    def act(self, inputs: PolicyInputs, state: LSTMState, *, deterministic: bool = False,
            generator: torch.Generator | None = None, episode_starts: Tensor | None = None,
            update_normalizer: bool = False) -> tuple[Tensor, ActionOutput, list[Action]]:
        """Normalized observations [B, F], the policy's output, and the decoded actions (one sync)."""
        if update_normalizer:
            self.observation_normalizer.update(inputs.raw_features)
        observations = self.observation_normalizer.normalize(inputs.raw_features)
        output = self.policy.act(observations, state, inputs.masks, inputs.blueprint_ids,
                                 deterministic=deterministic, generator=generator, episode_starts=episode_starts)
        rows = output.actions.tolist()  # the step's one sync: actions must reach the envs on the host
        return observations, output, [self.space.decode(row) for row in rows]


class PolicyController:
    """Plays one episode at a time with a trained policy (deterministic by default)."""

    def __init__(self, agent: PolicyAgent, *, deterministic: bool = True, seed: int = 0) -> None:
        self.agent, self.deterministic = agent, deterministic
        self.generator = torch.Generator(device=agent.device).manual_seed(seed)
        self.state = agent.policy.initial_state(1)

    def reset(self) -> None:
        self.state = self.agent.policy.initial_state(1)

    @torch.no_grad()
    def act(self, snapshot: EpisodeSnapshot, masks: Sequence[np.ndarray]) -> Action:
        inputs = self.agent.inputs([snapshot], [masks])
        _, output, actions = self.agent.act(inputs, self.state, deterministic=self.deterministic,
                                            generator=self.generator)
        self.state = output.state
        return actions[0]


def agent_from_checkpoint(state: dict[str, object], topology: str, device: torch.device | str | None = None,
                          *, source: str | Path = "checkpoint") -> PolicyAgent:
    """Rebuild the agent a training checkpoint describes (policy weights and observation statistics).

    A checkpoint whose observation or action layout differs from what this version of morphogen builds
    for its slots raises `CheckpointError` naming the field (`source` names the checkpoint in messages).
    """
    slot_ids = [str(s) for s in state["slot_ids"]]  # type: ignore[attr-defined]
    encoder = ObservationEncoder(slot_ids, topology)
    space = ActionSpace(slot_ids, topology)
    check_layout(state, {"observation_size": encoder.size, "action_sizes": tuple(space.sizes)}, source)
    hidden_size = int(state["hidden_size"])  # type: ignore[call-overload]
    policy = build_policy(encoder, space, hidden_size, device=device)
    normalizer = RunningMeanStd((encoder.size,), device=device)
    try:
        policy.load_state_dict(state["policy"])  # type: ignore[arg-type]
        normalizer.load_state_dict(state["observation_normalizer"])  # type: ignore[arg-type]
    except (RuntimeError, KeyError, TypeError, ValueError) as error:
        raise CheckpointError(f"checkpoint {source} does not fit the policy it describes: "
                              f"{str(error).strip().splitlines()[0]}") from None
    policy.eval()
    return PolicyAgent(policy, encoder, space, normalizer)
