"""The controller that never grows: the no-growth baseline every comparison trains beside growth.

What a controller must offer is the `morphogen.env.play.Controller` protocol."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from morphogen.env.actions import Action, ActionSpace
from morphogen.env.snapshot import EpisodeSnapshot


class NoGrowthController:
    """Always waits: the episode then trains the bare host (the no-growth baseline)."""

    reads_blueprints = False

    def reset(self) -> None:
        """Nothing to forget between episodes."""

    def act(self, snapshot: EpisodeSnapshot, masks: Sequence[np.ndarray]) -> Action:
        return Action()

    def state_dict(self) -> dict[str, Any]:
        """Nothing: it remembers nothing of an episode."""
        return {}

    def load_state_dict(self, state: dict[str, Any], space: ActionSpace) -> None:
        """Nothing to restore."""
