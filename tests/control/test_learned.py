"""The learned controller: masked actions only, and a policy rebuilt from a checkpoint that acts identically."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch

from morphogen.control.advice import HeuristicAdvisor
from morphogen.control.checkpoint import CheckpointError, load_checkpoint
from morphogen.control.learned import PolicyAgent, PolicyController, agent_from_checkpoint, build_agent
from morphogen.control.trainer import PPOTrainer, TrainConfig
from morphogen.core.lifecycle import GateConfig, GateMode
from morphogen.core.slot import SlotConfig
from morphogen.data import Task, load_task
from morphogen.env.actions import HEAD_RELEVANCE, HEADS, Action, ActionSpace, Op
from morphogen.env.episode import EpisodeConfig, MorphogenesisEpisode
from morphogen.env.observation import GLOBAL_SIZE, SLOT_SIZE
from morphogen.env.play import run_episode
from morphogen.env.snapshot import EpisodeSnapshot
from morphogen.telemetry.config import TelemetryConfig

PERMISSIVE = EpisodeConfig(max_epochs=7, slots=SlotConfig(gates=GateConfig(mode=GateMode.PERMISSIVE)))
#: Ops no seed makes legal at the start of an episode; the op head is biased towards them.
ILLEGAL_AT_START = (Op.SET_ALPHA_TARGET, Op.PRUNE, Op.FOSSILIZE, Op.ADVANCE)


@pytest.fixture(scope="module")
def digits() -> Task:
    """Digits on a 3-block host (slots r0c0, r0c1, r0c2): these tests use a slot subset that leaves out
    r0c0, and a policy that prefers the last of three slots. 200 training images keep episodes short."""
    return load_task("digits", max_train_samples=200, host={"n_blocks": 3})


def biased_agent() -> PolicyAgent:
    """A policy whose raw preferences are illegal: ops no seed allows yet."""
    torch.manual_seed(0)
    agent = build_agent(hidden_size=16)
    with torch.no_grad():
        agent.policy.op_head.bias.zero_()[list(ILLEGAL_AT_START)] = 8.0
    return agent


def assert_legal(space: ActionSpace, masks: Sequence[np.ndarray], action: Action) -> None:
    indices = space.encode(action)
    op = indices[0]
    assert masks[0][op], f"{action.describe()}: op masked"
    for head in range(1, len(HEADS)):
        if HEAD_RELEVANCE[op, head]:
            assert masks[head][op, indices[head]], f"{action.describe()}: {HEADS[head]} masked"


def test_stochastic_policy_controller_never_takes_a_masked_action(digits: Task) -> None:
    slots = ("r0c0", "r0c1", "r0c2")
    agent = biased_agent()  # prefers ops that need a seed
    episode = MorphogenesisEpisode(digits, PERMISSIVE, seed=0, slots=slots)
    episode.reset()
    space = episode.action_space
    # A seed in r0c0 by hand: from here on GERMINATE is masked (a seed is training) and every op the policy
    # prefers is legal, if at all, only on r0c0.
    snapshot = episode.step(Action(op=Op.GERMINATE, slot="r0c0", blueprint="norm")).snapshot
    masks = episode.masks()
    _, unmasked = agent.act(agent.inputs([snapshot], [masks], [HeuristicAdvisor()])._replace(masks=[None] * len(HEADS)),
                            agent.policy.initial_state(1), deterministic=True)
    with pytest.raises(AssertionError):
        assert_legal(space, masks, space.decode(unmasked.actions[0].tolist()))

    controller = PolicyController(agent, deterministic=False, seed=1)
    taken = []
    while not episode.done:
        masks = episode.masks()
        action = controller.act(snapshot, masks)
        assert_legal(space, masks, action)
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
        agent.observation_normalizer.globals.update(2.0 + 3.0 * torch.randn(8, GLOBAL_SIZE, generator=generator))
        agent.observation_normalizer.slots.update(-1.0 + 2.0 * torch.randn(8, SLOT_SIZE, generator=generator))
    return trainer


def test_agent_from_checkpoint_acts_exactly_like_the_saved_agent(digits: Task, tmp_path: Path) -> None:
    trainer = trained_like_trainer(digits)
    trainer.save(tmp_path)
    original = trainer.state.agent
    rebuilt = agent_from_checkpoint(load_checkpoint(tmp_path), source=tmp_path)
    assert not rebuilt.policy.training
    for name, tensor in original.observation_normalizer.state_dict().items():
        assert torch.equal(rebuilt.observation_normalizer.state_dict()[name], tensor), name

    episode = MorphogenesisEpisode(digits, PERMISSIVE, seed=4, slots=("r0c1", "r0c2"))
    snapshot = episode.reset()
    states = {"original": original.policy.initial_state(1), "rebuilt": rebuilt.policy.initial_state(1)}
    generators = {name: torch.Generator().manual_seed(9) for name in states}
    advisors = {name: HeuristicAdvisor() for name in states}
    for _ in range(4):  # the recurrent state carries over between steps in both agents alike
        masks = episode.masks()
        outputs = {}
        for name, agent in (("original", original), ("rebuilt", rebuilt)):
            _, output = agent.act(agent.inputs([snapshot], [masks], [advisors[name]]), states[name],
                                  generator=generators[name])
            states[name] = output.state
            outputs[name] = (output, agent.decode(output.actions, [snapshot]))
            advisors[name].taken(outputs[name][1][0])
        (mine, my_actions), (theirs, their_actions) = outputs["original"], outputs["rebuilt"]
        assert my_actions == their_actions
        assert torch.equal(mine.log_prob, theirs.log_prob) and torch.equal(mine.value, theirs.value)
        assert torch.equal(mine.state[0], theirs.state[0]) and torch.equal(mine.state[1], theirs.state[1])
        snapshot = episode.step(my_actions[0]).snapshot


@pytest.mark.parametrize(("field", "value", "message"), [
    ("hidden_size", 32, "does not fit the policy it describes: "),
    ("observation_normalizer", {}, "does not fit the policy it describes: "),
])
def test_agent_from_checkpoint_refuses_a_checkpoint_it_cannot_rebuild(digits: Task, tmp_path: Path, field: str,
                                                                      value: object, message: str) -> None:
    trainer = trained_like_trainer(digits)
    trainer.save(tmp_path)
    state = load_checkpoint(tmp_path)
    state[field] = value
    with pytest.raises(CheckpointError) as caught:
        agent_from_checkpoint(state, source="ck")
    assert str(caught.value).startswith("checkpoint ck ") and message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_policy_controller_is_deterministic_by_default_and_reset_forgets_the_episode(digits: Task) -> None:
    slots = ("r0c1", "r0c2")
    agent = biased_agent()
    controller = PolicyController(agent)
    episode = MorphogenesisEpisode(digits, PERMISSIVE, seed=0, slots=slots)
    snapshot = episode.reset()
    first = controller.act(snapshot, episode.masks())
    assert not torch.equal(controller.state[0], agent.policy.initial_state(1)[0]), "act advances the LSTM state"
    controller.reset()
    assert torch.equal(controller.state[0], agent.policy.initial_state(1)[0])
    assert controller.act(snapshot, episode.masks()) == first


def test_a_policy_controller_plays_episodes_that_measure_every_blueprints_growth_signal(digits: Task) -> None:
    agent = build_agent(hidden_size=16)
    episode = MorphogenesisEpisode(digits, dataclasses.replace(PERMISSIVE, max_epochs=3), seed=0)
    snapshots: list[EpisodeSnapshot] = []

    class Waiting(PolicyController):
        """The policy acts (and so reads every observation), but the episode only ever waits: its slots stay
        empty whatever the untrained policy would choose."""

        def act(self, snapshot: EpisodeSnapshot, masks: Sequence[np.ndarray]) -> Action:
            snapshots.append(snapshot)
            super().act(snapshot, masks)
            return Action()

    run_episode(episode, Waiting(agent))
    empty_and_open = snapshots[1:]  # the first is the reset's, before any epoch measured anything
    assert empty_and_open
    for snapshot in empty_and_open:
        assert all(slot.depth_signal is not None for slot in snapshot.slots)
        assert {name for name, _ in snapshot.slots[0].seed_costs} >= {"conv_light", "wider", "norm"}
