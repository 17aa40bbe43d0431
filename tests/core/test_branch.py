"""Branch seeds (`branch_wide`): a path beside the segment before a slot, reading that segment's input.

(Isolation, grafting and state_dict are checked here for new channels inside the block too, `wider_inside`:
both seeds read the block's input. The rest of inside widening is in test_inside_width.py.)

Checked on a user's ResNet cut after every block (the site where a branch runs beside each block, one of them
strided), a user's 1D CNN and an MLP: identity at birth, the counterfactual and shadow passes against plain
forwards, isolation while TRAINING, state_dict, export, and the refusals where a slot has no branch site.
"""

from __future__ import annotations

import copy

import pytest
import torch
from models import mlp
from slot_driver import (
    EASY_CONFIG,
    assert_identity_at_birth_until_perturbed,
    assert_passes_match_plain_forwards,
    assert_plain_network_matches,
    configuration_output,
    drive_to,
    perturb_seed,
    place_seed,
    resnet_host,
)
from torch import Tensor, nn

from morphogen import CNNHost, MorphogeneticModel, TransformerHost, host_from_module
from morphogen.core.blend import BlendKind
from morphogen.core.blueprints import UnknownBlueprintError
from morphogen.core.branch import BranchSite, NoBranchSiteError, find_branch_site
from morphogen.core.hosts import SegmentedHost
from morphogen.core.lifecycle import Stage

_resnet = resnet_host
#: The seeds that read the input of the segment before their slot: a branch beside it, new channels inside it.
READING_THE_BLOCK = ["branch_wide", "wider_inside"]


def _hosts() -> dict[str, tuple[SegmentedHost, Tensor]]:
    torch.manual_seed(0)
    sequence = nn.Sequential(nn.Conv1d(2, 4, 5, padding=2), nn.ReLU(), nn.Conv1d(4, 6, 5, stride=2, padding=2),
                             nn.ReLU(), nn.Flatten(), nn.Linear(6 * 10, 3))
    generator = torch.Generator().manual_seed(1)
    return {
        "resnet": _resnet(),
        "cnn1d": (host_from_module(sequence, ["1", "3"], example_input=torch.randn(2, 2, 20)).eval(),
                  torch.randn(3, 2, 20, generator=generator)),
        "mlp": (host_from_module(mlp(), ["1", "3"], example_input=torch.randn(2, 12)).eval(),
                torch.randn(3, 12, generator=generator)),
    }


def _place(model: MorphogeneticModel, slot_id: str, stage: Stage, seed: int, alpha: float = 1.0) -> None:
    place_seed(model, slot_id, "branch_wide", stage, seed, alpha)


@pytest.mark.parametrize("kind", ["resnet", "cnn1d", "mlp"])
def test_a_branch_seed_is_the_identity_at_birth_and_changes_the_output_once_trained(kind: str) -> None:
    host, x = _hosts()[kind]
    model = MorphogeneticModel(host)
    assert all(slot.branch_site is not None for slot in model.slots())
    assert_identity_at_birth_until_perturbed(host, x, "branch_wide")


def test_a_branch_maps_the_blocks_input_to_its_output_with_the_blocks_stride() -> None:
    host, _ = _resnet()
    model = MorphogeneticModel(host)
    # layer1.0 follows the stem (3 channels of the image in, 4 out); layer2.0 halves 12x12 and doubles 4 channels.
    assert model.slot("layer1_0").branch_site == BranchSite(2, 3, 4, 1)
    assert model.slot("layer2_0").branch_site == BranchSite(2, 4, 8, 2)
    assert model.slot("layer3_0").branch_site == BranchSite(2, 8, 16, 2)
    assert find_branch_site("cnn", (4, 12, 12), (8, 5, 5)) == \
        "no strided convolution maps the segment's input (4, 12, 12) to the slot's (8, 5, 5)"


def test_slots_without_a_measured_segment_input_refuse_a_branch_with_the_reason() -> None:
    built_in = MorphogeneticModel(CNNHost(5, 1, n_blocks=2, base_channels=4))
    with pytest.raises(NoBranchSiteError, match=r"r0c0 cannot grow a branch .* \(host_from_module measures it;"):
        built_in.germinate("r0c0", "branch_wide")
    assert not built_in.can_graft("r0c0", "branch_wide")
    # Token ids looked up by an embedding: a branch would multiply integers by its weights.
    ids = torch.randint(0, 12, (4, 10))
    bag = nn.Sequential(nn.Embedding(12, 16), nn.Flatten(), nn.Linear(160, 16), nn.ReLU(), nn.Linear(16, 3))
    model = MorphogeneticModel(host_from_module(bag, ["3"], example_input=ids[:2]))
    assert model.slot("3").branch_site is None and "integer ids cannot feed a branch" in model.slot("3").branch_problem
    assert not model.can_graft("3", "branch_wide")
    model.germinate("3", "mlp")  # what adds layers after the slot still grows there
    assert model(ids).shape == (4, 3)
    transformer = TransformerHost(vocab_size=11, d_model=16, n_heads=2, n_layers=2, block_size=6, n_segments=2)
    with pytest.raises(UnknownBlueprintError, match="unknown transformer blueprint 'branch_wide'"):
        MorphogeneticModel(transformer).germinate("r0c0", "branch_wide")
    host, _ = _resnet()
    with pytest.raises(ValueError, match="a branch seed adds its output"):
        MorphogeneticModel(host).germinate("layer1_0", "branch_wide", blend=BlendKind.GATE)
    assert MorphogeneticModel(host).can_graft("layer2_0", "branch_wide")



@pytest.mark.parametrize("blueprint", READING_THE_BLOCK)
def test_counterfactual_and_shadow_passes_agree_with_plain_forwards_around_seeds_reading_the_block(
        blueprint: str) -> None:
    """Seeds at adjacent blocks: the second one reads the first one's output, which the batch's expansion to K
    configurations (or its shadow rows) has already multiplied; one inside a block expands before the block."""
    host, x = _resnet()
    model = MorphogeneticModel(host, config=EASY_CONFIG).eval()
    place_seed(model, "layer1_0", blueprint, Stage.HOLDING, 1)
    place_seed(model, "layer2_0", blueprint, Stage.TRAINING, 2)
    place_seed(model, "layer3_0", blueprint, Stage.BLENDING, 3, alpha=0.5)
    assert_passes_match_plain_forwards(model, x)


def test_two_training_branch_seeds_each_get_their_own_input_in_the_shadow_pass() -> None:
    host, x = _resnet()
    model = MorphogeneticModel(host, config=EASY_CONFIG).eval()
    _place(model, "layer1_0", Stage.TRAINING, 1)
    _place(model, "layer3_0", Stage.TRAINING, 2)
    _, shadow = model.forward_with_shadow(x)
    assert shadow is not None and shadow.slot_ids == ("layer1_0", "layer3_0")
    torch.testing.assert_close(shadow.outputs[0], configuration_output(model, [1.0, 0.0, 0.0], x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(shadow.outputs[1], configuration_output(model, [0.0, 0.0, 1.0], x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("blueprint", READING_THE_BLOCK)
def test_a_training_seed_beside_or_inside_a_block_learns_only_from_its_shadow(blueprint: str) -> None:
    host, x = _resnet()
    host.train()
    bare = copy.deepcopy(host)
    model = MorphogeneticModel(host, config=EASY_CONFIG)
    place_seed(model, "layer2_0", blueprint, Stage.TRAINING, 1)
    targets = torch.randint(0, 4, (x.shape[0],))
    output, shadow = model.forward_with_shadow(x)
    torch.testing.assert_close(output, bare(x), rtol=0, atol=0)
    assert shadow is not None
    nn.functional.cross_entropy(shadow.outputs[0], targets).backward(inputs=list(shadow.parameters))
    assert all(parameter.grad is None for parameter in host.parameters())
    assert all(parameter.grad is not None for parameter in model.seed_parameters("layer2_0"))


@pytest.mark.parametrize("blueprint", READING_THE_BLOCK)
def test_seeds_grafted_beside_or_inside_blocks_train_with_the_host_and_round_trip_through_state_dict(
        blueprint: str) -> None:
    host, x = _resnet()
    host.train()
    model = MorphogeneticModel(host)
    for slot_id in model.slot_ids:
        assert model.can_graft(slot_id, blueprint)
        model.graft(slot_id, blueprint)
    nn.functional.cross_entropy(model(x), torch.randint(0, 4, (x.shape[0],))).backward()
    seed = model.slot("layer2_0").seed
    assert seed is not None and all(p.grad is not None for p in seed.parameters())
    assert all(p.grad is not None for p in host.parameters() if p.requires_grad)
    restored = MorphogeneticModel(copy.deepcopy(host))
    for slot_id in model.slot_ids:
        restored.graft(slot_id, blueprint)
    restored.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(restored.eval()(x), model.eval()(x), rtol=0, atol=0)


def test_the_plain_network_of_a_grown_model_holds_its_branches_and_exports() -> None:
    host, x = _resnet()
    model = MorphogeneticModel(host, config=EASY_CONFIG)
    _place(model, "layer1_0", Stage.FOSSILIZED, 1)
    _place(model, "layer2_0", Stage.HOLDING, 2)
    slot = model.germinate("layer3_0", "conv_light")
    perturb_seed(slot, torch.Generator().manual_seed(3))
    drive_to(slot, Stage.FOSSILIZED)
    assert_plain_network_matches(model, x)

