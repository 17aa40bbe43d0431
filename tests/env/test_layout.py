"""Where slots sit and what blueprints cost, relative to the host, measured on a real model."""

from __future__ import annotations

import torch

from morphogen.core.blueprints import blueprint_names
from morphogen.core.hosts import CNNHost, TransformerHost
from morphogen.core.model import MorphogeneticModel
from morphogen.env.layout import model_layout


def test_places_and_costs_of_a_three_block_image_host() -> None:
    torch.manual_seed(0)
    model = MorphogeneticModel(CNNHost(num_classes=10, in_channels=1, n_blocks=3, base_channels=4))
    host = model.host
    statistics = [buffer.clone() for buffer in host.buffers()]
    example = torch.randn(5, 1, 8, 8)
    generator = torch.get_rng_state()
    layout = model_layout(model, example)
    # Counting builds seeds with random weights: the global generator must not move (a resumed run would differ).
    assert torch.equal(torch.get_rng_state(), generator)
    # Widths 4, 8, 16; every block pools 8x8 -> 4x4 -> 2x2 -> 1x1 after its slot.
    assert [place.width_fraction for place in layout.places.values()] == [0.25, 0.5, 1.0]
    assert [place.resolution_fraction for place in layout.places.values()] == [1.0, 0.25, 0.0625]
    assert [place.depth_fraction for place in layout.places.values()] == [0.25, 0.5, 0.75]
    assert layout.blueprints == blueprint_names("cnn")
    heavy = layout.blueprints.index("conv_heavy")
    # Two 3x3 convolutions of 4 -> 4 channels over 8x8 pixels, 2 FLOPs per multiply-add.
    assert layout.blueprint_flops[0][heavy] == 2 * (2 * 4 * 4 * 9 * 64)
    assert layout.blueprint_flops[0][layout.blueprints.index("norm")] == 0
    assert layout.blueprint_parameters[0][heavy] == 2 * (4 * 4 * 9 + 4) + 2 * 2 * 4
    assert layout.host_flops > 0
    # A widening seed is counted at its slot's layers: as many new channels as the slot has (4 at r0c0).
    wider = layout.blueprints.index("wider")
    assert layout.blueprint_parameters[0][wider] > 0 and layout.blueprint_flops[0][wider] > 0
    # Measuring ran the host in evaluation mode: no running statistic moved, and the mode came back.
    assert host.training and all(torch.equal(a, b) for a, b in zip(statistics, host.buffers(), strict=True))


def test_a_transformer_host_keeps_every_token_at_every_slot() -> None:
    model = MorphogeneticModel(TransformerHost(vocab_size=11, d_model=16, n_heads=2, n_layers=2, block_size=8))
    layout = model_layout(model, torch.randint(0, 11, (3, 8)))
    assert [place.resolution_fraction for place in layout.places.values()] == [1.0, 1.0]
    assert [place.width_fraction for place in layout.places.values()] == [1.0, 1.0]
    assert all(flops > 0 for flops in layout.blueprint_flops[0][1:])
    # A copy of the block before the slot costs what a whole block does.
    names = layout.blueprints
    parameters = layout.blueprint_parameters[0]
    assert parameters[names.index("block_copy")] == parameters[names.index("block")] > 0


def test_a_controller_that_reads_no_blueprints_is_not_given_their_costs() -> None:
    """The heuristic and no growth skip counting every blueprint in every slot (a learned policy gets them)."""
    from morphogen.control.controller import NoGrowthController
    from morphogen.data import load_task
    from morphogen.env.episode import EpisodeConfig, MorphogenesisEpisode
    from morphogen.env.play import run_episode

    task = load_task("digits", max_train_samples=64)
    described = MorphogenesisEpisode(task, EpisodeConfig(max_epochs=1), seed=0)
    assert described.reset().blueprint_parameters[0]  # by default every blueprint is described
    episode = MorphogenesisEpisode(task, EpisodeConfig(max_epochs=1), seed=0)
    run_episode(episode, NoGrowthController())
    assert episode.snapshot.blueprints == ()
    assert episode.flop_counter.counts_made < described.flop_counter.counts_made - 20
