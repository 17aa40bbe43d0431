"""The layers of a pre-norm GPT: causal self-attention and the whole block (attention + MLP).

One home for both, because both a `TransformerHost` and the transformer seeds are made of them: the
`attention` seed is a `CausalSelfAttention`, and the `block` and `block_copy` seeds are whole
`TransformerBlock`s, the same class as the host's layers, so that a copy of a host layer loads into a
seed with `load_state_dict`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

Device = torch.device | str | None

#: Standard deviation of the GPT-2 initialisation of linear layers and embeddings.
GPT_INIT_STD = 0.02


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


class TransformerBlock(nn.Module):
    """Pre-norm GPT block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, d_model: int, n_heads: int, *, device: Device = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(d_model, device=device, dtype=dtype)
        self.attention = CausalSelfAttention(d_model, n_heads, device=device, dtype=dtype)
        self.mlp_norm = nn.LayerNorm(d_model, device=device, dtype=dtype)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model, device=device, dtype=dtype), nn.GELU(),
                                 nn.Linear(4 * d_model, d_model, device=device, dtype=dtype))

    @property
    def mlp_output(self) -> nn.Linear:
        """The MLP's output projection (a residual projection, scaled down at init)."""
        layer = self.mlp[2]
        assert isinstance(layer, nn.Linear)
        return layer

    @property
    def output_projections(self) -> tuple[nn.Linear, nn.Linear]:
        """The two layers that write into the residual stream: attention's and the MLP's output projections."""
        return self.attention.proj, self.mlp_output

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attention(self.attention_norm(x))
        mlp_out: Tensor = self.mlp(self.mlp_norm(x))
        return x + mlp_out


@torch.no_grad()
def init_gpt_(module: nn.Module, residual_std: float) -> None:
    """GPT-2's initialisation of every linear layer and embedding in `module`: weights N(0, 0.02), biases 0,
    and the blocks' output projections N(0, residual_std), so that the residual stream starts near unit scale."""
    for layer in module.modules():
        if isinstance(layer, (nn.Linear, nn.Embedding)):
            nn.init.normal_(layer.weight, std=GPT_INIT_STD)
        if isinstance(layer, nn.Linear) and layer.bias is not None:
            nn.init.zeros_(layer.bias)
    for block in module.modules():
        if isinstance(block, TransformerBlock):
            for projection in block.output_projections:
                nn.init.normal_(projection.weight, std=residual_std)
