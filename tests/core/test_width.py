"""Width growth: new channels of the layers around a slot, in the seed lifecycle (morphogen.core.width).

Identity at birth on every host kind that has layers around its slots (and a clear refusal where none
are), the same network as the host with wider layers once blended in, counterfactual and shadow passes
that agree with plain forwards, exact state_dict round trips, and FLOPs counted by hand.
"""

from __future__ import annotations

import copy

import pytest
import torch
from slot_driver import (
    EASY_CONFIG,
    assert_passes_match_plain_forwards,
    assert_plain_network_matches,
    drive_to,
    perturb_seed,
)
from torch import Tensor, nn

from morphogen import CNNHost, Conv1dHost, MorphogeneticModel, TransformerHost, host_from_module
from morphogen.core.blend import BlendKind
from morphogen.core.flops import FlopCounter
from morphogen.core.hosts import SegmentedHost
from morphogen.core.lifecycle import Stage
from morphogen.core.width import NoWidthSiteError
from morphogen.inputs import InputSpec


def _mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))


def _user_cnn() -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(6, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 4 * 4, 5))


def _hosts() -> dict[str, tuple[SegmentedHost, Tensor]]:
    """Every host kind with layers around its slots, in eval mode, with an input batch."""
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    return {
        "cnn": (CNNHost(5, 1, n_blocks=3, base_channels=4).eval(), torch.randn(4, 1, 8, 8, generator=generator)),
        "cnn1d": (Conv1dHost(5, 1, n_blocks=2, base_channels=4).eval(), torch.randn(4, 1, 40, generator=generator)),
        "mlp": (host_from_module(_mlp(), ["1", "3"], example_input=torch.randn(2, 12)).eval(),
                torch.randn(4, 12, generator=generator)),
        "user cnn": (host_from_module(_user_cnn(), ["2", "5"], example_input=torch.randn(2, 3, 8, 8)).eval(),
                     torch.randn(4, 3, 8, 8, generator=generator)),
    }


HOSTS = list(_hosts())


@pytest.mark.parametrize("kind", HOSTS)
@pytest.mark.parametrize("blueprint", ["wider", "wider_half"])
def test_a_widening_seed_is_the_identity_at_birth_on_every_host_kind(kind: str, blueprint: str) -> None:
    host, x = _hosts()[kind]
    with torch.no_grad():
        bare = host(x)
    for slot_id in host.slot_ids:
        model = MorphogeneticModel(host, [slot_id], config=EASY_CONFIG)
        slot = model.germinate(slot_id, blueprint)
        assert slot.width_site is not None and slot.seed_parameter_count() > 0
        for stage in (Stage.TRAINING, Stage.BLENDING, Stage.HOLDING, Stage.FOSSILIZED):
            drive_to(slot, stage)
            torch.testing.assert_close(model(x), bare, rtol=0, atol=1e-6, msg=f"{slot_id} {stage.name}")


def test_hosts_without_layers_around_a_slot_refuse_widening_with_the_reason() -> None:
    # A transformer's residual stream cannot be widened locally: its slots widen inside (test_transformer_width.py).
    transformer = TransformerHost(vocab_size=11, d_model=16, n_heads=2, n_layers=2, block_size=6, n_segments=2)
    assert MorphogeneticModel(transformer).can_graft("r0c0", "wider_inside")
    pooled = MorphogeneticModel(CNNHost(5, 1, n_blocks=2, base_channels=4, pool_slots=True))
    with pytest.raises(NoWidthSiteError, match="r1c0 cannot widen the layers around it: no convolution or linear"):
        pooled.germinate("r1c0", "wider")  # its segment holds only the pooling
    with pytest.raises(ValueError, match="adds its channels' output"):
        MorphogeneticModel(CNNHost(5, 1)).germinate("r0c0", "wider", blend=BlendKind.GATE)


def test_a_blended_widening_seed_is_the_host_with_wider_layers() -> None:
    """The oracle: an MLP whose two layers around the slot are built wider by hand from the seed's weights."""
    torch.manual_seed(0)
    network = _mlp()
    host = host_from_module(network, ["1", "3"], example_input=torch.randn(2, 12))
    model = MorphogeneticModel(host, config=EASY_CONFIG)
    slot = model.germinate("1", "wider")
    perturb_seed(slot, torch.Generator().manual_seed(3))
    drive_to(slot, Stage.FOSSILIZED)
    seed = slot.seed
    assert seed is not None
    producer, consumer = network[0], network[2]
    wide = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 3))
    with torch.no_grad():
        wide[0].weight.copy_(torch.cat([producer.weight, seed.producer.weight]))
        wide[0].bias.copy_(torch.cat([producer.bias, seed.producer.bias]))
        wide[2].weight.copy_(torch.cat([consumer.weight, seed.consumer.weight], dim=1))
        wide[2].bias.copy_(consumer.bias)
        wide[4].load_state_dict(network[4].state_dict())
    # The new neurons of an MLP without norms are exactly the producer's new rows after its activation.
    assert isinstance(seed.after_producer[0], nn.ReLU) and len(seed.after_producer) == 1
    x = torch.randn(5, 12)
    torch.testing.assert_close(model(x), wide(x), rtol=1e-6, atol=1e-6)


def _place(model: MorphogeneticModel, slot_id: str, stage: Stage, seed: int, alpha: float = 1.0) -> None:
    slot = model.germinate(slot_id, "wider")
    perturb_seed(slot, torch.Generator().manual_seed(seed))
    drive_to(slot, stage, alpha=alpha)



def test_counterfactual_and_shadow_passes_agree_with_plain_forwards_around_widening_seeds() -> None:
    """Adjacent widening seeds in a CNN: the first one's injection sits after the second one's tap, so the
    tap is read before the batch expands to K configurations (or gains shadow rows) and repeated after."""
    torch.manual_seed(0)
    host = CNNHost(5, 1, n_blocks=3, base_channels=4).eval()
    model = MorphogeneticModel(host, config=EASY_CONFIG).eval()
    _place(model, "r0c0", Stage.HOLDING, 1)
    _place(model, "r0c1", Stage.TRAINING, 2)
    _place(model, "r0c2", Stage.BLENDING, 3, alpha=0.5)
    x = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(4))
    assert_passes_match_plain_forwards(model, x)


def test_the_passes_around_widening_seeds_build_no_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """A segment cut by a widening seed runs its layers in turn: no `nn.Sequential` slice is built at each cut of each
    forward, which built one module per cut per pass."""
    torch.manual_seed(0)
    model = MorphogeneticModel(CNNHost(5, 1, n_blocks=3, base_channels=4), config=EASY_CONFIG)
    _place(model, "r0c0", Stage.HOLDING, 1)
    _place(model, "r0c1", Stage.TRAINING, 2)
    x = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(4))
    built: list[str] = []
    module_init = nn.Module.__init__

    def counted(self: nn.Module, *args: object, **kwargs: object) -> None:
        built.append(type(self).__name__)
        module_init(self, *args, **kwargs)

    monkeypatch.setattr(nn.Module, "__init__", counted)
    output, shadow = model.forward_with_shadow(x)
    assert shadow is not None and shadow.slot_ids == ("r0c1",)
    (output.sum() + shadow.outputs.sum()).backward()
    with torch.no_grad():
        model.eval()
        model(x)
        model.counterfactual_forward(x, [[1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    assert built == []


def test_a_training_widening_seed_learns_only_from_its_shadow() -> None:
    torch.manual_seed(0)
    host = CNNHost(5, 1, n_blocks=2, base_channels=4)
    bare = copy.deepcopy(host)
    model = MorphogeneticModel(host, config=EASY_CONFIG)
    _place(model, "r0c0", Stage.TRAINING, 1)
    x, targets = torch.randn(6, 1, 8, 8), torch.randint(0, 5, (6,))
    output, shadow = model.forward_with_shadow(x)
    assert torch.equal(output, bare(x))
    assert shadow is not None
    nn.functional.cross_entropy(shadow.outputs[0], targets).backward(inputs=list(shadow.parameters))
    assert all(parameter.grad is None for parameter in host.parameters())
    assert all(parameter.grad is not None for parameter in model.seed_parameters("r0c0"))


def test_state_dict_round_trips_the_wider_layers_exactly() -> None:
    torch.manual_seed(0)
    host, x = _hosts()["user cnn"]
    model = MorphogeneticModel(host, config=EASY_CONFIG)
    _place(model, "2", Stage.FOSSILIZED, 1)
    _place(model, "5", Stage.TRAINING, 2)
    state = model.state_dict()
    restored = MorphogeneticModel(copy.deepcopy(host), config=EASY_CONFIG)
    restored.load_state_dict(state)
    for name, value in restored.state_dict().items():
        if isinstance(value, Tensor):
            assert torch.equal(value, state[name]), name
    assert restored.slot("2").stage is Stage.FOSSILIZED and restored.slot("5").stage is Stage.TRAINING
    assert restored.param_count() == model.param_count() > restored.host_param_count()
    with torch.no_grad():
        torch.testing.assert_close(restored.eval()(x), model.eval()(x), rtol=0, atol=0)


@pytest.mark.parametrize(("blueprint", "multiply_adds"), [
    ("wider", 12 * 16 + 16 * 16),  # the slot's k = 16 new neurons: their producer rows and consumer columns
    ("branch_wide", 12 * 64 + 64 * 16),  # a branch beside the first layer: 12 inputs to 4 x 16 features, to 16
])
def test_flops_of_a_widening_or_branch_seed_match_a_hand_count(blueprint: str, multiply_adds: int) -> None:
    """Validation of an MLP with the seed in its first slot."""
    host = host_from_module(_mlp(), ["1", "3"], example_input=torch.randn(2, 12))
    model = MorphogeneticModel(host, config=EASY_CONFIG)
    counter, batch = FlopCounter(), 5
    bare = counter.validation_batch(model, [[0.0, 0.0]], InputSpec.tensor((batch, 12))).main
    drive_to(model.germinate("1", blueprint), Stage.FOSSILIZED)
    grown = counter.validation_batch(model, [[1.0, 0.0]], InputSpec.tensor((batch, 12))).main
    assert grown - bare == 2 * batch * multiply_adds  # a multiply-add is 2 FLOPs


def test_the_plain_network_of_a_grown_model_holds_its_wider_layers_and_exports() -> None:
    torch.manual_seed(0)
    model = MorphogeneticModel(CNNHost(5, 1, n_blocks=3, base_channels=4), config=EASY_CONFIG)
    _place(model, "r0c0", Stage.FOSSILIZED, 1)
    _place(model, "r0c1", Stage.HOLDING, 2)  # its tap is read inside the segment where r0c0 injects
    slot = model.germinate("r0c2", "conv_light")
    perturb_seed(slot, torch.Generator().manual_seed(3))
    drive_to(slot, Stage.FOSSILIZED)
    x = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(4))
    assert_plain_network_matches(model, x)
