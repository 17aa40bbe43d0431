"""Seed stories rebuilt from events: one per germination, stages in order, outcome and contribution."""

from morphogen.telemetry.events import CounterfactualMeasured, StageTransition
from morphogen.telemetry.story import seed_stories


def move(epoch: int, slot: str, blueprint: str, source: str, target: str, env_id: int = 0) -> StageTransition:
    return StageTransition(epoch=epoch, env_id=env_id, slot=slot, blueprint=blueprint, from_stage=source,
                           to_stage=target, reason=f"{source}->{target}")


def measured(epoch: int, slot: str, contribution: float, env_id: int = 0) -> CounterfactualMeasured:
    return CounterfactualMeasured(epoch=epoch, env_id=env_id, configs=("main", f"without:{slot}"),
                                  accuracies=(90.0, 90.0 - contribution), losses=(0.3, 0.4),
                                  contributions=((slot, contribution),))


def test_stories_follow_each_seed_from_germination_to_its_end():
    history = [
        move(3, "r0c1", "conv_light", "dormant", "germinated"),
        move(3, "r0c1", "conv_light", "germinated", "training"),
        move(8, "r0c1", "conv_light", "training", "blending"),
        measured(9, "r0c1", 1.5),
        move(10, "r0c1", "conv_light", "blending", "holding"),
        measured(11, "r0c1", 2.5),
        move(11, "r0c1", "conv_light", "holding", "fossilized"),
        move(12, "r0c0", "norm", "dormant", "germinated", env_id=1),
        move(14, "r0c0", "norm", "germinated", "pruned", env_id=1),
        move(15, "r0c0", "norm", "pruned", "embargoed", env_id=1),  # after the story ended: ignored
        move(16, "r0c2", "attention", "dormant", "germinated"),
    ]
    first, second, third = seed_stories(history)
    assert (first.slot, first.blueprint, first.germinated) == ("r0c1", "conv_light", 3)
    assert first.stages == {"training": 3, "blending": 8, "holding": 10, "fossilized": 11}
    assert (first.outcome, first.outcome_epoch, first.contribution) == ("fossilized", 11, 2.5)
    assert first.stage_path() == "training@3 blending@8 holding@10 fossilized@11"
    assert (second.env_id, second.outcome, second.outcome_epoch, second.contribution) == (1, "pruned", 14, None)
    assert "embargoed" not in second.stages
    assert (third.blueprint, third.outcome, third.stages) == ("attention", "alive", {})


def test_stories_carry_the_loss_a_seed_removes_before_and_after_blending():
    shadow = CounterfactualMeasured(epoch=5, env_id=0, configs=("main", "with:r0c0"), accuracies=(50.0, 50.25),
                                    losses=(1.5, 1.375), contributions=(("r0c0", 0.25),))
    blended = CounterfactualMeasured(epoch=8, env_id=0, configs=("main", "without:r0c0"), accuracies=(52.0, 49.0),
                                     losses=(1.25, 1.75), contributions=(("r0c0", 3.0),))
    history = [move(3, "r0c0", "block", "dormant", "germinated"), move(3, "r0c0", "block", "germinated", "training"),
               shadow, move(6, "r0c0", "block", "training", "blending"), blended]
    (story,) = seed_stories(history)
    assert (story.predicted_contribution, story.predicted_loss_contribution) == (0.25, 0.125)
    assert (story.contribution, story.loss_contribution) == (3.0, 0.5)
