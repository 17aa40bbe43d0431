"""Tests for which counterfactual configurations are evaluated, attribution, and the fused validation pass.

Planned configurations and contributions are written out by hand; the fused pass is checked against
one plain `model(x)` per configuration with the slots' alphas forced, scored in float64 NumPy.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from morphogen.core.hosts import CNNHost
from morphogen.core.lifecycle import BLENDED_STAGES, GateConfig, GateMode, Stage
from morphogen.core.model import MorphogeneticModel
from morphogen.core.slot import SlotConfig
from morphogen.data import DataError, DeviceDataset
from morphogen.env.counterfactual import (
    ALL_OFF,
    MAIN,
    CounterfactualResult,
    CounterfactualSchedule,
    alpha_configurations,
    without_seed,
)
from morphogen.env.evaluation import Objective, class_dim_of, per_config_loss_and_correct, task_loss, validate

SLOTS = ("r0c0", "r0c1", "r0c2")


# ---------------------------------------------------------------- planning


def test_no_blended_seed_plans_only_main() -> None:
    configurations = alpha_configurations(SLOTS, {})
    assert configurations.names == (MAIN,)
    assert configurations.alphas == ((0.0, 0.0, 0.0),)
    assert configurations.ablated == ()
    assert configurations.size == 1


def test_one_seed_plans_main_and_without_it_but_not_all_off() -> None:
    configurations = alpha_configurations(SLOTS, {"r0c1": 0.5})
    assert configurations.names == (MAIN, "without:r0c1")
    assert configurations.alphas == ((0.0, 0.5, 0.0), (0.0, 0.0, 0.0))
    assert configurations.ablated == ("r0c1",)


def test_a_seed_at_alpha_zero_is_not_ablated() -> None:
    configurations = alpha_configurations(SLOTS, {"r0c0": 0.0, "r0c2": 1.0})
    assert configurations.names == (MAIN, "without:r0c2")
    assert configurations.alphas == ((0.0, 0.0, 1.0), (0.0, 0.0, 0.0))


def test_two_seeds_plan_each_without_and_all_off() -> None:
    configurations = alpha_configurations(SLOTS, {"r0c2": 0.3, "r0c0": 1.0})
    assert configurations.names == (MAIN, "without:r0c0", "without:r0c2", ALL_OFF)
    assert configurations.alphas == ((1.0, 0.0, 0.3), (0.0, 0.0, 0.3), (1.0, 0.0, 0.0), (0.0, 0.0, 0.0))
    assert configurations.ablated == ("r0c0", "r0c2")


@pytest.mark.parametrize(("live", "has_all_off"), [(1, False), (2, True), (3, True), (4, True), (5, False)])
def test_all_off_only_for_two_to_four_live_seeds(live: int, has_all_off: bool) -> None:
    slot_ids = [f"s{i}" for i in range(6)]
    configurations = alpha_configurations(slot_ids, {slot_id: 1.0 for slot_id in slot_ids[:live]})
    assert (ALL_OFF in configurations.names) is has_all_off
    assert configurations.size == 1 + live + int(has_all_off)
    if has_all_off:
        assert configurations.alphas[configurations.names.index(ALL_OFF)] == (0.0,) * 6


def test_without_names_the_slot() -> None:
    assert without_seed("r1c2") == "without:r1c2"


# ---------------------------------------------------------------- attribution


def test_contributions_are_main_minus_without_in_points() -> None:
    configurations = alpha_configurations(SLOTS, {"r0c0": 1.0, "r0c2": 0.6})
    # main, without:r0c0, without:r0c2, all_off
    result = CounterfactualResult(configurations, accuracies=(90.0, 85.5, 91.25, 80.0), losses=(0.3, 0.5, 0.28, 0.7))
    assert result.contributions == {"r0c0": 4.5, "r0c2": -1.25}
    assert result.accuracy(MAIN) == 90.0
    assert result.loss("without:r0c0") == 0.5
    assert result.accuracy_all_off == 80.0


def test_all_off_accuracy_is_none_when_not_planned() -> None:
    configurations = alpha_configurations(SLOTS, {"r0c1": 1.0})
    result = CounterfactualResult(configurations, accuracies=(70.0, 72.0), losses=(1.0, 0.9))
    assert result.accuracy_all_off is None
    assert result.contributions == {"r0c1": -2.0}


# ---------------------------------------------------------------- per-config scoring


def test_per_config_loss_and_correct_by_hand_for_sequences() -> None:
    # K=2 configs, B=1 sequence of T=2 tokens, V=3 classes; targets [0, 2].
    outputs = torch.tensor([[[[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]]],
                            [[[0.0, 0.0, 0.0], [0.0, 0.0, 3.0]]]])  # (K, B, T, V)
    targets = torch.tensor([[0, 2]])  # (B, T)
    losses, correct = per_config_loss_and_correct(outputs, targets)
    # Config 0: -log softmax([2,0,0])[0] + -log softmax([0,1,0])[2] = log(e^2+2) - 2 + log(e+2).
    config0 = np.log(np.e**2 + 2) - 2 + np.log(np.e + 2)
    # Config 1: log 3 + log(e^3 + 2) - 3.
    config1 = np.log(3.0) + np.log(np.e**3 + 2) - 3
    np.testing.assert_allclose(losses.numpy(), [config0, config1], rtol=1e-6)
    # Config 0 predicts [0, 1]: one right. Config 1 predicts [0 (first of ties), 2]: two right.
    assert correct.tolist() == [1, 2]


def test_per_pixel_classes_on_dimension_1_are_scored_as_the_same_scores_moved_last() -> None:
    # K=2 configs, B=2 images of 2x3 pixels, C=4 classes on dimension 1 (torch's [B, C, H, W]).
    generator = torch.Generator().manual_seed(0)
    outputs = torch.randn(2, 2, 4, 2, 3, generator=generator)  # (K, B, C, H, W)
    targets = torch.randint(0, 4, (2, 2, 3), generator=generator)  # (B, H, W)
    losses, correct = per_config_loss_and_correct(outputs, targets, class_dim=1)
    moved_losses, moved_correct = per_config_loss_and_correct(outputs.movedim(2, -1), targets)  # (K, B, H, W, C)
    torch.testing.assert_close(losses, moved_losses)
    assert correct.tolist() == moved_correct.tolist()
    objective = Objective(task_loss, None, custom=False, class_dim=None)  # a user's task: the layout is inferred
    summed, scores, items = objective.loss_and_score(outputs, targets)
    assert items == 12 and scores.tolist() == [100.0 * c for c in correct.tolist()]
    for k in range(2):
        expected = torch.nn.functional.cross_entropy(outputs[k], targets)
        torch.testing.assert_close(summed[k] / items, expected)
        torch.testing.assert_close(objective.checked_loss(outputs[k], targets), expected)
    torch.testing.assert_close(objective.shadow_loss(outputs, targets),
                               sum(torch.nn.functional.cross_entropy(outputs[k], targets) for k in range(2)))


def test_a_bfloat16_models_validation_counts_every_right_answer_and_sums_its_losses_in_float32() -> None:
    # 61 of 128 right: in bfloat16, 100 * 61 rounds to 6,112 (47.75%), an accuracy 128 samples cannot have.
    generator = torch.Generator().manual_seed(0)
    targets = torch.randint(0, 3, (128,), generator=generator)
    logits = torch.randn(1, 128, 3, generator=generator)
    logits[0, torch.arange(128), targets] = -5.0
    logits[0, torch.arange(61), targets[:61]] = 5.0
    summed, scores, items = Objective(task_loss, None, custom=False).loss_and_score(logits.bfloat16(), targets)
    assert int(items) == 128 and scores.tolist() == [6100.0]
    exact = torch.nn.functional.cross_entropy(logits[0].bfloat16().float(), targets, reduction="sum")
    assert summed.dtype == torch.float32 and abs(summed.item() - exact.item()) < 1e-3 * exact.item()
    # A metric of one's own returning float32 keeps its digits (bfloat16 would make 0.123456 0.1235).
    own = Objective(torch.nn.functional.cross_entropy, lambda o, t: torch.tensor(0.123456), custom=True)
    _, own_scores, batch = own.loss_and_score(logits.bfloat16(), targets)
    assert abs(own_scores.item() / batch - 0.123456) < 1e-6


@pytest.mark.parametrize("class_dim", [-1, 1])
def test_targets_at_the_ignore_index_count_in_neither_the_validation_loss_nor_the_accuracy(class_dim: int) -> None:
    """Padding labelled -100 (torch's `ignore_index`, which the training loss leaves out): the validation loss is
    torch's mean over the other targets and the accuracy their share predicted right. Both once counted every
    position, the padding as a loss of zero and a wrong prediction."""
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(6, 5, 3, generator=generator)  # (B, T, C): 6 sequences of 5 tokens
    targets = torch.randint(0, 3, (6, 5), generator=generator)
    targets[:, 3:] = -100  # the last two tokens of each sequence are padding
    outputs = (scores if class_dim == -1 else scores.movedim(-1, 1)).unsqueeze(0)  # (K=1, B, ...)
    objective = Objective(task_loss, None, custom=False, class_dim=class_dim)
    summed, score, items = objective.loss_and_score(outputs, targets)
    real = targets != -100
    assert int(items) == 18
    expected = torch.nn.functional.cross_entropy(scores.reshape(-1, 3), targets.reshape(-1))
    torch.testing.assert_close(summed[0] / items, expected)
    accuracy = 100.0 * (scores.argmax(-1)[real] == targets[real]).float().mean()
    torch.testing.assert_close(score[0] / items, accuracy.to(score.dtype))


@pytest.mark.parametrize(("outputs", "targets", "class_dim"), [
    ((8, 5), (8,), -1), ((8, 10, 5), (8, 10), -1), ((8, 5, 10), (8, 10), 1), ((8, 5, 6, 6), (8, 6, 6), 1),
    ((8, 6, 6, 5), (8, 6, 6), -1),
])
def test_the_class_dimension_is_the_one_that_lines_the_outputs_up_with_the_targets(
        outputs: tuple[int, ...], targets: tuple[int, ...], class_dim: int) -> None:
    assert class_dim_of(torch.Size(outputs), torch.Size(targets), None) == class_dim
    assert class_dim_of(torch.Size(outputs), torch.Size(targets), -class_dim) == -class_dim  # a set one is kept


@pytest.mark.parametrize(("outputs", "targets", "message"), [
    ((8, 6, 6), (8, 6), "could hold the classes on dimension 1 or on the last"),
    ((8, 5, 7), (8, 6), "do not line up with targets"),
    ((8, 5), (8, 5), "one dimension of class scores more than the targets have"),
])
def test_outputs_that_do_not_say_where_their_classes_are_are_refused_in_one_line(
        outputs: tuple[int, ...], targets: tuple[int, ...], message: str) -> None:
    with pytest.raises(DataError, match=message):
        class_dim_of(torch.Size(outputs), torch.Size(targets), None)


# ---------------------------------------------------------------- the fused pass


def blended_model() -> MorphogeneticModel:
    """A small CNN with seeds blended in at r0c0 (alpha 1) and r0c2 (alpha 0.6), r0c1 empty.

    Seed weights are randomized so that ablating a seed changes the output (a new seed is identity).
    """
    torch.manual_seed(3)
    gates = GateConfig(mode=GateMode.PERMISSIVE, min_training_epochs=0)
    model = MorphogeneticModel(CNNHost(num_classes=5, in_channels=1, n_blocks=3, base_channels=4), SLOTS,
                               SlotConfig(gates=gates, blend_epochs=0))
    for slot_id, blueprint, alpha in (("r0c0", "conv_light", 1.0), ("r0c2", "conv_small", 0.6)):
        slot = model.germinate(slot_id, blueprint)
        slot.advance(0)  # -> TRAINING
        slot.record_signals(gradient_health=1.0, accuracy=50.0)
        slot.advance(0)  # -> BLENDING with a 0-epoch ramp: alpha snaps to 1 (and may auto-advance to HOLDING)
        assert slot.stage in (Stage.BLENDING, Stage.HOLDING)
        if alpha < 1.0:
            slot.set_alpha_target(alpha, 0, epoch=0)
        assert slot.alpha.alpha == alpha
        with torch.no_grad():
            for parameter in slot.seed_parameters():
                parameter.normal_(0.0, 0.5)
    # Host batch norm statistics that are not the identity, so eval mode matters.
    model.train()
    with torch.no_grad():
        model(torch.randn(64, 1, 8, 8))
    return model


def separate_metrics(model: MorphogeneticModel, inputs: torch.Tensor, targets: torch.Tensor,
                     alphas: tuple[float, ...]) -> tuple[float, float]:
    """Accuracy (points) and mean loss of one plain forward with every slot's alpha forced to `alphas`."""
    saved = [slot.alpha_value.clone() for slot in model.slots()]
    for slot, alpha in zip(model.slots(), alphas, strict=True):
        slot.alpha_value.fill_(alpha)
    model.eval()
    with torch.no_grad():
        logits = model(inputs).double().numpy()
    for slot, value in zip(model.slots(), saved, strict=True):
        slot.alpha_value.copy_(value)
    labels = targets.numpy()
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probabilities = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    loss = -log_probabilities[np.arange(len(labels)), labels].mean()
    accuracy = 100.0 * (logits.argmax(axis=1) == labels).mean()
    return float(accuracy), float(loss)


def test_validate_matches_a_separate_forward_per_configuration() -> None:
    model = blended_model()
    generator = torch.Generator().manual_seed(4)
    inputs = torch.randn(53, 1, 8, 8, generator=generator)
    targets = torch.randint(0, 5, (53,), generator=generator)
    alphas = {s.slot_id: s.alpha.alpha for s in model.slots() if s.stage in BLENDED_STAGES}
    configurations = alpha_configurations(model.slot_ids, alphas)
    assert configurations.names == (MAIN, "without:r0c0", "without:r0c2", ALL_OFF)
    model.train()

    result = validate(model, DeviceDataset(inputs, targets), configurations, batch_size=16)  # 4 batches, 1 short

    assert model.training, "validate must restore the train/eval mode it found"
    accuracies = []
    for name, row in zip(configurations.names, configurations.alphas, strict=True):
        accuracy, loss = separate_metrics(model, inputs, targets, row)
        assert result.accuracy(name) == pytest.approx(accuracy, abs=1e-9), name
        assert result.loss(name) == pytest.approx(loss, rel=1e-5), name
        accuracies.append(accuracy)
    # The seeds were randomized, so at least one ablation must change the outputs' loss.
    assert len(set(result.losses)) > 1
    assert result.contributions == pytest.approx({"r0c0": accuracies[0] - accuracies[1],
                                                  "r0c2": accuracies[0] - accuracies[2]})


def test_training_seeds_get_a_shadow_configuration_and_contribution() -> None:
    from morphogen.env.counterfactual import CounterfactualResult, with_seed

    configurations = alpha_configurations(("r0c0", "r0c1", "r0c2"), {"r0c2": 0.5}, training=("r0c0",))
    assert configurations.names == ("main", "without:r0c2", "with:r0c0")
    assert configurations.alphas[2] == (1.0, 0.0, 0.5)  # the TRAINING seed blended in fully, the rest as they are
    assert configurations.shadowed == ("r0c0",) and with_seed("r0c0") == "with:r0c0"
    result = CounterfactualResult(configurations, accuracies=(90.0, 88.0, 93.5), losses=(0.3, 0.4, 0.2))
    # without:r0c2 costs 2 points; blending the training seed in would add 3.5.
    assert result.contributions == {"r0c2": 2.0, "r0c0": 3.5}
    # In loss: the model without r0c2 loses 0.1 nats more; blending r0c0 in would remove 0.1.
    assert result.loss_contributions == pytest.approx({"r0c2": 0.1, "r0c0": 0.1})


def test_loss_contributions_are_the_loss_each_seed_removes() -> None:
    configurations = alpha_configurations(SLOTS, {"r0c0": 1.0, "r0c2": 0.6})
    # main, without:r0c0, without:r0c2, all_off (losses exact in binary)
    result = CounterfactualResult(configurations, accuracies=(90.0, 85.5, 91.25, 80.0),
                                  losses=(1.5, 1.75, 1.375, 2.0))
    assert result.loss_contributions == {"r0c0": 0.25, "r0c2": -0.125}


def test_episode_measures_the_shadow_of_a_training_seed() -> None:
    from morphogen.data import load_task
    from morphogen.env.actions import Action, Op
    from morphogen.env.episode import EpisodeConfig, MorphogenesisEpisode

    config = EpisodeConfig(max_epochs=3, counterfactuals=CounterfactualSchedule.EVERY_EPOCH)
    episode = MorphogenesisEpisode(load_task("digits", max_train_samples=128), config)
    episode.reset()
    result = episode.step(Action(Op.GERMINATE, "r0c1", "conv_light"))
    training = next(slot for slot in result.snapshot.slots if slot.slot_id == "r0c1")
    assert training.stage.value == "training"
    assert training.contribution is not None  # measured, even though the seed's output is not added yet
    assert episode.model.slot("r0c1").signals.contribution == training.contribution


def test_a_plan_can_ablate_some_seeds_and_leave_all_off_out() -> None:
    configurations = alpha_configurations(SLOTS, {"r0c0": 1.0, "r0c1": 1.0, "r0c2": 0.5}, ablate=("r0c1",),
                                          all_off=False)
    assert configurations.names == ("main", "without:r0c1") and configurations.ablated == ("r0c1",)
    assert configurations.alphas[0] == (1.0, 1.0, 0.5)  # main keeps every seed at its alpha


@pytest.mark.slow
def test_for_decisions_measures_only_what_the_gates_and_the_heuristic_read_next() -> None:
    """The shadow from the epoch before the blending gate may pass; a HOLDING seed's ablation; nothing else.

    The seeds walk the same path as under EVERY_EPOCH: training reads no measurement, so the models and
    every measurement taken are identical; only configurations no decision reads are left out.
    """
    from morphogen.core.lifecycle import GateConfig, Stage
    from morphogen.core.slot import SlotConfig
    from morphogen.data import load_task
    from morphogen.env.actions import Action, Op
    from morphogen.env.episode import EpisodeConfig, MorphogenesisEpisode

    task = load_task("digits", max_train_samples=128)
    gates = GateConfig(min_training_epochs=3, strict_min_improvement=-100.0, strict_min_gradient_ratio=0.0)
    actions = [Action(Op.GERMINATE, "r0c1", "conv_light", blend_epochs=3), *[Action()] * 3, Action(Op.ADVANCE, "r0c1"),
               *[Action()] * 5]
    measured: dict[CounterfactualSchedule, list[dict[str, float]]] = {}
    for schedule in CounterfactualSchedule:
        config = EpisodeConfig(max_epochs=len(actions), counterfactuals=schedule,
                               slots=SlotConfig(gates=gates))
        episode = MorphogenesisEpisode(task, config, seed=0)
        episode.reset()
        stages, measured[schedule] = [], []
        for action in actions:
            episode.step(action)
            measured[schedule].append({slot: value for slot, value in episode.contributions.items()
                                       if value is not None})
            stages.append(episode.model.slot("r0c1").stage)
    # Validation sees TRAINING in epochs 1-4, BLENDING in 5-7 (alpha 0, 1/3, 2/3), HOLDING in 8-10.
    assert stages == [Stage.TRAINING] * 4 + [Stage.BLENDING] * 2 + [Stage.HOLDING] * 4
    every, needed = measured[CounterfactualSchedule.EVERY_EPOCH], measured[CounterfactualSchedule.FOR_DECISIONS]
    # Every epoch but the first of BLENDING, whose alpha was still 0 when validation ran.
    assert [bool(epoch) for epoch in every] == [True] * 4 + [False] + [True] * 5
    # TRAINING: the shadow from its third epoch on (2 epochs counted when validation runs); BLENDING: only
    # in the epoch whose tick ends the ramp (the fossilize gate may read it right after); HOLDING: every epoch.
    assert [bool(epoch) for epoch in needed] == [False, False, True, True, False, False, True, True, True, True]
    for every_epoch, for_decisions in zip(every, needed, strict=True):
        assert all(every_epoch[slot] == value for slot, value in for_decisions.items())


@pytest.mark.slow
def test_seeds_grafted_together_are_ablated_one_an_epoch_and_judged_as_before() -> None:
    """GROW puts a seed into every slot at once; the heuristic judges one an epoch, the one measured. Where it can
    judge each seed when it is measured (here), ablating only that one changes no decision and no figure of the
    run, and halves what the counterfactuals cost. The settings are the `grow_for_compute` preset's, growing two
    epochs in instead of half the episode."""
    import dataclasses

    from morphogen.commands.run import RunConfig
    from morphogen.config import build_config, read_config_source
    from morphogen.control.heuristic import HeuristicController
    from morphogen.data import load_task
    from morphogen.env.episode import MorphogenesisEpisode
    from morphogen.telemetry import events

    recipe = build_config(RunConfig, read_config_source("grow_for_compute"))
    task = load_task("digits", max_train_samples=256)
    runs = {}
    for limit in (None, 1):
        config = dataclasses.replace(recipe.episode, max_epochs=8, ablations_per_epoch=limit)
        episode = MorphogenesisEpisode(task, config, seed=0)
        snapshot = episode.reset()
        heuristic = HeuristicController(episode.action_space, task.topology,
                                        dataclasses.replace(recipe.heuristic, warmup_fraction=0.0, warmup_epochs=2,
                                                            first_growth_by=0.1))
        measured = []
        while not episode.done:
            snapshot = episode.step(heuristic.act(snapshot, episode.masks())).snapshot
            measured.append(sorted(slot for slot, value in episode.contributions.items() if value is not None))
        actions = [(e.op, e.slot, e.succeeded) for e in episode.history if isinstance(e, events.ActionTaken)]
        runs[limit] = (snapshot.val_accuracy, snapshot.val_loss, actions, measured, episode.compute.counterfactual)
    (accuracy, loss, actions, every, every_cost), (accuracy_1, loss_1, actions_1, one, one_cost) = runs[None], runs[1]
    assert ("GROW", None, True) in actions and actions.count(("FOSSILIZE", "r0c0", True)) == 1
    assert (accuracy_1, loss_1, actions_1) == (accuracy, loss, actions)
    assert ["r0c0", "r0c1"] in every and max(len(slots) for slots in one) == 1
    assert one_cost < 0.6 * every_cost
