"""What a seed is judged by: a classifier's validation loss by default, the share of the validation loss it removes
for a task with its own loss or metric."""

from __future__ import annotations

import dataclasses

import torch
from models import blobs, mlp

import morphogen
from morphogen.core.lifecycle import Criterion, GateConfig, GateMode, SeedLifecycle, SeedSignals, Stage, evaluate_gate
from morphogen.data import Task, load_task
from morphogen.env.actions import Action
from morphogen.env.episode import EpisodeConfig, MorphogenesisEpisode


def judged_by(task: Task, gates: GateConfig | None = None) -> Criterion:
    config = EpisodeConfig(max_epochs=2)
    if gates is not None:
        config = dataclasses.replace(config, slots=dataclasses.replace(config.slots, gates=gates))
    episode = MorphogenesisEpisode(task, config, seed=0)
    episode.reset()
    assert episode.snapshot.criterion is episode.slot_config.gates.judged_by  # the heuristic reads the same
    return episode.snapshot.criterion


def blobs_task(**options: object) -> Task:
    train, validation = blobs(64, 0), blobs(32, 1)
    host = morphogen.host_from_module(mlp(), ["1", "3"], example_input=train[0][:2])
    return morphogen.task_from_data("blobs", train, validation, host=host, **options)  # type: ignore[arg-type]


def test_a_built_in_classifier_and_a_users_classifier_are_judged_by_validation_loss() -> None:
    assert judged_by(load_task("digits", max_train_samples=64)) is Criterion.LOSS
    assert judged_by(blobs_task()) is Criterion.LOSS
    images = torch.randn(16, 1, 4, 4)
    segmenter = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(4, 2, 1))
    labels = (images[:, 0] > 0).long()
    pixels = morphogen.task_from_data("pixels", (images, labels), (images, labels),
                                      host=morphogen.host_from_module(segmenter, ["1"], example_input=images[:2]))
    assert judged_by(pixels) is Criterion.LOSS  # classes on dimension 1 need no loss of one's own


def test_a_task_with_its_own_loss_is_judged_by_shares_of_it_and_a_cross_entropy_in_nats() -> None:
    def agreement(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return (outputs.argmax(-1) == targets).float().mean()

    def squared_error(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(outputs, torch.nn.functional.one_hot(targets, 3).float())

    assert judged_by(blobs_task(loss=squared_error)) is Criterion.RELATIVE_LOSS
    assert judged_by(blobs_task(loss=squared_error, metric=agreement)) is Criterion.RELATIVE_LOSS
    # A cross-entropy is in nats whoever passes it, and whatever the metric shown beside it.
    assert judged_by(blobs_task(metric=agreement)) is Criterion.LOSS
    assert judged_by(blobs_task(loss=torch.nn.functional.cross_entropy)) is Criterion.LOSS
    assert judged_by(blobs_task(loss=torch.nn.CrossEntropyLoss(label_smoothing=0.1), metric=agreement)) \
        is Criterion.LOSS
    assert judged_by(blobs_task(metric=agreement), GateConfig(criterion=Criterion.SCORE)) is Criterion.SCORE


def test_the_criterion_a_user_sets_is_kept() -> None:
    assert judged_by(load_task("digits", max_train_samples=64), GateConfig(criterion=Criterion.SCORE)) \
        is Criterion.SCORE


def test_a_seed_that_lowers_a_classifiers_loss_blends_though_its_accuracy_step_is_one_sample() -> None:
    # What digits showed: a shadow 0.03 nats better, one validation sample (0.28 points) more accurate.
    training = SeedLifecycle(stage=Stage.TRAINING, epochs_in_stage=5, seed_age=5)
    signals = SeedSignals(gradient_health=1.0, gradient_ratio=1.0, contribution=0.28, loss_contribution=0.03)
    classifier_gates = GateConfig(mode=GateMode.STRICT).judging("classification")
    assert evaluate_gate(Stage.BLENDING, training, signals, classifier_gates).passed
    by_accuracy = evaluate_gate(Stage.BLENDING, training, signals, GateConfig(criterion=Criterion.SCORE))
    assert not by_accuracy.passed and "+0.28 points < 0.5" in by_accuracy.reason


def test_a_regression_in_raw_units_trains_without_the_governor_calling_its_loss_divergent() -> None:
    # Targets in the thousands: the untrained model's squared error is about 1e6, far above any fixed ceiling.
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(256, 4, generator=generator)
    targets = 1000.0 + 300.0 * inputs[:, :1] - 200.0 * inputs[:, 1:2]
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    task = morphogen.task_from_data("raw", (inputs[:192], targets[:192]), (inputs[192:], targets[192:]),
                                    loss=torch.nn.functional.mse_loss,
                                    host=morphogen.host_from_module(net, ["1"], example_input=inputs[:2]))
    episode = MorphogenesisEpisode(task, EpisodeConfig(max_epochs=3), seed=0)
    initial_loss = episode.reset().val_loss
    assert initial_loss > 1e5
    for _ in range(3):
        episode.step(Action())  # WAIT: the host trains alone
    assert episode.governor.rollbacks == 0
    assert episode.snapshot.val_loss < initial_loss
