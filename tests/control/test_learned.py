"""The learned controller: masked actions only, and a policy rebuilt from a checkpoint that acts identically."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch

from morphogen.control.checkpoint import CheckpointError, load_checkpoint
from morphogen.control.learned import PolicyAgent, PolicyController, agent_from_checkpoint, build_policy
from morphogen.control.normalization import RunningMeanStd
from morphogen.control.trainer import PPOTrainer, TrainConfig
from morphogen.core.lifecycle import GateConfig, GateMode
from morphogen.core.slot import SlotConfig
from morphogen.data import Task, load_task
from morphogen.env.actions import HEAD_RELEVANCE, HEADS, Action, ActionSpace, Op
from morphogen.env.episode import EpisodeConfig, MorphogenesisEpisode
from morphogen.env.observation import ObservationEncoder
from morphogen.telemetry.config import TelemetryConfig

PERMISSIVE = EpisodeConfig(max_epochs=7, slots=SlotConfig(gates=GateConfig(mode=GateMode.PERMISSIVE)))
#: Ops no seed makes legal at the start of an episode; the op head is biased towards them.
ILLEGAL_AT_START = (Op.SET_ALPHA_TARGET, Op.PRUNE, Op.FOSSILIZE, Op.ADVANCE)


@pytest.fixture(scope="module")
def digits() -> Task:
    """Digits on a 3-block host (slots r0c0, r0c1, r0c2): these tests use a slot subset that leaves out
    r0c0, and a policy that prefers the last of three slots. 200 training images keep episodes short."""
    return load_task("digits", max_train_samples=200, host={"n_blocks": 3})


def biased_agent(slot_ids: Sequence[str]) -> PolicyAgent:
    """A policy whose raw preferences are illegal: ops no seed allows yet, and the last slot for every op."""
    encoder, space = ObservationEncoder(slot_ids, "cnn"), ActionSpace(slot_ids, "cnn")
    torch.manual_seed(0)
    policy = build_policy(encoder, space, hidden_size=16)
    with torch.no_grad():
        op_bias = policy.action_heads[0].bias
        assert isinstance(op_bias, torch.Tensor)
        op_bias.zero_()[list(ILLEGAL_AT_START)] = 8.0
        slot_bias = policy.action_heads[HEADS.index("slot")].bias
        assert isinstance(slot_bias, torch.Tensor)
        slot_bias.zero_()[-1] = 8.0
    return PolicyAgent(policy, encoder, space, RunningMeanStd((encoder.size,)))


def assert_legal(space: ActionSpace, masks: Sequence[np.ndarray], action: Action) -> None:
    indices = space.encode(action)
    op = indices[0]
    assert masks[0][op], f"{action.describe()}: op masked"
    for head in range(1, len(HEADS)):
        if HEAD_RELEVANCE[op, head]:
            assert masks[head][op, indices[head]], f"{action.describe()}: {HEADS[head]} masked"


def test_stochastic_policy_controller_never_takes_a_masked_action(digits: Task) -> None:
    slots = ("r0c0", "r0c1", "r0c2")
    agent = biased_agent(slots)  # prefers ops that need a seed, and slot r0c2
    episode = MorphogenesisEpisode(digits, PERMISSIVE, seed=0, slots=slots)
    episode.reset()
    # A seed in r0c0 by hand: from here on GERMINATE is masked (a seed is training) and every op the policy
    # prefers is legal, if at all, only on r0c0, never on the r0c2 its slot head prefers.
    snapshot = episode.step(Action(op=Op.GERMINATE, slot="r0c0", blueprint="norm")).snapshot
    masks = episode.masks()
    _, unmasked, _ = agent.act(agent.inputs([snapshot], [masks])._replace(masks=[None] * len(HEADS)),
                               agent.policy.initial_state(1), deterministic=True)
    with pytest.raises(AssertionError):
        assert_legal(agent.space, masks, agent.space.decode(unmasked.actions[0].tolist()))

    controller = PolicyController(agent, deterministic=False, seed=1)
    taken = []
    while not episode.done:
        masks = episode.masks()
        action = controller.act(snapshot, masks)
        assert_legal(agent.space, masks, action)
        taken.append(action)
        snapshot = episode.step(action).snapshot
    assert len(taken) == PERMISSIVE.max_epochs - 1
    biased = [a for a in taken if a.op in ILLEGAL_AT_START]
    assert biased and all(a.slot == "r0c0" for a in biased), [a.describe() for a in taken]


def trained_like_trainer(digits: Task) -> PPOTrainer:
    """A trainer whose policy weights and observation statistics are far from a fresh build."""
    base = TrainConfig(n_envs=2, rounds=1, hidden_size=16, max_train_samples=200,
                       telemetry=TelemetryConfig(level="off"),
                       slots=("r0c1", "r0c2"))
    trainer = PPOTrainer(dataclasses.replace(base, episode=dataclasses.replace(base.episode, max_epochs=3)), digits)
    generator = torch.Generator().manual_seed(5)
    agent = trainer.state.agent
    with torch.no_grad():
        for parameter in agent.policy.parameters():
            parameter.add_(0.3 * torch.randn(parameter.shape, generator=generator))
    for _ in range(3):
        agent.observation_normalizer.update(2.0 + 3.0 * torch.randn(8, agent.encoder.size, generator=generator))
    return trainer


def test_agent_from_checkpoint_acts_exactly_like_the_saved_agent(digits: Task, tmp_path: Path) -> None:
    trainer = trained_like_trainer(digits)
    trainer.save(tmp_path)
    original = trainer.state.agent
    rebuilt = agent_from_checkpoint(load_checkpoint(tmp_path), digits.topology, source=tmp_path)
    assert not rebuilt.policy.training
    for name, tensor in original.observation_normalizer.state_dict().items():
        assert torch.equal(rebuilt.observation_normalizer.state_dict()[name], tensor), name

    episode = MorphogenesisEpisode(digits, PERMISSIVE, seed=4, slots=("r0c1", "r0c2"))
    snapshot = episode.reset()
    states = {"original": original.policy.initial_state(1), "rebuilt": rebuilt.policy.initial_state(1)}
    generators = {name: torch.Generator().manual_seed(9) for name in states}
    for _ in range(4):  # the recurrent state carries over between steps in both agents alike
        masks = episode.masks()
        outputs = {}
        for name, agent in (("original", original), ("rebuilt", rebuilt)):
            _, output, actions = agent.act(agent.inputs([snapshot], [masks]), states[name],
                                           generator=generators[name])
            states[name] = output.state
            outputs[name] = (output, actions)
        (mine, my_actions), (theirs, their_actions) = outputs["original"], outputs["rebuilt"]
        assert my_actions == their_actions
        assert torch.equal(mine.log_prob, theirs.log_prob) and torch.equal(mine.value, theirs.value)
        assert torch.equal(mine.state[0], theirs.state[0]) and torch.equal(mine.state[1], theirs.state[1])
        snapshot = episode.step(my_actions[0]).snapshot


@pytest.mark.parametrize(("field", "value", "message"), [
    ("observation_size", 3, "was built for observation_size=3, but this run has observation_size="),
    ("action_sizes", [6, 2], "was built for action_sizes=(6, 2), but this run has action_sizes=(7, 2, "),
    ("hidden_size", 32, "does not fit the policy it describes: "),
])
def test_agent_from_checkpoint_refuses_a_checkpoint_it_cannot_rebuild(digits: Task, tmp_path: Path, field: str,
                                                                      value: object, message: str) -> None:
    trainer = trained_like_trainer(digits)
    trainer.save(tmp_path)
    state = load_checkpoint(tmp_path)
    state[field] = value
    with pytest.raises(CheckpointError) as caught:
        agent_from_checkpoint(state, digits.topology, source="ck")
    assert str(caught.value).startswith("checkpoint ck ") and message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_policy_controller_is_deterministic_by_default_and_reset_forgets_the_episode(digits: Task) -> None:
    slots = ("r0c1", "r0c2")
    agent = biased_agent(slots)
    controller = PolicyController(agent)
    episode = MorphogenesisEpisode(digits, PERMISSIVE, seed=0, slots=slots)
    snapshot = episode.reset()
    first = controller.act(snapshot, episode.masks())
    assert not torch.equal(controller.state[0], agent.policy.initial_state(1)[0]), "act advances the LSTM state"
    controller.reset()
    assert torch.equal(controller.state[0], agent.policy.initial_state(1)[0])
    assert controller.act(snapshot, episode.masks()) == first
