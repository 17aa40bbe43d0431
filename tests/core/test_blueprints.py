"""Blueprints: identity at birth on every host in every slot, learning from step one, registry errors, counts."""

from __future__ import annotations

import pytest
import torch
from slot_driver import EASY_CONFIG, drive_to
from torch import nn

from morphogen.core.blend import BlendKind
from morphogen.core.blueprints import (
    BlueprintKind,
    UnknownBlueprintError,
    blueprint_names,
    build_seed,
    get_blueprint,
    parameter_count,
    registry_table,
)
from morphogen.core.branch import NoBranchSiteError
from morphogen.core.hosts import CNNHost, Conv1dHost, SegmentedHost, TransformerHost
from morphogen.core.lifecycle import Stage
from morphogen.core.model import MorphogeneticModel
from morphogen.core.width import NoWidthSiteError

CNN_NAMES = ("norm", "attention", "depthwise", "bottleneck", "conv_small", "conv_light", "conv_heavy",
             "widen_x2", "widen_x4", "widen_x8", "conv_wide", "wider", "wider_half", "branch_wide",
             "wider_inside", "block_copy")
TRANSFORMER_NAMES = ("norm", "lora", "lora_large", "attention", "mlp_small", "mlp", "block", "block_copy", "wider",
                     "wider_half", "wider_inside")  # the widening ones last: the earlier ids are kept
NAMES = {"cnn": CNN_NAMES, "cnn1d": CNN_NAMES, "transformer": TRANSFORMER_NAMES}
ALL_BLUEPRINTS = [(topology, name) for topology, names in NAMES.items() for name in names]
#: Every blueprint but a copy of the host's layer (`block_copy`), which is not the identity at birth.
IDENTITY_AT_BIRTH = [(topology, name) for topology, name in ALL_BLUEPRINTS
                     if get_blueprint(topology, name).identity_at_birth]
#: Seeds that are shape-preserving modules at the slot (the widening and branch ones are tested in test_width.py
#: and test_branch.py).
DEEPENING = [(topology, name) for topology, name in ALL_BLUEPRINTS
             if get_blueprint(topology, name).kind is BlueprintKind.DEEPEN]


def _host(topology: str) -> tuple[SegmentedHost, torch.Tensor]:
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    if topology == "cnn":
        return CNNHost(10, 1, pool_slots=True).eval(), torch.randn(4, 1, 8, 8, generator=generator)
    if topology == "cnn1d":
        return Conv1dHost(10, 1, base_channels=8, pool_slots=True).eval(), torch.randn(4, 1, 40, generator=generator)
    host = TransformerHost(vocab_size=13, d_model=32, n_heads=4, n_layers=2, block_size=8, n_segments=2).eval()
    return host, torch.randint(0, 13, (3, 8), generator=generator)


def test_registry_names_and_order() -> None:
    for topology, names in NAMES.items():
        assert blueprint_names(topology) == names


def _deepening(topology: str) -> list[str]:
    """The blueprints whose seed is a shape-preserving module at the slot (widening ones need a model's layers)."""
    return [name for name in blueprint_names(topology) if get_blueprint(topology, name).kind is BlueprintKind.DEEPEN]


@pytest.mark.parametrize(("topology", "name"), IDENTITY_AT_BIRTH)
def test_every_blueprint_is_identity_at_birth_in_every_slot(topology: str, name: str) -> None:
    host, x = _host(topology)
    with torch.no_grad():
        bare = host(x)
    kind_of_seed = get_blueprint(topology, name).kind
    if kind_of_seed is BlueprintKind.BRANCH:  # a built-in host measures no segment input: test_branch.py grows them
        with pytest.raises(NoBranchSiteError, match="cannot grow a branch"):
            MorphogeneticModel(host, config=EASY_CONFIG).germinate(host.slot_ids[0], name)
        return
    widening = kind_of_seed is BlueprintKind.WIDEN
    for slot_id in host.slot_ids:
        for kind in [BlendKind.ADD] if widening else list(BlendKind):  # new channels' output is added
            model = MorphogeneticModel(host, [slot_id], config=EASY_CONFIG)
            slot = model.slot(slot_id)
            if widening and slot.width_site is None:  # after a pooling slot: no layer before it in its segment
                with pytest.raises(NoWidthSiteError, match=f"slot {slot_id} cannot widen"):
                    slot.germinate(name)
                continue
            slot.germinate(name, blend=kind)
            for stage in (Stage.TRAINING, Stage.BLENDING, Stage.HOLDING):
                drive_to(slot, stage)
                if stage is Stage.BLENDING:
                    assert slot.alpha.alpha == 1.0
                output = model(x)  # with autograd on, so TRAINING runs the seed too
                torch.testing.assert_close(output, bare, rtol=0, atol=1e-6,
                                           msg=f"{name} in {slot_id} ({kind.value}, {stage.name})")


@pytest.mark.parametrize("topology", list(NAMES))
def test_seeds_are_shape_preserving_at_any_resolution(topology: str) -> None:
    shapes = {"cnn": [(2, 8, 5, 7), (2, 8, 1, 1)], "cnn1d": [(2, 8, 40), (2, 8, 3), (2, 8, 1)],
              "transformer": [(2, 5, 8), (1, 1, 8)]}[topology]
    for name in _deepening(topology):
        seed = build_seed(topology, name, 8, n_heads=2) if name == "attention" and topology == "transformer" \
            else build_seed(topology, name, 8)
        for shape in shapes:
            assert seed(torch.randn(shape)).shape == shape


@pytest.mark.parametrize("topology", list(NAMES))
def test_seeds_never_use_batch_norm(topology: str) -> None:
    for name in _deepening(topology):
        seed = build_seed(topology, name, 32)
        assert not any(isinstance(module, nn.modules.batchnorm._BatchNorm) for module in seed.modules()), name


@pytest.mark.parametrize("topology", list(NAMES))
def test_unknown_names_list_the_valid_ones(topology: str) -> None:
    with pytest.raises(UnknownBlueprintError) as error:
        get_blueprint(topology, "conv_gigantic")
    message = str(error.value)
    assert "conv_gigantic" in message
    assert all(name in message for name in blueprint_names(topology))
    with pytest.raises(UnknownBlueprintError, match="conv_gigantic"):
        build_seed(topology, "conv_gigantic", 8)


def test_blueprint_of_the_other_topology_is_unknown() -> None:
    with pytest.raises(UnknownBlueprintError, match="lora"):
        build_seed("cnn", "lora", 8)


def test_unknown_topology_lists_the_valid_ones() -> None:
    with pytest.raises(UnknownBlueprintError, match="cnn, cnn1d, transformer, mlp"):
        blueprint_names("graph")
    with pytest.raises(UnknownBlueprintError, match="cnn, cnn1d, transformer, mlp"):
        registry_table("rnn", 8)


def test_unexpected_options_list_the_accepted_ones() -> None:
    with pytest.raises(UnknownBlueprintError, match=r"'lora'.*heads.*accepted: rank"):
        build_seed("transformer", "lora", 32, heads=2)
    with pytest.raises(UnknownBlueprintError, match="accepted: none"):
        build_seed("cnn", "conv_light", 8, rank=4)
    assert get_blueprint("transformer", "attention").options == ("n_heads",)
    assert get_blueprint("transformer", "lora_large").options == ()
    assert get_blueprint("cnn1d", "widen_x4").options == ()  # the dimensionality is fixed, not an option


def test_bad_option_values_raise_value_error() -> None:
    with pytest.raises(ValueError, match="rank"):
        build_seed("transformer", "lora", 32, rank=0)
    with pytest.raises(ValueError, match="n_heads"):
        build_seed("transformer", "attention", 30, n_heads=4)


def test_options_reach_the_module() -> None:
    seed = build_seed("transformer", "lora", 32, rank=4)
    assert sum(p.numel() for p in seed.parameters()) == 2 * 32 * 4


@pytest.mark.parametrize(("topology", "width"), [("cnn", 8), ("cnn", 48), ("cnn1d", 8), ("cnn1d", 24),
                                                 ("transformer", 16), ("transformer", 64)])
def test_parameter_count_matches_the_built_module(topology: str, width: int) -> None:
    for name in _deepening(topology):
        seed = build_seed(topology, name, width)
        assert parameter_count(topology, name, width) == sum(p.numel() for p in seed.parameters()), name


def test_parameter_count_oracles() -> None:
    assert parameter_count("cnn", "conv_small", 8) == 8 * 8 + 8  # 1x1 conv with bias
    assert parameter_count("cnn", "conv_light", 8) == 2 * 8 + 8 * 8 * 9 + 8  # group norm + 3x3 conv
    assert parameter_count("cnn", "norm", 8) == 2 * 8 + 8  # group norm + per-channel scale
    assert parameter_count("transformer", "lora", 32) == 32 * 8 + 8 * 32  # rank 8, no bias
    assert parameter_count("transformer", "lora_large", 32) == 32 * 32 + 32 * 32  # rank 32
    assert parameter_count("transformer", "lora", 32, rank=2) == 32 * 2 * 2
    # layer norm + Linear(16, 32) + Linear(32, 16)
    assert parameter_count("transformer", "mlp_small", 16) == 2 * 16 + (16 * 32 + 32) + (32 * 16 + 16)
    # bottleneck width is max(8, C / 4): Conv(16->8, 1x1) + Conv(8->8, 3x3) + Conv(8->16, 1x1)
    assert parameter_count("cnn", "bottleneck", 16) == (16 * 8 + 8) + (8 * 8 * 9 + 8) + (8 * 16 + 16)


def test_one_dimensional_parameter_count_oracles() -> None:
    # 1D spatial convolutions have 5 taps where 2D ones have 3x3.
    assert parameter_count("cnn1d", "conv_small", 8) == 8 * 8 + 8  # 1x1 conv with bias
    assert parameter_count("cnn1d", "conv_light", 8) == 2 * 8 + 8 * 8 * 5 + 8  # group norm + kernel-5 conv
    assert parameter_count("cnn1d", "conv_heavy", 8) == 2 * (2 * 8 + 8 * 8 * 5 + 8)
    assert parameter_count("cnn1d", "norm", 8) == 2 * 8 + 8  # group norm + per-channel scale
    assert parameter_count("cnn1d", "depthwise", 8) == (8 * 5 + 8) + (8 * 8 + 8)  # depthwise + pointwise
    # squeeze-excite hidden width max(4, C/4) = 4: Conv(8->4, 1x1) + Conv(4->8, 1x1)
    assert parameter_count("cnn1d", "attention", 8) == (8 * 4 + 4) + (4 * 8 + 8)
    assert parameter_count("cnn1d", "bottleneck", 16) == (16 * 8 + 8) + (8 * 8 * 5 + 8) + (8 * 16 + 16)


@pytest.mark.parametrize(("topology", "taps"), [("cnn", 9), ("cnn1d", 5)])
@pytest.mark.parametrize("expansion", [2, 4, 8])
def test_widening_parameter_count_oracle(topology: str, taps: int, expansion: int) -> None:
    c = 8
    hidden = expansion * c
    up = c * hidden + hidden  # 1x1 conv C -> e*C
    mid = hidden * taps + hidden  # depthwise conv
    down = hidden * c + c  # 1x1 conv e*C -> C
    norms = 2 * (2 * hidden)  # group norm after up and after mid
    assert parameter_count(topology, f"widen_x{expansion}", c) == up + mid + down + norms


@pytest.mark.parametrize("topology", ["cnn", "cnn1d"])
def test_widening_seeds_add_hidden_width(topology: str) -> None:
    seed = build_seed(topology, "widen_x4", 8)
    widths = [m.out_channels for m in seed.modules() if isinstance(m, (nn.Conv1d, nn.Conv2d))]
    assert widths == [32, 32, 8]  # up to 4*C, depthwise at 4*C, down to C
    counts = {name: parameter_count(topology, name, 8) for name in ("widen_x2", "widen_x4", "widen_x8")}
    assert counts["widen_x2"] < counts["widen_x4"] < counts["widen_x8"]


def _slot_activation(topology: str, generator: torch.Generator) -> torch.Tensor:
    """An activation like the host's at a slot: after conv -> norm -> ReLU (non-negative) for the CNNs,
    a signed residual stream for the transformer."""
    if topology == "transformer":
        return torch.randn((4, 6, 8), generator=generator)
    shape = (4, 8, 6, 6) if topology == "cnn" else (4, 8, 20)
    return torch.randn(shape, generator=generator).relu()


@pytest.mark.parametrize(("topology", "name"), DEEPENING)
def test_every_seed_learns_from_step_one(topology: str, name: str) -> None:
    """Identity at birth must not mean stuck: the first batch moves some parameter off its init, and
    after one optimizer step the gradient reaches every parameter of the seed."""
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(3)
    seed = build_seed(topology, name, 8, n_heads=2) if (topology, name) == ("transformer", "attention") \
        else build_seed(topology, name, 8)
    x = _slot_activation(topology, generator)
    target = torch.randn(x.shape, generator=generator)
    optimizer = torch.optim.SGD(seed.parameters(), lr=0.1)

    def gradients() -> dict[str, torch.Tensor]:
        optimizer.zero_grad()
        nn.functional.mse_loss(seed(x), target).backward()
        return {n: p.grad.clone() for n, p in seed.named_parameters() if p.grad is not None}

    first = gradients()
    assert any(g.abs().sum() > 0 for g in first.values()), f"{name}: no parameter gets a gradient at birth"
    optimizer.step()
    second = gradients()
    silent = [n for n, p in seed.named_parameters() if n not in second or second[n].abs().sum() == 0]
    assert not silent, f"{topology} {name}: no gradient after one step for {silent}"


@pytest.mark.parametrize("topology", ["cnn", "cnn1d"])
@pytest.mark.parametrize("expansion", [2, 4, 8])
def test_widening_seed_zero_initializes_only_its_last_layer(topology: str, expansion: int) -> None:
    seed = build_seed(topology, f"widen_x{expansion}", 8)
    convs = [m for m in seed.modules() if isinstance(m, (nn.Conv1d, nn.Conv2d))]
    assert all(p.abs().sum() == 0 for p in convs[-1].parameters())
    assert all(conv.weight.abs().sum() > 0 for conv in convs[:-1])


@pytest.mark.parametrize(("topology", "width"), [("cnn", 32), ("cnn1d", 16), ("transformer", 64)])
def test_registry_table_rows(topology: str, width: int) -> None:
    rows = registry_table(topology, width)
    assert [row[0] for row in rows] == list(blueprint_names(topology))
    for name, count, description in rows:
        if get_blueprint(topology, name).kind is not BlueprintKind.DEEPEN:
            assert count is None  # it depends on the host's layers around the slot
            continue
        assert count == parameter_count(topology, name, width)
        assert count is not None and count > 0
        assert description and description == get_blueprint(topology, name).description
    counts = dict((name, count) for name, count, _ in rows)
    if topology in ("cnn", "cnn1d"):
        assert counts["conv_small"] < counts["conv_light"] < counts["conv_heavy"]
    else:
        assert counts["lora"] < counts["lora_large"] and counts["mlp_small"] < counts["mlp"]
