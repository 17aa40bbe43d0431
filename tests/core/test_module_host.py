"""`host_from_module`: a user's model cut into a host at named submodules, checked before any training."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from torch import Tensor, nn

import morphogen
from morphogen import HostBuildError, MorphogeneticModel, host_from_module

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "own"))
from models import ResNet, TinyGPT, mlp


def test_a_resnet_is_cut_after_its_stages_and_computes_exactly_the_model() -> None:
    torch.manual_seed(0)
    model, x = ResNet(width=4).eval(), torch.randn(3, 3, 12, 12)
    host = host_from_module(model, ["layer3", "layer1", "layer2"], example_input=x)
    assert host.topology == "cnn"
    assert host.injection_points == {"layer1": 4, "layer2": 8, "layer3": 16}  # execution order, probed widths
    grown = MorphogeneticModel(host).eval()
    assert torch.equal(grown(x), model(x))
    grown.germinate("layer2", "conv_light")  # identity at birth, as on morphogen's own hosts
    assert torch.equal(grown(x), model(x))


def test_a_model_given_as_torch_compile_returns_it_is_cut_as_the_module_it_compiled() -> None:
    """`torch.compile(net)` wraps `net` in a module fx cannot trace, whose only child is `net`: the host is cut
    from `net` itself, shares its parameters and names its slots as `net` does."""
    torch.manual_seed(0)
    model, x = ResNet(width=4).eval(), torch.randn(3, 3, 12, 12)
    compiled = torch.compile(model)
    assert morphogen.slot_points(compiled, x[:2]) == morphogen.slot_points(model, x[:2])
    host = host_from_module(compiled, ["layer1", "layer2"], example_input=x[:2])
    assert host.injection_points == {"layer1": 4, "layer2": 8}
    assert {id(p) for p in host.parameters()} == {id(p) for p in model.parameters()}
    assert torch.equal(MorphogeneticModel(host).eval()(x), model(x))


def test_the_host_shares_the_users_parameters() -> None:
    model = mlp()
    host = host_from_module(model, ["1"], example_input=torch.randn(2, 12))
    assert {id(p) for p in host.parameters()} == {id(p) for p in model.parameters()}


class PositionalEncoding(nn.Module):
    """PyTorch's tutorial encoding: a sinusoid table kept as a buffer, sliced to the input's length."""

    def __init__(self, width: int, length: int = 32) -> None:
        super().__init__()
        position = torch.arange(length).unsqueeze(1) * torch.exp(torch.arange(0, width, 2) * (-4.0 / width))
        table = torch.zeros(1, length, width)
        table[0, :, 0::2], table[0, :, 1::2] = torch.sin(position), torch.cos(position)
        self.register_buffer("table", table)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.table[:, :x.size(1)]


class EncodedTokens(nn.Module):
    """Token ids through an embedding, a positional-encoding buffer of its own and one in a submodule, two layers."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.encoding = nn.Embedding(8, 8), PositionalEncoding(8)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 32).reshape(1, 32, 1))
        self.layer1, self.layer2, self.head = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 3)

    def forward(self, ids: Tensor) -> Tensor:
        x = self.encoding(self.embed(ids)) * self.scale[:, :ids.shape[1]]
        return self.head(torch.relu(self.layer2(torch.relu(self.layer1(x)))).mean(1))


def test_a_buffer_the_forward_slices_to_the_inputs_length_traces_and_stays_the_users() -> None:
    """fx hands the forward its buffers as tensors, so slicing one by a traced length failed (`slice indices must
    be integers`) and such a model could hold no slot at all."""
    torch.manual_seed(0)
    model, ids = EncodedTokens().eval(), torch.randint(0, 8, (4, 12))
    host = host_from_module(model, ["layer1", "layer2"], example_input=ids[:2])
    assert host.injection_points == {"layer1": 8, "layer2": 8}
    grown = MorphogeneticModel(host).eval()
    for length in (12, 5):  # the slices follow the input's length
        torch.testing.assert_close(grown(ids[:, :length]), model(ids[:, :length]), rtol=0, atol=0)
    held = {id(b) for b in host.buffers()}
    assert id(model.scale) in held and id(model.encoding.table) in held
    # The segment before a slot is traced again to find its width sites: layer1 -> relu -> layer2 is one.
    widened = MorphogeneticModel(host_from_module(EncodedTokens(), ["layer2"], example_input=ids[:2])).eval()
    before = widened(ids)
    widened.graft("layer2", "wider_inside")
    torch.testing.assert_close(widened(ids), before, rtol=0, atol=0)
    assert widened(ids[:, :5]).shape == (4, 3)


def test_layouts_are_read_from_the_shape_probe() -> None:
    gpt = host_from_module(TinyGPT(), ["blocks.0", "blocks.1"], example_input=torch.randint(0, 8, (2, 12)))
    assert gpt.topology == "transformer" and gpt.injection_points == {"blocks_0": 16, "blocks_1": 16}
    assert gpt.submodules == {"blocks_0": "blocks.0", "blocks_1": "blocks.1"}
    dense = host_from_module(mlp(), ["1", "3"], example_input=torch.randn(2, 12))
    assert dense.topology == "mlp" and dense.injection_points == {"1": 16, "3": 16}
    convolutional_1d = nn.Sequential(nn.Conv1d(1, 6, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(6 * 10, 2))
    sequence = host_from_module(convolutional_1d, ["1"], example_input=torch.randn(2, 1, 10))
    assert sequence.topology == "cnn1d" and sequence.injection_points == {"1": 6}
    tokens = host_from_module(convolutional_1d, ["1"], example_input=torch.randn(2, 1, 10), topology="transformer")
    assert tokens.topology == "transformer" and tokens.injection_points == {"1": 10}  # the override reads [N, T, D]


class ChannelNormedBlock(nn.Module):
    """A ConvNeXt-style 1-D block: a LayerNorm over the channels of [N, C, L], transposed around it."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv, self.norm = nn.Conv1d(channels, channels, 5, padding=2), nn.LayerNorm(channels)

    def forward(self, x: Tensor) -> Tensor:
        return x + torch.relu(self.norm(self.conv(x).transpose(1, 2)).transpose(1, 2))


def test_a_layer_norm_over_the_channels_of_a_1d_convolution_network_does_not_make_its_activations_tokens() -> None:
    """8 channels of 20 positions: the slots hold 8 channels (`cnn1d`). The LayerNorm once made the guess tokens, and
    each slot's width the 20 positions; a LayerNorm over the last dimension, as a transformer's, still does."""
    network = nn.Sequential(nn.Conv1d(2, 8, 3, padding=1), ChannelNormedBlock(8), ChannelNormedBlock(8),
                            nn.Flatten(), nn.Linear(8 * 20, 3))
    host = host_from_module(network, ["1", "2"], example_input=torch.randn(2, 2, 20))
    assert host.topology == "cnn1d" and host.injection_points == {"1": 8, "2": 8}
    mixer = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 8), nn.Flatten(), nn.Linear(8 * 20, 3))
    tokens = host_from_module(mixer, ["1"], example_input=torch.randn(2, 20, 4))
    assert tokens.topology == "transformer" and tokens.injection_points == {"1": 8}


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 4)

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        return self.layer(x) + y


class CalledTwice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 4)

    def forward(self, x: Tensor) -> Tensor:
        return self.layer(self.layer(x))


class ReturnsPair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 4)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        h = self.layer(x)
        return h, h


class DataDependent(nn.Module):
    """Untraceable (branches on a value), but its forward runs its children in order."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = self.first(x)
        if h.sum() > 1e9:
            h = h * 0
        return self.second(h)


def test_an_untraceable_model_that_runs_its_children_in_order_is_cut_between_them() -> None:
    model = DataDependent()
    x = torch.randn(3, 4)
    host = host_from_module(model, ["first"], example_input=x)
    assert torch.equal(MorphogeneticModel(host)(x), model(x))


class FlattensInPython(nn.Module):
    """The PyTorch tutorial's LeNet: pooling between its children, and a flatten that iterates over `x.size()`,
    which fx cannot trace."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = nn.Conv2d(1, 4, 3), nn.Linear(4 * 3 * 3, 2)

    def forward(self, x: Tensor) -> Tensor:
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)
        features = 1
        for size in x.size()[1:]:
            features *= size
        return self.fc(x.view(-1, features))


def test_an_untraceable_model_whose_children_do_not_run_in_order_says_fx_could_not_trace_it() -> None:
    """The model runs on the example; the cut between its children is what fails. The error once said that running
    the model failed, hiding that fx could not trace it."""
    model, x = FlattensInPython(), torch.randn(2, 1, 8, 8)
    assert model(x).shape == (2, 2)
    with pytest.raises(HostBuildError, match=r"^torch.fx cannot trace FlattensInPython \(TraceError: Proxy object "
                                             r"cannot be iterated.*\), and cutting it between its children fails "
                                             r"\(running the part after 'conv' on example_input failed: RuntimeError: "
                                             r".*\): its forward does not run them in order; write it so that fx "
                                             r"traces it$"):
        host_from_module(model, ["conv"], example_input=x)



class _ChecksItsLength(nn.Module):
    """nanoGPT's forward: a Python `assert` on the sequence length, which fx cannot trace, and its blocks in a list
    (a slot in the list cannot fall back to a cut between the model's children)."""

    def __init__(self, checks_length: bool = True) -> None:
        super().__init__()
        self.length, self.checks_length = 8, checks_length
        self.embed, self.blocks = nn.Embedding(5, 4), nn.ModuleList([nn.Linear(4, 4)])

    def forward(self, ids: Tensor) -> Tensor:
        _, t = ids.size()
        if self.checks_length:
            assert t <= self.length, f"sequence of {t} tokens, longer than {self.length}"
        return self.blocks[0](self.embed(ids))


def test_code_that_cannot_trace_or_run_is_named_by_its_line_in_the_users_forward() -> None:
    """The error names the line of the user's code it came from: fx's "cannot be used as inputs to control flow"
    alone does not say which `assert` or `if` of a long forward it met, nor an IndexError which embedding."""
    this_file = re.escape(Path(__file__).name)
    with pytest.raises(HostBuildError, match=rf"control flow, at .*{this_file}:\d+: `assert t <= self.length, "):
        host_from_module(_ChecksItsLength(), ["blocks.0"], example_input=torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(HostBuildError, match=rf"IndexError: index out of range in self, at .*{this_file}:\d+: "
                                             r"`return self.blocks\[0\]\(self.embed\(ids\)\)`"):
        host_from_module(_ChecksItsLength(checks_length=False), ["blocks.0"], example_input=torch.full((2, 4), 7))


@pytest.mark.parametrize(("model", "slots", "example", "message"), [
    (ResNet(), ["layer4"], torch.randn(2, 3, 12, 12), "no submodule named 'layer4' in CifarResNet; its children: stem"),
    (ResNet(), ["layer1.0.conv1"], torch.randn(2, 3, 12, 12), "slot after 'layer1.0.conv1': it sits inside a branch"),
    (ResNet(), ["layer1", "layer1.0"], torch.randn(2, 3, 12, 12), "lies inside 'layer1', which also holds a slot"),
    (ResNet(), ["layer1", "fc"], torch.randn(2, 3, 12, 12), "slots have outputs of different ranks"),
    (ResNet(), ["layer1"], torch.randn(2, 5, 12, 12), "running CifarResNet on example_input failed"),
    (ResNet(), ["layer1"], torch.randn(2, 3, 12, 12), None),
    (TwoInputs(), ["layer"], torch.randn(2, 4), "forward takes 2 inputs; give them all in example_input"),
    (CalledTwice(), ["layer"], torch.randn(2, 4), "forward calls it 2 times"),
    (_ChecksItsLength(checks_length=False), ["blocks"], torch.zeros(2, 4, dtype=torch.long),
     "forward calls it 0 times; a slot needs exactly one call on the main path: it holds the submodules your forward "
     "calls, name them (blocks.0)"),
    (ReturnsPair(), ["layer"], torch.randn(2, 4), "forward returns tuple; a host returns one tensor"),
    (DataDependent(), ["first.weight"], torch.randn(2, 4), "no submodule named 'first.weight'"),
    (mlp(), ["1"], torch.randn(2, 12), None),
    (mlp(), ["1"], torch.tensor(1.0), "example_input must be a batch of the model's inputs"),
    (mlp(), [1], torch.randn(2, 12), "slots are names of submodules, as strings: got 1 (int); write '1'"),
])
def test_what_cannot_work_is_one_clear_error_naming_the_submodule(model: nn.Module, slots: list[str], example: Tensor,
                                                                 message: str | None) -> None:
    if message is None:
        host_from_module(model, slots, example_input=example)
        return
    with pytest.raises(HostBuildError) as caught:
        host_from_module(model, slots, example_input=example)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_one_slot_may_be_named_by_a_string_not_split_into_its_characters() -> None:
    model = mlp()
    x = torch.randn(2, 12)
    assert host_from_module(model, "1", example_input=x).slot_ids == host_from_module(model, ["1"], x).slot_ids
    with pytest.raises(HostBuildError, match="no submodule named 'layer'"):
        host_from_module(model, "layer", example_input=x)


class _LogitsAndFeatures(nn.Module):
    """A model that returns its features beside its class scores, as a tuple, a dict or an object of outputs."""

    def __init__(self, returns: str) -> None:
        super().__init__()
        self.returns = returns
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
        self.block = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        self.head = nn.Linear(8, 3)

    def forward(self, x: Tensor) -> object:
        features = self.block(self.body(x))
        logits = self.head(features)
        if self.returns == "tuple":
            return logits, features
        if self.returns == "dict":
            return {"features": features, "logits": logits}
        return _Outputs(logits, features)


class _Outputs(NamedTuple):
    logits: Tensor
    features: Tensor


@pytest.mark.parametrize(("returns", "output"), [("tuple", 0), ("dict", "logits"), ("object", "logits")])
def test_output_names_the_one_the_loss_reads(returns: str, output: int | str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = _LogitsAndFeatures(returns)
    x = torch.randn(5, 4)
    host = host_from_module(net, ["body"], example_input=x[:2], output=output)
    assert not [key for key in host.state_dict() if "picked" in key], "the pick holds no state"
    model = MorphogeneticModel(host)
    expected = net(x)
    logits = expected[0] if returns == "tuple" else expected["logits"] if returns == "dict" else expected.logits
    torch.testing.assert_close(model(x), logits, rtol=0, atol=0)
    model.germinate("body", "mlp")
    program = torch.export.load(morphogen.export_model(model.eval(), x[:2], tmp_path / "grown.pt2")).module()
    torch.testing.assert_close(program(x), model(x), rtol=0, atol=1e-6)


@pytest.mark.parametrize(("returns", "output", "message"), [
    ("tuple", 2, "output=2: _LogitsAndFeatures's forward returns a tuple without it; its positions: output=0 to "
                 "output=1"),
    ("tuple", "logits", "output='logits': _LogitsAndFeatures's forward returns a tuple without it"),
    ("tuple", 1.5, "output must be a position (int) or a key or attribute name (str), got 1.5"),
    ("dict", "logit", "output='logit': _LogitsAndFeatures's forward returns a dict without it; its keys: "
                      "output='features', output='logits'"),
    ("dict", 0, "returns a dict without it; its keys: output='features', output='logits'"),
    ("object", "logit", "returns a _Outputs without it; its fields: output='logits', output='features'"),
    ("dict", None, "_LogitsAndFeatures's forward returns dict; a host returns one tensor: name the one your loss "
                   "reads (its keys: output='features', output='logits')"),
])
def test_an_output_the_forward_does_not_return_is_refused_naming_those_it_does(returns: str, output: object,
                                                                                message: str) -> None:
    with pytest.raises(HostBuildError, match=re.escape(message)):
        host_from_module(_LogitsAndFeatures(returns), ["body"], example_input=torch.randn(2, 4),
                         output=output)  # type: ignore[arg-type]


def test_slot_points_says_why_where_no_submodule_can_hold_a_slot() -> None:
    """A forward that returns several outputs needs `output=` for every slot: `slot_points` says so rather than
    listing nothing."""
    model, x = _LogitsAndFeatures("dict"), torch.randn(2, 4)
    with pytest.raises(HostBuildError, match=r"^no submodule of _LogitsAndFeatures can hold a slot "
                                             r"\(\d+ of \d+: _LogitsAndFeatures's forward returns dict; "
                                             r".*output='logits'"):
        morphogen.slot_points(model, x)
    assert set(morphogen.slot_points(model, x, output="logits")) >= {"body", "block"}


def test_a_topology_that_does_not_fit_the_probe_is_refused() -> None:
    with pytest.raises(HostBuildError, match="a cnn host needs 4 dimensions"):
        host_from_module(mlp(), ["1"], example_input=torch.randn(2, 12), topology="cnn")
    with pytest.raises(HostBuildError, match="unknown topology 'images'"):
        host_from_module(mlp(), ["1"], example_input=torch.randn(2, 12), topology="images")


def test_the_probe_leaves_batch_norm_statistics_and_modes_alone() -> None:
    model = ResNet().train()
    before = {name: buffer.clone() for name, buffer in model.named_buffers()}
    host_from_module(model, ["layer1"], example_input=torch.randn(2, 3, 12, 12))
    assert model.training and all(module.training for module in model.modules())
    assert all(torch.equal(before[name], buffer) for name, buffer in model.named_buffers())


class _FunctionalDropout(nn.Module):
    """A network written with functional calls, its dropout following the model's mode (`training=self.training`)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 4, 3, padding=1), nn.Conv2d(4, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 2 * 2, 10)

    def forward(self, x: Tensor) -> Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc(nn.functional.dropout(x.flatten(1), 0.5, training=self.training))


@pytest.mark.parametrize("traced_in", ["train", "eval"])
def test_a_functional_dropout_given_the_models_mode_follows_the_hosts(traced_in: str, tmp_path: Path) -> None:
    """fx fixes `self.training` at its value while tracing: the dropout would drop in every validation and export,
    or never. The host's follows its mode, as the model's does."""
    torch.manual_seed(0)
    model, x = _FunctionalDropout().train(traced_in == "train"), torch.randn(6, 1, 8, 8)
    grown = MorphogeneticModel(host_from_module(model, ["conv1", "conv2"], example_input=x[:2]))
    assert model.training is (traced_in == "train")  # the mode it was given back
    _assert_it_follows_the_mode(grown, model, x, tmp_path)


def _assert_it_follows_the_mode(grown: MorphogeneticModel, model: nn.Module, x: Tensor, tmp_path: Path) -> None:
    """The grown model computes what the model computes in eval mode, drops the same as it in training mode (the
    same random numbers), and exports its eval-mode function."""
    model.eval(), grown.eval()
    assert torch.equal(grown(x), model(x))
    model.train(), grown.train()
    torch.manual_seed(1)
    dropped = grown(x)
    torch.manual_seed(1)
    assert torch.equal(dropped, model(x)) and not torch.equal(dropped, grown.eval()(x))
    program = torch.export.load(morphogen.export_model(grown, x[:2], tmp_path / "grown.pt2")).module()
    assert torch.equal(program(x), model.eval()(x))


class _CausalSelfAttention(nn.Module):
    """nanoGPT's attention: its dropout probability is chosen by the mode in the forward."""

    def __init__(self, width: int = 8, dropout: float = 0.3) -> None:
        super().__init__()
        self.qkv, self.out, self.dropout = nn.Linear(width, 3 * width), nn.Linear(width, width), dropout

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.qkv(x).unsqueeze(1).chunk(3, dim=-1)  # one head: (N, 1, T, width) each
        attended = nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                                              is_causal=True)
        return x + self.out(attended.squeeze(1))


class _SmallGPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = nn.Embedding(5, 8), nn.Linear(8, 5)
        self.blocks = nn.Sequential(_CausalSelfAttention(), _CausalSelfAttention())

    def forward(self, ids: Tensor) -> Tensor:
        return self.head(self.blocks(self.embed(ids)))


def test_constants_the_forward_chooses_by_the_mode_follow_the_hosts_mode(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, ids = _SmallGPT(), torch.randint(0, 5, (4, 6))
    # A slot's submodule runs whole; the second block, traced through, has its dropout probability in the graph.
    grown = MorphogeneticModel(host_from_module(model, ["blocks.0"], example_input=ids[:2]))
    _assert_it_follows_the_mode(grown, model, ids, tmp_path)


class _TrainsOtherwise(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(4, 8), nn.Linear(8, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = self.first(x)
        if self.training:  # fx would keep one branch
            h = h + 1.0
        return self.second(h)


def test_a_forward_that_branches_on_the_mode_is_refused_in_one_line() -> None:
    with pytest.raises(HostBuildError, match=r"cannot cut _TrainsOtherwise: its forward runs other code in training "
                                             r"than in eval mode \(from add\)"):
        host_from_module(_TrainsOtherwise(), ["first"], example_input=torch.randn(2, 4))


class _StochasticDepth(nn.Module):
    """A residual block skipped at random while training (stochastic depth): a branch on a draw of each batch."""

    def __init__(self, width: int = 8, skip: float = 0.5) -> None:
        super().__init__()
        self.body, self.skip = nn.Sequential(nn.Linear(width, width), nn.ReLU()), skip

    def forward(self, x: Tensor) -> Tensor:
        if self.training and torch.rand(1) < self.skip:
            return x
        return x + self.body(x)


class _Noisy(nn.Module):
    """Stochastic depth after `first`, and fresh noise of a size alone added to the features while training."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.block, self.head = nn.Linear(4, 8), _StochasticDepth(), nn.Linear(8, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = self.first(x)
        h = self.block(torch.relu(h)) * 1.0  # not run as its children in order: no cut between them either
        return self.head(h + torch.randn(8) * (0.1 if self.training else 0.0))


@pytest.mark.parametrize("seed", range(4))
def test_random_draws_in_the_forward_stay_draws_of_every_batch(seed: int) -> None:
    """fx runs `torch.rand(1)` once while it traces: a stochastic-depth coin flip would be decided for good (the
    block always run, or always skipped) and noise would be a constant. Whatever torch's generator holds, a branch
    on a draw is refused in one line (a slot after that block keeps it whole), and other draws happen every
    batch, the same as the model's under the same generator."""
    torch.manual_seed(seed)
    model, x = _Noisy().train(), torch.randn(16, 4)
    with pytest.raises(HostBuildError, match=r"cannot trace _Noisy \(TraceError: symbolically traced variables "
                                             r"cannot be used as inputs to control flow, at .*: `if .*`\)"):
        host_from_module(model, ["first"], example_input=x[:2])
    grown = MorphogeneticModel(host_from_module(model, ["first", "block"], example_input=x[:2])).train()
    outputs = []
    for draw in (1, 2):
        torch.manual_seed(draw)
        outputs.append(grown(x))
        torch.manual_seed(draw)
        torch.testing.assert_close(outputs[-1], model(x), rtol=0, atol=1e-6)
    assert not torch.equal(outputs[0], outputs[1])
    model.eval(), grown.eval()
    assert torch.equal(grown(x), model(x))


class _AlwaysDropping(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(4, 8), nn.Linear(8, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.second(nn.functional.dropout(torch.relu(self.first(x)), 0.2))  # training=True, its default


def test_a_model_that_is_random_in_eval_mode_is_refused_naming_the_cause() -> None:
    with pytest.raises(HostBuildError, match=r"^_AlwaysDropping gives another output each time it runs in eval mode "
                                             r"on the same inputs: a dropout that is always on"):
        host_from_module(_AlwaysDropping(), ["first"], example_input=torch.randn(2, 4))


class _RunningCentre(nn.Module):
    """Centres its inputs on a running mean that its forward updates in place, in eval mode too."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(4))
        self.first, self.second = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        self.mean.mul_(0.9).add_(0.1 * x.mean(0).detach())
        return self.second(torch.relu(self.first(x - self.mean)))


def test_a_model_whose_forward_updates_a_buffer_in_eval_mode_is_refused_naming_that_cause_too() -> None:
    """The message named only dropout and random draws, neither of which such a model has."""
    with pytest.raises(HostBuildError, match=r"^_RunningCentre gives another output each time .*, or a buffer its "
                                             r"forward changes in place \(a running statistic kept outside a module "
                                             r"such as nn.BatchNorm\)"):
        host_from_module(_RunningCentre(), ["first"], example_input=torch.randn(2, 4) + 3)


class _ResidualLoop(nn.Module):
    """Pre-norm residual blocks whose sums are written in the model's own forward, as many hand-written models do."""

    def __init__(self, width: int = 8, depth: int = 3, form: str = "sum") -> None:
        super().__init__()
        self.embed, self.form = nn.Linear(4, width), form
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(depth))
        self.mlps = nn.ModuleList(nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
                                  for _ in range(depth))
        self.head = nn.Linear(width, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = self.embed(x)  # (N, T, width)
        for norm, block in zip(self.norms, self.mlps, strict=True):
            if self.form == "inplace":
                h += block(norm(h))
            elif self.form == "block_first":
                h = block(norm(h)) + h
            elif self.form == "dropout":  # through a dropout that follows the mode, as in many transformers
                h = h + nn.functional.dropout(block(norm(h)), 0.1, training=self.training)
            else:
                h = h + block(norm(h))
        return self.head(h.mean(1))


@pytest.mark.parametrize("form", ["sum", "inplace", "block_first", "dropout"])
def test_a_slot_after_a_block_whose_residual_sum_the_forward_writes_sits_after_the_sum(form: str,
                                                                                       tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, x = _ResidualLoop(form=form).eval(), torch.randn(5, 6, 4)
    host = host_from_module(model, ["mlps.0", "mlps.1"], example_input=x[:2])
    assert host.topology == "transformer" and host.injection_points == {"mlps_0": 8, "mlps_1": 8}
    grown = MorphogeneticModel(host).eval()
    assert torch.equal(grown(x), model(x))
    h = torch.randn(2, 6, 8)
    layer = host.layer_before("mlps_1")  # the block with its sum: what `block_copy` stacks
    assert layer is not None and torch.equal(layer(h), h + model.mlps[1](model.norms[1](h)))
    grown.install("mlps_1", "block_copy")  # a copy of the block and its sum, in the output at alpha 1
    with torch.no_grad():
        expected = model.embed(x)
        for index in (0, 1, 1, 2):
            expected = expected + model.mlps[index](model.norms[index](expected))
        torch.testing.assert_close(grown(x), model.head(expected.mean(1)), rtol=0, atol=1e-6)
    program = torch.export.load(morphogen.export_model(grown, x[:2], tmp_path / "grown.pt2")).module()
    torch.testing.assert_close(program(x), grown(x), rtol=0, atol=1e-6)


def test_a_sum_whose_other_value_flows_on_is_still_refused() -> None:
    class Forked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem, self.first, self.second = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 2)

        def forward(self, x: Tensor) -> Tensor:
            h = self.stem(x)
            y = h + self.first(h)
            return self.second(y) + h.sum(1, keepdim=True)  # `h` reaches the code after the sum

    with pytest.raises(HostBuildError, match="slot after 'first': it sits inside a branch: stem"):
        host_from_module(Forked(), ["first"], example_input=torch.randn(2, 4))


def test_a_sum_with_a_parameter_leaves_the_slot_after_the_call() -> None:
    """Position embeddings added to the token embeddings are no residual connection: the slot stays after `embed`,
    and the next part adds them."""
    torch.manual_seed(0)
    model, ids = TinyGPT().eval(), torch.randint(0, 8, (3, 12))
    with torch.no_grad():
        model.position.normal_()
    host = host_from_module(model, ["embed", "blocks.0", "blocks.1"], example_input=ids[:2])
    with torch.no_grad():
        assert torch.equal(host.run_segment(0, ids), model.embed(ids))
        assert torch.equal(MorphogeneticModel(host).eval()(ids), model(ids))


class _TutorialLM(nn.Module):
    """PyTorch's transformer tutorial model: its causal mask is made from the length of the embeddings, or with
    `mask_first` from the length of the token ids."""

    def __init__(self, mask_first: bool) -> None:
        super().__init__()
        self.mask_first = mask_first
        self.embedding, self.linear = nn.Embedding(7, 8), nn.Linear(8, 7)
        layer = nn.TransformerEncoderLayer(8, 2, 16, 0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

    def forward(self, ids: Tensor) -> Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(ids.size(1)) if self.mask_first else None
        x = self.embedding(ids) * 2.0
        if mask is None:
            mask = nn.Transformer.generate_square_subsequent_mask(x.size(1))
        return self.linear(self.encoder(x, mask=mask, is_causal=True))


def test_a_mask_made_from_the_size_of_an_activation_is_refused_with_what_to_do_instead() -> None:
    ids, slots = torch.randint(0, 7, (3, 5)), ["encoder.layers.0", "encoder.layers.1"]
    with pytest.raises(HostBuildError, match=r"slot after 'encoder\.layers\.0': the code after it reads triu, "
                                             r"computed from the size of a value on the main path.*compute it from "
                                             r"the model's inputs"):
        host_from_module(_TutorialLM(mask_first=False), slots, example_input=ids[:2])
    torch.manual_seed(0)
    model = _TutorialLM(mask_first=True).eval()
    grown = MorphogeneticModel(host_from_module(model, slots, example_input=ids[:2])).eval()
    torch.testing.assert_close(grown(ids), model(ids), rtol=0, atol=1e-6)


def test_a_block_traced_through_may_size_a_factory_by_numbers_it_reads_from_shapes() -> None:
    """TinyGPT's blocks make their causal mask with `torch.ones(t, t)`, `t` read from the activation's shape: fx
    cannot trace that call, but traces `torch.ones((t, t))`, which it becomes while tracing."""
    torch.manual_seed(0)
    model, ids = TinyGPT().eval(), torch.randint(0, 8, (3, 12))
    host = host_from_module(model, ["embed", "blocks.0"], example_input=ids[:2])  # blocks.1 is traced through
    assert torch.equal(MorphogeneticModel(host).eval()(ids), model(ids))
    assert all(type(getattr(torch, name)).__name__ == "builtin_function_or_method"  # torch's own again
               for name in ("ones", "zeros", "empty", "rand", "randn"))


def test_slot_points_lists_every_submodule_a_slot_can_follow_with_its_width() -> None:
    class Twice(nn.Module):  # `shared` runs twice: no slot can follow it
        def __init__(self) -> None:
            super().__init__()
            self.first, self.shared, self.head = nn.Linear(4, 6), nn.Linear(6, 6), nn.Linear(6, 2)

        def forward(self, x: Tensor) -> Tensor:
            return self.head(self.shared(self.shared(self.first(x))))

    assert morphogen.slot_points(Twice(), torch.randn(2, 4)) == {"first": 6, "head": 2}
    points = morphogen.slot_points(TinyGPT(), torch.randint(0, 8, (2, 12)))
    assert {"embed", "blocks.0", "blocks.1", "norm"} <= set(points) and points["blocks.0"] == 16
    for name in points:  # each one builds a host
        host_from_module(TinyGPT(), [name], example_input=torch.randint(0, 8, (2, 12)))
    with pytest.raises(HostBuildError, match=r"no submodule named 'block\.0'.*morphogen\.slot_points"):
        host_from_module(TinyGPT(), ["block.0"], example_input=torch.randint(0, 8, (2, 12)))


def test_a_slot_after_an_attention_whose_weights_the_forward_drops_sits_after_its_residual_sum() -> None:
    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.head = nn.Linear(4, 8), nn.Linear(8, 3)
            self.attention, self.norm = nn.MultiheadAttention(8, 2, batch_first=True), nn.LayerNorm(8)

        def forward(self, x: Tensor) -> Tensor:
            h = self.embed(x)
            attended, _ = self.attention(h, h, h, need_weights=False)  # `_` is read by nothing
            return self.head(self.norm(h + attended).mean(1))

    torch.manual_seed(0)
    model, x = Encoder().eval(), torch.randn(3, 5, 4)
    host = host_from_module(model, ["attention"], example_input=x[:2])
    assert torch.equal(MorphogeneticModel(host).eval()(x), model(x))
    layer, h = host.layer_before("attention"), torch.randn(2, 5, 8)
    assert layer is not None and torch.equal(layer(h), h + model.attention(h, h, h, need_weights=False)[0])


def test_a_slot_after_an_lstm_sits_after_the_output_the_forward_reads() -> None:
    class Recurrent(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.lstm, self.head = nn.Linear(3, 8), nn.LSTM(8, 8, batch_first=True), nn.Linear(8, 4)

        def forward(self, x: Tensor) -> Tensor:
            out, (_, _) = self.lstm(self.embed(x))  # the state is read by nothing
            return self.head(out[:, -1])

    torch.manual_seed(0)
    model, x = Recurrent().eval(), torch.randn(3, 7, 3)
    host = host_from_module(model, ["lstm"], example_input=x[:2])
    assert host.topology == "transformer" and host.injection_points == {"lstm": 8}  # [N, T, D]: tokens
    assert torch.equal(MorphogeneticModel(host).eval()(x), model(x))
    assert host.layer_before("lstm") is None  # one of its outputs: nothing a copy could stack
