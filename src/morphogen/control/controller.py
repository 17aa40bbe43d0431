"""What every controller offers the episode loop: reset at episode start, one action per epoch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from morphogen.env.actions import Action
from morphogen.env.snapshot import EpisodeSnapshot


class Controller(Protocol):
    def reset(self) -> None: ...

    def act(self, snapshot: EpisodeSnapshot, masks: Sequence[np.ndarray]) -> Action: ...


class NoGrowthController:
    """Always waits: the episode then trains the bare host (the no-growth baseline)."""

    def reset(self) -> None:
        """Nothing to forget between episodes."""

    def act(self, snapshot: EpisodeSnapshot, masks: Sequence[np.ndarray]) -> Action:
        return Action()
