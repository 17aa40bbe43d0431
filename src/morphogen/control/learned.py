"""The learned controller: a `GrowthPolicy` wired to morphogen's observations and actions.

`PolicyAgent` bundles what acting needs (observation normalizer, policy) and turns a batch of episode
snapshots and masks into padded tensors, one batched policy call, and `Action`s. The envs of a batch may
differ in task, host, number of slots and blueprints: each is encoded on its own, padded to the widest,
and decoded with its own slots and blueprints. `PolicyController` is the single-episode `Controller`
used by `morphogen run --policy` and `eval`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

from morphogen.control.advice import HeuristicAdvisor, advise_all
from morphogen.control.checkpoint import CheckpointError
from morphogen.control.growth_policy import BLUEPRINT_HEAD, SLOT_HEAD, GrowthInputs, GrowthPolicy
from morphogen.control.normalization import RunningMeanStd
from morphogen.control.policy import ActionOutput, LSTMState
from morphogen.env.actions import Action, ActionSpace
from morphogen.env.observation import (
    ADVICE_COLUMNS,
    GLOBAL_SIZE,
    SLOT_SIZE,
    EncodedObservation,
    encode_observation,
)
from morphogen.env.snapshot import EpisodeSnapshot


class PolicyInputs(NamedTuple):
    """A batch of observations as the policy sees them, before normalization, and the action masks."""

    raw: GrowthInputs
    masks: list[Tensor]  # per head: [B, n_ops] for the op, [B, n_ops, n_i] for the others (padded)


class ObservationNormalizer(nn.Module):
    """Running standardization of the global features and of the slot features (one statistic per feature,
    shared by all slots; padding rows are left out). Blueprint features are on fixed scales already."""

    def __init__(self, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.globals = RunningMeanStd((GLOBAL_SIZE,), device=device)
        self.slots = RunningMeanStd((SLOT_SIZE,), device=device)

    def update(self, inputs: GrowthInputs) -> None:
        """Merge a batch into the statistics, without a host sync (masked moments of the real slot rows)."""
        self.globals.update(inputs.globals)
        with torch.no_grad():
            rows = inputs.slots.reshape(-1, SLOT_SIZE).to(self.slots.mean.dtype)
            valid = inputs.slot_valid.reshape(-1, 1).to(rows.dtype)
            count = valid.sum().clamp(min=1.0)
            mean = (rows * valid).sum(0) / count
            variance = ((rows - mean).square() * valid).sum(0) / count
            self.slots.merge_batch(mean, variance, count)

    def normalize(self, inputs: GrowthInputs) -> GrowthInputs:
        """Standardized features; the advice's flags are left as they are (`ADVICE_COLUMNS`)."""
        normalized = self.globals.normalize(inputs.globals)
        start, stop = ADVICE_COLUMNS.start, ADVICE_COLUMNS.stop
        globals_ = torch.cat([normalized[..., :start], inputs.globals[..., start:stop].to(normalized.dtype),
                              normalized[..., stop:]], dim=-1)
        return inputs._replace(globals=globals_, slots=self.slots.normalize(inputs.slots))


def stack_observations(encoded: Sequence[EncodedObservation], device: torch.device | str) -> GrowthInputs:
    """Encoded observations of B envs as one `GrowthInputs` [B, ...], padded to the most slots and blueprints."""
    n_slots = max(observation.slots.shape[0] for observation in encoded)
    n_blueprints = max(observation.blueprints.shape[1] for observation in encoded)
    batch = len(encoded)
    slots = np.zeros((batch, n_slots, SLOT_SIZE), dtype=np.float32)
    slot_valid = np.zeros((batch, n_slots), dtype=bool)
    blueprints = np.zeros((batch, n_slots, n_blueprints, encoded[0].blueprints.shape[-1]), dtype=np.float32)
    blueprint_valid = np.zeros((batch, n_blueprints), dtype=bool)
    for row, observation in enumerate(encoded):
        s, k = observation.blueprints.shape[:2]
        slots[row, :s] = observation.slots
        slot_valid[row, :s] = True
        blueprints[row, :s, :k] = observation.blueprints
        blueprint_valid[row, :k] = True
    arrays = (np.stack([observation.globals for observation in encoded]), slots, slot_valid, blueprints,
              blueprint_valid)
    return GrowthInputs(*(torch.from_numpy(array).to(device) for array in arrays))


def stack_masks(masks: Sequence[Sequence[np.ndarray]], n_slots: int, n_blueprints: int,
                device: torch.device | str) -> list[Tensor]:
    """Per head, the masks of B envs stacked, the slot and blueprint masks padded with False to the widest."""
    stacked = []
    for head in range(len(masks[0])):
        width = n_slots if head == SLOT_HEAD else n_blueprints if head == BLUEPRINT_HEAD else None
        rows = [env_masks[head] for env_masks in masks]
        if width is not None:
            rows = [np.pad(row, ((0, 0), (0, width - row.shape[-1]))) for row in rows]
        stacked.append(torch.from_numpy(np.stack(rows)).to(device))
    return stacked


class PolicyAgent:
    """Encodes snapshots, normalizes observations, calls the policy once for all envs, decodes actions."""

    def __init__(self, policy: GrowthPolicy, observation_normalizer: ObservationNormalizer) -> None:
        self.policy, self.observation_normalizer = policy, observation_normalizer
        self.device = next(policy.parameters()).device
        self._spaces: dict[tuple[tuple[str, ...], str], ActionSpace] = {}

    def inputs(self, snapshots: Sequence[EpisodeSnapshot], masks: Sequence[Sequence[np.ndarray]],
               advisors: Sequence[HeuristicAdvisor]) -> PolicyInputs:
        """The batch's encoded observations, each with its env's advice (`advisors`, one per env, which then
        expect the action taken: `record_taken`), and masks."""
        advice = advise_all(advisors, snapshots, masks, [self.space_of(snapshot) for snapshot in snapshots])
        observations = stack_observations([encode_observation(snapshot, hint)
                                           for snapshot, hint in zip(snapshots, advice, strict=True)], self.device)
        n_slots, n_blueprints = observations.slots.shape[1], observations.blueprint_valid.shape[1]
        return PolicyInputs(observations, stack_masks(masks, n_slots, n_blueprints, self.device))

    def act(self, inputs: PolicyInputs, state: LSTMState, *, deterministic: bool = False,
            generator: torch.Generator | None = None, episode_starts: Tensor | None = None,
            update_normalizer: bool = False) -> tuple[GrowthInputs, ActionOutput]:
        """Normalized observations and the policy's output (no sync)."""
        if update_normalizer:
            self.observation_normalizer.update(inputs.raw)
        observations = self.observation_normalizer.normalize(inputs.raw)
        output = self.policy.act(observations, state, inputs.masks, deterministic=deterministic, generator=generator,
                                 episode_starts=episode_starts)
        return observations, output

    def decode(self, actions: Tensor, snapshots: Sequence[EpisodeSnapshot]) -> list[Action]:
        """Rows of ``actions [B, H]`` as `Action`s of each snapshot's own slots and blueprints (one sync)."""
        rows = actions.tolist()  # the step's one sync: actions must reach the envs on the host
        return [self.space_of(snapshot).decode(row) for snapshot, row in zip(snapshots, rows, strict=True)]

    def space_of(self, snapshot: EpisodeSnapshot) -> ActionSpace:
        """The action space of the episode `snapshot` was taken in (its slots, its topology's blueprints)."""
        key = (tuple(slot.slot_id for slot in snapshot.slots), snapshot.topology)
        if key not in self._spaces:
            self._spaces[key] = ActionSpace(*key)
        return self._spaces[key]


class PolicyController:
    """Plays one episode at a time with a trained policy (deterministic by default), on any task and host."""

    #: Its observation carries every blueprint's growth signal in every empty slot (`env/observation.py`).
    reads_growth_signals = True

    def __init__(self, agent: PolicyAgent, *, deterministic: bool = True, seed: int = 0) -> None:
        self.agent, self.deterministic = agent, deterministic
        self.generator = torch.Generator(device=agent.device).manual_seed(seed)
        self.state = agent.policy.initial_state(1)
        self.advisor = HeuristicAdvisor()

    def reset(self) -> None:
        self.state = self.agent.policy.initial_state(1)
        self.advisor.reset()

    def state_dict(self) -> dict[str, Any]:
        """Its recurrent state, its sampling generator and its advisor, between epochs (the policy's weights are
        its checkpoint's, not part of this)."""
        return {"recurrent": [tensor.detach().clone() for tensor in self.state],
                "generator": self.generator.get_state(), "advisor": self.advisor.state_dict()}

    def load_state_dict(self, state: dict[str, Any], space: ActionSpace) -> None:
        """Continue the episode `state_dict` was saved in, of action space `space`."""
        saved = [tensor.to(self.agent.device) for tensor in state["recurrent"]]
        if len(saved) != 2 or any(s.shape != t.shape for s, t in zip(saved, self.state, strict=True)):
            raise ValueError("the saved recurrent state does not fit this policy (another width or kind)")
        self.state = (saved[0], saved[1])
        self.generator.set_state(state["generator"])
        self.advisor.load_state_dict(state["advisor"], space)

    @torch.no_grad()
    def act(self, snapshot: EpisodeSnapshot, masks: Sequence[np.ndarray]) -> Action:
        inputs = self.agent.inputs([snapshot], [masks], [self.advisor])
        _, output = self.agent.act(inputs, self.state, deterministic=self.deterministic, generator=self.generator)
        self.state = output.state
        action = self.agent.decode(output.actions, [snapshot])[0]
        self.advisor.taken(action)
        return action


def build_agent(hidden_size: int, device: torch.device | str | None = None, *, recurrent: bool = True) -> PolicyAgent:
    """A fresh agent: a `GrowthPolicy` of width `hidden_size` (with an LSTM unless `recurrent=False`) and an empty
    observation normalizer."""
    policy = GrowthPolicy(hidden_size=hidden_size, device=device, recurrent=recurrent)
    return PolicyAgent(policy, ObservationNormalizer(device=device))


def agent_from_checkpoint(state: dict[str, Any], device: torch.device | str | None = None, *,
                          source: str | Path = "checkpoint") -> PolicyAgent:
    """Rebuild the agent a training checkpoint describes (policy weights and observation statistics); it acts
    on any task and host. `source` names the checkpoint in messages."""
    # The weights say whether the policy has an LSTM: a feed-forward one has no `lstm.` entries.
    recurrent = any(str(key).startswith("lstm.") for key in state["policy"])
    agent = build_agent(int(state["hidden_size"]), device=device, recurrent=recurrent)
    try:
        agent.policy.load_state_dict(state["policy"])
        agent.observation_normalizer.load_state_dict(state["observation_normalizer"])
    except (RuntimeError, KeyError, TypeError, ValueError) as error:
        raise CheckpointError(f"checkpoint {source} does not fit the policy it describes: "
                              f"{str(error).strip().splitlines()[0]}") from None
    agent.policy.eval()
    return agent
