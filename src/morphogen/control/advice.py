"""The heuristic's advice to a learned policy: what the rule-based controller would do at each step.

A growth policy reads, besides the episode, the action `HeuristicController` proposes now (the `advice`
features of `env/observation.py`). Imitation teaches it to follow that advice, PPO where departing from it
pays. The advice is the one input whose meaning does not drift from task to task: rules read the loss curve's
own plateaus and slowdowns, where the policy's other inputs (levels of accuracy and loss) differ between a
digits CNN at 98% and a user's MLP at 50%. A policy without advice learned timings that did not carry over
to such hosts (README, "The shipped policy").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from morphogen.control.heuristic import HeuristicController
from morphogen.env.actions import Action, ActionSpace
from morphogen.env.snapshot import EpisodeSnapshot


class HeuristicAdvisor:
    """One env's advisor: proposes the heuristic's action for each snapshot, then follows the action taken.

    The proposal comes from a copy of the heuristic (`HeuristicController.fork`); when the action taken is the
    proposal, the copy becomes the heuristic, otherwise the heuristic records the action taken as its own
    (`HeuristicController.follow`), so the next advice starts from the episode as it is.
    """

    def __init__(self) -> None:
        self._heuristic: HeuristicController | None = None
        self._pending: tuple[EpisodeSnapshot, Action, HeuristicController] | None = None

    def reset(self) -> None:
        """A new episode begins (on any task and host)."""
        self._heuristic, self._pending = None, None

    def state_dict(self) -> dict[str, Any]:
        """The heuristic it keeps in step with the episode (None before its first advice), between epochs."""
        if self._pending is not None:
            raise RuntimeError("the advisor is saved between epochs, not between advise and taken")
        return {"heuristic": None if self._heuristic is None else self._heuristic.state_dict()}

    def load_state_dict(self, state: dict[str, Any], space: ActionSpace) -> None:
        """Continue the episode `state_dict` was saved in, of action space `space`."""
        self.reset()
        if state["heuristic"] is not None:
            self._heuristic = HeuristicController(space, space.topology)
            self._heuristic.load_state_dict(state["heuristic"], space)

    def advise(self, snapshot: EpisodeSnapshot, masks: Sequence[np.ndarray], space: ActionSpace) -> Action:
        """The heuristic's action for `snapshot` in an episode of action space `space`; `taken` must follow."""
        if self._heuristic is None:
            self._heuristic = HeuristicController(space, space.topology)
        trial = self._heuristic.fork()
        advice = trial.act(snapshot, masks)
        self._pending = (snapshot, advice, trial)
        return advice

    def taken(self, action: Action) -> None:
        """The action the episode took at the snapshot last advised on."""
        if self._pending is None or self._heuristic is None:
            raise RuntimeError("HeuristicAdvisor.taken called before advise")
        snapshot, advice, trial = self._pending
        if (action.op, action.slot, action.blueprint) == (advice.op, advice.slot, advice.blueprint):
            self._heuristic = trial
        else:
            self._heuristic.follow(snapshot, action)
        self._pending = None


def advise_all(advisors: Sequence[HeuristicAdvisor], snapshots: Sequence[EpisodeSnapshot],
               masks: Sequence[Sequence[np.ndarray]], spaces: Sequence[ActionSpace]) -> list[Action]:
    """Each env's advice for its snapshot (one advisor, masks and action space per env)."""
    return [advisor.advise(snapshot, env_masks, space)
            for advisor, snapshot, env_masks, space in zip(advisors, snapshots, masks, spaces, strict=True)]


def record_taken(advisors: Sequence[HeuristicAdvisor], actions: Sequence[Action]) -> None:
    """Tell each env's advisor the action its episode took."""
    for advisor, action in zip(advisors, actions, strict=True):
        advisor.taken(action)
