"""grown_network: the grown model as a plain module computes what the model computes, with kept seeds folded in,
TRAINING seeds left out and BLENDING seeds refused (or left out when asked)."""

from __future__ import annotations

import pytest
import torch
from slot_driver import EASY_CONFIG, drive_to, perturb_seed
from torch import Tensor

from morphogen.core.blend import BlendKind
from morphogen.core.hosts import CNNHost, TransformerHost
from morphogen.core.lifecycle import Stage
from morphogen.core.model import MorphogeneticModel
from morphogen.core.module_host import host_from_module
from morphogen.core.plain import ExportError, FoldedSeed, grown_network

#: Per topology: a seed blueprint and the stages placed in the host's slots, in order.
LAYOUTS = {
    "cnn": ("conv_heavy", {"r0c0": Stage.FOSSILIZED, "r0c1": Stage.TRAINING, "r0c2": Stage.HOLDING}),
    "transformer": ("mlp_small", {"r0c0": Stage.HOLDING, "r0c1": Stage.GERMINATED, "r0c3": Stage.FOSSILIZED}),
}


def grown(topology: str, stages: dict[str, Stage], blueprint: str) -> MorphogeneticModel:
    """A small model whose seeds sit in `stages`, each seed's weights perturbed so that it changes its input."""
    torch.manual_seed(0)
    host = (CNNHost(5, 1, n_blocks=3, base_channels=8) if topology == "cnn" else
            TransformerHost(vocab_size=11, d_model=16, n_heads=2, n_layers=4, block_size=6, n_segments=4))
    model = MorphogeneticModel(host, config=EASY_CONFIG)
    generator = torch.Generator().manual_seed(1)
    for index, (slot_id, stage) in enumerate(stages.items()):
        blend = BlendKind.GATE if index == 0 else BlendKind.ADD
        slot = model.germinate(slot_id, blueprint, blend=blend)
        drive_to(slot, stage, alpha=0.4)
        perturb_seed(slot, generator)
    return model.eval()


def example(topology: str) -> Tensor:
    generator = torch.Generator().manual_seed(7)
    return (torch.randn(4, 1, 8, 8, generator=generator) if topology == "cnn" else
            torch.randint(0, 11, (4, 6), generator=generator))


@pytest.mark.parametrize("topology", list(LAYOUTS))
def test_the_plain_network_computes_what_the_grown_model_computes(topology: str) -> None:
    blueprint, stages = LAYOUTS[topology]
    model = grown(topology, stages, blueprint)
    network = grown_network(model)
    x = example(topology)
    with torch.no_grad():
        torch.testing.assert_close(network(x), model(x), rtol=0, atol=1e-6)
    folded = [slot_id for slot_id, seed in zip(model.host.injection_points, network.seeds, strict=True)
              if isinstance(seed, FoldedSeed)]
    assert folded == [slot_id for slot_id, stage in stages.items() if stage in (Stage.HOLDING, Stage.FOSSILIZED)]
    kept = sum(model.slot(slot_id).seed_parameter_count() for slot_id in folded)
    assert sum(p.numel() for p in network.parameters()) == model.host_param_count() + kept
    assert not network.training


def test_the_network_is_a_copy() -> None:
    blueprint, stages = LAYOUTS["cnn"]
    model = grown("cnn", stages, blueprint)
    x = example("cnn")
    network = grown_network(model)
    with torch.no_grad():
        before = network(x)
        for parameter in model.parameters():
            parameter.add_(1.0)
        torch.testing.assert_close(network(x), before, rtol=0, atol=0)
    assert model.slot("r0c1").stage is Stage.TRAINING  # the model itself is left as it was


def test_a_blending_seed_goes_in_at_its_alpha_or_is_left_out_when_asked() -> None:
    model = grown("cnn", {"r0c0": Stage.FOSSILIZED, "r0c1": Stage.BLENDING}, "conv_light")
    x = example("cnn")
    with torch.no_grad():  # the network computes what the model does, its seed at alpha 0.4
        torch.testing.assert_close(grown_network(model)(x), model.eval()(x), rtol=0, atol=1e-6)
        assert not torch.allclose(model.counterfactual_forward(x, [[1.0, 0.0, 0.0]])[0], model(x), atol=1e-3)
    network = grown_network(model, leave_out_blending=True)
    with torch.no_grad():
        without_blending = model.counterfactual_forward(x, [[1.0, 0.0, 0.0]])[0]  # the BLENDING seed at alpha 0
        torch.testing.assert_close(network(x), without_blending, rtol=0, atol=1e-6)


def test_a_float64_model_blends_at_its_exact_alpha_as_its_plain_network_does() -> None:
    """A float64 host's seed at alpha 1/3 computes the same in the model and in its plain network (and export):
    the model's slots once blended at alpha rounded to float32, 4e-7 away from the plain network."""
    torch.manual_seed(0)
    network = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).double()
    x = torch.randn(16, 4, dtype=torch.float64)
    model = MorphogeneticModel(host_from_module(network, ["1"], example_input=x[:2]), config=EASY_CONFIG)
    slot = model.germinate("1", "mlp")
    drive_to(slot, Stage.BLENDING, alpha=1 / 3)
    perturb_seed(slot, torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(grown_network(model)(x), model.eval()(x), rtol=0, atol=1e-12)


def test_a_network_or_host_given_for_the_grown_model_is_one_line_naming_what_to_pass() -> None:
    """`grown_network(host)` was an AttributeError ('ModuleHost' object has no attribute 'host')."""
    network = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    host = host_from_module(network, ["1"], example_input=torch.randn(2, 4))
    for given, name in [(host, "ModuleHost"), (network, "Sequential")]:
        with pytest.raises(ExportError, match=rf"^grown_network takes the grown model \(a MorphogeneticModel: "
                                              rf"`result.model` of morphogen.grow, `grower.model`\), not a {name}$"):
            grown_network(given)  # type: ignore[arg-type]
