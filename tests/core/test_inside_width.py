"""Width sites inside a residual block: a widening seed adds channels between the block's two convolutions.

Checked on a user's ResNet cut after every block (one block of each stage, two of them strided): the site is
the block's conv1 -> bn1 -> ReLU -> conv2 chain, the seed is the identity at birth, a blended seed is the block
with a wider inside (built by hand), the counterfactual and shadow passes match plain forwards (also beside
branch seeds and with several seeds TRAINING), a TRAINING seed learns only from its shadow, grafting, state_dict,
export, and the refusals.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
from slot_driver import (
    EASY_CONFIG,
    assert_passes_match_plain_forwards,
    assert_plain_network_matches,
    configuration_output,
    drive_to,
    perturb_seed,
)
from torch import Tensor, nn

from morphogen import CNNHost, MorphogeneticModel, host_from_module
from morphogen.core.hosts import SegmentedHost
from morphogen.core.lifecycle import Stage
from morphogen.core.width import NoWidthSiteError, WidthSeed

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "own"))
from models import ResNet

BLOCKS = ["layer1.0", "layer2.0", "layer3.0"]


def _resnet() -> tuple[SegmentedHost, Tensor]:
    torch.manual_seed(0)
    host = host_from_module(ResNet(width=4), BLOCKS, example_input=torch.randn(2, 3, 12, 12))
    return host.eval(), torch.randn(3, 3, 12, 12, generator=torch.Generator().manual_seed(1))


def _place(model: MorphogeneticModel, slot_id: str, stage: Stage, seed: int, blueprint: str = "wider",
           alpha: float = 1.0) -> None:
    slot = model.germinate(slot_id, blueprint)
    perturb_seed(slot, torch.Generator().manual_seed(seed))
    drive_to(slot, stage, alpha=alpha)


def test_a_residual_blocks_two_convolutions_are_the_site_inside_it() -> None:
    host, _ = _resnet()
    model = MorphogeneticModel(host)
    for slot_id, block in zip(model.slot_ids, BLOCKS, strict=True):
        site = model.slot(slot_id).width_site
        assert site is not None and site.inside, slot_id
        assert site.producer is host.get_submodule(f"segments.{site.tap_segment}").get_submodule(f"{block}.conv1")
        assert site.consumer is host.get_submodule(f"segments.{site.tap_segment}").get_submodule(f"{block}.conv2")
        assert [type(module) for module in site.after_producer] == [nn.BatchNorm2d, nn.ReLU]  # torch.relu, traced
    assert model.slot("layer3_0").width_site.channels == 16  # type: ignore[union-attr]


def test_an_inside_widening_seed_is_the_identity_at_birth_and_changes_the_output_once_trained() -> None:
    host, x = _resnet()
    with torch.no_grad():
        bare = host(x)
    for slot_id in host.slot_ids:
        model = MorphogeneticModel(host, [slot_id], config=EASY_CONFIG)
        slot = model.germinate(slot_id, "wider")
        for stage in (Stage.TRAINING, Stage.BLENDING, Stage.HOLDING, Stage.FOSSILIZED):
            drive_to(slot, stage)
            with torch.no_grad():
                torch.testing.assert_close(model(x), bare, rtol=0, atol=1e-6, msg=f"{slot_id} {stage.name}")
        perturb_seed(slot, torch.Generator().manual_seed(2))
        with torch.no_grad():
            assert not torch.allclose(model(x), bare, atol=1e-4), slot_id


def test_a_blended_inside_seed_is_the_block_with_more_channels_between_its_convolutions() -> None:
    """The oracle: the strided block of stage 2 computed by hand, its new channels beside conv1's and into conv2."""
    host, x = _resnet()
    model = MorphogeneticModel(host, ["layer2_0"], config=EASY_CONFIG)
    _place(model, "layer2_0", Stage.BLENDING, 3, alpha=0.5)
    seed = model.slot("layer2_0").seed
    assert isinstance(seed, WidthSeed)
    block = host.get_submodule("segments.1").get_submodule("layer2.0")
    with torch.no_grad():
        entering = host.segments[0](x)  # the input of the block: the slot before it holds no seed
        inner = torch.relu(block.bn1(block.conv1(entering)))
        new = torch.relu(seed.after_producer[0](seed.producer(entering)))  # its own one-group norm, then ReLU
        summed = block.conv2(inner) + 0.5 * seed.consumer(new)
        expected_block = torch.relu(block.bn2(summed) + block.shortcut(entering))
        expected = host.segments[3](host.segments[2](expected_block))
        torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-5)


def test_counterfactual_and_shadow_passes_agree_with_plain_forwards_around_inside_seeds() -> None:
    host, x = _resnet()
    model = MorphogeneticModel(host, config=EASY_CONFIG).eval()
    _place(model, "layer1_0", Stage.HOLDING, 1)
    _place(model, "layer2_0", Stage.TRAINING, 2)
    _place(model, "layer3_0", Stage.BLENDING, 3, alpha=0.5)
    assert_passes_match_plain_forwards(model, x)


def test_counterfactual_and_shadow_passes_agree_beside_branch_and_deepening_seeds() -> None:
    """A TRAINING branch before a TRAINING inside seed: the second one's rows join at its block's input."""
    host, x = _resnet()
    model = MorphogeneticModel(host, config=EASY_CONFIG).eval()
    _place(model, "layer1_0", Stage.TRAINING, 1, blueprint="branch_wide")
    _place(model, "layer2_0", Stage.TRAINING, 2)
    _place(model, "layer3_0", Stage.TRAINING, 3, blueprint="conv_light")
    _, shadow = model.forward_with_shadow(x)
    assert shadow is not None and shadow.slot_ids == tuple(model.slot_ids)
    for k, row in enumerate(([1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0])):
        torch.testing.assert_close(shadow.outputs[k], configuration_output(model, list(row), x), rtol=1e-5,
                                   atol=1e-5, msg=str(row))
    rows = [[0.0, 0.0, 0.0], [0.0, 1.0, 0.0], [1.0, 0.5, 0.0], [0.0, 0.3, 1.0]]
    with torch.no_grad():
        outputs = model.counterfactual_forward(x, rows)
    for k, row in enumerate(rows):
        torch.testing.assert_close(outputs[k], configuration_output(model, row, x), rtol=1e-5, atol=1e-5, msg=str(row))


def test_a_training_inside_seed_learns_only_from_its_shadow() -> None:
    host, x = _resnet()
    host.train()
    bare = copy.deepcopy(host)
    model = MorphogeneticModel(host, config=EASY_CONFIG)
    _place(model, "layer2_0", Stage.TRAINING, 1)
    targets = torch.randint(0, 4, (x.shape[0],))
    output, shadow = model.forward_with_shadow(x)
    torch.testing.assert_close(output, bare(x), rtol=0, atol=0)
    assert shadow is not None
    nn.functional.cross_entropy(shadow.outputs[0], targets).backward(inputs=list(shadow.parameters))
    assert all(parameter.grad is None for parameter in host.parameters())
    assert all(parameter.grad is not None for parameter in model.seed_parameters("layer2_0"))


def test_inside_seeds_graft_train_with_the_host_and_round_trip_through_state_dict() -> None:
    host, x = _resnet()
    host.train()
    model = MorphogeneticModel(host)
    for slot_id in model.slot_ids:
        assert model.can_graft(slot_id, "wider")
        model.graft(slot_id, "wider")
    nn.functional.cross_entropy(model(x), torch.randint(0, 4, (x.shape[0],))).backward()
    assert all(p.grad is not None for p in model.seed_parameters("layer2_0"))
    assert all(p.grad is not None for p in host.parameters() if p.requires_grad)
    restored = MorphogeneticModel(copy.deepcopy(host))
    for slot_id in model.slot_ids:
        restored.graft(slot_id, "wider")
    restored.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(restored.eval()(x), model.eval()(x), rtol=0, atol=0)


def test_the_plain_network_of_a_grown_model_holds_its_inside_seeds_and_exports() -> None:
    host, x = _resnet()
    model = MorphogeneticModel(host, config=EASY_CONFIG)
    _place(model, "layer1_0", Stage.FOSSILIZED, 1)
    _place(model, "layer2_0", Stage.HOLDING, 2, blueprint="branch_wide")
    _place(model, "layer3_0", Stage.FOSSILIZED, 3, blueprint="wider_half")
    assert_plain_network_matches(model, x)


def test_only_inside_sites_are_grafted_and_blocks_without_a_layer_pair_refuse_with_the_reason() -> None:
    assert not MorphogeneticModel(CNNHost(5, 1, n_blocks=2, base_channels=4)).can_graft("r0c0", "wider")

    class OneConvolution(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.norm = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)

        def forward(self, x: Tensor) -> Tensor:
            return torch.relu(self.norm(self.conv(x))) + x.mean(1, keepdim=True)

    network = nn.Sequential(OneConvolution(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    model = MorphogeneticModel(host_from_module(network, ["0"], example_input=torch.randn(2, 3, 6, 6)))
    with pytest.raises(NoWidthSiteError, match="no pair of convolution or linear layers joined by norms"):
        model.germinate("0", "wider")
    assert not model.can_graft("0", "wider")


def test_the_training_forward_with_inside_seeds_traces_as_one_graph_and_matches_eager() -> None:
    """The instrumented block and its injection closure compile without a graph break (fullgraph raises on one)."""
    host, x = _resnet()
    model = MorphogeneticModel(host.train(), config=EASY_CONFIG)
    _place(model, "layer1_0", Stage.BLENDING, 1, alpha=0.5)
    _place(model, "layer2_0", Stage.TRAINING, 2)
    plan = model.execution_plan()
    host_forward = torch.compile(MorphogeneticModel._host_forward, fullgraph=True, backend="eager")
    shadow_pass = torch.compile(MorphogeneticModel._shadow_pass, fullgraph=True, backend="eager")
    eager = copy.deepcopy(model)
    output, captured = host_forward(model, x, plan)
    eager_output, eager_captured = MorphogeneticModel._host_forward(eager, x, plan)
    torch.testing.assert_close(output, eager_output, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(shadow_pass(model, captured, plan),
                               MorphogeneticModel._shadow_pass(eager, eager_captured, plan), rtol=1e-5, atol=1e-6)
