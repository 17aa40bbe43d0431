"""`morphogen run`'s closing table tells each seed's worth in what the gates judged: points, or nats of loss."""

import dataclasses
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


def test_the_table_shows_the_last_epochs_and_says_when_the_final_gap_is_within_one_epoch_s_swing() -> None:
    grown = dataclasses.replace(outcome([]), final_accuracy=92.22, recent_scores=(98.61, 93.33, 93.61, 88.61, 92.22))
    steady = dataclasses.replace(outcome([]), final_accuracy=98.33, recent_scores=(98.06, 98.33, 98.33, 98.06, 98.33))
    out = io.StringIO()
    print_summary(grown, steady, out)
    row = next(line for line in out.getvalue().splitlines() if line.startswith("  last 5 epochs"))
    assert row.split()[3:] == ["88.61-98.61", "98.06-98.33", "-"]
    assert "may be noise" not in out.getvalue()  # 6.11 apart: more than any epoch moved (5.28)
    close = dataclasses.replace(grown, final_accuracy=94.00, recent_scores=(98.61, 93.33, 93.61, 88.61, 94.00))
    out = io.StringIO()
    print_summary(close, steady, out)
    assert "end 4.33 apart, less than one epoch moved their accuracy near the end (5.39)" in out.getvalue()
    assert 'schedule = "cosine"' in out.getvalue()
    assert all(len(line) <= 120 for line in out.getvalue().splitlines())  # the note wraps, as every line does
    out = io.StringIO()
    print_summary(close, steady, out, decaying=True)  # the rate decays already: no advice to make it decay
    assert out.getvalue().count("may be noise.)") == 1 and "cosine" not in out.getvalue()
    out = io.StringIO()
    print_summary(steady, steady, out)  # nothing grown: the same training, no gap to judge
    assert "may be noise" not in out.getvalue()


def test_the_table_says_what_the_grown_run_cost_against_its_architecture_from_scratch() -> None:
    from morphogen.env.compute import ComputeAccount

    grown = dataclasses.replace(outcome([]), flops=ComputeAccount(training=600, validation=20))
    scratch = dataclasses.replace(outcome([]), flops=ComputeAccount(training=950, validation=50))
    out = io.StringIO()
    print_summary(grown, None, out, from_scratch=scratch)
    assert next(line for line in out.getvalue().splitlines() if line.startswith("  of from scratch")).split() == [
        "of", "from", "scratch", "0.62x"]
    out = io.StringIO()
    print_summary(grown, None, out)  # no architecture trained from scratch: nothing to compare with
    assert "of from scratch" not in out.getvalue()


def test_a_seed_whose_story_would_not_fit_gives_its_contributions_a_line_of_their_own() -> None:
    from morphogen.commands.run import story_line

    path = f"{'branch_wide':<11} {'1':<5} {'training@5 blending@10 holding@12':<36} {'fossilized@14':<14}"
    assert story_line(path, "predicted +0.0669 nats  measured +1.3034 nats").count("\n") == 0
    long = story_line(path, "predicted +20.08% of loss  measured +553.37% of loss")
    assert long.splitlines() == ["  branch_wide 1     training@5 blending@10 holding@12    fossilized@14",
                                 "      predicted +20.08% of loss  measured +553.37% of loss"]
