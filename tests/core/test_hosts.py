"""Hosts: injection points and their widths, segment composition, tied embeddings, argument checks."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from morphogen.core.hosts import (
    CNNHost,
    Conv1dHost,
    HostSizeError,
    SegmentedHost,
    TransformerHost,
    UnknownSlotError,
    build_host,
    check_host_size,
    host_size_arguments,
)


def _cnn(pool_slots: bool = False) -> CNNHost:
    torch.manual_seed(0)
    return CNNHost(10, 1, n_blocks=3, base_channels=8, pool_slots=pool_slots).eval()


def _transformer(n_layers: int = 4, n_segments: int = 2) -> TransformerHost:
    torch.manual_seed(0)
    return TransformerHost(vocab_size=17, d_model=16, n_heads=2, n_layers=n_layers, block_size=8,
                           n_segments=n_segments).eval()


def _images() -> torch.Tensor:
    return torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(1))


def _tokens() -> torch.Tensor:
    return torch.randint(0, 17, (3, 8), generator=torch.Generator().manual_seed(1))


def _activations(host: SegmentedHost, x: Tensor) -> dict[str, Tensor]:
    """The activation at every injection point, segment by segment."""
    activations = {}
    for index, slot in enumerate(host.slot_ids):
        x = host.run_segment(index, x)
        activations[slot] = x
    return activations


def test_cnn_injection_points() -> None:
    assert CNNHost(10, 1).injection_points == {"r0c0": 32, "r0c1": 64, "r0c2": 128}
    assert list(_cnn(pool_slots=True).injection_points.items()) == [
        ("r0c0", 8), ("r1c0", 8), ("r0c1", 16), ("r1c1", 16), ("r0c2", 32), ("r1c2", 32)
    ]
    assert _cnn().slot_ids == ("r0c0", "r0c1", "r0c2")
    assert len(_cnn(pool_slots=True).segments) == 7  # one more segment than points


def test_cnn_activation_shapes_match_the_points() -> None:
    host = _cnn(pool_slots=True)
    x = _images()
    expected_sizes = {"r0c0": 8, "r1c0": 4, "r0c1": 4, "r1c1": 2, "r0c2": 2, "r1c2": 1}
    for slot, channels in host.injection_points.items():
        size = expected_sizes[slot]
        assert _activations(host, x)[slot].shape == (4, channels, size, size)
    assert host(x).shape == (4, 10)


def test_transformer_injection_points() -> None:
    assert _transformer().injection_points == {"r0c0": 16, "r0c1": 16}
    assert _transformer(n_layers=4, n_segments=4).slot_ids == ("r0c0", "r0c1", "r0c2", "r0c3")
    host = _transformer()
    assert _activations(host, _tokens())["r0c1"].shape == (3, 8, 16)
    assert host(_tokens()).shape == (3, 8, 17)


@pytest.mark.parametrize("host_name", ["cnn", "cnn_pool", "transformer"])
def test_segments_run_one_at_a_time_compose_to_forward(host_name: str) -> None:
    host = {"cnn": lambda: _cnn(), "cnn_pool": lambda: _cnn(True), "transformer": _transformer}[host_name]()
    x = _tokens() if host_name == "transformer" else _images()
    with torch.no_grad():
        assert len(_activations(host, x)) == len(host.slot_ids)
        h = x
        for index in range(len(host.segments)):
            h = host.run_segment(index, h)
        assert torch.equal(h, host(x))


def test_unknown_slots_are_refused_with_the_valid_ids() -> None:
    with pytest.raises(UnknownSlotError, match="r0c0, r0c1, r0c2"):
        _cnn().point_index("r7c7")


def test_transformer_embeddings_are_tied() -> None:
    host = _transformer()
    head = host.segments[-1]
    embedding = host.segments[0][0]
    assert head.output.weight is embedding.token.weight
    unique = sum(p.numel() for p in host.parameters())
    with_duplicates = sum(p.numel() for _, p in host.named_parameters(remove_duplicate=False))
    assert with_duplicates - unique == 17 * 16  # the shared vocab x d_model matrix, counted once
    host(_tokens()).sum().backward()
    assert embedding.token.weight.grad is not None
    # still tied after loading a state dict
    other = _transformer()
    other.load_state_dict(host.state_dict())
    assert other.segments[-1].output.weight is other.segments[0][0].token.weight


def test_transformer_is_causal() -> None:
    host = _transformer()
    tokens = _tokens()
    changed = tokens.clone()
    changed[:, 5:] = (changed[:, 5:] + 1) % 17
    with torch.no_grad():
        before, after = host(tokens), host(changed)
    assert torch.equal(before[:, :5], after[:, :5])
    assert not torch.equal(before[:, 5:], after[:, 5:])


def test_transformer_rejects_sequences_longer_than_block_size() -> None:
    with pytest.raises(ValueError, match="block_size"):
        _transformer()(torch.zeros(1, 9, dtype=torch.long))


@pytest.mark.parametrize(
    "kwargs",
    [{"num_classes": 0}, {"in_channels": 0}, {"n_blocks": 0}, {"base_channels": 0}, {"kernel_size": 2},
     {"kernel_size": 0}],
)
@pytest.mark.parametrize("host_class", [CNNHost, Conv1dHost])
def test_conv_hosts_reject_bad_arguments(host_class: type[CNNHost | Conv1dHost], kwargs: dict[str, int]) -> None:
    arguments = {"num_classes": 10, "in_channels": 1} | kwargs
    with pytest.raises(HostSizeError, match=f"{host_class.__name__} {next(iter(kwargs))}: must be") as error:
        host_class(**arguments)
    assert error.value.argument == next(iter(kwargs))


@pytest.mark.parametrize(
    "kwargs",
    [{"n_layers": 3}, {"n_layers": 0}, {"n_segments": 0}, {"d_model": 30}, {"n_heads": 0}, {"vocab_size": 0},
     {"block_size": 0}, {"d_model": 0}],
)
def test_transformer_rejects_bad_arguments(kwargs: dict[str, int]) -> None:
    arguments = {"vocab_size": 17, "d_model": 16, "n_heads": 4, "n_layers": 2, "block_size": 8,
                 "n_segments": 2} | kwargs
    with pytest.raises(HostSizeError, match=next(iter(kwargs))):
        TransformerHost(**arguments)


def test_hosts_take_device_and_dtype() -> None:
    cnn = CNNHost(10, 1, base_channels=4, dtype=torch.float64)
    assert {p.dtype for p in cnn.parameters()} == {torch.float64}
    transformer = TransformerHost(17, d_model=8, n_heads=2, n_layers=2, block_size=4, device="meta")
    assert {p.device.type for p in transformer.parameters()} == {"meta"}


def test_build_host() -> None:
    host = build_host("cnn", num_classes=3, in_channels=2, base_channels=4, n_blocks=2)
    assert isinstance(host, CNNHost)
    assert host.injection_points == {"r0c0": 4, "r0c1": 8}
    assert isinstance(build_host("transformer", vocab_size=5, d_model=8, n_heads=2, n_layers=2), TransformerHost)
    assert isinstance(build_host("cnn1d", num_classes=3, in_channels=1, base_channels=4), Conv1dHost)
    with pytest.raises(ValueError, match="cnn, cnn1d, transformer"):
        build_host("rnn")



def _sequences() -> torch.Tensor:
    return torch.randn(4, 1, 40, generator=torch.Generator().manual_seed(1))


def _conv1d(pool_slots: bool = False) -> Conv1dHost:
    torch.manual_seed(0)
    return Conv1dHost(10, 1, n_blocks=3, base_channels=8, pool_slots=pool_slots).eval()


def test_conv1d_host_has_the_cnn_block_structure_in_one_dimension() -> None:
    host = _conv1d(pool_slots=True)
    assert host.topology == "cnn1d"
    assert list(host.injection_points.items()) == [
        ("r0c0", 8), ("r1c0", 8), ("r0c1", 16), ("r1c1", 16), ("r0c2", 32), ("r1c2", 32)
    ]
    expected_lengths = {"r0c0": 40, "r1c0": 20, "r0c1": 20, "r1c1": 10, "r0c2": 10, "r1c2": 5}
    x = _sequences()
    for slot, channels in host.injection_points.items():
        assert _activations(host, x)[slot].shape == (4, channels, expected_lengths[slot])
    assert host(x).shape == (4, 10)
    kinds = [type(m) for m in host.modules() if not isinstance(m, (torch.nn.Sequential, torch.nn.ModuleList))]
    assert torch.nn.Conv1d in kinds and torch.nn.BatchNorm1d in kinds and torch.nn.Conv2d not in kinds
    convs = [m for m in host.modules() if isinstance(m, torch.nn.Conv1d)]
    assert [c.kernel_size for c in convs] == [(5,)] * 3  # the default kernel
    assert Conv1dHost(10, 1).injection_points == {"r0c0": 32, "r0c1": 64, "r0c2": 128}


def test_conv1d_host_parameter_count_oracle() -> None:
    host = Conv1dHost(10, 1, n_blocks=2, base_channels=4, kernel_size=3)
    convs = (1 * 4 * 3) + (4 * 8 * 3)  # no bias: batch norm follows
    norms = 2 * 4 + 2 * 8
    head = 8 * 10 + 10
    assert sum(p.numel() for p in host.parameters()) == convs + norms + head


def test_host_size_arguments_come_from_the_constructor_signature() -> None:
    assert host_size_arguments("cnn") == ("n_blocks", "base_channels", "kernel_size")
    assert host_size_arguments("cnn1d") == ("n_blocks", "base_channels", "kernel_size")
    assert host_size_arguments("transformer") == ("d_model", "n_heads", "n_layers", "block_size", "n_segments")


@pytest.mark.parametrize(
    ("topology", "size", "argument", "problem"),
    [
        ("cnn", {"base_channels": 0}, "base_channels", "must be >= 1, got 0"),
        ("cnn", {"kernel_size": 4}, "kernel_size", "must be odd and >= 1, got 4"),
        ("cnn", {"d_model": 8}, "d_model", "unknown key; accepted: n_blocks, base_channels, kernel_size"),
        ("cnn", {"num_classes": 3}, "num_classes", "unknown key; accepted: n_blocks, base_channels, kernel_size"),
        ("cnn1d", {"n_blocks": 2.5}, "n_blocks", "expected an integer, got 2.5"),
        ("cnn1d", {"n_blocks": True}, "n_blocks", "expected an integer, got True"),
        ("transformer", {"n_heads": 5}, "d_model", "must be divisible by n_heads (5), got 64"),
        ("transformer", {"n_layers": 3}, "n_layers", "must be a positive multiple of n_segments (2), got 3"),
    ],
)
def test_check_host_size_names_the_argument(topology: str, size: dict[str, object], argument: str,
                                            problem: str) -> None:
    with pytest.raises(HostSizeError) as error:
        check_host_size(topology, size)
    assert (error.value.argument, error.value.problem) == (argument, problem)


def test_check_host_size_accepts_what_the_host_builds_with() -> None:
    check_host_size("cnn", {"n_blocks": 1, "base_channels": 4, "kernel_size": 5})
    check_host_size("cnn1d", {})
    check_host_size("transformer", {"d_model": 32, "n_heads": 2, "n_layers": 6, "n_segments": 3})
