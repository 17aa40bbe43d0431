"""Blueprint registry: recipes for seeds, per host topology.

Every seed is shape-preserving and residual (`s = h + delta(h)`), and identity at birth: the last
layer of `delta` (or a ReZero-style output scale) starts at zero, so germinating a seed never
changes the host's function. Norms inside seeds are GroupNorm/LayerNorm, never BatchNorm: a seed
must behave the same whatever the batch composition, including the fused counterfactual batch.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

Device = torch.device | str | None


class UnknownBlueprintError(ValueError):
    """A blueprint name or argument that the registry does not know."""


def _group_count(channels: int) -> int:
    return math.gcd(channels, 8)


def _zero_(module: nn.Module) -> nn.Module:
    for parameter in module.parameters():
        nn.init.zeros_(parameter)
    return module


class ScaledResidual(nn.Module):
    """`h + scale * body(h)` with a per-channel scale that starts at zero (ReZero)."""

    def __init__(self, body: nn.Module, channels: int, channel_dim: int, *, device: Device = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.body = body
        shape = [1, channels, 1, 1] if channel_dim == 1 else [channels]
        self.scale = nn.Parameter(torch.zeros(shape, device=device, dtype=dtype))

    def forward(self, h: Tensor) -> Tensor:
        delta: Tensor = self.body(h)
        return h + self.scale * delta


class Residual(nn.Module):
    """`h + body(h)`; the body's last layer is zero-initialised by the builder."""

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, h: Tensor) -> Tensor:
        delta: Tensor = self.body(h)
        return h + delta


class NormDelta(nn.Module):
    """`norm(h) - h`: blended by a zero-init scale, the seed moves h towards its normalized form."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.norm = norm

    def forward(self, h: Tensor) -> Tensor:
        normalized: Tensor = self.norm(h)
        return normalized - h


class SqueezeExcite(nn.Module):
    """Channel attention: `h * (1 + mlp(pool(h)))`, with the MLP's last layer zero-initialised."""

    def __init__(self, channels: int, *, device: Device = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        hidden = max(4, channels // 4)
        self.down = nn.Conv2d(channels, hidden, 1, device=device, dtype=dtype)
        self.up = _zero_(nn.Conv2d(hidden, channels, 1, device=device, dtype=dtype))

    def forward(self, h: Tensor) -> Tensor:
        pooled = h.mean(dim=(2, 3), keepdim=True)  # (N, C, 1, 1)
        excitation: Tensor = self.up(torch.relu(self.down(pooled)))  # (N, C, 1, 1)
        return h * (1.0 + excitation)


def _preactivation_conv(channels: int, device: Device, dtype: torch.dtype | None, zero: bool) -> list[nn.Module]:
    """GroupNorm -> ReLU -> 3x3 conv; the last conv of a seed starts at zero so the seed is identity at birth."""
    conv = nn.Conv2d(channels, channels, 3, padding=1, device=device, dtype=dtype)
    return [
        nn.GroupNorm(_group_count(channels), channels, device=device, dtype=dtype),
        nn.ReLU(),
        _zero_(conv) if zero else conv,
    ]


def cnn_norm(channels: int, *, device: Device = None, dtype: torch.dtype | None = None) -> nn.Module:
    norm = nn.GroupNorm(_group_count(channels), channels, device=device, dtype=dtype)
    return ScaledResidual(NormDelta(norm), channels, 1, device=device, dtype=dtype)


def cnn_attention(channels: int, *, device: Device = None, dtype: torch.dtype | None = None) -> nn.Module:
    return SqueezeExcite(channels, device=device, dtype=dtype)


def cnn_depthwise(channels: int, *, device: Device = None, dtype: torch.dtype | None = None) -> nn.Module:
    return Residual(nn.Sequential(
        nn.Conv2d(channels, channels, 3, padding=1, groups=channels, device=device, dtype=dtype),
        nn.ReLU(),
        _zero_(nn.Conv2d(channels, channels, 1, device=device, dtype=dtype)),
    ))


def cnn_bottleneck(channels: int, *, device: Device = None, dtype: torch.dtype | None = None) -> nn.Module:
    width = max(8, channels // 4)
    return Residual(nn.Sequential(
        nn.Conv2d(channels, width, 1, device=device, dtype=dtype),
        nn.ReLU(),
        nn.Conv2d(width, width, 3, padding=1, device=device, dtype=dtype),
        nn.ReLU(),
        _zero_(nn.Conv2d(width, channels, 1, device=device, dtype=dtype)),
    ))


def cnn_conv_small(channels: int, *, device: Device = None, dtype: torch.dtype | None = None) -> nn.Module:
    return Residual(_zero_(nn.Conv2d(channels, channels, 1, device=device, dtype=dtype)))


def cnn_conv_light(channels: int, *, device: Device = None, dtype: torch.dtype | None = None) -> nn.Module:
    # Pre-activation order puts the zero-initialised conv last: unlike a zero output scale, it gets a
    # gradient from the first batch on, so the seed starts learning at once.
    return Residual(nn.Sequential(*_preactivation_conv(channels, device, dtype, zero=True)))


def cnn_conv_heavy(channels: int, *, device: Device = None, dtype: torch.dtype | None = None) -> nn.Module:
    return Residual(nn.Sequential(*_preactivation_conv(channels, device, dtype, zero=False),
                                  *_preactivation_conv(channels, device, dtype, zero=True)))


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention over [N, T, D] (scaled dot-product, fused where available)."""

    def __init__(self, d_model: int, n_heads: int, *, device: Device = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if n_heads < 1 or d_model % n_heads:
            raise ValueError(f"d_model {d_model} must be divisible by n_heads {n_heads} (n_heads >= 1)")
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model, device=device, dtype=dtype)
        self.proj = nn.Linear(d_model, d_model, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        n, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)  # 3 x (N, T, D)
        q, k, v = (z.view(n, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))  # (N, H, T, Dh)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # (N, H, T, Dh)
        projected: Tensor = self.proj(y.transpose(1, 2).reshape(n, t, d))  # (N, T, D)
        return projected


def transformer_norm(d_model: int, *, device: Device = None, dtype: torch.dtype | None = None) -> nn.Module:
    norm = nn.LayerNorm(d_model, device=device, dtype=dtype)
    return ScaledResidual(NormDelta(norm), d_model, -1, device=device, dtype=dtype)


def transformer_lora(d_model: int, *, rank: int = 8, device: Device = None,
                     dtype: torch.dtype | None = None) -> nn.Module:
    if rank < 1:
        raise ValueError(f"lora rank must be >= 1, got {rank}")
    return Residual(nn.Sequential(
        nn.Linear(d_model, rank, bias=False, device=device, dtype=dtype),
        _zero_(nn.Linear(rank, d_model, bias=False, device=device, dtype=dtype)),
    ))


def transformer_lora_large(d_model: int, *, device: Device = None, dtype: torch.dtype | None = None) -> nn.Module:
    return transformer_lora(d_model, rank=32, device=device, dtype=dtype)


def transformer_attention(d_model: int, *, n_heads: int = 4, device: Device = None,
                          dtype: torch.dtype | None = None) -> nn.Module:
    attention = CausalSelfAttention(d_model, n_heads, device=device, dtype=dtype)
    _zero_(attention.proj)
    return Residual(nn.Sequential(nn.LayerNorm(d_model, device=device, dtype=dtype), attention))


def _mlp(d_model: int, multiplier: int, device: Device, dtype: torch.dtype | None) -> nn.Module:
    return Residual(nn.Sequential(
        nn.LayerNorm(d_model, device=device, dtype=dtype),
        nn.Linear(d_model, multiplier * d_model, device=device, dtype=dtype),
        nn.GELU(),
        _zero_(nn.Linear(multiplier * d_model, d_model, device=device, dtype=dtype)),
    ))


def transformer_mlp_small(d_model: int, *, device: Device = None, dtype: torch.dtype | None = None) -> nn.Module:
    return _mlp(d_model, 2, device, dtype)


def transformer_mlp(d_model: int, *, device: Device = None, dtype: torch.dtype | None = None) -> nn.Module:
    return _mlp(d_model, 4, device, dtype)


@dataclass(frozen=True)
class Blueprint:
    """A named seed recipe for one topology; `build(width, **options)` makes the module."""

    name: str
    topology: str
    builder: Callable[..., nn.Module]
    description: str

    @property
    def options(self) -> tuple[str, ...]:
        """Keyword arguments this blueprint accepts beyond width, device and dtype."""
        signature = inspect.signature(self.builder)
        return tuple(n for n, p in signature.parameters.items()
                     if p.kind is inspect.Parameter.KEYWORD_ONLY and n not in ("device", "dtype"))

    def build(self, width: int, *, device: Device = None, dtype: torch.dtype | None = None,
              **options: Any) -> nn.Module:
        unexpected = sorted(set(options) - set(self.options))
        if unexpected:
            accepted = ", ".join(self.options) or "none"
            raise UnknownBlueprintError(
                f"blueprint {self.name!r} got unexpected option(s) {', '.join(unexpected)}; accepted: {accepted}"
            )
        return self.builder(width, device=device, dtype=dtype, **options)


TOPOLOGIES = ("cnn", "transformer")

_REGISTRY: dict[str, dict[str, Blueprint]] = {
    "cnn": {b.name: b for b in (
        Blueprint("norm", "cnn", cnn_norm, "group norm blended in by a zero-init scale"),
        Blueprint("attention", "cnn", cnn_attention, "squeeze-and-excite channel attention"),
        Blueprint("depthwise", "cnn", cnn_depthwise, "depthwise 3x3 then pointwise 1x1"),
        Blueprint("bottleneck", "cnn", cnn_bottleneck, "1x1 down, 3x3, 1x1 up (width max(8, C/4))"),
        Blueprint("conv_small", "cnn", cnn_conv_small, "one 1x1 convolution"),
        Blueprint("conv_light", "cnn", cnn_conv_light, "one 3x3 conv, group norm, ReLU block"),
        Blueprint("conv_heavy", "cnn", cnn_conv_heavy, "two 3x3 conv, group norm, ReLU blocks"),
    )},
    "transformer": {b.name: b for b in (
        Blueprint("norm", "transformer", transformer_norm, "layer norm blended in by a zero-init scale"),
        Blueprint("lora", "transformer", transformer_lora, "low-rank adapter, rank 8"),
        Blueprint("lora_large", "transformer", transformer_lora_large, "low-rank adapter, rank 32"),
        Blueprint("attention", "transformer", transformer_attention, "4-head causal self-attention"),
        Blueprint("mlp_small", "transformer", transformer_mlp_small, "MLP with 2x hidden width"),
        Blueprint("mlp", "transformer", transformer_mlp, "MLP with 4x hidden width"),
    )},
}


def _check_topology(topology: str) -> None:
    if topology not in _REGISTRY:
        raise UnknownBlueprintError(f"unknown topology {topology!r}; valid: {', '.join(TOPOLOGIES)}")


def blueprint_names(topology: str) -> tuple[str, ...]:
    """Blueprint names for a topology, in registry order (this order defines blueprint ids)."""
    _check_topology(topology)
    return tuple(_REGISTRY[topology])


def get_blueprint(topology: str, name: str) -> Blueprint:
    _check_topology(topology)
    try:
        return _REGISTRY[topology][name]
    except KeyError:
        valid = ", ".join(_REGISTRY[topology])
        raise UnknownBlueprintError(f"unknown {topology} blueprint {name!r}; valid: {valid}") from None


def build_seed(topology: str, name: str, width: int, *, device: Device = None,
               dtype: torch.dtype | None = None, **options: Any) -> nn.Module:
    """Build the seed module `name` for a slot of `width` channels (or d_model)."""
    return get_blueprint(topology, name).build(width, device=device, dtype=dtype, **options)


def parameter_count(topology: str, name: str, width: int, **options: Any) -> int:
    """Parameters a seed of this blueprint adds at this width (built on the meta device: no memory)."""
    seed = build_seed(topology, name, width, device="meta", **options)
    return sum(p.numel() for p in seed.parameters())


def registry_table(topology: str, width: int) -> list[tuple[str, int, str]]:
    """(name, parameter count at `width`, description) for every blueprint of a topology."""
    _check_topology(topology)
    return [(b.name, parameter_count(topology, b.name, width), b.description) for b in _REGISTRY[topology].values()]
