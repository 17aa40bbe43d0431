"""Depth growth in an episode: GROW grafts a whole block into every empty slot of a small language model, the
blocks learn with the host from the start on fresh optimizers, and a language model is judged by its loss."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from morphogen.control.heuristic import HeuristicConfig, HeuristicController, is_slowing
from morphogen.core.lifecycle import Criterion, Stage
from morphogen.core.transformer_layers import TransformerBlock
from morphogen.data import Task, load_task
from morphogen.data.text import read_default_corpus
from morphogen.env.actions import Action, Op
from morphogen.env.episode import EpisodeConfig, MorphogenesisEpisode
from morphogen.env.play import play_epoch

#: A small language model: 16 wide, 2 layers, a slot after each; windows of 16 characters.
TINY_HOST = {"d_model": 16, "n_layers": 2, "block_size": 16}


@pytest.fixture(scope="module")
def tiny_text() -> Task:
    return load_task("text", max_train_samples=96, host=TINY_HOST)


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory: pytest.TempPathFactory) -> Task:
    """24,000 characters of the standard library's sources: 20 batches an epoch, a validation pass in no time."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text(read_default_corpus(24_000))
    return load_task("text", text_file=path, host=TINY_HOST)


def started(task: Task, **config: object) -> MorphogenesisEpisode:
    episode = MorphogenesisEpisode(task, dataclasses.replace(EpisodeConfig(max_epochs=12), **config), seed=0)
    episode.reset()
    return episode


def test_a_language_model_episode_judges_by_loss(tiny_text: Task) -> None:
    episode = started(tiny_text)
    assert episode.slot_config.gates.judged_by is Criterion.LOSS
    assert episode.snapshot.criterion is Criterion.LOSS
    assert episode.snapshot.fossilize_contribution == 0.01  # the gate's loss_min_contribution, for the heuristic
    assert episode.optimizer_config.seed_warmup_steps == 100  # the text task re-warms new seeds


def test_grow_grafts_a_block_into_every_empty_slot_and_doubles_the_depth(tiny_text: Task) -> None:
    episode = started(tiny_text)
    model = episode.model
    assert model is not None
    episode.step(Action())  # the host trains an epoch first: its optimizer holds moments
    batches = -(-len(tiny_text.train) // episode.batch_size)
    x = next(tiny_text.validation.iterate_batches(8, shuffle=False))[0]
    with torch.no_grad():
        before = model.eval()(x)
    succeeded, reason = episode.apply_action(Action(Op.GROW, blueprint="block"))
    assert succeeded and reason == "grew block into r0c0, r0c1"
    for slot in model.slots():
        assert isinstance(slot.seed, TransformerBlock)
        assert slot.stage is Stage.HOLDING and slot.alpha.alpha == 1.0  # identity at birth: straight in
    with torch.no_grad():
        assert torch.equal(model(x), before)
    assert sum(isinstance(m, TransformerBlock) for m in model.modules()) == 4  # 2 -> 4 layers
    episode.train_epoch(tiny_text.train.iterate_batches(episode.batch_size, generator=episode.generator))
    # The host's optimizer goes on; each block has its own, begun empty with the block, its rate re-warmed.
    host_first = model.host_parameters()[0]
    assert float(episode.trainer.host_optimizer.state[host_first]["step"]) == 2 * batches
    for slot_id in model.slot_ids:
        optimizer = episode.trainer.seed_optimizers[slot_id][1]
        assert float(optimizer.state[model.seed_parameters(slot_id)[0]]["step"]) == batches
        assert optimizer.param_groups[0]["lr"] == pytest.approx(5e-3 * batches / 100)  # still warming up
    episode.finish_epoch(Action(Op.GROW, blueprint="block"), succeeded, reason)
    # Judged by loss: a block's loss contribution (the loss without it minus with it) is measured, one waiting
    # block an epoch (`ablations_per_epoch`), the first in slot order first; the next one the epoch after.
    measured = [slot.slot_id for slot in episode.snapshot.slots if slot.loss_contribution is not None]
    assert measured == ["r0c0"]
    episode.step(Action())
    assert [slot.slot_id for slot in episode.snapshot.slots if slot.loss_contribution is not None] == ["r0c1"]


def test_grow_with_copies_blends_them_in_from_alpha_zero(tiny_text: Task) -> None:
    episode = started(tiny_text)
    episode.step(Action())  # a trained host to copy from
    assert episode.apply_action(Action(Op.GROW, blueprint="block_copy", blend_epochs=5))[0]
    assert episode.model is not None
    for index, slot in enumerate(episode.model.slots()):
        assert slot.stage is Stage.BLENDING and slot.alpha.alpha == pytest.approx(0.2)
        neighbour = episode.model.host.segments[index][-1]
        assert isinstance(slot.seed, TransformerBlock) and isinstance(neighbour, TransformerBlock)
        assert torch.equal(slot.seed.mlp_output.weight, neighbour.mlp_output.weight)


def test_grow_is_refused_while_a_seed_trains_and_when_no_slot_is_empty(tiny_text: Task) -> None:
    episode = started(tiny_text)
    assert episode.apply_action(Action(Op.GERMINATE, "r0c0", "lora"))[0]
    assert episode.masks()[0][Op.GROW] == 0
    assert episode.apply_action(Action(Op.GROW, blueprint="block")) == (
        False, "another seed is still germinated or training")
    full = started(tiny_text)
    assert full.apply_action(Action(Op.GROW, blueprint="block"))[0]
    assert full.masks()[0][Op.GROW] == 0
    assert full.apply_action(Action(Op.GROW, blueprint="block")) == (False, "no empty slot to grow into")


@pytest.mark.slow
def test_the_heuristic_grows_a_language_model_by_depth_when_its_loss_slows(small_corpus: Task) -> None:
    episode = MorphogenesisEpisode(small_corpus, EpisodeConfig(max_epochs=10), seed=0)
    snapshot = episode.reset()
    heuristic = HeuristicController(episode.action_space, small_corpus.topology)
    config = HeuristicConfig()
    losses = [snapshot.val_loss]
    while snapshot.epoch < 6:
        result = play_epoch(episode, heuristic, snapshot)
        snapshot = result.snapshot
        losses.append(snapshot.val_loss)
        if snapshot.last_op == Op.GROW:
            break
    # The first epoch after the warm-up whose last losses slow down, by the rule's own definition (oracle-tested
    # in tests/control/test_heuristic.py); the heuristic acts on it at the start of the next epoch.
    slowing = next(epoch for epoch in range(config.warmup_epochs, len(losses))
                   if is_slowing(losses[max(0, epoch - 4):epoch + 1], config.slowing_window, config.slowing_ratio))
    assert snapshot.last_op == Op.GROW and result.reason == "grew block_copy into r0c0, r0c1: the validation loss " \
        "is falling more slowly"
    assert snapshot.epoch == slowing + 1
    # Copies of the trained layers blended in over 3 epochs: the first trained at alpha 1/3, then 2/3.
    assert [(slot.blueprint, slot.stage) for slot in snapshot.slots] == [("block_copy", Stage.BLENDING)] * 2
    assert [slot.alpha for slot in snapshot.slots] == pytest.approx([2 / 3] * 2)


class _Tokens(torch.nn.Module):
    """A user's token model without morphogen's blocks: embeddings, two linear layers, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(8, 16)
        self.layers = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 16))
        self.head = torch.nn.Linear(16, 8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(self.embed(ids)))


def test_grow_offers_only_what_the_host_can_graft(tiny_text: Task) -> None:
    """A copy of the layer before a slot needs that layer: a user's model without blocks is offered `block`, not
    `block_copy`; a widening blueprint is never offered to GROW."""
    from morphogen.core.model import MorphogeneticModel
    from morphogen.core.module_host import host_from_module
    from morphogen.env.actions import ActionSpace

    own = MorphogeneticModel(host_from_module(_Tokens(), ["layers.0", "layers.1"], torch.zeros(2, 6, dtype=torch.long),
                                              topology="transformer"))
    space = ActionSpace(own.slot_ids, "transformer")
    offered = dict(zip(space.blueprints, space.masks(own)[2][Op.GROW], strict=True))
    assert offered["block"] and not offered["block_copy"]
    episode = started(tiny_text)
    assert episode.model is not None
    assert all(episode.masks()[2][Op.GROW])  # the TransformerHost has a block before every slot



def test_a_grow_that_cannot_graft_every_slot_is_refused_and_changes_nothing() -> None:
    episode = MorphogenesisEpisode(load_task("digits", max_train_samples=64), EpisodeConfig(max_epochs=2), seed=0)
    episode.reset()
    assert episode.model is not None
    succeeded, reason = episode.apply_action(Action(Op.GROW, blueprint="wider"))
    assert not succeeded and reason.startswith("GROW adds layers; wider cannot be grafted into r0c0, r0c1")
    assert all(slot.stage is Stage.DORMANT for slot in episode.model.slots())
