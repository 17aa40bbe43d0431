"""An episode's FLOPs: every trained and validated batch charged once, at the count of its plan and shape."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from morphogen.core.flops import FlopCounter
from morphogen.core.lifecycle import Stage
from morphogen.core.model import shadow_rows
from morphogen.data import Task, load_task
from morphogen.env.actions import Action, Op
from morphogen.env.compute import note_batch
from morphogen.env.counterfactual import CounterfactualSchedule
from morphogen.env.episode import EpisodeConfig, MorphogenesisEpisode
from morphogen.inputs import InputSpec

TRAIN_SAMPLES, BATCH, VALIDATION_BATCH = 150, 64, 128


@pytest.fixture(scope="module")
def digits() -> Task:
    return load_task("digits", max_train_samples=TRAIN_SAMPLES)


def batches(samples: int, size: int) -> dict[int, int]:
    """Batch sizes of one pass over `samples` in batches of `size`: the full ones and the remainder."""
    counts = {size: samples // size}
    if samples % size:
        counts[samples % size] = 1
    return counts


def test_an_episode_charges_every_batch_it_trained_and_validated(digits: Task) -> None:
    config = EpisodeConfig(max_epochs=3, batch_size=BATCH, validation_batch_size=VALIDATION_BATCH,
                           counterfactuals=CounterfactualSchedule.EVERY_EPOCH, shadow_fraction=0.5)
    episode = MorphogenesisEpisode(digits, config, seed=0)
    episode.reset()
    episode.step(Action())
    episode.step(Action(Op.GERMINATE, "r0c0", "conv_light"))  # GERMINATED, then auto-advanced to TRAINING
    assert episode.model is not None and episode.model.slot("r0c0").stage is Stage.TRAINING
    episode.step(Action())

    # The oracle: a fresh counter, a fresh model in each epoch's state, the batches a pass makes.
    sample = tuple(digits.validation.inputs.shape[1:])
    counter, bare = FlopCounter(), episode.build_model()
    expected_training = expected_shadow = 0
    for model in (bare, episode.model, episode.model):  # epoch 1 bare, epochs 2 and 3 with the TRAINING seed
        for size, count in batches(TRAIN_SAMPLES, BATCH).items():
            step = counter.training_step(model, InputSpec.tensor((size, *sample)), shadow_rows(size, 0.5))
            expected_training += step.main * count
            expected_shadow += step.shadow * count
    validation_passes = [(bare, [[0.0, 0.0]])] * 2 + [(episode.model, [[0.0, 0.0], [1.0, 0.0]])] * 2
    expected_validation = expected_counterfactual = 0
    for model, alphas in validation_passes:  # before training, then after each epoch
        for size, count in batches(len(digits.validation), VALIDATION_BATCH).items():
            batch = counter.validation_batch(model, alphas, InputSpec.tensor((size, *sample)))
            expected_validation += batch.main * count
            expected_counterfactual += batch.counterfactual * count

    account = episode.compute
    assert account.training == expected_training
    assert account.shadow == expected_shadow > 0  # the seed trained behind the host in epochs 2 and 3
    assert account.validation == expected_validation
    assert account.counterfactual == expected_counterfactual > 0  # shadow contribution, epochs 2-3
    assert account.total == expected_training + expected_shadow + expected_validation + expected_counterfactual
    # Two plans x two shapes, for training and for validation; and, once per env, what each blueprint would add
    # in each slot (the layout a learned policy reads).
    layout_counts = len(episode.model.slot_ids) * len(episode.layout.blueprints)
    assert episode.flop_counter.counts_made <= 8 + layout_counts


def test_the_shadow_on_half_the_batch_costs_half_the_shadow() -> None:
    from morphogen import CNNHost, MorphogeneticModel

    model = MorphogeneticModel(CNNHost(10, 1, n_blocks=2, base_channels=4))
    model.germinate("r0c0", "conv_light")
    model.slot("r0c0").advance(0)
    counter = FlopCounter()
    whole = counter.training_step(model, InputSpec.tensor((64, 1, 8, 8)))
    half = counter.training_step(model, InputSpec.tensor((64, 1, 8, 8)), shadow_rows(64, 0.5))
    assert half.main == whole.main and 2 * half.shadow == whole.shadow


def test_batches_of_several_inputs_are_noted_by_their_spec_without_reading_a_value(sync_calls: list[str]) -> None:
    """What an epoch is charged for: each batch's spec (rows, each input's sample shape and dtype, the structure),
    noted without a sync, so a model called with tokens and a mask is charged per batch like any other."""
    tokens, mask = torch.zeros(8, 6, dtype=torch.int64), torch.ones(8, 6, dtype=torch.bool)
    shapes: Counter[InputSpec] = Counter()
    for batch in ((tokens, mask), (tokens, mask), (tokens[:3], mask[:3]), {"tokens": tokens, "mask": mask}):
        note_batch(shapes, batch)
    assert sync_calls == []
    assert shapes == {InputSpec.of((tokens, mask)): 2, InputSpec.of((tokens[:3], mask[:3])): 1,
                      InputSpec.of({"tokens": tokens, "mask": mask}): 1}
    assert {spec.rows for spec in shapes} == {8, 3}
