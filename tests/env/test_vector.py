"""VectorEpisodes: envs in lockstep on one shared batch stream, each env's trajectory its own."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from torch import Tensor

import morphogen
from morphogen.control.growth_policy import GrowthInputs, GrowthPolicy
from morphogen.control.trainer import PPOTrainer, TrainConfig
from morphogen.data import Task, load_task
from morphogen.env.actions import Action, Op
from morphogen.env.episode import EpisodeConfig, MorphogenesisEpisode, task_with_host
from morphogen.env.seeding import derive_seed
from morphogen.env.training import HostAndSeedTrainer
from morphogen.env.vector import VectorEpisodes
from morphogen.telemetry.config import TelemetryConfig

SEED = 3
ROUND = 5




@pytest.fixture(scope="module")
def digits() -> Task:
    return load_task("digits", max_train_samples=200)


Call = tuple[HostAndSeedTrainer, Tensor, Tensor]


def record_batches(monkeypatch: pytest.MonkeyPatch) -> list[Call]:
    """Make `HostAndSeedTrainer.train_batch` record which trainer got which batch (then train as usual)."""
    calls: list[Call] = []
    original = HostAndSeedTrainer.train_batch

    def recording(trainer: HostAndSeedTrainer, inputs: Tensor, targets: Tensor) -> None:
        calls.append((trainer, inputs, targets))
        original(trainer, inputs, targets)

    monkeypatch.setattr(HostAndSeedTrainer, "train_batch", recording)
    return calls


def test_all_envs_train_on_the_same_batches(digits: Task, monkeypatch: pytest.MonkeyPatch) -> None:
    vector = VectorEpisodes(digits, EpisodeConfig(max_epochs=2), 3, seed=SEED)
    vector.reset(ROUND)
    calls = record_batches(monkeypatch)
    vector.step([Action()] * 3)

    trainers = [episode.trainer for episode in vector.episodes]
    n = len(trainers)
    assert len(calls) % n == 0
    batches = [calls[i:i + n] for i in range(0, len(calls), n)]
    for group in batches:
        assert [call[0] for call in group] == trainers, "each batch goes to every env, in env order"
        assert all(call[1] is group[0][1] and call[2] is group[0][2] for call in group), \
            "envs share the batch tensors themselves (loaded and augmented once)"
    assert sum(group[0][1].shape[0] for group in batches) == len(digits.train), "one epoch: every sample once"
    assert all(episode.timer.totals["train"] > 0.0 for episode in vector.episodes)


def test_each_env_matches_a_lone_episode_with_its_seed_and_actions(digits: Task,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    config = EpisodeConfig(max_epochs=3)
    slots = ("r0c0", "r0c1")
    actions = [  # per step, per env: env 0 grows a conv seed, env 1 waits then grows a norm seed
        [Action(op=Op.GERMINATE, slot="r0c0", blueprint="conv_light"), Action()],
        [Action(op=Op.ADVANCE, slot="r0c0"), Action(op=Op.GERMINATE, slot="r0c1", blueprint="norm")],
        [Action(), Action(op=Op.ADVANCE, slot="r0c1")],
    ]
    vector = VectorEpisodes(digits, config, 2, seed=SEED, slots=slots)
    starts = vector.reset(ROUND)
    calls = record_batches(monkeypatch)
    shared_batches: list[list[tuple[Tensor, Tensor]]] = []
    vector_results = []
    for step_actions in actions:
        calls.clear()
        vector_results.append(vector.step(step_actions))
        shared_batches.append([(x.clone(), y.clone()) for trainer, x, y in calls
                               if trainer is vector.episodes[0].trainer])
    monkeypatch.undo()
    first_weights = [episode.build_model().host_parameters()[0] for episode in vector.episodes]
    assert not torch.equal(*first_weights), "envs must start from different host seeds"

    for env in range(2):
        lone = MorphogenesisEpisode(digits, config, seed=derive_seed(SEED, ROUND, env), slots=slots)
        assert repr(lone.reset()) == repr(starts[env])
        for step, step_actions in enumerate(actions):
            succeeded, reason = lone.apply_action(step_actions[env])
            lone.train_epoch(shared_batches[step])
            result = lone.finish_epoch(step_actions[env], succeeded, reason)
            expected = vector_results[step][env]
            assert repr(result.snapshot) == repr(expected.snapshot), (env, step)
            assert result.reward == expected.reward and result.action_succeeded == expected.action_succeeded
        assert lone.model is not None and vector.episodes[env].model is not None
        lone_state, vector_state = lone.model.state_dict(), vector.episodes[env].model.state_dict()
        assert lone_state.keys() == vector_state.keys()
        for key, value in lone_state.items():  # parameters and buffers, and the slots' extra (lifecycle) state
            same = torch.equal(value, vector_state[key]) if isinstance(value, Tensor) else \
                repr(value) == repr(vector_state[key])
            assert same, (env, key)
    grown = [[s.blueprint for s in vector_results[-1][env].snapshot.slots] for env in range(2)]
    assert grown == [["conv_light", None], [None, "norm"]], "the actions must really have differed per env"


def test_reset_derives_env_seeds_from_the_round(digits: Task) -> None:
    vector = VectorEpisodes(digits, EpisodeConfig(max_epochs=1), 2, seed=SEED)
    vector.reset(0)
    first = [episode.seed for episode in vector.episodes]
    vector.reset(1)
    second = [episode.seed for episode in vector.episodes]
    assert first == [derive_seed(SEED, 0, 0), derive_seed(SEED, 0, 1)]
    assert second == [derive_seed(SEED, 1, 0), derive_seed(SEED, 1, 1)]
    assert len(set(first + second)) == 4


def test_step_needs_one_action_per_env(digits: Task) -> None:
    with pytest.raises(ValueError, match="n_envs must be >= 1, got 0"):
        VectorEpisodes(digits, EpisodeConfig(max_epochs=1), 0)
    vector = VectorEpisodes(digits, EpisodeConfig(max_epochs=1), 2)
    vector.reset(0)
    with pytest.raises(ValueError, match="expected 2 actions, got 1"):
        vector.step([Action()])


def test_collect_makes_one_batched_policy_call_per_step(digits: Task, monkeypatch: pytest.MonkeyPatch) -> None:
    base = TrainConfig(n_envs=3, rounds=1, hidden_size=16, max_train_samples=200,
                       telemetry=TelemetryConfig(level="off"))
    config = dataclasses.replace(base, episode=dataclasses.replace(base.episode, max_epochs=3))
    trainer = PPOTrainer(config, digits)
    batch_sizes: list[int] = []
    original = GrowthPolicy.act

    def counting_act(policy: GrowthPolicy, observation: GrowthInputs, *args: Any, **kwargs: Any) -> Any:
        batch_sizes.append(observation.globals.shape[0])
        return original(policy, observation, *args, **kwargs)

    monkeypatch.setattr(GrowthPolicy, "act", counting_act)
    trainer.collect(0)
    assert batch_sizes == [3, 3, 3], "one call per step, for all envs at once"


def test_a_users_shuffled_loader_gives_the_same_epoch_whatever_the_process_drew_before(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A `DataLoader(shuffle=True)` shuffles from torch's global generator; an epoch's batches come from the round's
    seed and the epoch, so a resumed or repeated round trains on the ones it trained on before."""
    generator = torch.Generator().manual_seed(0)
    inputs, targets = torch.randn(64, 6, generator=generator), torch.randint(0, 2, (64,), generator=generator)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(inputs, targets), batch_size=16, shuffle=True)

    def host() -> torch.nn.Module:
        net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        return morphogen.host_from_module(net, slots=["1"], example_input=inputs[:2])

    task = task_with_host(morphogen.task_from_data("shuffled", loader, (inputs[:16], targets[:16]), host=host))
    calls = record_batches(monkeypatch)
    seen = []
    for draw_first in (0, 5):
        vector = VectorEpisodes(task, EpisodeConfig(max_epochs=2), 2, seed=SEED)
        vector.reset(ROUND)
        torch.rand(draw_first)
        epochs = []
        for _ in range(2):
            calls.clear()
            vector.step([Action()] * 2)
            epochs.append(torch.cat([call[2] for call in calls]))
        assert not torch.equal(epochs[0], epochs[1]), "each epoch its own order"
        seen.append(epochs)
    assert all(torch.equal(a, b) for a, b in zip(seen[0], seen[1], strict=True))


@pytest.mark.parametrize(("baselines", "batch_identical"), [(False, False), (True, False), (False, True)])
def test_a_streamed_first_training_batch_beyond_num_classes_is_refused_in_the_vector_env(
        baselines: bool, batch_identical: bool) -> None:
    """The vector's unbatched path, its no-growth twins (which train first) and its stacked (vmap) path go through
    the episode's first training batch: class 7 of num_classes=3 in a DataLoader is the one line, not an IndexError."""
    generator = torch.Generator().manual_seed(0)
    inputs, labels = torch.randn(32, 4, generator=generator), torch.randint(0, 3, (32,), generator=generator)
    labels[2] = 7
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    host = morphogen.host_from_module(net, ["1"], example_input=inputs[:2])
    task = morphogen.task_from_data("beyond", torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(inputs, labels), batch_size=16), (inputs[:16], labels[:16] % 3),
        num_classes=3, host=host)
    vector = VectorEpisodes(task, EpisodeConfig(max_epochs=1, batch_identical=batch_identical), 2, seed=SEED,
                            baselines=baselines)
    vector.reset(ROUND)
    with pytest.raises(morphogen.DataError, match=r"^task 'beyond': train \(the first batch\): targets hold class 7"):
        vector.step([Action()] * 2)
