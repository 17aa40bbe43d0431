"""Blend operators: how a seed's output `s` is mixed into the host's activation `h` with weight alpha.

Every operator is the identity at alpha = 0, clamps alpha (and the gate) to [0, 1], and returns a
tensor in h's dtype. Alpha may be a Python float, a 0-dim tensor, or one value per sample (shape
[N]); the per-sample form powers the fused counterfactual pass, where K alpha configurations ride
in one batch of K*N samples.
"""

from __future__ import annotations

import enum

import torch
from torch import Tensor, nn


class BlendKind(enum.Enum):
    ADD = "add"
    MULTIPLY = "multiply"
    GATE = "gate"


AlphaLike = float | Tensor


def _broadcast_alpha(alpha: AlphaLike, h: Tensor) -> AlphaLike:
    """Clamp alpha to [0, 1]; a per-sample [N] alpha becomes [N, 1, ..., 1] to broadcast over h."""
    if isinstance(alpha, Tensor):
        alpha = alpha.to(dtype=h.dtype).clamp(0.0, 1.0)
        if alpha.dim() == 1:
            alpha = alpha.view(-1, *([1] * (h.dim() - 1)))  # (N, 1, ..., 1)
        return alpha
    return min(max(float(alpha), 0.0), 1.0)


def add_blend(h: Tensor, s: Tensor, alpha: AlphaLike) -> Tensor:
    """Linear interpolation `h + alpha (s - h)`; seeds are residual (s = h + delta), so this adds alpha*delta."""
    a = _broadcast_alpha(alpha, h)
    return (h + a * (s.to(h.dtype) - h)).to(h.dtype)


def multiply_blend(h: Tensor, s: Tensor, alpha: AlphaLike) -> Tensor:
    """Multiplicative modulation `h * (1 + alpha tanh(s - h))`: the seed rescales features within (0, 2)."""
    a = _broadcast_alpha(alpha, h)
    return (h * (1.0 + a * torch.tanh(s.to(h.dtype) - h))).to(h.dtype)


def gate_blend(h: Tensor, s: Tensor, alpha: AlphaLike, gate: Tensor) -> Tensor:
    """Gated interpolation `h + alpha g (s - h)` with a learned gate g in [0, 1] broadcastable to h."""
    a = _broadcast_alpha(alpha, h)
    g = gate.to(h.dtype).clamp(0.0, 1.0)
    return (h + a * g * (s.to(h.dtype) - h)).to(h.dtype)


class BlendGate(nn.Module):
    """Small learned gate g(h): pool -> MLP -> sigmoid.

    `channel_dim` says where the activation keeps its channels. Channels-first activations
    (`channel_dim=1`: images [N, C, H, W], CNN feature sequences [N, C, L]) get one gate per sample,
    pooled over every spatial dimension. Channels-last token sequences (`channel_dim=-1`: [N, T, D]) get
    one gate per position, not per sample: pooling over time would let later tokens steer the gate of
    earlier ones and break the causal language model. None tells the two apart by rank: 4-D inputs are
    images, others token sequences (a 3-D [N, C, L] input then needs `channel_dim=1`).
    """

    def __init__(self, channels: int, hidden: int | None = None, *, channel_dim: int | None = None,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if channel_dim not in (None, 1, -1):
            raise ValueError(f"channel_dim must be 1 (channels first), -1 (channels last) or None, got {channel_dim}")
        self.channel_dim = channel_dim
        hidden = hidden or max(4, channels // 4)
        self.net = nn.Sequential(
            nn.Linear(channels, hidden, device=device, dtype=dtype),
            nn.ReLU(),
            nn.Linear(hidden, 1, device=device, dtype=dtype),
        )

    def forward(self, h: Tensor) -> Tensor:
        channels_first = self.channel_dim == 1 or (self.channel_dim is None and h.dim() == 4)
        if channels_first:
            pooled = h.flatten(2).mean(dim=2)  # (N, C)
            return torch.sigmoid(self.net(pooled)).view(-1, *([1] * (h.dim() - 1)))  # (N, 1, ..., 1)
        return torch.sigmoid(self.net(h))  # (N, T, 1)


class Blend(nn.Module):
    """A blend operator as a module (holds the learned gate for `GATE`)."""

    def __init__(self, kind: BlendKind, channels: int, *, channel_dim: int | None = None,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.kind = kind
        self.gate = (BlendGate(channels, channel_dim=channel_dim, device=device, dtype=dtype)
                     if kind is BlendKind.GATE else None)

    def forward(self, h: Tensor, s: Tensor, alpha: AlphaLike) -> Tensor:
        if self.kind is BlendKind.ADD:
            return add_blend(h, s, alpha)
        if self.kind is BlendKind.MULTIPLY:
            return multiply_blend(h, s, alpha)
        assert self.gate is not None
        return gate_blend(h, s, alpha, self.gate(h))
