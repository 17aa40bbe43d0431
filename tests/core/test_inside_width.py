"""Width sites inside a residual block: a widening seed adds channels between the block's two convolutions.

Checked on a user's ResNet cut after every block (one block of each stage, two of them strided): the site is
the block's conv1 -> bn1 -> ReLU -> conv2 chain, the seed is the identity at birth, a blended seed is the block
with a wider inside (built by hand), the counterfactual and shadow passes match plain forwards (also beside
branch seeds and with several seeds TRAINING), compilation, export, and the refusals. Isolation while TRAINING,
grafting and state_dict are checked with the branch seeds' (test_branch.py), which read the block's input too.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from slot_driver import (
    EASY_CONFIG,
    RESNET_BLOCKS,
    assert_identity_at_birth_until_perturbed,
    assert_plain_network_matches,
    configuration_output,
    drive_to,
    perturb_seed,
    place_seed,
    resnet_host,
)
from torch import Tensor, nn

from morphogen import CNNHost, MorphogeneticModel, grown_network, host_from_module
from morphogen.core.lifecycle import Stage
from morphogen.core.width import BoundDropout, NoWidthSiteError, WidthSeed


def _place(model: MorphogeneticModel, slot_id: str, stage: Stage, seed: int, blueprint: str = "wider",
           alpha: float = 1.0) -> None:
    place_seed(model, slot_id, blueprint, stage, seed, alpha)


def test_a_residual_blocks_two_convolutions_are_the_site_inside_it() -> None:
    host, _ = resnet_host()
    model = MorphogeneticModel(host)
    for slot_id, block in zip(model.slot_ids, RESNET_BLOCKS, strict=True):
        site = model.slot(slot_id).width_site
        assert site is not None and site.inside, slot_id
        assert site.producer is host.get_submodule(f"segments.{site.tap_segment}").get_submodule(f"{block}.conv1")
        assert site.consumer is host.get_submodule(f"segments.{site.tap_segment}").get_submodule(f"{block}.conv2")
        assert [type(module) for module in site.after_producer] == [nn.BatchNorm2d, nn.ReLU]  # torch.relu, traced
    assert model.slot("layer3_0").width_site.channels == 16  # type: ignore[union-attr]


def test_an_inside_widening_seed_is_the_identity_at_birth_and_changes_the_output_once_trained() -> None:
    host, x = resnet_host()
    assert_identity_at_birth_until_perturbed(host, x, "wider")


def test_a_blended_inside_seed_is_the_block_with_more_channels_between_its_convolutions() -> None:
    """The oracle: the strided block of stage 2 computed by hand, its new channels beside conv1's and into conv2."""
    host, x = resnet_host()
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


def test_wider_inside_normalizes_its_new_channels_as_the_block_does_and_judges_each_sample_alone() -> None:
    """After the block's BatchNorm, `wider_inside`'s new channels get a BatchNorm of their own with its settings
    (`wider` keeps a one-group GroupNorm); it learns running statistics in training, and in eval mode a
    sample's counterfactual outputs do not depend on the batch it is validated in."""
    host, x = resnet_host()
    model = MorphogeneticModel(host, ["layer2_0"], config=EASY_CONFIG)
    _place(model, "layer2_0", Stage.BLENDING, 3, blueprint="wider_inside")
    seed = model.slot("layer2_0").seed
    assert isinstance(seed, WidthSeed)
    norm, block_norm = seed.after_producer[0], host.get_submodule("segments.1").get_submodule("layer2.0.bn1")
    assert type(norm) is nn.BatchNorm2d and isinstance(block_norm, nn.BatchNorm2d)
    assert norm.num_features == 3 * block_norm.num_features
    assert (norm.eps, norm.momentum, norm.affine) == (block_norm.eps, block_norm.momentum, block_norm.affine)
    model.train()
    model(x)
    assert norm.num_batches_tracked.item() == 1 and norm.running_mean.abs().sum() > 0
    model.eval()
    alphas = [[1.0], [0.0]]
    whole = model.counterfactual_forward(x, alphas)
    one_by_one = torch.cat([model.counterfactual_forward(x[i:i + 1], alphas) for i in range(x.shape[0])], dim=1)
    torch.testing.assert_close(whole, one_by_one, rtol=1e-5, atol=1e-6)
    wider = MorphogeneticModel(resnet_host()[0], ["layer2_0"], config=EASY_CONFIG)
    _place(wider, "layer2_0", Stage.BLENDING, 3, blueprint="wider")
    assert type(wider.slot("layer2_0").seed.after_producer[0]) is nn.GroupNorm  # type: ignore[union-attr]


def test_counterfactual_and_shadow_passes_agree_beside_branch_and_deepening_seeds() -> None:
    """A TRAINING branch before a TRAINING inside seed: the second one's rows join at its block's input."""
    host, x = resnet_host()
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


def test_the_plain_network_of_a_grown_model_holds_its_inside_seeds_and_exports() -> None:
    host, x = resnet_host()
    model = MorphogeneticModel(host, config=EASY_CONFIG)
    _place(model, "layer1_0", Stage.FOSSILIZED, 1)
    _place(model, "layer2_0", Stage.HOLDING, 2, blueprint="branch_wide")
    _place(model, "layer3_0", Stage.FOSSILIZED, 3, blueprint="wider_half")
    assert_plain_network_matches(model, x)


class _Block(nn.Module):
    """A residual block as the README writes it: conv1 -> bn1 -> ReLU -> conv2 -> bn2, plus its input."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels)
        self.conv2, self.bn2 = nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels)

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))) + x)


def test_the_first_block_of_a_sequential_resnet_widens_inside_behind_its_stem_convolution() -> None:
    """`nn.Sequential(stem conv, block, block, ...)` cut after each block: the part before the first slot is the stem
    and the block, which ends in the block and so widens inside it, as the second block does. It once had no site
    ("no convolution or linear layer on both sides of it"), and `wider_inside` depth growth fell back to seeds."""
    torch.manual_seed(0)
    network = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), _Block(8), _Block(8), nn.AdaptiveAvgPool2d(1),
                            nn.Flatten(), nn.Linear(8, 10))
    x = torch.randn(4, 3, 12, 12, generator=torch.Generator().manual_seed(1))
    host = host_from_module(network, ["1", "2"], example_input=x[:2]).eval()
    model = MorphogeneticModel(host, config=EASY_CONFIG)
    for slot_id, block in (("1", network[1]), ("2", network[2])):
        site = model.slot(slot_id).width_site
        assert site is not None and site.inside, slot_id
        assert site.producer is block.conv1 and site.consumer is block.conv2
        assert model.can_graft(slot_id, "wider_inside")
    assert_identity_at_birth_until_perturbed(host, x, "wider_inside")
    _place(model, "1", Stage.FOSSILIZED, 1, blueprint="wider_inside")
    _place(model, "2", Stage.HOLDING, 2, blueprint="wider_inside")
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
    host, x = resnet_host()
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


def test_a_block_written_as_torchvisions_has_its_site_inside_with_one_relu_module_called_twice() -> None:
    """torchvision's BasicBlock calls one in-place `nn.ReLU` twice and adds the skip in place: the chain between
    its convolutions is still conv1 -> bn1 -> relu -> conv2, and the grafted seed is the identity at birth."""

    class Block(nn.Module):
        def __init__(self, channels: int) -> None:
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels)
            self.relu = nn.ReLU(inplace=True)
            self.conv2, self.bn2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels)

        def forward(self, x: Tensor) -> Tensor:
            out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
            out += x
            return self.relu(out)

    torch.manual_seed(0)
    network = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), Block(8), Block(8), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                            nn.Linear(8, 4))
    x = torch.randn(4, 3, 8, 8)
    model = MorphogeneticModel(host_from_module(network, ["1", "2"], example_input=x[:2])).eval()
    site = model.slot("2").width_site
    assert site is not None and site.inside and site.producer is network[2].conv1 and site.consumer is network[2].conv2
    before = model(x)
    slot = model.graft("2", "wider_inside")
    assert torch.equal(model(x), before)
    perturb_seed(slot, torch.Generator().manual_seed(1))
    model.train()(x).sum().backward()
    assert all(p.grad is not None for p in slot.seed_parameters())


@pytest.mark.parametrize(("between", "new_channels_through"), [
    (nn.Dropout2d(0.2), nn.Dropout2d), (nn.ReLU6(), nn.ReLU6), (nn.Hardswish(), nn.Hardswish), (nn.Mish(), nn.Mish),
    (nn.functional.relu6, nn.ReLU6), (nn.functional.hardswish, nn.Hardswish),
    (nn.functional.selu, nn.SELU)], ids=["dropout2d", "relu6", "hardswish", "mish", "F.relu6", "F.hardswish",
                                                 "F.selu"])
def test_a_channel_dropout_or_another_activation_between_a_blocks_convolutions_is_part_of_its_site(
        between: nn.Module | Callable[[Tensor], Tensor], new_channels_through: type[nn.Module]) -> None:
    """A block's `nn.Dropout2d` (a whole channel dropped), or a MobileNet's ReLU6 or hard swish, module or function,
    acts on each channel by itself: the new channels go through a copy of it, as they do through an `nn.Dropout`."""

    class Block(nn.Module):
        def __init__(self, channels: int) -> None:
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels)
            # A function of torch's is called in the forward (`F.relu6(h)`), as a function attribute is traced.
            self.between = copy.deepcopy(between) if isinstance(between, nn.Module) else between
            self.conv2, self.bn2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels)

        def forward(self, x: Tensor) -> Tensor:
            return torch.relu(x + self.bn2(self.conv2(self.between(torch.relu(self.bn1(self.conv1(x)))))))

    torch.manual_seed(0)
    network = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), Block(8), Block(8), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                            nn.Linear(8, 4))
    x = torch.randn(4, 3, 8, 8)
    model = MorphogeneticModel(host_from_module(network, ["1", "2"], example_input=x[:2]), config=EASY_CONFIG).eval()
    site = model.slot("2").width_site
    assert site is not None and site.inside and site.producer is network[2].conv1 and site.consumer is network[2].conv2
    before = model(x)
    slot = model.graft("2", "wider_inside")
    assert torch.equal(model(x), before)
    seed = slot.seed
    assert isinstance(seed, WidthSeed) and any(type(m) is new_channels_through for m in seed.after_producer)
    perturb_seed(slot, torch.Generator().manual_seed(1))
    model.train()(x).sum().backward()
    assert all(p.grad is not None for p in slot.seed_parameters())
    drive_to(slot, Stage.FOSSILIZED)
    assert_plain_network_matches(model.eval(), x)


class _DropoutBlock(nn.Module):
    """A block whose dropout is a function given `self.training`: fx would fix the flag at its trace-time value."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x: Tensor) -> Tensor:
        return x + nn.functional.dropout(self.fc2(torch.relu(self.fc1(x))), 0.5, training=self.training)


class _DropoutNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.block, self.head = nn.Linear(6, 8), _DropoutBlock(8), nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.block(self.embed(x)))


@pytest.mark.parametrize("sequential", [False, True], ids=["traced_model", "sequential"])
@pytest.mark.parametrize("built_training", [True, False], ids=["built_training", "built_eval"])
def test_a_functional_dropout_in_a_widened_block_follows_the_models_mode(sequential: bool,
                                                                         built_training: bool) -> None:
    """The block runs as a traced copy once a seed widens it inside; its `F.dropout(training=self.training)`
    still drops in training mode only, whichever mode the model was built in: at birth the grown model gives
    the host's outputs under the same random draws, in both modes."""
    torch.manual_seed(0)
    net = _DropoutNet()
    # A sequence of modules is cut between its children and its segments are the user's own modules, not traced.
    network: nn.Module = nn.Sequential(nn.Sequential(net.embed), net.block, net.head) if sequential else net
    slot_name = "1" if sequential else "block"
    model = MorphogeneticModel(host_from_module(network.train(built_training), [slot_name],
                                                example_input=torch.randn(2, 6)), config=EASY_CONFIG)
    x = torch.randn(16, 6)

    def outputs() -> dict[bool, Tensor]:
        drawn = {}
        for training in (True, False):
            model.train(training)
            torch.manual_seed(1)
            drawn[training] = model(x)
        return drawn

    before = outputs()
    assert not torch.equal(before[True], before[False])  # the block's dropout drops in training mode
    slot = model.graft(slot_name, "wider_inside")
    after = outputs()
    torch.testing.assert_close(after[True], before[True])
    torch.testing.assert_close(after[False], before[False])
    perturb_seed(slot, torch.Generator().manual_seed(2))
    drive_to(slot, Stage.FOSSILIZED)
    exported = grown_network(model)  # in eval mode, its copy of the block too
    torch.testing.assert_close(exported(x), model.eval()(x))
    torch.manual_seed(1)
    dropped = exported.train()(x)
    torch.manual_seed(1)
    torch.testing.assert_close(dropped, model.train()(x))


class _NormedDropoutBlock(nn.Module):
    """A block with a batch norm and a functional dropout given `self.training` between its two layers."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1, self.bn = nn.Linear(width, 2 * width), nn.BatchNorm1d(2 * width)
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.fc2(nn.functional.dropout(torch.relu(self.bn(self.fc1(x))), 0.5, training=self.training))


class _NormedDropoutNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.block, self.head = nn.Linear(6, 8), _NormedDropoutBlock(8), nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.block(self.embed(x)))


def test_a_block_a_loop_leaves_in_eval_mode_stays_in_eval_mode_in_its_widened_copy() -> None:
    """A loop that trains the model but keeps a (frozen) block in eval mode, as `HostAndSeedTrainer.kept_in_eval`
    and the Grower do: the traced copy the block runs as once widened shares its batch norm, which keeps its
    statistics, and its functional dropout, which followed the slot's mode and so dropped, follows the block's;
    so do the new channels'. Once the block trains again, both drop."""
    torch.manual_seed(0)
    net = _NormedDropoutNet()
    model = MorphogeneticModel(host_from_module(net, ["block"], example_input=torch.randn(2, 6)), config=EASY_CONFIG)
    x = torch.randn(16, 6)

    def output_with_the_block_frozen() -> Tensor:
        model.train()
        net.block.eval()
        torch.manual_seed(1)
        return model(x)

    before = output_with_the_block_frozen()
    statistics = net.block.bn.running_mean.clone()
    slot = model.graft("block", "wider")
    assert slot.width_site is not None and slot.width_site.inside
    torch.testing.assert_close(output_with_the_block_frozen(), before)  # at birth, the host's: no dropout
    assert torch.equal(net.block.bn.running_mean, statistics)
    seed = slot.seed
    assert isinstance(seed, WidthSeed)
    dropout = seed.after_producer[-1]
    assert isinstance(dropout, BoundDropout) and dropout.call.followed is net.block  # the block, not a copy of it
    tap = torch.randn(16, 8)
    with torch.no_grad():
        assert torch.equal(seed.after_producer(seed.producer(tap)), seed.after_producer(seed.producer(tap)))
        net.block.train()
        assert not torch.equal(seed.after_producer(seed.producer(tap)), seed.after_producer(seed.producer(tap)))
        torch.manual_seed(1)
        assert not torch.equal(model(x), before)  # the block's own dropout drops again


class _WideResNetBlock(nn.Module):
    """Wide ResNet's block: a functional dropout given the model's mode between its two convolutions."""

    def __init__(self, channels: int, drop: float = 0.5) -> None:
        super().__init__()
        self.bn1, self.conv1 = nn.BatchNorm2d(channels), nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2, self.conv2 = nn.BatchNorm2d(channels), nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.drop = drop

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv1(torch.relu(self.bn1(x)))
        h = nn.functional.dropout(torch.relu(self.bn2(h)), p=self.drop, training=self.training)
        return x + self.conv2(h)


def test_a_functional_dropout_between_a_blocks_convolutions_is_part_of_its_site_and_drops_the_new_channels() -> None:
    torch.manual_seed(0)
    network = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), _WideResNetBlock(8), _WideResNetBlock(8),
                            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
    x = torch.randn(4, 3, 8, 8)
    model = MorphogeneticModel(host_from_module(network, ["1", "2"], example_input=x[:2]), config=EASY_CONFIG)
    site = model.slot("2").width_site
    assert site is not None and site.inside and site.producer is network[2].conv1 and site.consumer is network[2].conv2
    model.eval()
    before = model(x)
    slot = model.graft("2", "wider_inside")
    assert torch.equal(model(x), before)
    seed = slot.seed
    assert isinstance(seed, WidthSeed)
    perturb_seed(slot, torch.Generator().manual_seed(1))
    tap = torch.randn(4, 8, 8, 8)
    with torch.no_grad():  # the seed's own dropout follows the model's mode
        model.eval()
        assert torch.equal(seed.after_producer(seed.producer(tap)), seed.after_producer(seed.producer(tap)))
        model.train()
        dropped = seed.after_producer(seed.producer(tap))
        kept = torch.relu(seed.after_producer[0](seed.producer(tap)))
        assert torch.equal(dropped[dropped != 0], 2.0 * kept[dropped != 0]) and (dropped == 0).sum() > (kept == 0).sum()
    model.train()(x).sum().backward()
    assert all(p.grad is not None for p in slot.seed_parameters())
    drive_to(slot, Stage.FOSSILIZED)
    assert_plain_network_matches(model.eval(), x)  # the export's dropout is off, as the model's in eval mode


class _CausalBlock(nn.Module):
    """A temporal convolution network's residual block: each convolution padded on both sides, the right side's
    padding trimmed off (torch's `Chomp1d` pattern), or the input padded on the left only."""

    def __init__(self, channels: int, dilation: int, trim: bool) -> None:
        super().__init__()
        self.pad, self.trim = 2 * dilation, trim
        padding = self.pad if trim else 0
        self.conv1 = nn.Conv1d(channels, channels, 3, dilation=dilation, padding=padding)
        self.conv2 = nn.Conv1d(channels, channels, 3, dilation=dilation, padding=padding)

    def causal(self, conv: nn.Conv1d, x: Tensor) -> Tensor:
        if self.trim:
            return conv(x)[:, :, :-self.pad].contiguous()
        return conv(nn.functional.pad(x, (self.pad, 0)))

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(x + self.causal(self.conv2, torch.relu(self.causal(self.conv1, x))))


@pytest.mark.parametrize("trim", [True, False], ids=["trimmed", "padded_left"])
def test_a_causal_blocks_slice_or_left_padding_between_its_convolutions_is_part_of_its_site(trim: bool) -> None:
    torch.manual_seed(0)
    network = nn.Sequential(nn.Conv1d(1, 6, 1), _CausalBlock(6, 1, trim), _CausalBlock(6, 2, trim),
                            nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(6, 3))
    x = torch.randn(4, 1, 20)
    model = MorphogeneticModel(host_from_module(network, ["1", "2"], example_input=x[:2]), config=EASY_CONFIG)
    block = network[2]
    site = model.slot("2").width_site
    assert site is not None and site.inside and site.producer is block.conv1 and site.consumer is block.conv2
    model.eval()
    with torch.no_grad():
        before = model(x)
        slot = model.graft("2", "wider_inside")
        assert torch.equal(model(x), before)  # the identity at birth
        perturb_seed(slot, torch.Generator().manual_seed(1))
        seed = slot.seed
        assert isinstance(seed, WidthSeed)
        # The oracle: the block with the seed's channels beside conv1's, through the same trim or padding, into conv2.
        entering = network[1](network[0](x))
        tap = entering if trim else nn.functional.pad(entering, (block.pad, 0))  # what conv1 reads
        new = seed.after_producer(seed.producer(tap))  # trimmed, or padded for conv2, as the block's channels
        assert new.shape[-1] == 20 + (0 if trim else block.pad)
        inner = torch.relu(block.causal(block.conv1, entering))
        grown = block.conv2(inner if trim else nn.functional.pad(inner, (block.pad, 0))) + seed.consumer(new)
        out = torch.relu(entering + (grown[:, :, :-block.pad] if trim else grown))
        torch.testing.assert_close(model(x), network[5](network[4](network[3](out))), rtol=1e-5, atol=1e-5)
    drive_to(slot, Stage.FOSSILIZED)
    assert_plain_network_matches(model.eval(), x)


class _TrimmedToInput(_CausalBlock):
    """The trim written as the length of each convolution's input, read from it in the forward."""

    def causal(self, conv: nn.Conv1d, x: Tensor) -> Tensor:
        return conv(x)[..., :x.size(-1)]


class _TrimmedToAComputedLength(_CausalBlock):
    def causal(self, conv: nn.Conv1d, x: Tensor) -> Tensor:
        return conv(x)[..., :x.size(-1) // 1]  # a length the new channels would have to compute again


def test_a_trim_to_the_convolutions_input_length_is_part_of_the_site_and_a_length_computed_from_it_is_not() -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 1, 20)
    for block, has_site in ((_TrimmedToInput, True), (_TrimmedToAComputedLength, False)):
        network = nn.Sequential(nn.Conv1d(1, 6, 1), block(6, 1, True), block(6, 2, True), nn.AdaptiveAvgPool1d(1),
                                nn.Flatten(), nn.Linear(6, 3))
        model = MorphogeneticModel(host_from_module(network, ["1", "2"], example_input=x[:2]), config=EASY_CONFIG)
        slot = model.slot("2")
        if not has_site:
            assert slot.width_site is None
            assert "constant slices or paddings of positions" in slot.site_problem("wider_inside")
            continue
        assert slot.width_site is not None and slot.width_site.consumer is network[2].conv2
        model.eval()
        with torch.no_grad():
            before = model(x)
            model.graft("2", "wider_inside")
            assert torch.equal(model(x), before)
            perturb_seed(slot, torch.Generator().manual_seed(1))
            seed = slot.seed
            assert isinstance(seed, WidthSeed)
            entering, conv1, conv2 = network[1](network[0](x)), network[2].conv1, network[2].conv2
            inner = torch.relu(conv1(entering)[..., :20])
            new = seed.after_producer[-1](seed.producer(entering)[..., :20])  # trimmed to the tap's length
            grown = (conv2(inner) + seed.consumer(new))[..., :20]
            torch.testing.assert_close(model(x), network[5](network[4](network[3](torch.relu(entering + grown)))),
                                       rtol=1e-5, atol=1e-5)
        drive_to(slot, Stage.FOSSILIZED)
        assert_plain_network_matches(model.eval(), x)
