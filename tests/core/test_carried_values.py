"""Values that cross slots: a U-Net's skips handed from the segment that computes them to the one that reads them
(`host_from_module(..., carry_skips=True)`), through every pass the model runs and into its export."""

from __future__ import annotations

import copy
import pickle
import sys
from pathlib import Path

import pytest
import torch
from slot_driver import (
    EASY_CONFIG,
    assert_passes_match_plain_forwards,
    assert_plain_network_matches,
    configuration_output,
    place_seed,
)
from torch import Tensor, nn

import morphogen
from morphogen.core.lifecycle import Stage
from morphogen.core.model import MorphogeneticModel
from morphogen.core.module_host import HostBuildError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "own"))
from models import UNet

SLOTS = ["down1", "down2", "middle", "up2", "up1"]


def unet_host() -> tuple[morphogen.ModuleHost, Tensor]:
    """The U-Net cut after each of its five blocks, every cut but the first crossed by a skip, and a batch."""
    torch.manual_seed(0)
    net = UNet(width=4)
    host = morphogen.host_from_module(net, SLOTS, example_input=torch.randn(2, 1, 8, 8), carry_skips=True)
    return host.eval(), torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(1))


def test_a_unet_is_refused_without_carry_skips_and_computes_what_the_model_does_with_it() -> None:
    torch.manual_seed(0)
    net, x = UNet(width=4).eval(), torch.randn(3, 1, 8, 8)
    with pytest.raises(HostBuildError, match=r"^slot after 'down2': it sits inside a branch: .* a U-Net's skip.* "
                                             r"or pass carry_skips=True to hand those values across the slot$"):
        morphogen.host_from_module(net, ["down2"], example_input=x[:2])
    host = morphogen.host_from_module(net, SLOTS, example_input=x[:2], carry_skips=True).eval()
    assert host.injection_points == {"down1": 4, "down2": 8, "middle": 8, "up2": 4, "up1": 4}
    with torch.no_grad():
        torch.testing.assert_close(host(x), net(x), rtol=0, atol=1e-6)
    assert host.carried_values is not None and host.carried_values.rows_held() == {}, "nothing kept after a pass"
    assert set(SLOTS) <= set(morphogen.slot_points(net, x[:2], carry_skips=True))
    assert {"down2", "middle", "up2"}.isdisjoint(morphogen.slot_points(net, x[:2]))


@pytest.mark.parametrize("blueprint", ["conv_light", "wider", "wider_inside"])
def test_counterfactual_and_shadow_passes_agree_with_plain_forwards_across_skips(blueprint: str) -> None:
    """A TRAINING seed in the middle: its shadow rows start there and read the skips the host pass computed; a
    widening seed is cut into a segment that also reads a skip."""
    host, x = unet_host()
    model = MorphogeneticModel(host, ["down2", "middle", "up2"], config=EASY_CONFIG).eval()
    place_seed(model, "down2", blueprint, Stage.HOLDING, 1)
    place_seed(model, "middle", blueprint, Stage.TRAINING, 2)
    place_seed(model, "up2", blueprint, Stage.BLENDING, 3, alpha=0.5)
    assert_passes_match_plain_forwards(model, x)


@pytest.mark.parametrize("shadow_rows", [None, 2])
def test_two_training_seeds_with_a_skip_taken_between_them_each_see_only_themselves(shadow_rows: int | None) -> None:
    """The first seed's rows carry its own `down1` output along the skip; the second's join after it was taken,
    so they read the host's."""
    host, x = unet_host()
    model = MorphogeneticModel(host, ["down1", "up2"], config=EASY_CONFIG).eval()
    place_seed(model, "down1", "conv_light", Stage.TRAINING, 1)
    place_seed(model, "up2", "conv_light", Stage.TRAINING, 2)
    _, shadow = model.forward_with_shadow(x, shadow_rows)
    assert shadow is not None and shadow.slot_ids == ("down1", "up2")
    rows = slice(None, shadow_rows)
    for index, row in enumerate(([1.0, 0.0], [0.0, 1.0])):
        torch.testing.assert_close(shadow.outputs[index], configuration_output(model, row, x)[rows], rtol=1e-5,
                                   atol=1e-5)


def test_a_seed_before_a_skip_reaches_the_skip_as_in_the_users_model_with_the_seed_inserted() -> None:
    """Oracle outside morphogen's cut: the user's U-Net with each slot's seed called after its block."""
    torch.manual_seed(0)
    net, x = UNet(width=4).eval(), torch.randn(3, 1, 8, 8)
    host = morphogen.host_from_module(net, SLOTS, example_input=x[:2], carry_skips=True).eval()
    model = MorphogeneticModel(host, ["down1", "down2"], config=EASY_CONFIG).eval()
    place_seed(model, "down1", "conv_light", Stage.HOLDING, 1)
    place_seed(model, "down2", "conv_heavy", Stage.BLENDING, 2, alpha=0.5)
    with torch.no_grad():
        grown = model(x)
        net.down1 = nn.Sequential(net.down1, model.slot("down1"))  # the same modules, called as the model calls them
        net.down2 = nn.Sequential(net.down2, model.slot("down2"))
        torch.testing.assert_close(grown, net(x), rtol=0, atol=1e-6)


def test_the_shadow_loss_trains_the_seed_only_through_a_skip_and_after_the_host_loss() -> None:
    """The skip's host value is detached in the shadow pass: no host gradient, and no second pass through the
    host's graph, which the host loss's backward has freed."""
    host, x = unet_host()
    model = MorphogeneticModel(host, ["down2"], config=EASY_CONFIG).train()
    place_seed(model, "down2", "conv_light", Stage.TRAINING, 1)
    targets = torch.randint(0, 3, (3, 8, 8), generator=torch.Generator().manual_seed(2))
    output, shadow = model.forward_with_shadow(x)
    assert shadow is not None
    nn.functional.cross_entropy(output, targets).backward()
    host_gradients = {name: p.grad.clone() for name, p in host.named_parameters() if p.grad is not None}
    assert host_gradients
    nn.functional.cross_entropy(shadow.outputs[0], targets).backward(inputs=list(shadow.parameters))
    assert all(torch.equal(p.grad, host_gradients[name]) for name, p in host.named_parameters() if p.grad is not None)
    assert all(p.grad is not None for p in model.seed_parameters("down2"))


def test_the_grown_unet_exports_to_a_program_that_computes_what_the_model_computes() -> None:
    host, x = unet_host()
    model = MorphogeneticModel(host, ["down1", "middle", "up1"], config=EASY_CONFIG).eval()
    place_seed(model, "down1", "wider_inside", Stage.HOLDING, 4)
    place_seed(model, "middle", "conv_light", Stage.FOSSILIZED, 5)
    place_seed(model, "up1", "wider", Stage.HOLDING, 6)
    assert_plain_network_matches(model, x)


class _BatchStatistic(nn.Module):
    """Reads the batch's mean over samples across the slot: a value without one row per sample."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Conv2d(1, 4, 3, padding=1), nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        h = self.first(x)
        statistic = h.mean(0, keepdim=True)  # computed before the slot after `second`, read after it
        return self.second(h) * statistic


def test_a_value_without_a_row_per_sample_cannot_cross_a_slot() -> None:
    with pytest.raises(HostBuildError, match=r"^mean, which crosses a slot, has 1 rows for a batch of 2 samples; a "
                                             r"value carried across slots needs one row per sample$"):
        morphogen.host_from_module(_BatchStatistic(), ["second"], example_input=torch.randn(2, 1, 6, 6),
                                   carry_skips=True)


def test_a_copy_of_a_host_mid_pass_takes_none_of_its_activations() -> None:
    """Segments walked by hand (as a user's loop may) leave values held until the next pass: a deep copy or a
    pickle of the host leaves them behind (activations with a graph cannot be deep-copied at all)."""
    host, x = unet_host()
    h = x.requires_grad_()
    for index in range(3):
        h = host.run_segment(index, h)
    assert host.carried_values is not None and host.carried_values.rows_held()
    copied = copy.deepcopy(host)
    assert copied.carried_values is not None and copied.carried_values.rows_held() == {}
    assert pickle.loads(pickle.dumps(host)).carried_values.rows_held() == {}
    with torch.no_grad():
        torch.testing.assert_close(copied(x), host(x))
