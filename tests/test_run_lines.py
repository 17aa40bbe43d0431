"""What `morphogen run` prints per epoch and per seed: lines within 120 columns that never cut why an action
was refused, and seed stories that name each stage once."""

from __future__ import annotations

import io

from morphogen.commands.run import format_step, print_summary
from morphogen.core.lifecycle import Stage
from morphogen.env.actions import Op
from morphogen.env.episode import StepResult
from morphogen.env.play import EpisodeOutcome
from morphogen.env.rewards import RewardBreakdown
from morphogen.env.snapshot import EpisodeSnapshot, SlotSnapshot
from morphogen.telemetry.story import SeedStory

REASON = "blended in, the seed would add -0.28 points < 0.5"


def slot(slot_id: str, blueprint: str | None, stage: Stage, alpha: float = 0.0) -> SlotSnapshot:
    return SlotSnapshot(slot_id=slot_id, stage=stage, blueprint=blueprint,
                        alpha=alpha, alpha_target=alpha, alpha_progress=1.0, alpha_ramping=False, epochs_in_stage=1,
                        seed_age=1, seed_parameters=100, contribution=None, previous_contribution=None,
                        gradient_norm=None, gradient_health=None, gradient_ratio=None)


def step(slots: tuple[SlotSnapshot, ...], op: Op, succeeded: bool, reason: str) -> StepResult:
    snapshot = EpisodeSnapshot(epoch=14, max_epochs=30, train_loss=0.2, val_loss=0.167, val_accuracy=96.94,
                               accuracy_history=(96.94,), loss_history=(0.167,), host_parameters=1_442,
                               active_parameters=2_642, slots=slots, accuracy_all_off=None, last_op=int(op),
                               last_action_succeeded=succeeded)
    return StepResult(snapshot=snapshot, reward=RewardBreakdown.from_components([]), done=False,
                      action_succeeded=succeeded, reason=reason, rollback=None)


THREE_SEEDS = (slot("r0c0", "conv_heavy", Stage.BLENDING, 0.33), slot("r0c1", "attention", Stage.TRAINING),
               slot("r1c0", "conv_light", Stage.HOLDING, 1.0))


def test_a_refusal_keeps_its_whole_reason_within_120_columns() -> None:
    text = format_step(step(THREE_SEEDS, Op.ADVANCE, False, REASON))
    lines = text.split("\n")
    assert all(len(line) <= 120 for line in lines), lines
    assert lines[0].startswith("epoch  14/30") and lines[0].endswith("| ADVANCE refused")
    assert lines[1:] == [f"      {REASON}"], "the reason, whole, on its own line"


def test_a_long_reason_wraps_on_lines_of_its_own_never_cut() -> None:
    reason = "the seed would add " + "very " * 40 + "little"
    lines = format_step(step(THREE_SEEDS, Op.FOSSILIZE, False, reason)).split("\n")
    assert len(lines) >= 3 and all(len(line) <= 120 for line in lines)
    assert " ".join(line.strip() for line in lines[1:]) == reason


def test_a_line_that_fits_stays_one_line() -> None:
    one_seed = (slot("r0c0", "conv_heavy", Stage.TRAINING),)
    assert format_step(step(one_seed, Op.ADVANCE, False, "too early")) == (
        "epoch  14/30  acc  96.94%  loss 0.167  params     2,642  | r0c0 conv_heavy TRAIN | ADVANCE refused: too early")
    accepted = format_step(step(THREE_SEEDS, Op.ADVANCE, True, "advanced"))
    assert "\n" not in accepted and len(accepted) <= 120 and accepted.endswith("| ADVANCE ok")
    assert "…" in accepted, "the seeds part is what gets shortened"
    labelled = format_step(step(one_seed, Op.WAIT, True, "waited"), "label acc")  # a task's own metric, by its name
    assert labelled.startswith("epoch  14/30  label acc 96.94  loss 0.167  ")


def test_the_seed_story_names_its_final_stage_once() -> None:
    kept = SeedStory(0, "r0c0", "conv_heavy", 9, {"training": 9, "blending": 14, "holding": 16, "fossilized": 18},
                     "fossilized", 18, predicted_contribution=3.06, contribution=5.0)
    pruned = SeedStory(0, "r0c1", "conv_light", 20, {"training": 20, "pruned": 28}, "pruned", 28)
    alive = SeedStory(0, "r1c0", "norm", 25, {"training": 25})
    outcome = EpisodeOutcome(final_accuracy=97.78, final_loss=0.1, parameters=2_642, host_parameters=1_442,
                             seconds=5.0, episode_return=1.0, stories=[kept, pruned, alive], phase_seconds={})
    out = io.StringIO()
    print_summary(outcome, None, out)
    lines = out.getvalue().splitlines()
    story_lines = lines[lines.index("seeds (3):") + 1:]
    assert story_lines[0].split()[2:6] == ["training@9", "blending@14", "holding@16", "fossilized@18"]
    assert [line.count("fossilized@18") for line in story_lines] == [1, 0, 0]
    assert story_lines[1].count("pruned@28") == 1 and story_lines[2].split()[2:4] == ["training@25", "alive"]
