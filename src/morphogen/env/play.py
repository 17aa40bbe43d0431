"""Playing an episode: a controller acts once per epoch until the episode is over.

`Controller` is what the episode loop asks of whoever decides (the heuristic, a learned policy, no growth
at all); `run_episode` plays a whole episode and returns its `EpisodeOutcome`. `morphogen run`, `eval`
and the benchmarks all play episodes through here.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from morphogen.env.actions import Action, ActionSpace
from morphogen.env.compute import ComputeAccount
from morphogen.env.episode import MorphogenesisEpisode, StepResult
from morphogen.env.snapshot import EpisodeSnapshot
from morphogen.telemetry.profiler import TraceProfiler
from morphogen.telemetry.story import SeedStory, seed_stories


class Controller(Protocol):
    """Decides the action of every epoch; `reset` is called at the start of each episode.

    A controller that chooses where and how to grow by growth signals also has a method
    `growth_candidates(epoch) -> Sequence[str]`, the blueprints it would compare: the episode then measures
    the signals and those candidates' costs into the snapshot's slots (`env/growth_signals.py`). One that may
    germinate any blueprint and reads the signals from its observation (the learned policy) has
    `reads_growth_signals = True`: the episode measures them for every blueprint. One that
    reads no blueprint descriptions (the heuristic, no growth) has `reads_blueprints = False`: the episode
    then does not count what every blueprint would add in every slot.
    """

    def reset(self) -> None: ...

    def act(self, snapshot: EpisodeSnapshot, masks: Sequence[np.ndarray]) -> Action: ...


@runtime_checkable
class SavableController(Protocol):
    """A controller whose memory of an episode can be saved between epochs and restored (a `Grower`'s
    `state_dict`): the heuristic, the learned policy and no growth are."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any], space: ActionSpace) -> None: ...


@dataclass
class EpisodeOutcome:
    """How an episode ended: final validation figures, size, time, return and the story of every seed."""

    final_accuracy: float
    final_loss: float
    parameters: int
    host_parameters: int
    seconds: float
    episode_return: float
    stories: list[SeedStory]
    phase_seconds: dict[str, float]
    flops: ComputeAccount = field(default_factory=ComputeAccount)
    """The FLOPs the episode spent: training, shadow passes, validation and counterfactuals."""
    recent_scores: tuple[float, ...] = ()
    """The validation scores of the last epochs (up to `HISTORY_LENGTH`), the final one last: how much the
    final figure could have moved had the episode ended an epoch or two sooner or later."""


def play_epoch(episode: MorphogenesisEpisode, controller: Controller, snapshot: EpisodeSnapshot) -> StepResult:
    """One controller decision and one epoch of `episode`, then the telemetry epoch is closed."""
    result = episode.step(controller.act(snapshot, episode.masks()))
    episode.telemetry.end_epoch(result.snapshot.epoch)
    return result


def connect(episode: MorphogenesisEpisode, controller: object) -> None:
    """Have `episode` measure what `controller` reads: growth signals of its candidates (of every blueprint for
    one that `reads_growth_signals`), and what each blueprint would add in each slot unless it reads none."""
    candidates = getattr(controller, "growth_candidates", None)
    if candidates is None and getattr(controller, "reads_growth_signals", False):
        candidates = episode.every_blueprint
    episode.growth_candidates = candidates
    episode.describe_blueprints = getattr(controller, "reads_blueprints", True)


def savable(controller: object, what: str) -> SavableController:
    """`controller`, where its memory of an episode can be saved; else a TypeError naming it (`what` it cannot be:
    "saved", "restored")."""
    if not isinstance(controller, SavableController):
        raise TypeError(f"the controller {type(controller).__name__} cannot be {what}: give it "
                        "state_dict() and load_state_dict(state, space), as the heuristic has")
    return controller


def play_state(episode: MorphogenesisEpisode, controller: Controller, seconds: float) -> dict[str, Any]:
    """Where a played episode stands between two epochs, for `run_episode(resume=...)`: the episode, the
    controller's memory, the telemetry's escalation, the anomaly detector, the phase timer, torch's global generator
    (for what a user's code draws from it between epochs; an epoch's training draws from its own) and the seconds
    played. Plain values and tensors only."""
    return {"episode": episode.state_dict(), "controller": savable(controller, "saved").state_dict(),
            "torch_rng": torch.get_rng_state(),
            "seconds": seconds, "telemetry": episode.telemetry.state_dict(), "timer": episode.timer.state_dict(),
            "detector": None if episode.detector is None else episode.detector.state_dict()}


def _load_play_state(episode: MorphogenesisEpisode, controller: Controller,
                     state: Mapping[str, Any]) -> EpisodeSnapshot:
    """Put `episode` (just reset) and `controller` where `play_state` saved them; the snapshot to act on next."""
    snapshot = episode.load_state_dict(state["episode"])
    savable(controller, "restored").load_state_dict(state["controller"], episode.action_space)
    episode.telemetry.load_state_dict(state["telemetry"])
    episode.timer.load_state_dict(state["timer"])
    if episode.detector is not None and state["detector"] is not None:
        episode.detector.load_state_dict(state["detector"])
    torch.set_rng_state(state["torch_rng"])
    return snapshot


def run_episode(episode: MorphogenesisEpisode, controller: Controller,
                on_step: Callable[[StepResult], None] | None = None,
                profiler: TraceProfiler | None = None, *, resume: Mapping[str, Any] | None = None,
                save: Callable[[dict[str, Any]], None] | None = None, save_every: int = 1) -> EpisodeOutcome:
    """Play one whole episode of `controller` in `episode` (one profiler step per epoch).

    `resume`, a `play_state` saved between two epochs, has the episode go on from there (an episode saved at its
    end is not played again); `save` receives the `play_state` after every `save_every`-th epoch and the last
    (`save_every` 0: never).
    """
    started = time.perf_counter()
    connect(episode, controller)
    snapshot = episode.reset()
    controller.reset()
    seconds_before = 0.0
    if resume is not None:
        snapshot = _load_play_state(episode, controller, resume)
        seconds_before = float(resume["seconds"])
    while not episode.done:
        result = play_epoch(episode, controller, snapshot)
        snapshot = result.snapshot
        if profiler is not None:
            profiler.step()
        if on_step is not None:
            on_step(result)
        if save is not None and save_every and (episode.epoch % save_every == 0 or episode.done):
            save(play_state(episode, controller, seconds_before + time.perf_counter() - started))
    return episode_outcome(episode, snapshot, seconds_before + time.perf_counter() - started)


def episode_outcome(episode: MorphogenesisEpisode, snapshot: EpisodeSnapshot, seconds: float) -> EpisodeOutcome:
    """How `episode`, whose last snapshot is `snapshot`, ended after `seconds` of play."""
    assert episode.model is not None
    return EpisodeOutcome(
        final_accuracy=snapshot.val_accuracy, final_loss=snapshot.val_loss, parameters=snapshot.active_parameters,
        host_parameters=snapshot.host_parameters, seconds=seconds,
        episode_return=episode.episode_return, stories=seed_stories(episode.history),
        phase_seconds=episode.timer.totals, flops=dataclasses.replace(episode.compute),
        # Trained epochs only, not the start (none before the first: a slice [-0:] would keep the start).
        recent_scores=tuple(snapshot.accuracy_history)[-snapshot.epoch:] if snapshot.epoch else (),
    )
