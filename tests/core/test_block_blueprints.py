"""Whole-block seeds of transformer hosts: `block` (identity at birth) and `block_copy` (a copy of the layer
before the slot), through a model: germination, state_dict, export and grafting. Isolation while TRAINING and
compilation without graph breaks are tested with every blueprint in test_slot_isolation.py and
test_compilation.py."""

from __future__ import annotations

import io
import types
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from slot_driver import EASY_CONFIG, drive_to, perturb_seed

import morphogen
from morphogen.core.blueprints import build_seed, get_blueprint
from morphogen.core.hosts import TransformerHost
from morphogen.core.lifecycle import GateConfig, GateMode, IllegalTransitionError, Stage
from morphogen.core.model import MorphogeneticModel
from morphogen.core.slot import SeedSlot, SlotConfig
from morphogen.core.transformer_layers import CausalSelfAttention, TransformerBlock
from morphogen.model_file import load_model_state, read_model_file, save_model_file

VOCABULARY, WIDTH, CONTEXT = 13, 32, 8


def host(layers: int = 2) -> TransformerHost:
    torch.manual_seed(0)
    return TransformerHost(VOCABULARY, WIDTH, n_heads=4, n_layers=layers, block_size=CONTEXT, n_segments=layers)


def tokens() -> torch.Tensor:
    return torch.randint(0, VOCABULARY, (3, CONTEXT), generator=torch.Generator().manual_seed(1))


def test_a_block_is_a_whole_pre_norm_layer_with_zero_output_projections() -> None:
    seed = build_seed("transformer", "block", WIDTH)
    assert isinstance(seed, TransformerBlock)
    assert get_blueprint("transformer", "block").identity_at_birth
    assert not get_blueprint("transformer", "block_copy").identity_at_birth
    for projection in seed.output_projections:
        assert not projection.weight.any() and not projection.bias.any()
    # The other layers are GPT-initialised, so the block learns as soon as its projections move off zero.
    assert 0.01 < float(seed.attention.qkv.weight.detach().std()) < 0.03
    h = torch.randn(2, CONTEXT, WIDTH)
    assert torch.equal(seed(h), h)
    assert sum(p.numel() for p in seed.parameters()) == sum(
        p.numel() for p in TransformerBlock(WIDTH, 4).parameters())


def test_a_zero_block_gets_a_gradient_into_its_projections_from_the_first_batch() -> None:
    seed = build_seed("transformer", "block", WIDTH)
    h = torch.randn(2, CONTEXT, WIDTH)
    (seed(h) ** 2).sum().backward()
    for projection in seed.output_projections:
        assert projection.weight.grad is not None and projection.weight.grad.abs().sum() > 0


def test_block_copy_germinates_as_the_trained_layer_before_its_slot() -> None:
    model = MorphogeneticModel(host(), config=EASY_CONFIG)
    with torch.no_grad():
        for parameter in model.host.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)  # a "trained" host: no zero projections
    for index, slot_id in enumerate(model.slot_ids):
        seed = model.germinate(slot_id, "block_copy").seed
        neighbour = model.host.segments[index][-1]
        assert isinstance(seed, TransformerBlock) and isinstance(neighbour, TransformerBlock)
        for (name, copied), original in zip(seed.state_dict().items(), neighbour.state_dict().values(), strict=True):
            assert torch.equal(copied, original), name
            assert copied.data_ptr() != original.data_ptr(), name  # a copy, not the same tensor
        h = torch.randn(2, CONTEXT, WIDTH)
        assert torch.equal(seed(h), neighbour(h))  # not the identity: the lifecycle blends it in from alpha 0


def test_block_copy_takes_the_layer_as_it_is() -> None:
    model = MorphogeneticModel(host(), config=EASY_CONFIG)
    with pytest.raises(ValueError, match=r"copies the layer before its slot \(TransformerBlock \{'n_heads': 4\}\) "
                                         r"as it is; options \{'n_heads': 2\} would change it"):
        model.germinate("r0c0", "block_copy", n_heads=2)
    assert model.slot("r0c0").stage is Stage.DORMANT
    # A model file of an earlier morphogen saved the copy's head count among its options: the same count loads.
    assert isinstance(model.germinate("r0c0", "block_copy", n_heads=4).seed, TransformerBlock)


@pytest.mark.parametrize("blueprint", ["block", "block_copy"])
def test_block_seeds_round_trip_through_state_dict_in_every_stage(blueprint: str) -> None:
    model = MorphogeneticModel(host(), config=EASY_CONFIG)
    for slot_id, stage in zip(model.slot_ids, (Stage.TRAINING, Stage.FOSSILIZED), strict=True):
        slot = model.germinate(slot_id, blueprint)
        drive_to(slot, stage)
        assert slot.seed is not None
        with torch.no_grad():
            for parameter in slot.seed.parameters():
                parameter.add_(torch.randn_like(parameter) * 0.05)
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    restored = MorphogeneticModel(host(), config=EASY_CONFIG)
    restored.load_state_dict(torch.load(buffer, weights_only=False))
    for slot_id in model.slot_ids:
        assert restored.slot(slot_id).stage is model.slot(slot_id).stage
        assert restored.slot(slot_id).blueprint == blueprint
    x = tokens()
    model.eval(), restored.eval()
    with torch.no_grad():
        assert torch.equal(restored(x), model(x))
        alphas = [[1.0, 1.0], [0.0, 1.0]]  # the TRAINING block's shadow, and the fossil ablated
        assert torch.equal(restored.counterfactual_forward(x, alphas), model.counterfactual_forward(x, alphas))


def test_a_new_block_takes_the_head_count_of_the_layer_before_it() -> None:
    two_heads = TransformerHost(VOCABULARY, 16, n_heads=2, n_layers=2, block_size=CONTEXT, n_segments=2)
    model = MorphogeneticModel(two_heads, config=EASY_CONFIG)
    for slot_id, blueprint, options in zip(model.slot_ids, ("block", "block_copy"), ({"n_heads": 2}, {}), strict=True):
        slot = model.germinate(slot_id, blueprint)
        assert isinstance(slot.seed, TransformerBlock) and slot.seed.attention.n_heads == 2
        assert slot.blueprint_options == options  # saved, so that a reload rebuilds it alike (a copy: from the layer)
    attention = MorphogeneticModel(two_heads, config=EASY_CONFIG).germinate("r0c0", "attention")
    assert _seed_heads(attention) == [2] and attention.blueprint_options == {"n_heads": 2}


def _seed_heads(slot: SeedSlot) -> list[int]:
    """The head counts of the seed's attentions."""
    assert slot.seed is not None
    return [module.n_heads for module in slot.seed.modules() if isinstance(module, CausalSelfAttention)]


class _TorchAttentionBlock(torch.nn.Module):
    """A user's pre-norm block on torch's `nn.MultiheadAttention` (`num_heads`)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.attention = torch.nn.MultiheadAttention(width, heads, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return x + self.attention(h, h, h, need_weights=False)[0]


class _NamedHeadsBlock(torch.nn.Module):
    """A user's block whose attention names its head count as nanoGPT (`n_head`) or, in a config, as Hugging Face
    models do (`config.num_attention_heads`); its attention is a stand-in, what is read is the count."""

    def __init__(self, width: int, heads: int, *, in_config: bool) -> None:
        super().__init__()
        self.attn = torch.nn.Linear(width, width)
        if in_config:
            self.attn.config = types.SimpleNamespace(num_attention_heads=heads)
        else:
            self.attn.n_head = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attn(x)


class _UsersTransformer(torch.nn.Module):
    """Token ids [N, T] -> logits: an embedding, two of the user's blocks and a head."""

    def __init__(self, block: Callable[[], torch.nn.Module], width: int = 24) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCABULARY, width)
        self.blocks = torch.nn.Sequential(block(), block())
        self.head = torch.nn.Linear(width, VOCABULARY)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(ids)))


@pytest.mark.parametrize("block", [
    lambda: _TorchAttentionBlock(24, 6),
    lambda: _NamedHeadsBlock(24, 6, in_config=False),
    lambda: _NamedHeadsBlock(24, 6, in_config=True),
], ids=["nn.MultiheadAttention", "n_head", "config.num_attention_heads"])
def test_a_block_or_attention_in_a_users_transformer_takes_its_head_count(
        block: Callable[[], torch.nn.Module]) -> None:
    """Six heads, not the four of a host that names none; still the identity at birth, and rebuilt alike from the
    model's state_dict."""
    torch.manual_seed(0)
    ids = tokens()
    model = MorphogeneticModel(morphogen.host_from_module(_UsersTransformer(block), slots=["blocks.0", "blocks.1"],
                                                          example_input=ids[:2]), config=EASY_CONFIG)
    x = torch.randn(2, CONTEXT, 24)
    for slot_id, blueprint in zip(model.slot_ids, ("attention", "block"), strict=True):
        slot = model.germinate(slot_id, blueprint)
        assert _seed_heads(slot) == [6] and slot.blueprint_options == {"n_heads": 6}
        assert slot.seed is not None
        torch.testing.assert_close(slot.seed(x), x)
        drive_to(slot, Stage.FOSSILIZED)
        perturb_seed(slot, torch.Generator().manual_seed(2))
    model.eval()
    restored = MorphogeneticModel(morphogen.host_from_module(_UsersTransformer(block), slots=["blocks.0", "blocks.1"],
                                                             example_input=ids[:2]), config=EASY_CONFIG)
    restored.load_state_dict(model.state_dict())
    assert [_seed_heads(restored.slot(slot_id)) for slot_id in restored.slot_ids] == [[6], [6]]
    with torch.no_grad():
        assert torch.equal(restored.eval()(ids), model(ids))


@pytest.mark.parametrize("blueprint", ["attention", "block"])
def test_a_block_or_attention_after_a_layer_without_attention_takes_the_head_count_of_the_models_attention(
        blueprint: str) -> None:
    """After the embedding there is no layer before the slot to read heads from: the seed takes the six of the
    model's attention layers, not four, and records them, so that a reload rebuilds it alike."""
    ids = tokens()
    model = MorphogeneticModel(morphogen.host_from_module(_UsersTransformer(lambda: _TorchAttentionBlock(24, 6)),
                                                          slots=["embed"], example_input=ids[:2]), config=EASY_CONFIG)
    assert model.slot("embed").layer_before is None
    slot = model.germinate("embed", blueprint)
    assert _seed_heads(slot) == [6] and slot.blueprint_options == {"n_heads": 6}
    assert slot.seed is not None
    x = torch.randn(2, CONTEXT, 24)
    torch.testing.assert_close(slot.seed(x), x)  # still the identity at birth


@pytest.mark.parametrize("block", [
    lambda: _NamedHeadsBlock(24, 5, in_config=False),  # 5 heads cannot split 24
    lambda: torch.nn.Sequential(_NamedHeadsBlock(24, 6, in_config=False), _NamedHeadsBlock(24, 3, in_config=True)),
], ids=["not-a-divisor", "two-counts"])
def test_a_head_count_that_cannot_split_the_width_or_is_not_one_leaves_the_default(
        block: Callable[[], torch.nn.Module]) -> None:
    ids = tokens()
    model = MorphogeneticModel(morphogen.host_from_module(_UsersTransformer(block), slots=["blocks.0"],
                                                          example_input=ids[:2]), config=EASY_CONFIG)
    slot = model.germinate("blocks_0", "attention")
    assert _seed_heads(slot) == [4] and slot.blueprint_options == {}


class _Width18(torch.nn.Module):
    """A user's transformer 18 wide (3 heads): 4 heads cannot split its width."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCABULARY, 18)
        self.project = torch.nn.Linear(18, 18)  # no block: nothing to copy, nor heads to take
        self.head = torch.nn.Linear(18, VOCABULARY)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.project(self.embed(ids)))


@pytest.mark.parametrize(("width", "heads"), [(32, 4), (18, 3), (10, 2), (7, 1)])
def test_a_new_block_or_attention_without_heads_to_take_gets_four_or_the_most_below_that_divide_its_width(
        width: int, heads: int) -> None:
    block, attention = build_seed("transformer", "block", width), build_seed("transformer", "attention", width)
    assert isinstance(block, TransformerBlock) and block.attention.n_heads == heads
    x = torch.randn(2, 5, width)
    torch.testing.assert_close(block(x), x)  # still the identity at birth
    torch.testing.assert_close(attention(x), x)


def test_a_users_transformer_whose_width_four_heads_cannot_split_grows_zero_blocks() -> None:
    ids = tokens()
    model = MorphogeneticModel(morphogen.host_from_module(_Width18(), slots=["project"], example_input=ids[:2]))
    before = model(ids)
    model.graft("project", "block")
    torch.testing.assert_close(model(ids), before, rtol=0, atol=0)


def test_block_copy_is_refused_without_the_layer_to_copy() -> None:
    slot = SeedSlot("r0c0", WIDTH, "transformer", EASY_CONFIG)  # in no model: no host layer before it
    with pytest.raises(ValueError, match=r"'block_copy' copies the host's layer just before slot r0c0, and the host "
                                         "has none there"):
        slot.germinate("block_copy")
    assert slot.stage is Stage.DORMANT and slot.seed is None


# ---------------------------------------------------------------- grafting: trained with the host from the start

GRAFT_CONFIG = SlotConfig(blend_epochs=3, gates=GateConfig(mode=GateMode.STRICT))


def test_a_grafted_zero_block_is_in_the_output_at_once_and_changes_nothing_yet() -> None:
    model = MorphogeneticModel(host(), config=GRAFT_CONFIG)
    x = tokens()
    with torch.no_grad():
        before = model(x)
    for slot_id in model.slot_ids:
        slot = model.graft(slot_id, "block", epoch=4)
        # No TRAINING behind the host: blended in at alpha 1 straight away, and HOLDING (auto) since its ramp is done.
        assert slot.stage is Stage.HOLDING and slot.alpha.alpha == 1.0 and not slot.detach_input
        assert [record.to_stage for record in slot.drain_transitions()] == [
            Stage.GERMINATED, Stage.TRAINING, Stage.BLENDING, Stage.HOLDING]
    with torch.no_grad():
        assert torch.equal(model(x), before)
    # Its output projections learn from the model's own loss (no shadow pass).
    output, shadow = model.forward_with_shadow(x)
    assert shadow is None
    output.square().mean().backward()
    seed = model.slot("r0c1").seed
    assert isinstance(seed, TransformerBlock) and seed.mlp_output.weight.grad is not None
    assert seed.mlp_output.weight.grad.abs().sum() > 0


def test_a_grafted_copy_ramps_in_from_alpha_zero_over_its_blend_epochs() -> None:
    model = MorphogeneticModel(host(), config=GRAFT_CONFIG)
    slot = model.graft("r0c0", "block_copy", epoch=4)
    alphas = [slot.alpha.alpha]
    stages = [slot.stage]
    for epoch in (5, 6):
        slot.step_epoch(epoch)
        alphas.append(slot.alpha.alpha)
        stages.append(slot.stage)
    assert alphas == pytest.approx([1 / 3, 2 / 3, 1.0])  # its first epoch already trains at 1/3
    assert stages == [Stage.BLENDING, Stage.BLENDING, Stage.HOLDING]
    # The fossilize gate still has the last word: strict gates want a measured contribution.
    assert not slot.fossilize(7).passed
    slot.record_signals(gradient_health=1.0, contribution=3.0)
    assert slot.fossilize(7).passed and slot.stage is Stage.FOSSILIZED


def test_graft_needs_an_empty_slot() -> None:
    model = MorphogeneticModel(host(), config=GRAFT_CONFIG)
    model.graft("r0c0", "block")
    with pytest.raises(IllegalTransitionError, match="germinate needs DORMANT"):
        model.graft("r0c0", "block")


def test_a_model_grown_by_whole_blocks_exports_and_round_trips_through_its_model_file(tmp_path: Path) -> None:
    model = MorphogeneticModel(host(), config=GRAFT_CONFIG)
    model.graft("r0c0", "block")
    model.graft("r0c1", "block_copy", blend_epochs=1)  # a one-epoch ramp: at alpha 1, HOLDING, at once
    for slot in model.slots():
        assert slot.stage is Stage.HOLDING
        perturb_seed(slot, torch.Generator().manual_seed(5), scale=0.05)  # trained blocks: nothing zero
    x = tokens()
    with torch.no_grad():
        expected = model.eval()(x)
    program = torch.export.load(morphogen.export_model(model, x, tmp_path / "grown.pt2"))
    torch.testing.assert_close(program.module()(x), expected, rtol=0, atol=1e-5)
    save_model_file(model, tmp_path / "model.pt")
    restored = MorphogeneticModel(host(), config=GRAFT_CONFIG)
    load_model_state(restored, read_model_file(tmp_path / "model.pt"), tmp_path / "model.pt")
    with torch.no_grad():
        assert torch.equal(restored.eval()(x), expected)
