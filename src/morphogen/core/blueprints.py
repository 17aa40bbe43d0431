"""Blueprint registry: recipes for seeds, per host topology.

Every seed is shape-preserving and residual (`s = h + delta(h)`), and identity at birth: the last
layer of `delta` (or a ReZero-style output scale) starts at zero, so germinating a seed never
changes the host's function. Norms inside seeds are GroupNorm/LayerNorm, not BatchNorm: a seed
must behave the same whatever the batch composition, including the fused counterfactual batch. The one
exception widens a host's own BatchNorm: `wider_inside`'s new channels after a host BatchNorm get one of
their own (`morphogen.core.width.new_channel_norm`), batch-dependent in training only where the host is.

Topologies: "cnn" (images [N, C, H, W]), "cnn1d" (sequences [N, C, L]), "transformer" ([N, T, D]) and
"mlp" (features [N, F]); `register_blueprint` adds a user's own recipe to any of them.
The two convolutional topologies share one set of recipes, written once over the number of spatial
dimensions. Besides seeds of the slot's own width they have *widening* seeds (`widen_x2/x4/x8`,
inverted residuals with e*C hidden channels): on a narrow host a seed of the slot's width adds almost
no capacity, a widening one does (docs/architecture.md#blueprints-and-hosts).
"""

from __future__ import annotations

import copy
import enum
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from morphogen.core.branch import BRANCH_EXPANSION, BranchSite, NoBranchSiteError, wide_branch
from morphogen.core.hosts import SideInputs
from morphogen.core.transformer_layers import GPT_INIT_STD, CausalSelfAttention, TransformerBlock, init_gpt_
from morphogen.core.width import NoWidthSiteError, WidthSeed, WidthSite

Device = torch.device | str | None


class UnknownBlueprintError(ValueError):
    """A blueprint name or argument that the registry does not know."""


def _group_count(channels: int) -> int:
    return math.gcd(channels, 8)


def _zero_(module: nn.Module) -> nn.Module:
    for parameter in module.parameters():
        nn.init.zeros_(parameter)
    return module


#: Convolution class per number of spatial dimensions: 1 for sequences [N, C, L], 2 for images [N, C, H, W].
_CONV: dict[int, type[nn.Conv1d | nn.Conv2d]] = {1: nn.Conv1d, 2: nn.Conv2d}
#: Kernel of a seed's spatial convolutions per number of spatial dimensions. A 3x3 kernel sees one
#: neighbour each way in an image; along a sequence 5 taps see two each way, a comparable reach for
#: fewer weights than a 3x3's 9 (and the kernel of `Conv1dHost`'s own convolutions).
SPATIAL_KERNEL = {1: 5, 2: 3}
#: Expansion factors of the widening blueprints (`widen_x{e}`).
WIDENING_FACTORS = (2, 4, 8)

#: A convolutional seed recipe: (spatial dims, channels, device, dtype) -> seed module.
ConvRecipe = Callable[[int, int, Device, torch.dtype | None], nn.Module]


def _conv(dims: int, in_channels: int, out_channels: int, kernel_size: int, device: Device,
          dtype: torch.dtype | None, *, groups: int = 1) -> nn.Module:
    """A same-padded convolution over `dims` spatial dimensions (odd `kernel_size`), with bias."""
    return _CONV[dims](in_channels, out_channels, kernel_size, padding=kernel_size // 2, groups=groups,
                       device=device, dtype=dtype)


def _group_norm(channels: int, device: Device, dtype: torch.dtype | None) -> nn.GroupNorm:
    return nn.GroupNorm(_group_count(channels), channels, device=device, dtype=dtype)


class ScaledResidual(nn.Module):
    """`h + scale * body(h)` with a scale of shape `scale_shape` that starts at zero (ReZero)."""

    def __init__(self, body: nn.Module, scale_shape: Sequence[int], *, device: Device = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.body = body
        self.scale = nn.Parameter(torch.zeros(tuple(scale_shape), device=device, dtype=dtype))

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
    """Channel attention: `h * (1 + mlp(pool(h)))`, with the MLP's last layer zero-initialised.

    Works on [N, C, L] or [N, C, H, W] (`dims` = 1 or 2 spatial dimensions).
    """

    def __init__(self, channels: int, *, dims: int = 2, device: Device = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        hidden = max(4, channels // 4)
        self.spatial = tuple(range(2, 2 + dims))
        self.down = _conv(dims, channels, hidden, 1, device, dtype)
        self.up = _zero_(_conv(dims, hidden, channels, 1, device, dtype))

    def forward(self, h: Tensor) -> Tensor:
        pooled = h.mean(dim=self.spatial, keepdim=True)  # (N, C, 1) or (N, C, 1, 1)
        excitation: Tensor = self.up(torch.relu(self.down(pooled)))  # same shape as pooled
        return h * (1.0 + excitation)


def _preactivation_conv(dims: int, channels: int, device: Device, dtype: torch.dtype | None,
                        zero: bool) -> list[nn.Module]:
    """GroupNorm -> ReLU -> spatial conv; the last conv of a seed starts at zero so the seed is identity at birth."""
    conv = _conv(dims, channels, channels, SPATIAL_KERNEL[dims], device, dtype)
    return [_group_norm(channels, device, dtype), nn.ReLU(), _zero_(conv) if zero else conv]


# Convolutional seeds, written once for both spatial dimensionalities (`dims`); `_for_dims` below turns
# each into a registry builder for "cnn" (2D) or "cnn1d" (1D).

def _conv_norm(dims: int, channels: int, device: Device, dtype: torch.dtype | None) -> nn.Module:
    scale_shape = [1, channels, *([1] * dims)]  # broadcast over (N, ..., spatial)
    return ScaledResidual(NormDelta(_group_norm(channels, device, dtype)), scale_shape, device=device, dtype=dtype)


def _conv_attention(dims: int, channels: int, device: Device, dtype: torch.dtype | None) -> nn.Module:
    return SqueezeExcite(channels, dims=dims, device=device, dtype=dtype)


def _conv_depthwise(dims: int, channels: int, device: Device, dtype: torch.dtype | None) -> nn.Module:
    return Residual(nn.Sequential(
        _conv(dims, channels, channels, SPATIAL_KERNEL[dims], device, dtype, groups=channels),
        nn.ReLU(),
        _zero_(_conv(dims, channels, channels, 1, device, dtype)),
    ))


def _conv_bottleneck(dims: int, channels: int, device: Device, dtype: torch.dtype | None) -> nn.Module:
    width = max(8, channels // 4)
    return Residual(nn.Sequential(
        _conv(dims, channels, width, 1, device, dtype),
        nn.ReLU(),
        _conv(dims, width, width, SPATIAL_KERNEL[dims], device, dtype),
        nn.ReLU(),
        _zero_(_conv(dims, width, channels, 1, device, dtype)),
    ))


def _conv_small(dims: int, channels: int, device: Device, dtype: torch.dtype | None) -> nn.Module:
    return Residual(_zero_(_conv(dims, channels, channels, 1, device, dtype)))


def _conv_light(dims: int, channels: int, device: Device, dtype: torch.dtype | None) -> nn.Module:
    # Pre-activation order puts the zero-initialised conv last: unlike a zero output scale, it gets a
    # gradient from the first batch on, so the seed starts learning at once.
    return Residual(nn.Sequential(*_preactivation_conv(dims, channels, device, dtype, zero=True)))


def _conv_heavy(dims: int, channels: int, device: Device, dtype: torch.dtype | None) -> nn.Module:
    return Residual(nn.Sequential(*_preactivation_conv(dims, channels, device, dtype, zero=False),
                                  *_preactivation_conv(dims, channels, device, dtype, zero=True)))


#: Inner width of `conv_wide` as a multiple of the slot's channels.
WIDE_BLOCK_EXPANSION = 4


def _conv_wide(dims: int, channels: int, device: Device, dtype: torch.dtype | None) -> nn.Module:
    """A residual block as a ResNet's, with `WIDE_BLOCK_EXPANSION` times the slot's channels inside:
    `h + conv(relu(norm(conv(h))))`, the second conv zero so the seed is identity at birth.

    Grafted after every block of a narrow residual network (`[heuristic] depth_blueprint = "conv_wide"`), these
    add the inner width that a residual stage cannot be widened by in place (benchmarks/your_model.py).
    """
    hidden = WIDE_BLOCK_EXPANSION * channels
    kernel = SPATIAL_KERNEL[dims]
    return Residual(nn.Sequential(
        _conv(dims, channels, hidden, kernel, device, dtype),  # (N, e*C, ...)
        # One group, as for a width seed's new channels (core/width.py): the channels' relative means survive.
        nn.GroupNorm(1, hidden, device=device, dtype=dtype),
        nn.ReLU(),
        _zero_(_conv(dims, hidden, channels, kernel, device, dtype)),  # (N, C, ...)
    ))


def _widening(expansion: int) -> ConvRecipe:
    """Inverted residual (MobileNetV2) of expansion `expansion`: `h + down(act(mid(act(up(h)))))`.

    `up` is a 1x1 conv to e*C channels, `mid` a depthwise spatial conv, `down` a 1x1 conv back to C;
    GroupNorm follows `up` and `mid`. Only `down` starts at zero: the seed is identity at birth, and the
    gradient to `down` (the hidden activations times the loss gradient) is non-zero from the first batch,
    after which `up` and `mid` learn too. This is how growth widens a narrow host: the seed adds e*C
    hidden channels at the slot (in the spirit of Net2Net, GradMax and TINY) while the slot keeps C.
    """

    def build(dims: int, channels: int, device: Device, dtype: torch.dtype | None) -> nn.Module:
        hidden = expansion * channels
        return Residual(nn.Sequential(
            _conv(dims, channels, hidden, 1, device, dtype),  # (N, e*C, ...)
            _group_norm(hidden, device, dtype),
            nn.ReLU(),
            _conv(dims, hidden, hidden, SPATIAL_KERNEL[dims], device, dtype, groups=hidden),  # (N, e*C, ...)
            _group_norm(hidden, device, dtype),
            nn.ReLU(),
            _zero_(_conv(dims, hidden, channels, 1, device, dtype)),  # (N, C, ...)
        ))

    return build


def _for_dims(build: ConvRecipe, dims: int) -> Callable[..., nn.Module]:
    """A registry builder `(channels, *, device, dtype)` that builds `build`'s seed for `dims` spatial dims.

    A closure rather than `functools.partial`: `Blueprint.options` reads the builder's signature, and a
    partial would show `dims` as an option the user could set.
    """

    def builder(channels: int, *, device: Device = None, dtype: torch.dtype | None = None) -> nn.Module:
        return build(dims, channels, device, dtype)

    return builder


def transformer_norm(d_model: int, *, device: Device = None, dtype: torch.dtype | None = None) -> nn.Module:
    norm = nn.LayerNorm(d_model, device=device, dtype=dtype)
    return ScaledResidual(NormDelta(norm), [d_model], device=device, dtype=dtype)


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


SEED_HEADS = 4
"""Heads of a new `attention` or `block` seed where neither the layer before its slot nor the host's attention layers
give a count that splits its width (`heads_of`)."""


def seed_heads(d_model: int) -> int:
    """`SEED_HEADS` where it divides `d_model`, else the most heads below it that do (a user's width 18 gets 3): a
    seed on a width that 4 heads cannot split still grows."""
    return next(heads for heads in range(SEED_HEADS, 0, -1) if d_model % heads == 0)


def transformer_attention(d_model: int, *, n_heads: int | None = None, device: Device = None,
                          dtype: torch.dtype | None = None) -> nn.Module:
    """Pre-norm causal self-attention, its output projection zero (identity at birth); `n_heads` defaults to
    `seed_heads(d_model)` (in a slot, the host's count: `heads_of`)."""
    attention = CausalSelfAttention(d_model, seed_heads(d_model) if n_heads is None else n_heads, device=device,
                                    dtype=dtype)
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


def transformer_block(d_model: int, *, n_heads: int | None = None, device: Device = None,
                      dtype: torch.dtype | None = None) -> nn.Module:
    """A whole pre-norm block (causal attention + 4x MLP), GPT-initialised, its two output projections zero;
    `n_heads` defaults to `seed_heads(d_model)` (in a slot, the host's count: `heads_of`).

    Identity at birth: both residual branches add zero. A `block` in every slot of a host with a slot after
    each layer doubles its depth (2 -> 4 layers); zero-initialised new layers reached a from-scratch model's
    loss with 46.6% fewer tokens in Gstack (Du et al., 2024). The projections get a gradient from the first
    batch, and the rest of the block once they have moved off zero.
    """
    block = TransformerBlock(d_model, seed_heads(d_model) if n_heads is None else n_heads, device=device, dtype=dtype)
    init_gpt_(block, residual_std=GPT_INIT_STD)
    for projection in block.output_projections:
        _zero_(projection)
    return block


#: Attributes under which attention modules keep their head count: torch's `nn.MultiheadAttention` and Hugging
#: Face's GPT-2 attention (`num_heads`), morphogen's `CausalSelfAttention` (`n_heads`), nanoGPT's (`n_head`) and
#: BERT's (`num_attention_heads`); a module's `config` (a Hugging Face model's) is read for them as well.
_HEAD_COUNT_ATTRIBUTES = ("num_heads", "n_heads", "n_head", "num_attention_heads")


def layer_heads(layer: nn.Module | None) -> int | None:
    """The head count of the attention in `layer`, read off its modules and their configs; None where it holds
    none, or several that disagree (a guess would be no better than the default)."""
    if layer is None:
        return None
    counts = {value for module in layer.modules() for holder in (module, getattr(module, "config", None))
              for name in _HEAD_COUNT_ATTRIBUTES
              if isinstance(value := getattr(holder, name, None), int) and not isinstance(value, bool) and value > 0}
    return counts.pop() if len(counts) == 1 else None


def heads_of(layer: nn.Module | None, width: int, host_heads: int | None) -> dict[str, Any]:
    """`{"n_heads": ...}` for a new block or attention in a slot of `width`, so that it splits its width as the
    host's attention does: the one head count of the attention in the host's layer before the slot, else (no layer
    there, or one without attention) `host_heads`, the one count of all the host's attention layers (`layer_heads`
    of the host), the first of them that splits `width`; else `{}` (the default, `seed_heads`)."""
    heads = next((count for count in (layer_heads(layer), host_heads) if count is not None and width % count == 0),
                 None)
    return {} if heads is None else {"n_heads": heads}


def copy_of_layer(blueprint: str, layer: nn.Module, *, device: Device = None, dtype: torch.dtype | None = None,
                  **options: Any) -> nn.Module:
    """`layer` copied, weights and all, as a seed on `device` and `dtype`: stacking (Gstack), where a new layer
    starts as a trained neighbour. The copy reads what the host's layer reads beside its input (a mask) from the
    host's `SideInputs`, which it shares rather than copies. Raises `ValueError` for options that would change
    the copy (a head count other than the layer's)."""
    heads = layer_heads(layer)
    own = {} if heads is None else {"n_heads": heads}
    if options and options != own:
        raise ValueError(f"{blueprint!r} copies the layer before its slot ({type(layer).__name__} "
                         f"{own or ''}) as it is; options {options} would change it")
    shared: dict[int, Any] = {id(module): module for module in layer.modules() if isinstance(module, SideInputs)}
    seed = copy.deepcopy(layer, shared)
    if device is not None or dtype is not None:
        seed = seed.to(device=device, dtype=dtype)
    return seed.requires_grad_(True)


class BlueprintKind(enum.Enum):
    """How a seed grows the host."""

    DEEPEN = "deepen"
    """A module between two segments, shape-preserving: `builder(width, *, device, dtype)`."""
    WIDEN = "widen"
    """New channels of the layers around the slot (`morphogen.core.width`): `builder(site, *, device, dtype)`."""
    BRANCH = "branch"
    """A path beside the segment that ends at the slot (`morphogen.core.branch`): `builder(site, *, device,
    dtype)`."""


@dataclass(frozen=True)
class Blueprint:
    """A named seed recipe for one topology; `build(width, **options)` makes the module."""

    name: str
    topology: str
    builder: Callable[..., nn.Module]
    description: str
    kind: BlueprintKind = BlueprintKind.DEEPEN
    copies_layer_before: bool = False
    """The seed is a copy of the host's layer before its slot (`SegmentedHost.layer_before`), weights and all:
    stacking (`block_copy`). `builder` then only describes it where no host is at hand. Not the identity at
    birth."""
    options_from_host: Callable[[nn.Module | None, int, int | None], dict[str, Any]] | None = None
    """Options read off the host for those the caller does not give, from its layer before the slot (None where it
    has none), the slot's width and the head count of the host's attention layers (None where none, or several):
    a whole block or an attention takes the host's head count (`heads_of`)."""
    inside_only: bool = False
    """For a widening blueprint: it grows only a width site inside the segment before its slot (a residual
    block's inner width, `WidthSite.inside`), never the layers around a slot."""

    @property
    def identity_at_birth(self) -> bool:
        """Whether germinating this seed leaves the host's function unchanged (every blueprint but a copy)."""
        return not self.copies_layer_before

    @property
    def options(self) -> tuple[str, ...]:
        """Keyword arguments this blueprint accepts beyond width, device and dtype."""
        signature = inspect.signature(self.builder)
        return tuple(n for n, p in signature.parameters.items()
                     if p.kind is inspect.Parameter.KEYWORD_ONLY and n not in ("device", "dtype"))

    def build(self, width: int, *, device: Device = None, dtype: torch.dtype | None = None,
              site: WidthSite | BranchSite | None = None, **options: Any) -> nn.Module:
        """The seed for a slot of `width` channels; a widening or branch blueprint needs the slot's site of its
        kind (`SeedSlot.site_for`)."""
        unexpected = sorted(set(options) - set(self.options))
        if unexpected:
            accepted = ", ".join(self.options) or "none"
            raise UnknownBlueprintError(
                f"blueprint {self.name!r} got unexpected option(s) {', '.join(unexpected)}; accepted: {accepted}"
            )
        if self.kind is BlueprintKind.DEEPEN:
            return self.builder(width, device=device, dtype=dtype, **options)
        if self.kind is BlueprintKind.BRANCH:
            if not isinstance(site, BranchSite):
                raise NoBranchSiteError(f"blueprint {self.name!r} grows beside a segment: germinate it in a model's "
                                        "slot whose segment input was measured (morphogen.core.branch)")
            return self.builder(site, device=device, dtype=dtype, **options)
        if not isinstance(site, WidthSite):
            raise NoWidthSiteError(f"blueprint {self.name!r} widens the layers around a slot: germinate it in a "
                                   "model's slot that has them (morphogen.core.width)")
        return self.builder(site, device=device, dtype=dtype, **options)


def _widening_layers(fraction: float, *, batch_norm: bool = False) -> Callable[..., nn.Module]:
    """A widening builder adding `fraction` of the slot's channels (at least one) to the layers around it;
    `batch_norm` as in `WidthSeed`."""

    def builder(site: WidthSite, *, device: Device = None, dtype: torch.dtype | None = None) -> nn.Module:
        return WidthSeed(site, max(1, math.ceil(site.channels * fraction)), batch_norm=batch_norm, device=device,
                         dtype=dtype)

    return builder


def _widening_blueprints(topology: str) -> dict[str, Blueprint]:
    """Width growth of the layers around a slot, for the topologies whose hosts can have width sites; on a
    transformer, whose residual stream cannot widen locally, of the MLP inside the block before the slot."""
    if topology == "transformer":
        where, unit, has = "the MLP of the block before the slot gets", "neurons", "it has"
    else:
        unit = "neurons" if topology == "mlp" else "channels"
        where, has = "the layers around the slot get", "the slot has"
    return {
        "wider": Blueprint("wider", topology, _widening_layers(1.0), f"{where} as many new {unit} as {has}",
                           BlueprintKind.WIDEN),
        "wider_half": Blueprint("wider_half", topology, _widening_layers(0.5),
                                f"{where} half as many new {unit} as {has}", BlueprintKind.WIDEN),
    }


def _convolutional_blueprints(topology: str, dims: int) -> dict[str, Blueprint]:
    """The convolutional seeds for `dims` spatial dimensions; 1D descriptions name their kernel (kernel-5)."""
    spatial = "3x3" if dims == 2 else f"kernel-{SPATIAL_KERNEL[dims]}"
    recipes: list[tuple[str, ConvRecipe, str]] = [
        ("norm", _conv_norm, "group norm blended in by a zero-init scale"),
        ("attention", _conv_attention, "squeeze-and-excite channel attention"),
        ("depthwise", _conv_depthwise, f"depthwise {spatial} then pointwise 1x1"),
        ("bottleneck", _conv_bottleneck, f"1x1 down, {spatial}, 1x1 up (width max(8, C/4))"),
        ("conv_small", _conv_small, "one 1x1 convolution"),
        ("conv_light", _conv_light, f"one {spatial} conv, group norm, ReLU block"),
        ("conv_heavy", _conv_heavy, f"two {spatial} conv, group norm, ReLU blocks"),
    ]
    recipes += [(f"widen_x{e}", _widening(e), f"inverted residual: 1x1 up to {e}*C, depthwise {spatial}, 1x1 down")
                for e in WIDENING_FACTORS]
    recipes.append(("conv_wide", _conv_wide, f"residual block: {spatial} conv to {WIDE_BLOCK_EXPANSION}*C, group "
                                             f"norm, ReLU, {spatial} conv back to C"))
    return {name: Blueprint(name, topology, _for_dims(build, dims), description)
            for name, build, description in recipes}


def _residual_mlp_blueprints(topology: str, *, attention: bool) -> dict[str, Blueprint]:
    """Seeds over the last dimension: tokens [N, T, D] (`attention` adds causal self-attention) or features [N, F]."""
    blueprints = [
        Blueprint("norm", topology, transformer_norm, "layer norm blended in by a zero-init scale"),
        Blueprint("lora", topology, transformer_lora, "low-rank adapter, rank 8"),
        Blueprint("lora_large", topology, transformer_lora_large, "low-rank adapter, rank 32"),
        Blueprint("mlp_small", topology, transformer_mlp_small, "MLP with 2x hidden width"),
        Blueprint("mlp", topology, transformer_mlp, "MLP with 4x hidden width"),
    ]
    if attention:
        blueprints.insert(3, Blueprint("attention", topology, transformer_attention,
                                       "causal self-attention, as many heads as the layer before the slot (else "
                                       "the host's attention) has; else 4, fewer where 4 do not divide w",
                                       options_from_host=heads_of))
        blueprints += [
            Blueprint("block", topology, transformer_block,
                      "whole pre-norm block (attention + MLP), output projections zero: identity at birth",
                      options_from_host=heads_of),
            Blueprint("block_copy", topology, transformer_block,
                      "copy of the host's layer before the slot, weights and all (stacking; not identity at birth)",
                      copies_layer_before=True),
        ]
    return {b.name: b for b in blueprints}


def _inside_widening_blueprints(topology: str) -> dict[str, Blueprint]:
    """Width growth inside the block before a slot (listed last: earlier blueprints keep their ids)."""
    unit = "channels" if topology in ("cnn", "cnn1d") else "neurons"
    # What a residual block's inside gained most by in a plain loop (benchmarks/late_width.py, ResNet-20 at width
    # 4, new channels joining at epoch 6): 4x as wide, +0.94 +- 0.14 points; 2x as wide (`wider`), +0.67 +- 0.23.
    # The new channels are normalized as the block normalizes its own (a BatchNorm after a BatchNorm): joining at
    # epoch 1, +0.78 +- 0.10 so against +0.22 +- 0.16 with a GroupNorm.
    return {"wider_inside": Blueprint("wider_inside", topology, _widening_layers(3.0, batch_norm=True),
                                      f"the block before the slot gets three new {unit} per {unit[:-1]} between "
                                      "its layers: four times as wide inside", BlueprintKind.WIDEN, inside_only=True)}


def _branch_blueprints(topology: str) -> dict[str, Blueprint]:
    """Paths beside the segment before a slot, for the topologies whose segments a probe can measure."""
    unit = "features" if topology == "mlp" else "channels"
    return {"branch_wide": Blueprint("branch_wide", topology, wide_branch,
                                     f"path beside the segment before the slot, {BRANCH_EXPANSION}x its {unit} "
                                     "inside", BlueprintKind.BRANCH)}


def _copy_blueprint(topology: str, stand_in: Callable[..., nn.Module]) -> dict[str, Blueprint]:
    """Stacking for a user's own blocks (listed last: earlier blueprints keep their ids): a copy of the block before
    the slot, where it keeps the activation's shape (a residual block of a ResNet, not one that downsamples).
    `stand_in` only describes its size where no host is at hand."""
    return {"block_copy": Blueprint("block_copy", topology, stand_in,
                                    "copy of the host's layer before the slot, weights and all (stacking; not "
                                    "identity at birth; only where that layer keeps the shape)",
                                    copies_layer_before=True)}


_REGISTRY: dict[str, dict[str, Blueprint]] = {
    "cnn": {**_convolutional_blueprints("cnn", dims=2), **_widening_blueprints("cnn"), **_branch_blueprints("cnn"),
            **_inside_widening_blueprints("cnn"), **_copy_blueprint("cnn", _for_dims(_conv_heavy, 2))},
    "cnn1d": {**_convolutional_blueprints("cnn1d", dims=1), **_widening_blueprints("cnn1d"),
              **_branch_blueprints("cnn1d"), **_inside_widening_blueprints("cnn1d"),
              **_copy_blueprint("cnn1d", _for_dims(_conv_heavy, 1))},
    "transformer": {**_residual_mlp_blueprints("transformer", attention=True), **_widening_blueprints("transformer"),
                    **_inside_widening_blueprints("transformer")},
    "mlp": {**_residual_mlp_blueprints("mlp", attention=False), **_widening_blueprints("mlp"),
            **_branch_blueprints("mlp"), **_inside_widening_blueprints("mlp"),
            **_copy_blueprint("mlp", transformer_mlp)},
}
TOPOLOGIES = tuple(_REGISTRY)
"""Host topologies that have blueprints: "cnn" (images), "cnn1d" (sequences), "transformer" (tokens), "mlp"
(features)."""
CHANNEL_DIM = {"cnn": 1, "cnn1d": 1, "transformer": -1, "mlp": -1}
"""Where each topology's activations keep their channels: [N, C, H, W] and [N, C, L] first, [N, T, D] and [N, F]
last."""
#: The activation shape a registered blueprint is checked on, per topology, for a width C.
_PROBE_SHAPES: dict[str, Callable[[int], tuple[int, ...]]] = {
    "cnn": lambda c: (3, c, 5, 5), "cnn1d": lambda c: (3, c, 7), "transformer": lambda c: (3, 5, c),
    "mlp": lambda c: (3, c),
}
_PROBE_WIDTH = 16


def register_blueprint(topology: str, name: str, builder: Callable[..., nn.Module], description: str = "") -> None:
    """Add a seed recipe of your own: `builder(width, *, device=None, dtype=None, **options)` returns the module.

    Checked here, once, at width 16 on a random activation of the topology's layout: the seed must keep
    the shape, be the identity at birth (zero-initialise its last layer, as the built-in seeds do), have
    parameters to train, and hold no BatchNorm (seeds see fused counterfactual batches). Raises
    `UnknownBlueprintError` for an unknown topology or a name already taken, `ValueError` for a failed check.
    """
    _check_topology(topology)
    if not name or not name.isidentifier():
        raise ValueError(f"blueprint name must be an identifier (letters, digits, _), got {name!r}")
    if name in _REGISTRY[topology]:
        raise UnknownBlueprintError(f"{topology} blueprint {name!r} already exists; choose another name")
    blueprint = Blueprint(name, topology, builder, description or f"user blueprint {name}")
    seed = blueprint.build(_PROBE_WIDTH)
    if not isinstance(seed, nn.Module):
        raise ValueError(f"blueprint {name!r}: the builder returned {type(seed).__name__}, not an nn.Module")
    if any(isinstance(module, nn.modules.batchnorm._BatchNorm) for module in seed.modules()):
        raise ValueError(f"blueprint {name!r} holds a BatchNorm; use GroupNorm or LayerNorm (seeds see fused "
                         "counterfactual batches)")
    if not any(parameter.requires_grad for parameter in seed.parameters()):
        raise ValueError(f"blueprint {name!r} has no trainable parameters")
    probe = torch.randn(_PROBE_SHAPES[topology](_PROBE_WIDTH), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        output = seed.eval()(probe)
    if not isinstance(output, Tensor) or output.shape != probe.shape:
        shape = tuple(output.shape) if isinstance(output, Tensor) else type(output).__name__
        raise ValueError(f"blueprint {name!r} must keep the activation's shape {tuple(probe.shape)}, returned {shape}")
    if not torch.allclose(output, probe, atol=1e-6):
        raise ValueError(f"blueprint {name!r} is not the identity at birth (max change "
                         f"{(output - probe).abs().max().item():.3g}); zero-initialise its last layer")
    _REGISTRY[topology][name] = blueprint


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
               dtype: torch.dtype | None = None, site: WidthSite | BranchSite | None = None,
               **options: Any) -> nn.Module:
    """Build the seed module `name` for a slot of `width` channels (or d_model); a widening or branch one at
    `site`."""
    return get_blueprint(topology, name).build(width, device=device, dtype=dtype, site=site, **options)


def parameter_count(topology: str, name: str, width: int, *, site: WidthSite | BranchSite | None = None,
                    **options: Any) -> int:
    """Parameters a seed of this blueprint adds at this width, or at `site` for a widening or branch one (built
    on the meta device: no memory)."""
    seed = build_seed(topology, name, width, device="meta", site=site, **options)
    return sum(p.numel() for p in seed.parameters())


def registry_table(topology: str, width: int) -> list[tuple[str, int | None, str]]:
    """(name, parameter count at `width`, description) for every blueprint of a topology; the count of a
    widening or branch blueprint depends on the host's layers around the slot: None here (`morphogen list blueprints`
    shows it per slot of a task's host)."""
    _check_topology(topology)
    return [(b.name, parameter_count(topology, b.name, width) if b.kind is BlueprintKind.DEEPEN else None,
             b.description) for b in _REGISTRY[topology].values()]
