"""Models a user would write, none of them morphogen's: a CIFAR-style ResNet, a GPT-like stack over token ids,
an MLP; with small generated data each can learn from, and settings that make the heuristic grow quickly."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import Tensor, nn

from morphogen import RunConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from morphogen.control.heuristic import HeuristicConfig
from morphogen.core.lifecycle import GateConfig, GateMode
from morphogen.core.slot import SlotConfig
from morphogen.env.episode import EpisodeConfig
from your_model import (  # noqa: F401  # re-exported for tests
    CifarResNet,
    PaddedBlock,
    PaddedClassifier,
    UNet,
    padded_sequences,
    shape_scenes,
)


def ResNet(width: int = 4, num_classes: int = 4, blocks: int = 1) -> nn.Module:
    """The CIFAR-layout ResNet of `benchmarks/your_model.py` (stem, three residual stages, pooling, linear)."""
    return CifarResNet(width=width, blocks=blocks, num_classes=num_classes)


class GPTBlock(PaddedBlock):
    """Pre-norm block: causal self-attention (torch's MultiheadAttention) and an MLP, each residual."""

    def forward(self, x: Tensor) -> Tensor:  # type: ignore[override]  # no padding: a causal mask instead
        t = x.shape[1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=1)
        h = self.norm1(x)
        x = x + self.attention(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    """Token ids [N, T] -> logits [N, T, V]: embeddings, a stack of blocks, a final norm and head."""

    def __init__(self, vocab: int = 8, width: int = 16, length: int = 12, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.zeros(1, length, width))
        self.blocks = nn.Sequential(*(GPTBlock(width) for _ in range(layers)))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: Tensor) -> Tensor:
        x = self.embed(ids) + self.position[:, :ids.shape[1]]
        return self.head(self.norm(self.blocks(x)))


def mlp(inputs: int = 12, hidden: int = 16, classes: int = 3) -> nn.Sequential:
    return nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, classes))


def quadrant_images(count: int, seed: int) -> tuple[Tensor, Tensor]:
    """[N, 3, 12, 12] noise with a bright quadrant; the class is the quadrant."""
    generator = torch.Generator().manual_seed(seed)
    images = 0.5 * torch.randn(count, 3, 12, 12, generator=generator)
    labels = torch.randint(0, 4, (count,), generator=generator)
    rows, columns = labels // 2, labels % 2
    for i in range(count):
        images[i, :, rows[i] * 6:(rows[i] + 1) * 6, columns[i] * 6:(columns[i] + 1) * 6] += 1.0
    return images, labels


def counting_sequences(count: int, seed: int, vocab: int = 8, length: int = 12) -> tuple[Tensor, Tensor]:
    """Token ids that count up modulo `vocab` from a random start; the target is the next token."""
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, vocab, (count, 1), generator=generator)
    ids = (starts + torch.arange(length + 1)) % vocab
    return ids[:, :-1], ids[:, 1:]


def blobs(count: int, seed: int, inputs: int = 12, classes: int = 3) -> tuple[Tensor, Tensor]:
    """Gaussian blobs around fixed class centres."""
    generator = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, inputs, generator=torch.Generator().manual_seed(99))
    labels = torch.randint(0, classes, (count,), generator=generator)
    return centres[labels] + 0.8 * torch.randn(count, inputs, generator=generator), labels


def eager_config(epochs: int = 5, **overrides: object) -> RunConfig:
    """Settings under which the heuristic germinates at once and a seed can blend in within a few epochs."""
    gates = GateConfig(mode=GateMode.PERMISSIVE, min_training_epochs=1)
    episode = EpisodeConfig(max_epochs=epochs, slots=SlotConfig(gates=gates, blend_epochs=3))
    # Every epoch counts as a plateau, whether the heuristic judges by score, by loss or by shares of the loss.
    heuristic = HeuristicConfig(warmup_epochs=0, plateau_epochs=1, plateau_threshold=1e9, loss_plateau_threshold=1e9,
                                relative_plateau_threshold=1e9, min_training_epochs=1)
    values: dict[str, object] = {"episode": episode, "heuristic": heuristic, "baseline": False,
                                 "from_scratch": False, **overrides}
    return RunConfig(**values)  # type: ignore[arg-type]
