"""`morphogen run`'s closing table tells each seed's worth in what the gates judged: points, or nats of loss."""

import io

from morphogen.commands.run import print_summary
from morphogen.core.lifecycle import Criterion
from morphogen.env.play import EpisodeOutcome
from morphogen.telemetry.story import SeedStory


def outcome(stories: list[SeedStory]) -> EpisodeOutcome:
    return EpisodeOutcome(final_accuracy=55.0, final_loss=1.5, parameters=56_000, host_parameters=30_592,
                          seconds=1.0, episode_return=0.0, stories=stories, phase_seconds={})


def test_a_language_model_tells_its_seeds_worth_in_nats() -> None:
    block = SeedStory(0, "r0c0", "block", 5, {"training": 5, "blending": 5, "holding": 5}, contribution=4.25,
                      loss_contribution=0.0625)
    for criterion, shown, hidden in ((Criterion.LOSS, "measured +0.0625 nats", "pts"),
                                     (Criterion.SCORE, "measured +4.25 pts", "nats")):
        out = io.StringIO()
        print_summary(outcome([block]), None, out, criterion=criterion)
        seeds = out.getvalue().split("seeds (1):")[1]
        assert shown in seeds and "predicted -" in seeds and hidden not in seeds
