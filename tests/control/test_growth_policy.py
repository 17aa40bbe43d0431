"""GrowthPolicy: one set of weights for any number of slots and blueprints, slots treated as a set, masks held."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from morphogen.control.growth_policy import BLUEPRINT_HEAD, SLOT_HEAD, GrowthInputs, GrowthPolicy
from morphogen.control.learned import PolicyController, build_agent
from morphogen.core.lifecycle import GateConfig, GateMode
from morphogen.core.slot import SlotConfig
from morphogen.data import load_task
from morphogen.env.actions import FIXED_CHOICES, HEAD_RELEVANCE, HEADS, Op
from morphogen.env.episode import EpisodeConfig, MorphogenesisEpisode
from morphogen.env.observation import ADVICE_COLUMNS, ADVICE_OP_COLUMNS, BLUEPRINT_SIZE, GLOBAL_SIZE, SLOT_SIZE

N_OPS = len(FIXED_CHOICES["op"])


def random_inputs(leading: tuple[int, ...], n_slots: int, n_blueprints: int, generator: torch.Generator,
                  ) -> GrowthInputs:
    """Random features for `leading` envs/steps with `n_slots` slots and `n_blueprints` blueprints, none padded."""
    return GrowthInputs(
        globals=torch.randn(*leading, GLOBAL_SIZE, generator=generator),
        slots=torch.randn(*leading, n_slots, SLOT_SIZE, generator=generator),
        slot_valid=torch.ones(*leading, n_slots, dtype=torch.bool),
        blueprints=torch.randn(*leading, n_slots, n_blueprints, BLUEPRINT_SIZE, generator=generator),
        blueprint_valid=torch.ones(*leading, n_blueprints, dtype=torch.bool),
    )


def permuted(inputs: GrowthInputs, order: torch.Tensor) -> GrowthInputs:
    """The same observation with its slots listed in `order`."""
    return inputs._replace(slots=inputs.slots[..., order, :], slot_valid=inputs.slot_valid[..., order],
                           blueprints=inputs.blueprints[..., order, :, :])


def test_permuting_the_slots_permutes_the_slot_heads_logits_the_same_way() -> None:
    torch.manual_seed(0)
    policy = GrowthPolicy(hidden_size=16)
    generator = torch.Generator().manual_seed(1)
    steps, batch, n_slots = 3, 2, 4
    inputs = random_inputs((steps, batch), n_slots, 5, generator)
    order = torch.tensor([2, 0, 3, 1])
    starts = torch.zeros(steps, batch, dtype=torch.bool)
    starts[0] = True
    for slot in range(n_slots):
        # GERMINATE in `slot` (the slot and blueprint heads matter), listed as its new position after the permutation.
        actions = torch.zeros(steps, batch, len(HEADS), dtype=torch.long)
        actions[..., 0], actions[..., SLOT_HEAD], actions[..., BLUEPRINT_HEAD] = int(Op.GERMINATE), slot, 1
        moved = actions.clone()
        moved[..., SLOT_HEAD] = int((order == slot).nonzero())
        original = policy.evaluate_sequence(inputs, policy.initial_state(batch), starts, actions)
        reordered = policy.evaluate_sequence(permuted(inputs, order), policy.initial_state(batch), starts, moved)
        # The same slot has the same probability wherever it is listed; so do the op and its blueprint.
        torch.testing.assert_close(reordered.log_prob_per_head, original.log_prob_per_head, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(reordered.value, original.value, rtol=1e-5, atol=1e-5)


def test_padding_slots_and_blueprints_changes_nothing_and_is_never_chosen() -> None:
    """An env with fewer slots or blueprints than the widest of its batch is padded: the padding is invisible."""
    torch.manual_seed(0)
    policy = GrowthPolicy(hidden_size=16)
    generator = torch.Generator().manual_seed(2)
    inputs = random_inputs((6,), 2, 3, generator)
    padded = GrowthInputs(
        globals=inputs.globals,
        slots=torch.cat([inputs.slots, torch.randn(6, 2, SLOT_SIZE, generator=generator)], dim=1),
        slot_valid=torch.cat([inputs.slot_valid, torch.zeros(6, 2, dtype=torch.bool)], dim=1),
        blueprints=torch.randn(6, 4, 5, BLUEPRINT_SIZE, generator=generator),
        blueprint_valid=torch.tensor([True, True, True, False, False]).expand(6, 5),
    )
    padded.blueprints[:, :2, :3] = inputs.blueprints
    state = policy.initial_state(6)
    narrow = policy.act(inputs, state, deterministic=True)
    wide = policy.act(padded, state, deterministic=True)
    assert torch.equal(narrow.actions, wide.actions)
    sampled = policy.act(inputs, state, generator=torch.Generator().manual_seed(3)).actions.unsqueeze(0)
    starts = torch.ones(1, 6, dtype=torch.bool)
    scored = [policy.evaluate_sequence(GrowthInputs(*(tensor.unsqueeze(0) for tensor in observation)), state, starts,
                                       sampled) for observation in (inputs, padded)]
    torch.testing.assert_close(scored[1].log_prob_per_head, scored[0].log_prob_per_head)
    torch.testing.assert_close(scored[1].entropy_per_head, scored[0].entropy_per_head)
    for _ in range(50):
        sampled = policy.act(padded, state).actions
        assert (sampled[:, SLOT_HEAD] < 2).all() and (sampled[:, BLUEPRINT_HEAD] < 3).all()


@pytest.mark.parametrize(("n_blocks", "pool_slots", "slots"), [(1, False, 1), (2, False, 2), (3, False, 3),
                                                               (3, True, 6)])
def test_one_policy_acts_on_any_number_of_slots_and_episode_length_within_the_masks(
        n_blocks: int, pool_slots: bool, slots: int) -> None:
    """The same weights play hosts of 1, 2, 3 and 6 slots and episodes of 4 and 7 epochs; every action is legal."""
    torch.manual_seed(0)
    agent = build_agent(hidden_size=16)
    task = load_task("digits", max_train_samples=100, host={"n_blocks": n_blocks})
    permissive = SlotConfig(gates=GateConfig(mode=GateMode.PERMISSIVE, min_training_epochs=1))
    for length in (4, 7):
        episode = MorphogenesisEpisode(task, EpisodeConfig(max_epochs=length, slots=permissive), seed=length,
                                       pool_slots=pool_slots)
        controller = PolicyController(agent, deterministic=False, seed=length)
        snapshot = episode.reset()
        assert len(snapshot.slots) == slots
        ops = []
        while not episode.done:
            masks = episode.masks()
            action = controller.act(snapshot, masks)
            indices = episode.action_space.encode(action)
            op = indices[0]
            assert masks[0][op], action.describe()
            for head in range(1, len(HEADS)):
                if HEAD_RELEVANCE[op, head]:
                    assert masks[head][op, indices[head]], (action.describe(), HEADS[head])
            ops.append(action.op)
            snapshot = episode.step(action).snapshot
        assert len(ops) == length
    assert np.isfinite(agent.policy.value_head.weight.detach().numpy()).all()


def test_a_new_policy_follows_any_advised_op_grow_included() -> None:
    """One weight for every op, started at a prior to follow: whatever op is advised is the most likely, also one
    (GROW) that no training step may ever advise."""
    torch.manual_seed(0)
    policy = GrowthPolicy(hidden_size=16)
    inputs = random_inputs((len(Op),), 2, 3, torch.Generator().manual_seed(2))
    advice = torch.zeros(len(Op), len(Op))
    advice[torch.arange(len(Op)), torch.arange(len(Op))] = 1.0  # env i is advised op i
    globals_ = inputs.globals.clone()
    globals_[:, ADVICE_OP_COLUMNS] = advice
    output = policy.act(inputs._replace(globals=globals_), policy.initial_state(len(Op)), deterministic=True)
    assert output.actions[:, 0].tolist() == [int(op) for op in Op]
    with torch.no_grad():
        policy.advice_weight.zero_()
    unadvised = policy.act(inputs._replace(globals=globals_), policy.initial_state(len(Op)), deterministic=True)
    assert unadvised.actions[:, 0].tolist() != [int(op) for op in Op]


def test_the_observation_normalizer_leaves_the_advice_flags_as_they_are() -> None:
    agent = build_agent(hidden_size=16)
    generator = torch.Generator().manual_seed(3)
    for _ in range(3):  # statistics from observations whose advice is always WAIT
        batch = random_inputs((8,), 2, 3, generator)
        flags = torch.zeros(8, ADVICE_COLUMNS.stop - ADVICE_COLUMNS.start)
        flags[:, 0], flags[:, 1 + int(Op.WAIT)] = 1.0, 1.0
        globals_ = batch.globals.clone()
        globals_[:, ADVICE_COLUMNS] = flags
        agent.observation_normalizer.update(batch._replace(globals=globals_))
    grow = random_inputs((1,), 2, 3, generator)
    globals_ = grow.globals.clone()
    globals_[:, ADVICE_COLUMNS] = 0.0
    globals_[:, ADVICE_COLUMNS.start], globals_[:, ADVICE_OP_COLUMNS.start + int(Op.GROW)] = 1.0, 1.0
    normalized = agent.observation_normalizer.normalize(grow._replace(globals=globals_))
    torch.testing.assert_close(normalized.globals[:, ADVICE_COLUMNS], globals_[:, ADVICE_COLUMNS])
    others = torch.ones(GLOBAL_SIZE, dtype=torch.bool)
    others[ADVICE_COLUMNS] = False
    assert not torch.equal(normalized.globals[:, others], globals_[:, others])  # the rest is standardized
