"""The life story of every seed of an episode, rebuilt from its events (for `run` output and reports)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from morphogen.telemetry.events import CounterfactualMeasured, Event, StageTransition

TERMINAL_OUTCOMES = ("fossilized", "pruned")
#: Counterfactual configuration names (written by env/counterfactual.py): `with:<slot>` blends a TRAINING
#: seed in at alpha 1 (its shadow), `without:<slot>` removes a blended seed.
SHADOW_PREFIX, WITHOUT_PREFIX = "with:", "without:"
#: The configuration of the model as it is, next to which the others are measured.
MAIN_CONFIG = "main"
#: The score's name of a task with its own loss and no metric (the loss, negated): the run's output and the
#: readers of its summary show the loss itself for it.
NEGATIVE_LOSS = "negative loss"
#: The events a story is built from: what a saved episode keeps of its history to tell its seeds' stories later.
STORY_EVENTS = (StageTransition, CounterfactualMeasured)


@dataclass
class SeedStory:
    """One seed: where and what it was, the epoch it entered each stage, how it ended, what it gave."""

    env_id: int
    slot: str
    blueprint: str
    germinated: int
    #: Stage name -> epoch it was entered (first time), in order of entry.
    stages: dict[str, int] = field(default_factory=dict)
    #: "fossilized", "pruned", or "alive" at the end of the events.
    outcome: str = "alive"
    outcome_epoch: int | None = None
    outcome_reason: str = ""
    #: Last measured counterfactual contribution in accuracy points (None if never blended in).
    contribution: float | None = None
    #: Last shadow contribution measured while the seed was TRAINING: what blending it in was predicted
    #: to add, in accuracy points (None if it never trained behind the host).
    predicted_contribution: float | None = None
    #: The same two in validation loss removed (nats per token for a language model): loss without the seed
    #: minus loss with it, and while TRAINING the model's loss minus its shadow's.
    loss_contribution: float | None = None
    predicted_loss_contribution: float | None = None
    #: The same two as shares of the model's validation loss they were measured against (None where that loss
    #: was not positive): what the gates judge by a task with its own loss.
    relative_loss_contribution: float | None = None
    predicted_relative_loss_contribution: float | None = None

    def stage_path(self) -> str:
        """Every stage entered after germination, as `stage@epoch`, the outcome included."""
        return " ".join(f"{stage}@{epoch}" for stage, epoch in self.stages.items())

    def path_before_outcome(self) -> str:
        """`stage_path` without the outcome, which `ending` shows (so that a story never says it twice)."""
        return " ".join(f"{stage}@{epoch}" for stage, epoch in self.stages.items() if stage not in TERMINAL_OUTCOMES)

    def ending(self) -> str:
        """How the seed ended, with the epoch: `fossilized@18`, `pruned@28`, or `alive`."""
        return self.outcome if self.outcome_epoch is None else f"{self.outcome}@{self.outcome_epoch}"


def seed_stories(history: Iterable[Event]) -> list[SeedStory]:
    """Stories in germination order from a stream of events (of one or several envs)."""
    stories: list[SeedStory] = []
    current: dict[tuple[int, str], SeedStory] = {}
    for event in history:
        if isinstance(event, StageTransition):
            key = (event.env_id, event.slot)
            if event.to_stage == "germinated":
                story = SeedStory(event.env_id, event.slot, event.blueprint, event.epoch)
                current[key] = story
                stories.append(story)
                continue
            story_or_none = current.get(key)
            if story_or_none is None:
                continue  # a slot's embargo/reset moves after its seed's story ended
            story_or_none.stages.setdefault(event.to_stage, event.epoch)
            if event.to_stage in TERMINAL_OUTCOMES:
                story_or_none.outcome, story_or_none.outcome_epoch = event.to_stage, event.epoch
                story_or_none.outcome_reason = event.reason
                del current[key]
        elif isinstance(event, CounterfactualMeasured):
            _note_contributions(event, current)
    return stories


def _note_contributions(event: CounterfactualMeasured, current: dict[tuple[int, str], SeedStory]) -> None:
    """Write the contributions `event` measured into the stories of the live seeds it measured."""
    losses = dict(zip(event.configs, event.losses, strict=True))
    main_loss = losses.get(MAIN_CONFIG)
    for slot, contribution in event.contributions:
        story = current.get((event.env_id, slot))
        if story is None:
            continue
        if SHADOW_PREFIX + slot in event.configs:
            story.predicted_contribution = contribution
            if main_loss is not None:
                story.predicted_loss_contribution = main_loss - losses[SHADOW_PREFIX + slot]
                story.predicted_relative_loss_contribution = share_of_loss(story.predicted_loss_contribution, main_loss)
        elif WITHOUT_PREFIX + slot in event.configs:
            story.contribution = contribution
            if main_loss is not None:
                story.loss_contribution = losses[WITHOUT_PREFIX + slot] - main_loss
                story.relative_loss_contribution = share_of_loss(story.loss_contribution, main_loss)


def share_of_loss(loss_removed: float | None, loss: float | None) -> float | None:
    """`loss_removed` as a share of the model's validation `loss` (None: not measured, or a loss that is not
    positive, of which no share means anything)."""
    if loss_removed is None or loss is None or not loss > 0.0:
        return None
    return loss_removed / loss
