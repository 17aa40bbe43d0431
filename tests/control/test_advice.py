"""The heuristic's advice to a learned policy: the heuristic's own choices when followed, in step when not."""

from __future__ import annotations

import dataclasses

import numpy as np
from tests.control.test_heuristic import ALL_EMPTY, RISING, controller, make_masks, make_slot, make_snapshot
from tests.control.test_learned import PERMISSIVE

from morphogen.control.advice import HeuristicAdvisor
from morphogen.control.heuristic import HeuristicController
from morphogen.core.lifecycle import Stage
from morphogen.data import Task
from morphogen.env.actions import Action, Op
from morphogen.env.episode import MorphogenesisEpisode
from morphogen.env.play import run_episode
from morphogen.env.snapshot import EpisodeSnapshot


def test_advice_followed_at_every_step_is_what_the_heuristic_plays(digits: Task) -> None:
    episode = MorphogenesisEpisode(digits, dataclasses.replace(PERMISSIVE, max_epochs=12), seed=1)
    steps: list[tuple[EpisodeSnapshot, list[np.ndarray], Action]] = []

    class Recorded(HeuristicController):
        def act(self, snapshot: EpisodeSnapshot, masks: list[np.ndarray]) -> Action:  # type: ignore[override]
            action = super().act(snapshot, masks)
            steps.append((snapshot, masks, action))
            return action

    episode.reset()
    run_episode(episode, Recorded(episode.action_space, digits.topology))
    assert {action.op for _, _, action in steps} >= {Op.GERMINATE, Op.ADVANCE}, "a heuristic episode that grows"
    advisor = HeuristicAdvisor()
    for snapshot, masks, action in steps:
        assert advisor.advise(snapshot, masks, episode.action_space) == action
        advisor.taken(action)


def test_a_declined_germination_is_advised_again_and_a_taken_one_counts_as_growth() -> None:
    space = controller()[1]
    steady = (1.0, 0.8, 0.6, 0.4, 0.2)  # the loss still falls: only `first_growth_by` germinates the first seed
    due = make_snapshot(epoch=10, history=RISING, losses=steady)
    masks = make_masks(space, ALL_EMPTY)
    advisor = HeuristicAdvisor()
    first = advisor.advise(due, masks, space)
    assert first.op is Op.GERMINATE
    advisor.taken(Action())  # the policy waited: the episode has still not grown
    assert advisor.advise(make_snapshot(epoch=11, history=RISING, losses=steady), masks, space) == first
    advisor.taken(first)  # now it germinated: a further seed waits for learning to slow down
    assert advisor.advise(make_snapshot(epoch=12, history=RISING, losses=steady), masks, space) == Action()


def test_a_prune_the_policy_chose_holds_its_blueprint_back_in_later_advice() -> None:
    heuristic, space = controller()
    masks = make_masks(space, ALL_EMPTY)
    first_choice = heuristic.fork().act(make_snapshot(epoch=10), masks)
    assert first_choice.op is Op.GERMINATE and first_choice.blueprint is not None
    advisor = HeuristicAdvisor()
    young = make_slot("r0c0", Stage.TRAINING, blueprint=first_choice.blueprint, epochs_in_stage=1)
    assert advisor.advise(make_snapshot(young, epoch=9), make_masks(space, {Op.PRUNE: ("r0c0",)}), space) == Action()
    advisor.taken(Action(Op.PRUNE, "r0c0"))  # the policy pruned the seed the heuristic would have kept training
    later = advisor.advise(make_snapshot(epoch=10), masks, space)
    assert later.op is Op.GERMINATE and later.blueprint != first_choice.blueprint
