"""Growth signals in an episode: measured for a controller that asks, when a seed could be germinated, charged
to the episode's FLOPs, invisible to the training; a widening seed trains with an optimizer of its own."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from morphogen import MorphogeneticModel, host_from_module
from morphogen.control.controller import NoGrowthController
from morphogen.control.heuristic import HeuristicController
from morphogen.core.flops import FlopCounter
from morphogen.core.lifecycle import Stage
from morphogen.data import Task, load_task
from morphogen.env.actions import Action, Op
from morphogen.env.episode import EpisodeConfig, MorphogenesisEpisode
from morphogen.env.evaluation import Objective, task_loss
from morphogen.env.growth_signals import measure_growth
from morphogen.env.play import run_episode


@pytest.fixture(scope="module")
def digits() -> Task:
    return load_task("digits", max_train_samples=128)


def test_the_episode_measures_signals_and_costs_only_when_a_controller_asks(digits: Task) -> None:
    episode = MorphogenesisEpisode(digits, EpisodeConfig(max_epochs=2), seed=0)
    episode.reset()
    heuristic = HeuristicController(episode.action_space, digits.topology)
    episode.growth_candidates = heuristic.growth_candidates  # what run_episode hands over
    snapshot = episode.step(Action()).snapshot  # an empty model: a seed could be germinated
    assert episode.compute.probe > 0
    for slot in snapshot.slots:
        assert slot.depth_signal is not None and slot.depth_signal > 0
        assert slot.width_signal is not None and slot.width_signal > 0  # both CNN slots have layers around them
        assert [name for name, _ in slot.seed_costs] == ["conv_heavy", "wider"]
        assert all(cost.relative_flops > 0 and cost.parameters > 0 for _, cost in slot.seed_costs)
    episode.step(Action())  # the last epoch: nothing is measured for a decision that never comes
    assert all(slot.depth_signal is None for slot in episode.snapshot.slots)
    plain = MorphogenesisEpisode(digits, EpisodeConfig(max_epochs=2), seed=0)
    run_episode(plain, NoGrowthController())
    assert plain.compute.probe == 0 and all(slot.depth_signal is None for slot in plain.snapshot.slots)
    # Measuring changed nothing of the training: the same host weights as without it.
    for (name, mine), (_, theirs) in zip(episode.model.host.state_dict().items(),  # type: ignore[union-attr]
                                         plain.model.host.state_dict().items(), strict=True):  # type: ignore[union-attr]
        assert torch.equal(mine, theirs), name


def test_a_widening_seed_gets_a_fresh_optimizer_of_its_own(digits: Task) -> None:
    episode = MorphogenesisEpisode(digits, EpisodeConfig(max_epochs=2), seed=0)
    episode.reset()
    host_parameters = {id(p) for group in episode.trainer.host_optimizer.param_groups for p in group["params"]}
    episode.step(Action(Op.GERMINATE, "r0c1", "wider"))
    assert episode.model is not None
    slot = episode.model.slot("r0c1")
    assert slot.stage is Stage.TRAINING and slot.width_site is not None
    seed, optimizer = episode.trainer.seed_optimizers["r0c1"]
    assert seed is slot.seed
    owned = [p for group in optimizer.param_groups for p in group["params"]]
    assert {id(p) for p in owned} == {id(p) for p in slot.seed_parameters()}
    assert not host_parameters & {id(p) for p in owned}
    assert all(optimizer.state[p]["momentum_buffer"] is not None for p in owned)  # it stepped, from nothing


def test_a_frozen_part_of_a_users_model_reads_the_same_signals_and_is_charged_its_probe() -> None:
    """Where nothing before a slot learns (a frozen backbone), its activation does not require grad; the probe
    still measures the gradient there, the same as with the backbone learning, and FLOP counting still runs."""
    torch.manual_seed(0)
    network = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
    x, targets = torch.randn(6, 3, 8, 8), torch.arange(6) % 4
    objective = Objective(task_loss, None, custom=False)
    measured = []
    for frozen in (False, True):
        model = MorphogeneticModel(host_from_module(copy.deepcopy(network), ["1", "3"], example_input=x[:2]))
        for parameter in model.host.segments[0].parameters():
            parameter.requires_grad_(not frozen)
        signals, probe_flops = measure_growth(model, (x, targets), objective, FlopCounter(), ["wider"])
        measured.append(({slot: (s.depth, s.width) for slot, s in signals.items()}, probe_flops))
    (learning, learning_flops), (frozen_signals, frozen_flops) = measured
    assert frozen_signals.keys() == learning.keys() == {"1", "3"} and frozen_flops == learning_flops > 0
    for slot, (depth, width) in learning.items():
        assert frozen_signals[slot][0] == pytest.approx(depth) and depth > 0
        assert frozen_signals[slot][1] == (None if width is None else pytest.approx(width))
