"""Blend operators: identity at alpha 0, clamping, dtype, oracle values, and the learned gate's scope."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from morphogen.core.blend import AlphaLike, Blend, BlendGate, BlendKind, add_blend, gate_blend, multiply_blend

IMAGE_SHAPE = (3, 4, 5, 5)  # (N, C, H, W)
SEQUENCE_SHAPE = (3, 6, 4)  # (N, T, D)
SHAPES = {"image": IMAGE_SHAPE, "sequence": SEQUENCE_SHAPE}


def _pair(shape: tuple[int, ...], seed: int = 0, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(seed)
    h = torch.randn(shape, generator=generator, dtype=dtype)
    s = h + torch.randn(shape, generator=generator, dtype=dtype)
    return h, s


def _blend_module(kind: BlendKind, channels: int, dtype: torch.dtype = torch.float32) -> Blend:
    torch.manual_seed(0)
    module = Blend(kind, channels, dtype=dtype)
    if module.gate is not None:
        with torch.no_grad():  # a gate far from 0.5 everywhere, so a wrong formula cannot hide
            for parameter in module.gate.parameters():
                parameter.add_(torch.randn_like(parameter))
    return module


def _zero_alphas(batch: int) -> list[AlphaLike]:
    return [0.0, torch.tensor(0.0), torch.zeros(batch), -0.3, torch.full((batch,), -2.0)]


@pytest.mark.parametrize("kind", list(BlendKind))
@pytest.mark.parametrize("layout", list(SHAPES))
def test_every_blend_is_exactly_the_identity_at_alpha_zero(kind: BlendKind, layout: str) -> None:
    shape = SHAPES[layout]
    h, s = _pair(shape)
    channels = shape[1] if layout == "image" else shape[-1]
    blend = _blend_module(kind, channels)
    for alpha in _zero_alphas(shape[0]):
        assert torch.equal(blend(h, s, alpha), h)


@pytest.mark.parametrize("kind", list(BlendKind))
def test_alpha_is_clamped_to_unit_interval(kind: BlendKind) -> None:
    h, s = _pair(IMAGE_SHAPE)
    blend = _blend_module(kind, IMAGE_SHAPE[1])
    assert torch.equal(blend(h, s, 3.0), blend(h, s, 1.0))
    assert torch.equal(blend(h, s, torch.tensor(1.5)), blend(h, s, torch.tensor(1.0)))
    per_sample = blend(h, s, torch.tensor([-1.0, 0.5, 7.0]))
    assert torch.equal(per_sample, blend(h, s, torch.tensor([0.0, 0.5, 1.0])))


def test_gate_is_clamped_to_unit_interval() -> None:
    h, s = _pair(SEQUENCE_SHAPE)
    assert torch.equal(gate_blend(h, s, 1.0, torch.full((3, 6, 1), 4.0)), gate_blend(h, s, 1.0, torch.ones(3, 6, 1)))
    assert torch.equal(gate_blend(h, s, 1.0, torch.full((3, 6, 1), -4.0)), h)


BLEND_FUNCTIONS: dict[str, Callable[[Tensor, Tensor, AlphaLike], Tensor]] = {
    "add": add_blend,
    "multiply": multiply_blend,
    "gate": lambda h, s, alpha: gate_blend(h, s, alpha, torch.full(h.shape[:1] + (1,) * (h.dim() - 1), 0.7)),
}


@pytest.mark.parametrize("name", list(BLEND_FUNCTIONS))
@pytest.mark.parametrize("alpha", [0.5, torch.tensor(0.5), torch.tensor([0.2, 0.5, 0.9], dtype=torch.float32)])
def test_result_has_the_dtype_of_h(name: str, alpha: AlphaLike) -> None:
    h, _ = _pair(IMAGE_SHAPE, dtype=torch.float64)
    s = torch.randn(IMAGE_SHAPE, dtype=torch.float32)
    assert BLEND_FUNCTIONS[name](h, s, alpha).dtype == torch.float64
    h16 = h.to(torch.bfloat16)
    assert BLEND_FUNCTIONS[name](h16, s, alpha).dtype == torch.bfloat16


def test_blend_module_result_has_the_dtype_of_h() -> None:
    h, _ = _pair(SEQUENCE_SHAPE, dtype=torch.float64)
    s = torch.randn(SEQUENCE_SHAPE, dtype=torch.float32)
    for kind in BlendKind:
        assert _blend_module(kind, SEQUENCE_SHAPE[-1], torch.float64)(h, s, 0.5).dtype == torch.float64


def test_add_oracle() -> None:
    h = torch.tensor([1.0, 2.0, -4.0], dtype=torch.float64)
    s = torch.tensor([3.0, -2.0, -4.0], dtype=torch.float64)
    # h + 0.5 (s - h): 1 + 1, 2 - 2, -4 + 0
    assert torch.equal(add_blend(h, s, 0.5), torch.tensor([2.0, 0.0, -4.0], dtype=torch.float64))
    assert torch.equal(add_blend(h, s, 1.0), s)


def test_multiply_oracle() -> None:
    h = torch.tensor([1.0, 2.0, -3.0], dtype=torch.float64)
    s = torch.tensor([2.0, 2.0, -4.0], dtype=torch.float64)
    # h (1 + 0.5 tanh(s - h)): tanh(1), tanh(0) = 0, tanh(-1)
    expected = [1.0 + 0.5 * math.tanh(1.0), 2.0, -3.0 * (1.0 - 0.5 * math.tanh(1.0))]
    assert multiply_blend(h, s, 0.5).tolist() == pytest.approx(expected, abs=1e-15)


def test_gate_oracle() -> None:
    h = torch.tensor([[1.0, 2.0], [0.0, 4.0]], dtype=torch.float64)
    s = torch.tensor([[3.0, 2.0], [2.0, 0.0]], dtype=torch.float64)
    gate = torch.tensor([[0.5], [0.25]], dtype=torch.float64)
    # h + alpha g (s - h) with alpha 0.5: row 0 scale 0.25, row 1 scale 0.125
    expected = torch.tensor([[1.5, 2.0], [0.25, 3.5]], dtype=torch.float64)
    assert torch.equal(gate_blend(h, s, 0.5, gate), expected)


@pytest.mark.parametrize("kind", list(BlendKind))
@pytest.mark.parametrize("layout", list(SHAPES))
def test_per_sample_alpha_matches_one_call_per_sample(kind: BlendKind, layout: str) -> None:
    shape = SHAPES[layout]
    h, s = _pair(shape, seed=3)
    channels = shape[1] if layout == "image" else shape[-1]
    blend = _blend_module(kind, channels)
    alphas = [0.0, 0.4, 1.0]
    fused = blend(h, s, torch.tensor(alphas))
    for i, alpha in enumerate(alphas):
        single = blend(h[i : i + 1], s[i : i + 1], alpha)
        torch.testing.assert_close(fused[i : i + 1], single, rtol=0, atol=1e-6)
    assert torch.equal(fused[0], h[0])


def test_gate_is_per_sample_for_images() -> None:
    torch.manual_seed(1)
    gate = BlendGate(4)
    h = torch.randn(IMAGE_SHAPE)
    values = gate(h)
    assert values.shape == (3, 1, 1, 1)
    assert bool(((values > 0) & (values < 1)).all())
    changed = h.clone()
    changed[1] += 5.0
    after = gate(changed)
    assert torch.equal(after[0], values[0]) and torch.equal(after[2], values[2])
    assert not torch.equal(after[1], values[1])


def test_gate_is_per_position_and_causal_for_sequences() -> None:
    torch.manual_seed(2)
    blend = Blend(BlendKind.GATE, 4)
    assert blend.gate is not None
    h, s = _pair(SEQUENCE_SHAPE, seed=4)
    gate_values = blend.gate(h)
    assert gate_values.shape == (3, 6, 1)
    later = h.clone()
    later[:, 4:] += 3.0  # change tokens 4 and 5 only
    new_values = blend.gate(later)
    assert torch.equal(new_values[:, :4], gate_values[:, :4])
    assert not torch.equal(new_values[:, 4:], gate_values[:, 4:])
    assert torch.equal(blend(later, s, 0.8)[:, :4], blend(h, s, 0.8)[:, :4])


def test_only_gate_blend_has_parameters() -> None:
    assert list(Blend(BlendKind.ADD, 8).parameters()) == []
    assert list(Blend(BlendKind.MULTIPLY, 8).parameters()) == []
    # Linear(8, 4) + Linear(4, 1): the hidden width is max(4, channels / 4)
    assert sum(p.numel() for p in Blend(BlendKind.GATE, 8).parameters()) == (8 * 4 + 4) + (4 * 1 + 1)


def test_gate_is_per_sample_for_channels_first_sequences() -> None:
    """A 1D CNN activation [N, C, L] is 3-D like a token sequence, but pooled per sample over its length."""
    torch.manual_seed(3)
    blend = Blend(BlendKind.GATE, 4, channel_dim=1)
    assert blend.gate is not None
    h, s = _pair((3, 4, 10), seed=5)
    values = blend.gate(h)
    assert values.shape == (3, 1, 1)
    changed = h.clone()
    changed[1, :, 7] += 5.0  # one position of sample 1
    after = blend.gate(changed)
    assert torch.equal(after[0], values[0]) and torch.equal(after[2], values[2])
    assert not torch.equal(after[1], values[1])
    torch.testing.assert_close(blend(h, s, 0.0), h, rtol=0, atol=0)


def test_gate_rejects_an_unknown_channel_dim() -> None:
    with pytest.raises(ValueError, match="channel_dim"):
        BlendGate(4, channel_dim=2)
