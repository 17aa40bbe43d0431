"""Width growth on transformers: new neurons in the MLP of the block before a slot (morphogen.core.width).

A transformer's residual stream cannot widen locally, so its slots widen inside: the block's MLP (Linear ->
GELU -> Linear) gets new hidden neurons whose output weights start at zero. Checked on the built-in GPT and on a
user's GPT written with torch's MultiheadAttention and a causal mask made from the input's length, which fx
cannot trace whole (`core/tracing.PartialTracer`): identity at birth through every stage, a blended seed is the
block with a wider MLP (built by hand), counterfactual and shadow passes match plain forwards, a TRAINING seed
learns from its shadow only, state_dict round trips, and the plain network and its export.
"""

from __future__ import annotations

import copy
import math
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from slot_driver import (
    EASY_CONFIG,
    assert_identity_at_birth_until_perturbed,
    assert_passes_match_plain_forwards,
    assert_plain_network_matches,
    drive_to,
    place_seed,
)
from torch import Tensor, fx, nn

from morphogen import MorphogeneticModel, TransformerHost, host_from_module
from morphogen.core.hosts import SegmentedHost
from morphogen.core.lifecycle import Stage
from morphogen.core.tracing import trace_partially
from morphogen.core.transformer_layers import TransformerBlock

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "own"))
from models import GPTBlock, TinyGPT  # a user's GPT: torch's attention under a causal mask sized from the input

VOCABULARY = 8


def _ids(rows: int = 4, seed: int = 1) -> Tensor:
    return torch.randint(0, VOCABULARY, (rows, 6), generator=torch.Generator().manual_seed(seed))


def _hosts() -> dict[str, SegmentedHost]:
    """The built-in GPT with a slot after each of its three blocks, and a user's, both in eval mode."""
    torch.manual_seed(0)
    built_in = TransformerHost(VOCABULARY, d_model=16, n_heads=2, n_layers=3, block_size=6, n_segments=3).eval()
    users = host_from_module(TinyGPT(vocab=VOCABULARY, layers=3), ["blocks.0", "blocks.1", "blocks.2"],
                             example_input=_ids(2))
    return {"built-in": built_in, "user's": users.eval()}


@pytest.mark.parametrize("kind", ["built-in", "user's"])
def test_every_slot_of_a_transformer_widens_the_mlp_of_the_block_before_it(kind: str) -> None:
    host = _hosts()[kind]
    model = MorphogeneticModel(host)
    for slot in model.slots():
        site = slot.width_site
        assert site is not None and site.inside, slot.slot_id
        assert [type(module) for module in site.after_producer] == [nn.GELU]
        assert isinstance(site.producer, nn.Linear) and site.producer.in_features == 16
        assert isinstance(site.consumer, nn.Linear) and site.consumer.out_features == 16
    last = host.segments[2]
    block = last[0] if kind == "built-in" else last.get_submodule("blocks.2")
    assert model.slot(model.slot_ids[2]).width_site.producer is block.mlp[0]  # type: ignore[union-attr]


@pytest.mark.parametrize("kind", ["built-in", "user's"])
@pytest.mark.parametrize("blueprint", ["wider", "wider_half", "wider_inside"])
def test_a_widening_seed_is_the_identity_at_birth_on_a_transformer(kind: str, blueprint: str) -> None:
    assert_identity_at_birth_until_perturbed(_hosts()[kind], _ids(), blueprint)


def test_a_blended_widening_seed_is_the_block_with_a_wider_mlp() -> None:
    """The oracle: the built-in block before the first slot rebuilt with its MLP's new neurons beside the old."""
    host = _hosts()["built-in"]
    model = MorphogeneticModel(host, ["r0c0"], config=EASY_CONFIG)
    place_seed(model, "r0c0", "wider_half", Stage.BLENDING, 3, alpha=0.5)
    seed = model.slot("r0c0").seed
    assert seed is not None
    block = host.segments[0][1]
    assert isinstance(block, TransformerBlock)
    wide = copy.deepcopy(block)
    wide.mlp = nn.Sequential(nn.Linear(16, 64 + 32), nn.GELU(), nn.Linear(64 + 32, 16))
    with torch.no_grad():
        wide.mlp[0].weight.copy_(torch.cat([block.mlp[0].weight, seed.producer.weight]))
        wide.mlp[0].bias.copy_(torch.cat([block.mlp[0].bias, seed.producer.bias]))
        wide.mlp[2].weight.copy_(torch.cat([block.mlp[2].weight, 0.5 * seed.consumer.weight], dim=1))  # alpha 0.5
        wide.mlp[2].bias.copy_(block.mlp[2].bias)
    by_hand = nn.Sequential(host.segments[0][0], wide, host.segments[1], host.segments[2], host.segments[3])
    x = _ids()
    with torch.no_grad():
        torch.testing.assert_close(model(x), by_hand(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["built-in", "user's"])
def test_counterfactual_and_shadow_passes_agree_with_plain_forwards_on_a_transformer(kind: str) -> None:
    host = _hosts()[kind]
    model = MorphogeneticModel(host, config=EASY_CONFIG).eval()
    first, middle, last = model.slot_ids
    place_seed(model, first, "wider", Stage.HOLDING, 1)
    place_seed(model, middle, "wider_half", Stage.TRAINING, 2)
    place_seed(model, last, "wider", Stage.BLENDING, 3, alpha=0.5)
    assert_passes_match_plain_forwards(model, _ids())


def _assert_a_training_wider_seed_learns_only_from_its_shadow(host: nn.Module, slot: str) -> MorphogeneticModel:
    """A TRAINING `wider` seed in `slot` leaves the host's output exactly as it was and learns from its shadow's loss
    alone: no host parameter gets a gradient, each of the seed's does. Returns the model."""
    host.train()
    bare = copy.deepcopy(host)
    model = MorphogeneticModel(host, config=EASY_CONFIG)
    place_seed(model, slot, "wider", Stage.TRAINING, 1)
    x, targets = _ids(), _ids(seed=2)
    output, shadow = model.forward_with_shadow(x)
    torch.testing.assert_close(output, bare(x), rtol=0, atol=0)
    assert shadow is not None
    nn.functional.cross_entropy(shadow.outputs[0].flatten(0, 1), targets.flatten()).backward(
        inputs=list(shadow.parameters))
    assert all(parameter.grad is None for parameter in host.parameters())
    assert all(parameter.grad is not None and parameter.grad.abs().sum() > 0
               for parameter in model.seed_parameters(slot))
    return model


def test_a_training_widening_seed_of_a_transformer_learns_only_from_its_shadow() -> None:
    _assert_a_training_wider_seed_learns_only_from_its_shadow(_hosts()["user's"], "blocks_1")


def test_state_dict_round_trips_a_transformers_wider_mlps_exactly() -> None:
    host = _hosts()["built-in"]
    model = MorphogeneticModel(host, config=EASY_CONFIG)
    place_seed(model, "r0c0", "wider", Stage.FOSSILIZED, 1)
    place_seed(model, "r0c2", "wider_inside", Stage.TRAINING, 2)
    state = model.state_dict()
    restored = MorphogeneticModel(copy.deepcopy(host), config=EASY_CONFIG)
    restored.load_state_dict(state)
    tensors = {name: value for name, value in restored.state_dict().items() if isinstance(value, Tensor)}
    assert tensors and all(torch.equal(value, state[name]) for name, value in tensors.items())
    assert restored.slot("r0c0").stage is Stage.FOSSILIZED and restored.slot("r0c2").stage is Stage.TRAINING
    with torch.no_grad():
        torch.testing.assert_close(restored.eval()(_ids()), model.eval()(_ids()), rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["built-in", "user's"])
def test_the_plain_network_of_a_grown_transformer_holds_its_wider_mlps_and_exports(kind: str) -> None:
    host = _hosts()[kind]
    model = MorphogeneticModel(host, config=EASY_CONFIG)
    first, middle, _ = model.slot_ids
    place_seed(model, first, "wider", Stage.FOSSILIZED, 1)
    place_seed(model, middle, "block", Stage.FOSSILIZED, 2)  # a whole block grown after the next one's MLP widened
    assert_plain_network_matches(model, _ids())


def test_a_submodule_fx_cannot_trace_is_kept_as_one_call_and_the_rest_is_traced() -> None:
    block = GPTBlock(8).eval()
    with pytest.raises(TypeError):  # fx alone cannot: the mask's size is traced
        fx.symbolic_trace(block)

    class ChecksLength(nn.Module):  # Python control flow on a traced value: fx cannot trace it
        def forward(self, x: Tensor) -> Tensor:
            if x.shape[1] > 100:
                raise ValueError("too long")
            return x * 2

    wrapped = nn.Sequential(ChecksLength(), block)
    traced = trace_partially(wrapped)
    kept = [node.target for node in traced.graph.nodes if node.op == "call_module"]
    assert kept[0] == "0" and "1.mlp.0" in kept and "1.mlp.2" in kept  # the checker whole, the block traced into
    x = torch.randn(3, 5, 8)
    with torch.no_grad():
        torch.testing.assert_close(traced(x), wrapped(x), rtol=0, atol=0)


def test_new_neurons_after_a_layer_norm_over_the_features_get_a_layer_norm_of_their_own() -> None:
    class NormedMLPBlock(nn.Module):  # an MLP with a norm inside (NormFormer's), over tokens [N, T, D]
        def __init__(self) -> None:
            super().__init__()
            self.mlp = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 16))

        def forward(self, x: Tensor) -> Tensor:
            return x + self.mlp(x)

    torch.manual_seed(0)
    net = nn.Sequential(nn.Embedding(VOCABULARY, 16), NormedMLPBlock(), NormedMLPBlock(), nn.Linear(16, VOCABULARY))
    host = host_from_module(net, ["1", "2"], example_input=_ids(2), topology="transformer").eval()
    x = _ids()
    with torch.no_grad():
        bare = host(x)
    model = MorphogeneticModel(host, ["2"], config=EASY_CONFIG)
    place_seed(model, "2", "wider_half", Stage.HOLDING, 1)
    seed = model.slot("2").seed
    assert seed is not None and isinstance(seed.after_producer[0], nn.LayerNorm)
    assert seed.after_producer[0].normalized_shape == (16,)  # half of the MLP's 32
    with torch.no_grad():
        assert not torch.allclose(model(x), bare, atol=1e-4)  # perturbed: the new neurons count
    assert_identity_at_birth_until_perturbed(host, x, "wider")


class _TanhGeluBlock(nn.Module):
    """GPT-2's MLP written functionally: `F.gelu(h, approximate="tanh")` between its two layers."""

    def __init__(self) -> None:
        super().__init__()
        self.c_fc, self.c_proj = nn.Linear(16, 32), nn.Linear(32, 16)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.c_proj(nn.functional.gelu(self.c_fc(x), approximate="tanh"))


def test_new_neurons_after_a_functional_gelu_with_its_tanh_approximation_go_through_the_same_gelu() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Embedding(VOCABULARY, 16), _TanhGeluBlock(), _TanhGeluBlock(), nn.Linear(16, VOCABULARY))
    host = host_from_module(net, ["1", "2"], example_input=_ids(2), topology="transformer").eval()
    model = MorphogeneticModel(host, ["2"], config=EASY_CONFIG)
    place_seed(model, "2", "wider_half", Stage.HOLDING, 1)
    seed = model.slot("2").seed
    assert seed is not None and isinstance(seed.after_producer[0], nn.GELU)
    assert seed.after_producer[0].approximate == "tanh"
    block, x = net[2], _ids()
    with torch.no_grad():  # the oracle: the block with its MLP's new neurons beside the old, by hand
        h = net[1](net[0](x))
        hidden = torch.cat([block.c_fc(h), seed.producer(h)], dim=-1)
        weight = torch.cat([block.c_proj.weight, seed.consumer.weight], dim=1)
        by_hand = net[3](h + nn.functional.linear(nn.functional.gelu(hidden, approximate="tanh"), weight,
                                                  block.c_proj.bias))
        assert not torch.allclose(by_hand, net(x), atol=1e-4)  # perturbed: the new neurons count
        torch.testing.assert_close(model.eval()(x), by_hand, rtol=1e-5, atol=1e-5)


class _GeluWrittenOut(nn.Module):
    """GELU's tanh approximation written out with `torch.tanh` and `torch.pow`, as Hugging Face's
    `NewGELUActivation` (GPT-2's) computes it: not a torch.nn class, so recognised by what it computes."""

    def forward(self, x: Tensor) -> Tensor:
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class _GeluByAttribute(nn.Module):
    """An activation that calls the function it holds (Hugging Face's `GELUActivation` does so)."""

    def __init__(self) -> None:
        super().__init__()
        self.function = nn.functional.gelu

    def forward(self, x: Tensor) -> Tensor:
        return self.function(x)


class _ActivationModuleBlock(nn.Module):
    """A GPT-2-style MLP block whose activation is the module given."""

    def __init__(self, activation: nn.Module) -> None:
        super().__init__()
        self.c_fc, self.act, self.c_proj = nn.Linear(16, 32), activation, nn.Linear(32, 16)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.c_proj(self.act(self.c_fc(x)))


def _activation_module_host(activation: type[nn.Module]) -> tuple[nn.Sequential, SegmentedHost]:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Embedding(VOCABULARY, 16), _ActivationModuleBlock(activation()),
                        _ActivationModuleBlock(activation()), nn.Linear(16, VOCABULARY))
    return net, host_from_module(net, ["1", "2"], example_input=_ids(2), topology="transformer").eval()


@pytest.mark.parametrize("activation", [_GeluWrittenOut, _GeluByAttribute])
def test_new_neurons_after_a_users_activation_module_go_through_a_copy_of_it(activation: type[nn.Module]) -> None:
    """The oracle: the block with its MLP's new neurons beside the old, by hand; identity at birth in every stage."""
    net, host = _activation_module_host(activation)
    model = MorphogeneticModel(host, ["2"], config=EASY_CONFIG)
    place_seed(model, "2", "wider_half", Stage.HOLDING, 1)
    seed = model.slot("2").seed
    assert seed is not None and [type(module) for module in seed.after_producer] == [activation]
    block, x = net[2], _ids()
    with torch.no_grad():
        h = net[1](net[0](x))
        hidden = torch.cat([block.c_fc(h), seed.producer(h)], dim=-1)
        weight = torch.cat([block.c_proj.weight, seed.consumer.weight], dim=1)
        by_hand = net[3](h + nn.functional.linear(block.act(hidden), weight, block.c_proj.bias))
        assert not torch.allclose(by_hand, net(x), atol=1e-4)  # perturbed: the new neurons count
        torch.testing.assert_close(model.eval()(x), by_hand, rtol=1e-5, atol=1e-5)
    assert_identity_at_birth_until_perturbed(host, x, "wider")


def _assert_a_wider_seed_learns_only_from_its_shadow_round_trips_and_exports(
        host: nn.Module, second_blueprint: str) -> dict[str, Tensor]:
    """A TRAINING `wider` seed in slot 1 leaves the host's output and gradients alone and learns from its shadow; with
    it fossilized and `second_blueprint` fossilized in slot 2, the state_dict (returned) restores the model exactly
    and the exported plain network computes what it computes."""
    bare = copy.deepcopy(host)
    model = _assert_a_training_wider_seed_learns_only_from_its_shadow(host, "1")
    x = _ids()
    drive_to(model.slot("1"), Stage.FOSSILIZED)
    place_seed(model, "2", second_blueprint, Stage.FOSSILIZED, 3)
    state = model.state_dict()
    restored = MorphogeneticModel(copy.deepcopy(bare), config=EASY_CONFIG)
    restored.load_state_dict(state)
    with torch.no_grad():
        torch.testing.assert_close(restored.eval()(x), model.eval()(x), rtol=0, atol=0)
    assert_plain_network_matches(model, x)
    return state


def test_a_widening_seed_after_a_users_activation_module_learns_only_from_its_shadow_and_round_trips() -> None:
    _assert_a_wider_seed_learns_only_from_its_shadow_round_trips_and_exports(
        _activation_module_host(_GeluWrittenOut)[1], "wider")


class _SwiGLUBlock(nn.Module):
    """A Llama-style pre-norm gated MLP block: `down(silu(gate(h)) * up(h))`, no biases."""

    def __init__(self, gate_first: bool = True) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.gate_proj, self.up_proj = nn.Linear(16, 24, bias=False), nn.Linear(16, 24, bias=False)
        self.down_proj = nn.Linear(24, 16, bias=False)
        self.gate_first = gate_first

    def forward(self, x: Tensor) -> Tensor:
        h = self.norm(x)
        gated, up = nn.functional.silu(self.gate_proj(h)), self.up_proj(h)
        return x + self.down_proj(gated * up if self.gate_first else up * gated)


def _swiglu_host(gate_first: bool = True) -> tuple[nn.Sequential, SegmentedHost]:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Embedding(VOCABULARY, 16), _SwiGLUBlock(gate_first), _SwiGLUBlock(gate_first),
                        nn.Linear(16, VOCABULARY))
    return net, host_from_module(net, ["1", "2"], example_input=_ids(2), topology="transformer").eval()


@pytest.mark.parametrize("gate_first", [True, False], ids=["gate*up", "up*gate"])
def test_a_gated_mlp_widens_by_new_rows_of_gate_and_up_and_zero_columns_of_down(gate_first: bool) -> None:
    """The oracle: the block with the new neurons beside the old in all three layers, by hand; identity at birth in
    every stage."""
    net, host = _swiglu_host(gate_first)
    model = MorphogeneticModel(host, ["2"], config=EASY_CONFIG)
    block = net[2]
    site = model.slot("2").width_site
    assert site is not None and site.inside
    assert (site.producer, site.multiplier, site.consumer) == (block.gate_proj, block.up_proj, block.down_proj)
    place_seed(model, "2", "wider_half", Stage.HOLDING, 1)
    seed = model.slot("2").seed
    assert seed is not None and seed.multiplier is not None and seed.multiplier.out_features == 12
    x = _ids()
    with torch.no_grad():
        h = net[1](net[0](x))
        normed = block.norm(h)
        gate = torch.cat([block.gate_proj.weight, seed.producer.weight])
        up = torch.cat([block.up_proj.weight, seed.multiplier.weight])
        down = torch.cat([block.down_proj.weight, seed.consumer.weight], dim=1)
        hidden = nn.functional.silu(normed @ gate.T) * (normed @ up.T)
        by_hand = net[3](h + hidden @ down.T)
        assert not torch.allclose(by_hand, net(x), atol=1e-4)  # perturbed: the new neurons count
        torch.testing.assert_close(model.eval()(x), by_hand, rtol=1e-5, atol=1e-5)
    assert_identity_at_birth_until_perturbed(host, x, "wider")


def test_a_gated_mlps_widening_seed_learns_only_from_its_shadow_round_trips_and_exports() -> None:
    state = _assert_a_wider_seed_learns_only_from_its_shadow_round_trips_and_exports(_swiglu_host()[1], "wider_inside")
    assert any(name.endswith("seed.multiplier.weight") for name in state)


def test_a_gated_mlp_whose_up_layer_reads_another_input_has_no_site() -> None:
    class CrossGated(nn.Module):  # the product's other factor is a layer of another value: no new rows match it
        def __init__(self) -> None:
            super().__init__()
            self.gate, self.up, self.down = nn.Linear(16, 24), nn.Linear(16, 24), nn.Linear(24, 16)

        def forward(self, x: Tensor) -> Tensor:
            return x + self.down(torch.sigmoid(self.gate(x)) * self.up(torch.tanh(x)))

    net = nn.Sequential(nn.Embedding(VOCABULARY, 16), CrossGated(), CrossGated(), nn.Linear(16, VOCABULARY))
    model = MorphogeneticModel(host_from_module(net, ["1", "2"], example_input=_ids(2), topology="transformer"))
    assert model.slot("2").width_site is None


class _T5GatedDense(nn.Module):
    """T5 v1.1's gated MLP written out as `T5DenseGatedActDense` computes it: `wo(dropout(act(wi_0(h)) * wi_1(h)))`
    with GPT-2's tanh GELU as the activation, and its cast to `wo`'s dtype. `between` stands where the dropout is:
    a module, or None for the functional dropout given the model's mode."""

    def __init__(self, between: nn.Module | None) -> None:
        super().__init__()
        self.wi_0, self.wi_1 = nn.Linear(16, 24, bias=False), nn.Linear(16, 24, bias=False)
        self.wo = nn.Linear(24, 16, bias=False)
        self.act, self.between = _GeluWrittenOut(), between

    def forward(self, h: Tensor) -> Tensor:
        hidden = self.act(self.wi_0(h)) * self.wi_1(h)
        hidden = (nn.functional.dropout(hidden, 0.5, training=self.training) if self.between is None
                  else self.between(hidden))
        if isinstance(self.wo.weight, Tensor) and hidden.dtype != self.wo.weight.dtype:
            hidden = hidden.to(self.wo.weight.dtype)
        return self.wo(hidden)


class _T5FeedForward(nn.Module):
    """T5's feed-forward layer (`T5LayerFF`): a pre-norm, the gated MLP, a dropout on the residual branch."""

    def __init__(self, between: nn.Module | None) -> None:
        super().__init__()
        self.layer_norm, self.DenseReluDense, self.dropout = nn.LayerNorm(16), _T5GatedDense(between), nn.Dropout(0.1)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.dropout(self.DenseReluDense(self.layer_norm(x)))


#: What stands between a T5 MLP's product and `wo`, by name: None is the functional dropout.
_BETWEEN: dict[str, Callable[[], nn.Module] | None] = {
    "dropout": lambda: nn.Dropout(0.5), "functional": None, "identity": nn.Identity,
    "layer norm": lambda: nn.LayerNorm(24),
}


def _t5_host(between: str) -> tuple[nn.Sequential, SegmentedHost]:
    """Two T5 feed-forward layers with `_BETWEEN[between]` between an embedding and a head, cut after each, in
    eval mode."""
    torch.manual_seed(0)
    make = _BETWEEN[between]
    layers = [_T5FeedForward(None if make is None else make()) for _ in range(2)]
    net = nn.Sequential(nn.Embedding(VOCABULARY, 16), *layers, nn.Linear(16, VOCABULARY))
    return net, host_from_module(net, ["1", "2"], example_input=_ids(2), topology="transformer").eval()


@pytest.mark.parametrize("between", ["dropout", "functional", "identity"])
def test_a_t5_gated_mlp_with_a_dropout_before_its_output_layer_widens_keeping_the_dropout(between: str) -> None:
    """The oracle in eval mode: the MLP with the new neurons beside the old in `wi_0`, `wi_1` and `wo`, by hand;
    identity at birth in every stage."""
    net, host = _t5_host(between)
    model = MorphogeneticModel(host, ["2"], config=EASY_CONFIG)
    dense = net[2].DenseReluDense
    site = model.slot("2").width_site
    assert site is not None and site.inside, model.slot("2").width_problem
    assert (site.producer, site.multiplier, site.consumer) == (dense.wi_0, dense.wi_1, dense.wo)
    place_seed(model, "2", "wider_half", Stage.HOLDING, 1)
    seed = model.slot("2").seed
    assert seed is not None and seed.multiplier is not None
    assert [type(module) for module in seed.after_producer] == [_GeluWrittenOut]
    if between == "functional":
        assert [module.call.function for module in seed.before_consumer] == [nn.functional.dropout]
    else:
        assert [type(module) for module in seed.before_consumer] == [type(dense.between)]
    x = _ids()
    with torch.no_grad():
        h = net[1](net[0](x))
        normed = net[2].layer_norm(h)
        gate = torch.cat([dense.wi_0.weight, seed.producer.weight])
        up = torch.cat([dense.wi_1.weight, seed.multiplier.weight])
        down = torch.cat([dense.wo.weight, seed.consumer.weight], dim=1)
        hidden = dense.act(normed @ gate.T) * (normed @ up.T)
        by_hand = net[3](h + hidden @ down.T)
        assert not torch.allclose(by_hand, net(x), atol=1e-4)  # perturbed: the new neurons count
        torch.testing.assert_close(model.eval()(x), by_hand, rtol=1e-5, atol=1e-5)
    assert_identity_at_birth_until_perturbed(host, x, "wider")


@pytest.mark.parametrize("between", ["dropout", "functional"])
def test_a_t5_gated_mlps_new_neurons_drop_out_in_training_and_learn(between: str) -> None:
    """In training mode the new neurons' products go through the block's dropout (some are zero, none in eval
    mode), and every parameter of the seed gets a gradient."""
    _, host = _t5_host(between)
    model = MorphogeneticModel(host, ["2"], config=EASY_CONFIG)
    place_seed(model, "2", "wider", Stage.HOLDING, 1)
    seed = model.slot("2").seed
    assert seed is not None
    entering: list[Tensor] = []
    seed.consumer.register_forward_hook(lambda _module, inputs, _output: entering.append(inputs[0].detach()))
    torch.manual_seed(3)
    with torch.no_grad():
        model.eval()(_ids())
    model.train()
    loss = nn.functional.cross_entropy(model(_ids()).flatten(0, 1), _ids(seed=2).flatten())
    loss.backward()
    evaluated, trained = entering
    assert (evaluated == 0).sum() == 0 and (trained == 0).float().mean() > 0.3  # dropout at 0.5 on the new ones
    assert all(parameter.grad is not None and parameter.grad.abs().sum() > 0
               for parameter in model.seed_parameters("2"))


def test_a_widened_t5_gated_mlp_round_trips_its_state_dict_and_exports() -> None:
    _, host = _t5_host("dropout")
    bare = copy.deepcopy(host)
    model = MorphogeneticModel(host, config=EASY_CONFIG)
    place_seed(model, "1", "wider", Stage.FOSSILIZED, 1)
    place_seed(model, "2", "wider_inside", Stage.HOLDING, 2)
    state = model.state_dict()
    assert any(name.endswith("seed.multiplier.weight") for name in state)
    restored = MorphogeneticModel(copy.deepcopy(bare), config=EASY_CONFIG)
    restored.load_state_dict(state)
    x = _ids()
    with torch.no_grad():
        torch.testing.assert_close(restored.eval()(x), model.eval()(x), rtol=0, atol=0)
    assert_plain_network_matches(model, x)


def test_a_gated_mlp_with_a_norm_over_the_features_before_its_output_layer_has_no_site() -> None:
    """A LayerNorm between the product and `wo` mixes the features: new neurons would change the old ones' norm."""
    _, host = _t5_host("layer norm")
    model = MorphogeneticModel(host, ["2"], config=EASY_CONFIG)
    assert model.slot("2").width_site is None
    assert "no pair of convolution or linear layers" in model.slot("2").width_problem
