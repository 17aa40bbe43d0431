"""RolloutBuffer: bootstrap wiring at truncation/termination, protocol errors, copies, env selection."""

from __future__ import annotations

import pytest
import torch

from morphogen.control.policy import ActionOutput
from morphogen.control.rollout import RolloutBuffer

HIDDEN = 3


def action_output(values: list[float], n_heads: int = 2) -> ActionOutput:
    batch = len(values)
    return ActionOutput(
        actions=torch.zeros(batch, n_heads, dtype=torch.long),
        log_prob=torch.full((batch,), -1.0),
        value=torch.tensor(values),
        entropy_per_head=torch.zeros(batch, n_heads),
        log_prob_per_head=torch.full((batch, n_heads), -0.5),
        state=(torch.zeros(1, batch, HIDDEN), torch.zeros(1, batch, HIDDEN)),
    )


def flags(*values: bool) -> torch.Tensor:
    return torch.tensor(values)


def test_bootstraps_from_truncation_values_and_cuts_at_every_episode_end() -> None:
    buffer = RolloutBuffer(3, 2, observation_size=1, n_heads=2, hidden_size=HIDDEN)
    buffer.reset((torch.zeros(1, 2, HIDDEN), torch.zeros(1, 2, HIDDEN)))
    observation = torch.zeros(2, 1)
    # env 0: values 1, 2, 3; rewards 0; truncated at step 1 with V(final observation) = 10.
    # env 1: values 1, 1, 1; rewards 1; terminated at step 2 (its 99 at step 1 must be ignored).
    buffer.add(
        observation,
        flags(True, True),
        action_output([1.0, 1.0]),
        torch.tensor([0.0, 1.0]),
        flags(False, False),
        flags(False, False),
    )
    buffer.add(
        observation,
        flags(False, False),
        action_output([2.0, 1.0]),
        torch.tensor([0.0, 1.0]),
        flags(False, False),
        flags(True, False),
        truncation_values=torch.tensor([10.0, 99.0]),
    )
    buffer.add(
        observation,
        flags(True, False),
        action_output([3.0, 1.0]),
        torch.tensor([0.0, 1.0]),
        flags(False, True),
        flags(False, False),
    )
    batch = buffer.finish(torch.tensor([4.0, 4.0]), gamma=0.5, gae_lambda=1.0)
    # By hand, with gamma 0.5 and lambda 1:
    # env 0: next values 2, 10, 4 -> deltas 0, 3, -1 -> A = 0 + 0.5 * 3, 3 (cut), -1.
    # env 1: next values 1, 1, (terminated) -> deltas 0.5, 0.5, 0 -> A = 0.5 + 0.5 * 0.5, 0.5 + 0, 0.
    assert batch.advantages.T.tolist() == [[1.5, 3.0, -1.0], [0.75, 0.5, 0.0]]
    assert batch.returns.T.tolist() == [[2.5, 5.0, 2.0], [1.75, 1.5, 1.0]]


def test_truncation_without_its_bootstrap_value_is_an_error() -> None:
    buffer = RolloutBuffer(1, 2, observation_size=1, n_heads=2, hidden_size=HIDDEN)
    buffer.reset((torch.zeros(1, 2, HIDDEN), torch.zeros(1, 2, HIDDEN)))
    buffer.add(
        torch.zeros(2, 1),
        flags(True, True),
        action_output([0.0, 0.0]),
        torch.zeros(2),
        flags(False, False),
        flags(False, True),
    )
    with pytest.raises(ValueError, match="truncation_values"):
        buffer.finish(torch.zeros(2), gamma=0.9, gae_lambda=0.9)


def test_protocol_errors() -> None:
    buffer = RolloutBuffer(1, 2, observation_size=1, n_heads=2, hidden_size=HIDDEN)
    step = (
        torch.zeros(2, 1),
        flags(True, True),
        action_output([0.0, 0.0]),
        torch.zeros(2),
        flags(False, False),
        flags(False, False),
    )
    with pytest.raises(RuntimeError, match="reset"):
        buffer.add(*step)
    with pytest.raises(ValueError, match="initial_state"):
        buffer.reset((torch.zeros(1, 3, HIDDEN), torch.zeros(1, 3, HIDDEN)))
    buffer.reset((torch.zeros(1, 2, HIDDEN), torch.zeros(1, 2, HIDDEN)))
    with pytest.raises(RuntimeError, match="full rollout"):
        buffer.finish(torch.zeros(2), gamma=0.9, gae_lambda=0.9)
    with pytest.raises(ValueError, match="action_masks"):
        buffer.add(*step, action_masks=[torch.ones(2, 4, dtype=torch.bool)] * 2)
    buffer.add(*step)
    with pytest.raises(RuntimeError, match="full"):
        buffer.add(*step)


@pytest.mark.parametrize("bad", ["rollout_length", "n_envs", "hidden_size"])
def test_constructor_rejects_empty_sizes(bad: str) -> None:
    sizes = {"rollout_length": 2, "n_envs": 2, "observation_size": 1, "n_heads": 1, "hidden_size": 1}
    sizes[bad] = 0
    with pytest.raises(ValueError, match=bad):
        RolloutBuffer(**sizes)


def fill(buffer: RolloutBuffer, batch: int, offset: float) -> None:
    buffer.reset((torch.full((1, batch, HIDDEN), offset), torch.full((1, batch, HIDDEN), -offset)))
    for step in range(buffer.rollout_length):
        values = [offset + 10 * env + step for env in range(batch)]
        buffer.add(
            torch.tensor(values).unsqueeze(-1),
            torch.full((batch,), step == 0),
            action_output(values),
            torch.zeros(batch),
            torch.zeros(batch, dtype=torch.bool),
            torch.zeros(batch, dtype=torch.bool),
            action_masks=[torch.full((batch, 4), step % 2 == 0), torch.ones(batch, 4, 3, dtype=torch.bool)],
            blueprint_ids=torch.tensor([[env, step] for env in range(batch)]),
        )


def test_batch_is_a_copy_and_select_envs_keeps_whole_sequences() -> None:
    buffer = RolloutBuffer(
        4, 3, observation_size=1, n_heads=2, hidden_size=HIDDEN, mask_shapes=[(4,), (4, 3)], n_slots=2
    )
    fill(buffer, 3, offset=0.0)
    batch = buffer.finish(torch.zeros(3), gamma=0.9, gae_lambda=0.9)
    fill(buffer, 3, offset=100.0)  # refilling must not change the batch already handed out
    assert batch.observations[:, :, 0].T.tolist() == [[0, 1, 2, 3], [10, 11, 12, 13], [20, 21, 22, 23]]
    assert batch.actions.shape[0] == 4 and batch.n_envs == 3
    assert (batch.initial_state[0] == 0).all()
    assert batch.action_masks is not None and batch.blueprint_ids is not None
    assert batch.action_masks[0][:, 0, 0].tolist() == [True, False, True, False]

    selected = batch.select_envs(torch.tensor([2, 0]))
    assert selected.observations[:, :, 0].T.tolist() == [[20, 21, 22, 23], [0, 1, 2, 3]]
    assert torch.equal(selected.values, batch.values[:, [2, 0]])
    assert torch.equal(selected.advantages, batch.advantages[:, [2, 0]])
    assert selected.blueprint_ids is not None and selected.blueprint_ids[:, :, 0].T.tolist() == [[2] * 4, [0] * 4]
    assert selected.action_masks is not None and tuple(selected.action_masks[1].shape) == (4, 2, 4, 3)
    assert tuple(selected.initial_state[0].shape) == (1, 2, HIDDEN)
    assert selected.episode_starts[0].all() and not selected.episode_starts[1:].any()
