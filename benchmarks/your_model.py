"""Growth on models a user writes: a CIFAR-style ResNet and an MLP grown through the public API.

- `resnet`: a ResNet-20 of the CIFAR layout (3 stages of 3 residual blocks) at a quarter of its usual width
  (4/8/16 channels instead of 16/32/64), on scikit-learn's digits resized to 32x32x3 tensors; slots after
  each of its 9 residual blocks, grown by depth: the heuristic puts a `conv_wide` seed (a residual block
  with 4x the slot's channels inside) into every empty slot at once (`[heuristic] depth_blueprint`), the
  inner width a residual stage cannot be widened by in place. `resnet_branch` grows a `branch_wide` seed
  beside every block instead (reading the block's input, adding to its output: `morphogen.core.branch`), and
  `resnet_inside` a `wider_inside` seed inside every block (its two convolutions four times as wide between
  them: `morphogen.core.width`); `resnet_inside_early` grows it at epoch 2 (`warmup_epochs = 1`,
  `first_growth_by = 0.05`) rather than when the validation loss slows down, and `resnet_inside_late` after
  17 of the 30 epochs (`warmup_epochs = 17`, `first_growth_by = 0.55`), where 17 host epochs and 13 wide ones
  would cost about 0.6 of the wide network's 30 before any measuring (measured: 0.67, README).
  `resnet_by_seeds` is the same ResNet grown seed by seed by the default heuristic, with slots after each
  stage (`--models resnet_by_seeds`).
- `mlp`: a two-hidden-layer MLP (width 32) on MNIST-1D's 40-sample signals as flat vectors; slots after
  each hidden layer, grown seed by seed by the default heuristic. `mlp_early` grows its first seed at epoch 2
  and `mlp_late` after half the episode (the same settings as the ResNet's); `mlp_branch_all` grows a
  `branch_wide` seed beside both hidden layers at once (`depth_blueprint = "branch_wide"`), and
  `mlp_branch_all_late` does so after half the episode (as the `grow_for_compute` preset grows the built-in
  CNNs).
- `cnn1d`: a user's small 1-D CNN (two convolution-ReLU-pool stages of 8 and 16 channels, then a linear layer)
  on MNIST-1D's signals; slots after each ReLU, grown by the default heuristic (its first seed `branch_wide`,
  then by growth signal). `cnn1d_by_signal` lets the signals choose the first seed too (`first_seed = ""`, the
  default before 2026-11-28), `cnn1d_branch_all` grows `branch_wide` beside both convolutions at once.
- `cnn2d`: the same design in 2-D (4 and 8 channels) on the digits task's 8x8 images; `cnn2d_branch_first`
  names its first seed `branch_wide` (`first_seed`), which the default now does too, and `cnn2d_by_signal`
  lets the growth signals choose it (`first_seed = ""`).
- `regression`: an MLP (10-16-16-1) with a regression's own loss, the mean squared error, on scikit-learn's
  Friedman #1 problem (`make_friedman1`: 10 uniform inputs, 5 of them in a nonlinear target, noise 1.0; 3,000
  training and 1,000 validation samples, the target standardized by the training split's mean and std); slots
  after each hidden layer, the default heuristic and gates, which judge a task with its own loss by the share
  of its validation loss a seed removes. Its table compares validation losses, paired by seed as relative
  changes (`--criterion score`: judged by its score, the negated loss, in points, as before 2026-11-28).
  `friedman2` and `friedman3` (4 inputs, noise-free) and `linear_regression` (a linear target with noise, where
  no capacity is needed) grow the same network on the other problems, inputs standardized too.
- `padded`: a model of two inputs, token ids and a padding mask that every block reads (`PaddedClassifier`: an
  embedding, two pre-norm attention blocks of width 16 that ignore padding, a mean over the real tokens and a
  linear head) on generated padded sequences (`padded_sequences`: 3 to 16 tokens of 16, then padding of random
  tokens, 1s among them; the class is the number of 1s among the real tokens, modulo 3); slots after each block;
  AdamW, as `grow` trains a user's transformer. The heuristic grows copies of both blocks (`block_copy`);
  `padded_zero_blocks` grows zero-initialised morphogen blocks (`block`) instead, as before a user's own block
  could be copied.
- `encoder`: the same classifier built on torch's `nn.TransformerEncoder` (`EncoderClassifier`), slots after its
  two layers; the heuristic grows copies of them.
- `padded_flat`: the same classifier written by hand (`FlatClassifier`): its layers in lists, the residual sums
  and a functional dropout (0.1, `training=self.training`) in the model's forward; slots after each attention
  and each MLP, which sit after their residual sums; the heuristic grows copies of those sub-blocks.
- `unet`: a small U-Net (`UNet`: two levels down, the middle, two up, each block two 3x3 convolutions with
  batch norms, width 4; 3,536 parameters) segmenting 16x16 scenes of shapes in noise (`shape_scenes`: two of a
  filled square, a ring and a cross, equally bright; every pixel's class is its shape, or the background), with
  the cross-entropy over the pixels' 4 scores as its own loss and the share of pixels right as its metric; slots
  after all five blocks, the inner four crossed by its skips (`carry_skips=True`). `unet_inside` grows as the
  `wider_inside_blocks` preset does: new channels between the two convolutions of every block, two epochs in
  (with `--schedule cosine --criterion loss`, the preset's other settings). `--fixed-widths 6,8 --fixed-model
  unet` trains it wider without growth.
- `tcn_inside`: the temporal convolution network of Bai et al. (`TemporalConvNet`: three causal residual blocks
  of 8 channels, dilations 1, 2 and 4, weight-normed convolutions whose right padding a `Chomp1d` trims, ReLU and
  dropout between them), classifying 48-step noisy sines by their frequency band (`frequency_bands`: four bands,
  2,400 training and 600 validation signals) from its last step; slots after its blocks, grown as the
  `wider_inside_blocks` preset grows (run it with `--schedule cosine --criterion loss --epochs 8`): new channels
  between each block's convolutions, through the same trim.

Each is made a host by `morphogen.host_from_module` and grown by `morphogen.grow` with the heuristic
(defaults but for the settings named above) and strict gates, next to the same host without growth and the
grown model's final architecture from scratch (each seed's own initialisation, data order and batch order).
Printed per model:
accuracy, loss, parameters, training FLOPs (mean) and wall time (mean ± std over seeds), the paired
differences (mean ± standard error) and the grown run's training FLOPs over its final architecture's from
scratch. Jobs run in `--jobs` processes of one torch thread each.

`--fixed-widths 8,16` also trains the ResNet at those base widths without growth (same data, epochs and
seeds): how much accuracy more capacity can buy on this task at all, the room growth has to work in; with
`--fixed-model mlp`, the MLP at those hidden widths. With `--models ''` only those run, paired with the width
the benchmark grows from when it is among them.

`--schedule cosine` decays the learning rates over the 30 epochs (`[episode.optimizer] schedule`); at the
default constant rate the ResNet's accuracy swings by points from one epoch to the next up to the last.
`--criterion loss` has the gates and the heuristic judge seeds by validation loss instead of accuracy points
(`[episode.slots.gates] criterion`). The default judges a classifier by accuracy points (`score`), as the
README's rows without `--criterion` were measured, though `morphogen run` and `grow` now judge a classifier by
its loss, and leaves a model with a loss of its own to its task's criterion (the regressions' `relative_loss`;
the U-Net's cross-entropy in nats since 2026-12-01, before which it too was judged by `relative_loss`).
"""

from __future__ import annotations

import dataclasses
import io
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

import morphogen
from arguments import BenchmarkParser, count, run_script, whole_numbers
from morphogen.commands.run import RunConfig
from morphogen.control.controller import NoGrowthController
from morphogen.core.lifecycle import Criterion
from morphogen.data import load_task
from morphogen.data.catalog import TOPOLOGY_OPTIMIZERS
from morphogen.env.episode import MorphogenesisEpisode, task_with_host
from morphogen.env.optimizer import SCHEDULES, OptimizerConfig
from morphogen.env.play import run_episode
from morphogen.inputs import Inputs, take_rows
from morphogen.paired_statistics import format_mean_error, format_mean_std
from morphogen.ui.units import format_flops

VARIANTS = ("grown", "no growth", "from scratch")
#: The ResNet's base width as the benchmark grows it: a quarter of the CIFAR paper's 16.
HOST_WIDTH = 4


#: Convolution and batch norm per number of spatial dimensions: the ResNet on images (2) or on signals (1).
_LAYERS: dict[int, tuple[type[nn.Conv1d | nn.Conv2d], type[nn.BatchNorm1d | nn.BatchNorm2d]]] = {
    1: (nn.Conv1d, nn.BatchNorm1d), 2: (nn.Conv2d, nn.BatchNorm2d)}


class BasicBlock(nn.Module):
    """The residual block of the CIFAR ResNets; `inner` channels between its convolutions (default: as many as
    it outputs); `dims` 1 for signals [N, C, L]."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, inner: int | None = None,
                 dims: int = 2) -> None:
        super().__init__()
        conv, norm = _LAYERS[dims]
        inner = inner or out_channels
        self.conv1 = conv(in_channels, inner, 3, stride, 1, bias=False)
        self.bn1 = norm(inner)
        self.conv2 = conv(inner, out_channels, 3, 1, 1, bias=False)
        self.bn2 = norm(out_channels)
        self.shortcut: nn.Module = nn.Sequential()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(conv(in_channels, out_channels, 1, stride, bias=False), norm(out_channels))

    def forward(self, x: Tensor) -> Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet-(6n+2) of the CIFAR paper layout: stem, stages of width w, 2w, 4w, global pooling, linear; each
    block `expansion` times wider inside (benchmarks/late_width.py). `dims=1, in_channels=1`: the same on
    MNIST-1D's signals."""

    def __init__(self, width: int = HOST_WIDTH, blocks: int = 3, num_classes: int = 10, expansion: int = 1,
                 dims: int = 2, in_channels: int = 3) -> None:
        super().__init__()
        conv, norm = _LAYERS[dims]
        self.dims = dims
        self.stem = nn.Sequential(conv(in_channels, width, 3, padding=1, bias=False), norm(width), nn.ReLU())
        self.layer1 = self._stage(width, width, blocks, 1, expansion, dims)
        self.layer2 = self._stage(width, 2 * width, blocks, 2, expansion, dims)
        self.layer3 = self._stage(2 * width, 4 * width, blocks, 2, expansion, dims)
        self.fc = nn.Linear(4 * width, num_classes)

    @staticmethod
    def _stage(in_channels: int, out_channels: int, blocks: int, stride: int, expansion: int,
               dims: int) -> nn.Sequential:
        inner = expansion * out_channels
        return nn.Sequential(BasicBlock(in_channels, out_channels, stride, inner, dims),
                             *(BasicBlock(out_channels, out_channels, 1, inner, dims) for _ in range(blocks - 1)))

    def forward(self, x: Tensor) -> Tensor:
        x = self.layer3(self.layer2(self.layer1(self.stem(x))))
        pooled = (nn.functional.adaptive_avg_pool2d(x, 1) if self.dims == 2
                  else nn.functional.adaptive_avg_pool1d(x, 1))
        return self.fc(torch.flatten(pooled, 1))


def resnet1d(width: int = 2 * HOST_WIDTH) -> CifarResNet:
    """The CIFAR-layout ResNet-20 on MNIST-1D's [N, 1, 40] signals (stages at lengths 40, 20, 10)."""
    return CifarResNet(width=width, dims=1, in_channels=1)


def mlp(inputs: int = 40, hidden: int = 32, classes: int = 10) -> nn.Sequential:
    return nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, classes))


def cnn1d(channels: int = 8, length: int = 40, classes: int = 10) -> nn.Sequential:
    """Two convolution-ReLU-pool stages and a linear classifier over [N, 1, length] signals."""
    return nn.Sequential(nn.Conv1d(1, channels, 5, padding=2), nn.ReLU(), nn.MaxPool1d(2),
                         nn.Conv1d(channels, 2 * channels, 5, padding=2), nn.ReLU(), nn.MaxPool1d(2),
                         nn.Flatten(), nn.Linear(2 * channels * (length // 4), classes))


def cnn2d(channels: int = 4, classes: int = 10) -> nn.Sequential:
    """Two convolution-ReLU-pool stages and a linear classifier over the digits task's [N, 1, 8, 8] images."""
    return nn.Sequential(nn.Conv2d(1, channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(2 * channels * 4, classes))


Split = tuple[tuple[Inputs, Tensor], tuple[Inputs, Tensor]]


def task_tensors(name: str, inputs: Callable[[Tensor], Tensor] = lambda x: x) -> Split:
    """Built-in task `name`'s (training inputs, targets), (validation inputs, targets), `inputs` applied."""
    task = load_task(name)
    return ((inputs(task.train.inputs), task.train.targets),
            (inputs(task.validation.inputs), task.validation.targets))


def digits_images() -> Split:
    return task_tensors("digits")


def mnist1d_signals() -> Split:
    return task_tensors("mnist1d")


def digits_32x32x3() -> Split:
    """The digits task's standardized 8x8 images, resized to 32x32 (bilinear) and repeated on 3 channels."""
    return task_tensors("digits", lambda images: nn.functional.interpolate(
        images, size=32, mode="bilinear", align_corners=False).repeat(1, 3, 1, 1))


def mnist1d_flat() -> Split:
    return task_tensors("mnist1d", lambda signals: signals.flatten(1))


def friedman1() -> Split:
    """scikit-learn's Friedman #1 regression (4,000 samples, noise 1.0, drawn once), targets standardized by the
    3,000 training samples' mean and std."""
    from sklearn.datasets import make_friedman1

    features, target = make_friedman1(n_samples=4000, noise=1.0, random_state=0)
    return _regression_split(features, target, standardize_inputs=False)


def other_regression(kind: str) -> Callable[[], Split]:
    """scikit-learn's Friedman #2 or #3 (noise-free) or a linear problem (`make_regression`: 10 inputs, 5 used,
    noise 10), 4,000 samples drawn once; inputs and targets standardized by the 3,000 training samples."""

    def split() -> Split:
        from sklearn import datasets

        if kind == "linear":
            features, target = datasets.make_regression(n_samples=4000, n_features=10, n_informative=5,
                                                        noise=10.0, random_state=0)
        else:
            features, target = getattr(datasets, f"make_{kind}")(n_samples=4000, noise=0.0, random_state=0)
        return _regression_split(features, target, standardize_inputs=True)

    return split


def _regression_split(features: object, target: object, *, standardize_inputs: bool) -> Split:
    """The first 3,000 samples train, the last 1,000 validate; standardized by the training split."""
    x = torch.tensor(features, dtype=torch.float32)
    y = torch.tensor(target, dtype=torch.float32).unsqueeze(1)  # (N, 1)
    if standardize_inputs:
        x = (x - x[:3000].mean(0)) / x[:3000].std(0)
    y = (y - y[:3000].mean()) / y[:3000].std()
    return (x[:3000], y[:3000]), (x[3000:], y[3000:])


class PaddedBlock(nn.Module):
    """Pre-norm block over padded sequences: self-attention that ignores padding (`key_padding_mask`), an MLP."""

    def __init__(self, width: int, heads: int = 2) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x: Tensor, padding: Tensor) -> Tensor:
        h = self.norm1(x)
        x = x + self.attention(h, h, h, key_padding_mask=padding, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class PaddedClassifier(nn.Module):
    """A model of two inputs, as a text classifier takes them: token ids [N, T] and a padding mask [N, T] (True:
    padding), which every block reads; class scores [N, C] from the mean over the real tokens."""

    def __init__(self, vocab: int = 8, width: int = 16, classes: int = 3, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(PaddedBlock(width) for _ in range(layers))
        self.head = nn.Linear(width, classes)

    def forward(self, ids: Tensor, padding: Tensor) -> Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x, padding)
        keep = (~padding).unsqueeze(-1).to(x.dtype)
        return self.head((x * keep).sum(1) / keep.sum(1).clamp_min(1.0))


class EncoderClassifier(nn.Module):
    """The padded-sequence classifier built on torch's own `nn.TransformerEncoder` (pre-norm layers, 2 heads, a 2x
    MLP, no dropout), the padding mask read by every layer."""

    def __init__(self, vocab: int = 16, width: int = 16, classes: int = 3, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, 2, 2 * width, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, classes)

    def forward(self, ids: Tensor, padding: Tensor) -> Tensor:
        x = self.encoder(self.embed(ids), src_key_padding_mask=padding)
        keep = (~padding).unsqueeze(-1).to(x.dtype)
        return self.head((x * keep).sum(1) / keep.sum(1).clamp_min(1.0))


class FlatClassifier(nn.Module):
    """The padded-sequence classifier as many write it by hand: its layers in lists, the residual sums and the
    dropout (`training=self.training`) in the model's own forward, not in block modules."""

    def __init__(self, vocab: int = 16, width: int = 16, classes: int = 3, layers: int = 2,
                 dropout: float = 0.1) -> None:
        super().__init__()
        self.embed, self.dropout = nn.Embedding(vocab, width), dropout
        self.attention_norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(layers))
        self.attentions = nn.ModuleList(nn.MultiheadAttention(width, 2, batch_first=True) for _ in range(layers))
        self.mlp_norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(layers))
        self.mlps = nn.ModuleList(nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
                                  for _ in range(layers))
        self.head = nn.Linear(width, classes)

    def forward(self, ids: Tensor, padding: Tensor) -> Tensor:
        x = self.embed(ids)
        layers = zip(self.attention_norms, self.attentions, self.mlp_norms, self.mlps, strict=True)
        for attention_norm, attention, mlp_norm, mlp in layers:
            h = attention_norm(x)
            attended, _ = attention(h, h, h, key_padding_mask=padding, need_weights=False)
            x = x + nn.functional.dropout(attended, self.dropout, training=self.training)
            x = x + nn.functional.dropout(mlp(mlp_norm(x)), self.dropout, training=self.training)
        keep = (~padding).unsqueeze(-1).to(x.dtype)
        return self.head((x * keep).sum(1) / keep.sum(1).clamp_min(1.0))


def double_conv(channels_in: int, channels_out: int) -> nn.Sequential:
    """A U-Net's block: two 3x3 convolutions, each with a batch norm and a ReLU."""
    return nn.Sequential(nn.Conv2d(channels_in, channels_out, 3, padding=1), nn.BatchNorm2d(channels_out), nn.ReLU(),
                         nn.Conv2d(channels_out, channels_out, 3, padding=1), nn.BatchNorm2d(channels_out), nn.ReLU())


class UNet(nn.Module):
    """A small U-Net (Ronneberger et al. 2015): two levels down, the middle, two up, each level's output joined to
    the way up by a skip (concatenated); scores per pixel, [N, classes, H, W]."""

    def __init__(self, channels: int = 1, width: int = 4, classes: int = 3) -> None:
        super().__init__()
        self.down1, self.down2 = double_conv(channels, width), double_conv(width, 2 * width)
        self.middle = double_conv(2 * width, 2 * width)
        self.up2, self.up1 = double_conv(4 * width, width), double_conv(2 * width, width)
        self.head = nn.Conv2d(width, classes, 1)

    def forward(self, x: Tensor) -> Tensor:
        d1 = self.down1(x)
        d2 = self.down2(nn.functional.max_pool2d(d1, 2))
        m = self.middle(nn.functional.max_pool2d(d2, 2))
        u2 = self.up2(torch.cat([nn.functional.interpolate(m, scale_factor=2.0), d2], 1))
        u1 = self.up1(torch.cat([nn.functional.interpolate(u2, scale_factor=2.0), d1], 1))
        return self.head(u1)


def shape_scenes(count: int, seed: int, size: int = 16) -> tuple[Tensor, Tensor]:
    """`count` scenes [N, 1, size, size] in noise, each with two of three shapes (a filled square, a ring, a cross;
    sides 4 to 6) at random places, the second drawn over the first; every pixel's class is the shape it is on
    (1-3) or the background (0), [N, size, size]. All shapes are equally bright: only their form tells them
    apart."""
    generator = torch.Generator().manual_seed(seed)
    scenes = 0.3 * torch.randn(count, 1, size, size, generator=generator)
    masks = torch.zeros(count, size, size, dtype=torch.long)
    for i in range(count):
        for kind in torch.randperm(3, generator=generator)[:2].tolist():
            side = int(torch.randint(4, 7, (1,), generator=generator))
            row, column = torch.randint(0, size - side + 1, (2,), generator=generator).tolist()
            window = masks[i, row:row + side, column:column + side]  # a view: drawing into it draws the scene
            if kind == 0:
                window[:] = 1
            elif kind == 1:
                window[0, :] = window[-1, :] = window[:, 0] = window[:, -1] = 2
            else:
                window[side // 2, :] = window[:, side // 2] = 3
    scenes[:, 0] += (masks > 0).float()
    return scenes, masks


def shape_segmentation() -> Split:
    """2,000 training and 500 validation scenes (`shape_scenes`): 4 classes per pixel, 87% of them background."""
    return shape_scenes(2000, 0), shape_scenes(500, 1)


def padded_sequences(count: int, seed: int, vocab: int = 8, length: int = 10) -> tuple[tuple[Tensor, Tensor], Tensor]:
    """((ids, padding), labels): sequences of 3 to `length` real tokens, then padding; every position, padding
    too, holds token 1 with probability 1/4 and another token otherwise, so a model that ignores the mask is
    misled. The label is the number of 1s among the real tokens, modulo 3."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, vocab, (count, length), generator=generator)
    ids[torch.rand(count, length, generator=generator) < 0.25] = 1
    lengths = torch.randint(3, length + 1, (count,), generator=generator)
    padding = torch.arange(length)[None, :] >= lengths[:, None]
    labels = ((ids == 1) & ~padding).sum(1) % 3
    return (ids, padding), labels


def padded() -> Split:
    """4,000 training and 1,000 validation padded sequences (`padded_sequences`, 16 tokens of a vocabulary of 16)."""
    return padded_sequences(4000, 0, vocab=16, length=16), padded_sequences(1000, 1, vocab=16, length=16)


class Chomp1d(nn.Module):
    """Trims the right padding a causal convolution added (`chomp` positions)."""

    def __init__(self, chomp: int) -> None:
        super().__init__()
        self.chomp = chomp

    def forward(self, x: Tensor) -> Tensor:
        return x[:, :, :-self.chomp].contiguous()


class TemporalBlock(nn.Module):
    """Two dilated causal convolutions (weight-normed, each trimmed, ReLU and dropout after), a residual around."""

    def __init__(self, channels_in: int, channels: int, dilation: int, kernel: int = 3, dropout: float = 0.1) -> None:
        super().__init__()
        padding = (kernel - 1) * dilation
        norm = nn.utils.parametrizations.weight_norm
        self.net = nn.Sequential(
            norm(nn.Conv1d(channels_in, channels, kernel, padding=padding, dilation=dilation)), Chomp1d(padding),
            nn.ReLU(), nn.Dropout(dropout),
            norm(nn.Conv1d(channels, channels, kernel, padding=padding, dilation=dilation)), Chomp1d(padding),
            nn.ReLU(), nn.Dropout(dropout))
        self.downsample = nn.Conv1d(channels_in, channels, 1) if channels_in != channels else None

    def forward(self, x: Tensor) -> Tensor:
        residual = x if self.downsample is None else self.downsample(x)
        return torch.relu(self.net(x) + residual)


class TemporalConvNet(nn.Module):
    """Three temporal blocks (dilations 1, 2, 4) and a linear layer on the last step."""

    def __init__(self, channels: int = 8, classes: int = 4) -> None:
        super().__init__()
        self.blocks = nn.Sequential(TemporalBlock(1, channels, 1), TemporalBlock(channels, channels, 2),
                                    TemporalBlock(channels, channels, 4))
        self.head = nn.Linear(channels, classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.blocks(x)[:, :, -1])


def frequency_bands(count: int = 3000, length: int = 48, seed: int = 0) -> Split:
    """Noisy sines [N, 1, length] classified by which of four frequency bands they are in; 4/5 for training."""
    generator = torch.Generator().manual_seed(seed)
    classes = torch.randint(0, 4, (count,), generator=generator)
    frequency = (classes.float() + 1) * 0.08 + 0.02 * torch.rand(count, generator=generator)
    phase = 6.28 * torch.rand(count, 1, generator=generator)
    steps = torch.arange(length).float()
    signals = torch.sin(frequency[:, None] * steps * 3.14 + phase) + 0.6 * torch.randn(count, length,
                                                                                         generator=generator)
    cut = count * 4 // 5
    return (signals[:cut, None], classes[:cut]), (signals[cut:, None], classes[cut:])


def scene_unet(width: int = 4) -> UNet:
    """The U-Net at `width` on `shape_scenes`: one channel in, 4 classes per pixel."""
    return UNet(channels=1, width=width, classes=4)


def regression_mlp(inputs: int = 10, hidden: int = 16) -> nn.Sequential:
    """Two hidden layers of `hidden` ReLU units and one output."""
    return nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, 1))


@dataclass(frozen=True)
class Model:
    data: Callable[[], tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]]
    module: Callable[[], nn.Module]
    slots: tuple[str, ...]
    batch_size: int
    #: `[heuristic]` settings that differ from the defaults.
    heuristic: tuple[tuple[str, str | int | float], ...] = ()
    #: The model's own loss (None: cross-entropy, a classifier judged by accuracy).
    loss: Callable[[Tensor, Tensor], Tensor] | None = None
    #: Classes of a classifier (chance accuracy is 100 / classes).
    classes: int = 10
    #: `[episode.optimizer]` settings over SGD's defaults (the `--schedule` given is kept).
    optimizer: tuple[tuple[str, object], ...] = ()
    #: Whether values cross the slots (a U-Net's skips): `host_from_module(..., carry_skips=True)`.
    carry_skips: bool = False
    #: The model's own metric and its name (None: accuracy for a classifier, the negated loss for a loss of its own).
    metric: Callable[[Tensor, Tensor], Tensor] | None = None
    metric_name: str | None = None


#: The ResNet's residual blocks by name (`layer1.0` ... `layer3.2`): where its slots are when it grows by depth.
RESNET_BLOCKS = tuple(f"layer{stage}.{block}" for stage in (1, 2, 3) for block in range(3))
#: Those of its blocks that map their input to the same shape (not the first of stages 2 and 3, which downsample):
#: where a copy of the block can follow it.
SHAPE_KEEPING_BLOCKS = tuple(name for name in RESNET_BLOCKS if name not in ("layer2.0", "layer3.0"))
#: The U-Net's five blocks: a slot after each, the inner four crossed by its skips.
UNET_BLOCKS = ("down1", "down2", "middle", "up2", "up1")


def pixel_accuracy(outputs: Tensor, targets: Tensor) -> Tensor:
    """The share of pixels whose highest score is their class, in percent: scores [N, C, H, W], classes [N, H, W]."""
    return (outputs.argmax(1) == targets).float().mean() * 100
MODELS = {
    "resnet": Model(digits_32x32x3, CifarResNet, RESNET_BLOCKS, 64, (("depth_blueprint", "conv_wide"),)),
    "resnet_branch": Model(digits_32x32x3, CifarResNet, RESNET_BLOCKS, 64, (("depth_blueprint", "branch_wide"),)),
    "resnet_inside": Model(digits_32x32x3, CifarResNet, RESNET_BLOCKS, 64, (("depth_blueprint", "wider_inside"),)),
    "resnet_inside_early": Model(digits_32x32x3, CifarResNet, RESNET_BLOCKS, 64, (
        ("depth_blueprint", "wider_inside"), ("warmup_epochs", 1), ("first_growth_by", 0.05))),
    "resnet_inside_late": Model(digits_32x32x3, CifarResNet, RESNET_BLOCKS, 64, (
        ("depth_blueprint", "wider_inside"), ("warmup_epochs", 17), ("first_growth_by", 0.55))),
    "resnet_by_seeds": Model(digits_32x32x3, CifarResNet, ("layer1", "layer2", "layer3"), 64),
    "resnet1d": Model(mnist1d_signals, resnet1d, RESNET_BLOCKS, 100),
    # Stacking: a copy of every block that keeps its input's shape is grafted after it, at epoch 2, or after half
    # the epochs and kept if it lowers the validation loss at all (as the grow_for_compute preset does).
    "resnet1d_copy_early": Model(mnist1d_signals, resnet1d, SHAPE_KEEPING_BLOCKS, 100, (
        ("depth_blueprint", "block_copy"), ("warmup_epochs", 1), ("first_growth_by", 0.05))),
    "resnet1d_copy_late": Model(mnist1d_signals, resnet1d, SHAPE_KEEPING_BLOCKS, 100, (
        ("depth_blueprint", "block_copy"), ("warmup_epochs", 15), ("first_growth_by", 0.5),
        ("loss_fossilize_threshold", 0.0))),
    "mlp": Model(mnist1d_flat, mlp, ("1", "3"), 100),
    "mlp_early": Model(mnist1d_flat, mlp, ("1", "3"), 100, (("warmup_epochs", 1), ("first_growth_by", 0.05))),
    "mlp_late": Model(mnist1d_flat, mlp, ("1", "3"), 100, (("warmup_epochs", 15), ("first_growth_by", 0.5))),
    "mlp_branch_all": Model(mnist1d_flat, mlp, ("1", "3"), 100, (("depth_blueprint", "branch_wide"),)),
    "mlp_branch_all_late": Model(mnist1d_flat, mlp, ("1", "3"), 100, (
        ("depth_blueprint", "branch_wide"), ("warmup_epochs", 15), ("first_growth_by", 0.5),
        ("loss_fossilize_threshold", 0.0))),
    "cnn1d": Model(mnist1d_signals, cnn1d, ("1", "4"), 100),
    "cnn1d_by_signal": Model(mnist1d_signals, cnn1d, ("1", "4"), 100, (("first_seed", ""),)),
    "cnn2d": Model(digits_images, cnn2d, ("1", "4"), 64),
    "cnn2d_branch_first": Model(digits_images, cnn2d, ("1", "4"), 64, (("first_seed", "branch_wide"),)),
    "cnn2d_by_signal": Model(digits_images, cnn2d, ("1", "4"), 64, (("first_seed", ""),)),
    "cnn1d_branch_all": Model(mnist1d_signals, cnn1d, ("1", "4"), 100, (("depth_blueprint", "branch_wide"),)),
    "padded": Model(padded, lambda: PaddedClassifier(vocab=16), ("blocks.0", "blocks.1"), 64, classes=3,
                    optimizer=tuple(TOPOLOGY_OPTIMIZERS["transformer"].items())),  # as grow trains a transformer
    "encoder": Model(padded, EncoderClassifier, ("encoder.layers.0", "encoder.layers.1"), 64, classes=3,
                     optimizer=tuple(TOPOLOGY_OPTIMIZERS["transformer"].items())),
    "padded_flat": Model(padded, FlatClassifier, ("attentions.0", "mlps.0", "attentions.1", "mlps.1"), 64, classes=3,
                         optimizer=tuple(TOPOLOGY_OPTIMIZERS["transformer"].items())),
    "padded_zero_blocks": Model(padded, lambda: PaddedClassifier(vocab=16), ("blocks.0", "blocks.1"), 64, classes=3,
                                optimizer=tuple(TOPOLOGY_OPTIMIZERS["transformer"].items()),
                                heuristic=(("depth_blueprint", "block"),)),  # zero-initialised blocks, not copies
    "regression": Model(friedman1, regression_mlp, ("1", "3"), 64, loss=nn.functional.mse_loss),
    # Pixel scores [N, 4, H, W]: the cross-entropy over dimension 1; slots after all five blocks, four of them
    # crossed by the skips.
    "unet": Model(shape_segmentation, scene_unet, UNET_BLOCKS, 64, loss=nn.functional.cross_entropy, carry_skips=True,
                  metric=pixel_accuracy, metric_name="pixel accuracy"),
    # The `wider_inside_blocks` preset's growth: new channels between the two convolutions of every block, two
    # epochs in (run it with `--schedule cosine --criterion loss`, the preset's other settings).
    "unet_inside": Model(shape_segmentation, scene_unet, UNET_BLOCKS, 64, (
        ("depth_blueprint", "wider_inside"), ("warmup_epochs", 1), ("first_growth_by", 0.05)),
        loss=nn.functional.cross_entropy, carry_skips=True, metric=pixel_accuracy, metric_name="pixel accuracy"),
    "tcn_inside": Model(frequency_bands, TemporalConvNet, ("blocks.0", "blocks.1", "blocks.2"), 64, (
        ("depth_blueprint", "wider_inside"), ("warmup_epochs", 1), ("first_growth_by", 0.05)), classes=4),
    "friedman2": Model(other_regression("friedman2"), lambda: regression_mlp(inputs=4), ("1", "3"), 64,
                       loss=nn.functional.mse_loss),
    "friedman3": Model(other_regression("friedman3"), lambda: regression_mlp(inputs=4), ("1", "3"), 64,
                       loss=nn.functional.mse_loss),
    "linear_regression": Model(other_regression("linear"), regression_mlp, ("1", "3"), 64,
                               loss=nn.functional.mse_loss),
}


@dataclass(frozen=True)
class Figures:
    accuracy: float
    loss: float
    parameters: int
    seconds: float
    flops: int
    """Training FLOPs: host and seeds forward and backward, shadow passes, validation and counterfactuals."""


#: The models `--fixed-widths` trains at other widths: the module at a width, and the width the benchmark grows.
FIXED_FAMILIES: dict[str, tuple[Callable[[int], nn.Module], int]] = {
    "resnet": (lambda width: CifarResNet(width=width), HOST_WIDTH),
    "resnet1d": (resnet1d, 2 * HOST_WIDTH),
    "mlp": (lambda width: mlp(hidden=width), 32),
    "cnn1d": (lambda width: cnn1d(channels=width), 8),
    "cnn2d": (lambda width: cnn2d(channels=width), 4),
    "regression": (lambda width: regression_mlp(hidden=width), 16),
    "padded": (lambda width: PaddedClassifier(vocab=16, width=width), 16),
    "unet": (lambda width: scene_unet(width=width), 4),
}


def task_and_host(name: str, width: int | None = None) -> tuple[morphogen.Task, Callable[[], morphogen.ModuleHost]]:
    """Model `name`'s task and a function that builds its host; `width` builds it at that width (a model of
    `FIXED_FAMILIES`)."""
    model = MODELS[name]
    train, validation = model.data()
    task = morphogen.task_from_data(name, train, validation, batch_size=model.batch_size, loss=model.loss,
                                    num_classes=None if model.loss else model.classes, metric=model.metric,
                                    metric_name=model.metric_name)
    example = take_rows(train[0], slice(0, 2))

    def host() -> morphogen.ModuleHost:  # called under the episode's seed: each seed its own initialisation
        module = model.module() if width is None else FIXED_FAMILIES[name][0](width)
        return morphogen.host_from_module(module, list(model.slots), example_input=example,
                                          carry_skips=model.carry_skips)

    return task, host


def mlp_task(seed: int = 0) -> tuple[morphogen.Task, Callable[[], morphogen.ModuleHost]]:
    """The `mlp` model as `--task your_model:mlp_task` takes it (from the benchmarks directory): a user's MLP
    on flat MNIST-1D signals, each episode building its own initialisation. `seed` is the command's."""
    return task_and_host("mlp")


def cnn1d_task(seed: int = 0) -> tuple[morphogen.Task, Callable[[], morphogen.ModuleHost]]:
    """The `cnn1d` model as `--task your_model:cnn1d_task` takes it: a user's small 1-D CNN on MNIST-1D."""
    return task_and_host("cnn1d")


def padded_task(seed: int = 0) -> tuple[morphogen.Task, Callable[[], morphogen.ModuleHost]]:
    """The `padded` model as `--task your_model:padded_task` takes it: a user's transformer of two inputs."""
    return task_and_host("padded")


def run_config(schedule: str, heuristic: Sequence[tuple[str, str | int | float]] = (),
               criterion: str | None = None, optimizer: Sequence[tuple[str, object]] = ()) -> RunConfig:
    """`morphogen run`'s settings with the learning-rate schedule `schedule` (the task's SGD otherwise), the
    `heuristic` settings (name, value) and the gates' `criterion` (None: the task's, validation loss for these
    classifiers)."""
    config = RunConfig()
    slots = config.episode.slots
    gates = dataclasses.replace(slots.gates, criterion=None if criterion is None else Criterion(criterion))
    settings: dict[str, Any] = {**dict(optimizer), "schedule": schedule}
    episode = dataclasses.replace(config.episode, optimizer=OptimizerConfig(**settings),
                                  slots=dataclasses.replace(slots, gates=gates))
    return dataclasses.replace(config, episode=episode, heuristic=dataclasses.replace(config.heuristic,
                                                                                      **dict(heuristic)))


def run_job(job: tuple[str, int, int, str, str | None]) -> tuple[str, int, dict[str, Figures], dict[str, str]]:
    name, seed, epochs, schedule, criterion = job
    if criterion is None:  # a classifier by accuracy points, as the README's rows were measured; a regression
        criterion = None if MODELS[name].loss else Criterion.SCORE.value  # by its task's criterion
    torch.set_num_threads(1)
    task, host = task_and_host(name)
    with tempfile.TemporaryDirectory() as root:
        result = morphogen.grow(task, host, epochs=epochs, seed=seed, run_dir=f"{root}/run", out=io.StringIO(),
                                config=run_config(schedule, MODELS[name].heuristic, criterion,
                                                  MODELS[name].optimizer))
    assert result.baseline is not None
    scratch = result.from_scratch or result.baseline  # nothing grown: the final architecture is the host
    figures = {variant: Figures(o.final_accuracy, o.final_loss, o.parameters, o.seconds, o.flops.total)
               for variant, o in zip(VARIANTS, (result.grown, result.baseline, scratch), strict=True)}
    return name, seed, figures, result.model.architecture()


def run_fixed(job: tuple[str, int, int, int, str]) -> tuple[int, int, Figures]:
    """Model `family` at width `width`, no growth, trained as `grow` trains its no-growth comparison."""
    family, width, seed, epochs, schedule = job
    torch.set_num_threads(1)
    task, host = task_and_host(family, width)
    config = dataclasses.replace(run_config(schedule, optimizer=MODELS[family].optimizer).episode, max_epochs=epochs)
    outcome = run_episode(MorphogenesisEpisode(task_with_host(task, host), config, seed=seed), NoGrowthController())
    return width, seed, Figures(outcome.final_accuracy, outcome.final_loss, outcome.parameters, outcome.seconds,
                                outcome.flops.total)


def print_fixed_widths(family: str, results: Sequence[tuple[int, int, Figures]],
                       grown: Sequence[tuple[str, int, dict[str, Figures], dict[str, str]]]) -> None:
    """Each fixed width's accuracy, and its paired gain over the width the benchmark grows (when it ran)."""
    print(f"\n{family} at fixed widths, no growth")
    host_width = FIXED_FAMILIES[family][1]
    regression = MODELS[family].loss is not None  # a loss of its own, on any scale: compared as relative losses

    def paired_figure(figures: Figures) -> float:
        return figures.loss if regression else figures.accuracy

    host = {r[1]: paired_figure(r[2]["no growth"]) for r in grown if r[0] == family}
    if not host:  # the growth runs were left out (--models ''): pair with the host's width when it was trained
        host = {seed: paired_figure(f) for w, seed, f in results if w == host_width}
    for width in sorted({r[0] for r in results}):
        figures = sorted(((seed, f) for w, seed, f in results if w == width), key=lambda pair: pair[0])
        digits = 4 if regression else 2
        score = format_mean_std([paired_figure(f) for _, f in figures], f">8.{digits}f", f"<6.{digits}f")
        line = (f"  width {width:<3}{score}{figures[0][1].parameters:>10,} "
                f"params{format_flops(statistics.fmean(f.flops for _, f in figures)):>12}"
                f"{statistics.fmean(f.seconds for _, f in figures):>8.0f} s")
        if MODELS[family].metric_name:  # the model's own metric beside its loss
            line += f"  {MODELS[family].metric_name} {statistics.fmean(f.accuracy for _, f in figures):.2f}"
        paired = [100 * (f.loss / host[seed] - 1) if regression else f.accuracy - host[seed]
                  for seed, f in figures if seed in host]
        if len(paired) >= 2:
            unit = "% validation loss" if regression else " points"
            line += f"   vs width {host_width} (the grown host), paired by seed: {format_mean_error(paired)}{unit}"
        print(line)


def print_table(name: str, results: Sequence[tuple[str, int, dict[str, Figures], dict[str, str]]]) -> None:
    print(f"\n{name} ({len(results)} seeds)")
    score = MODELS[name].metric_name or ("val -loss" if MODELS[name].loss else "val accuracy")
    print(f"  {'':14}{score:>18}{'val loss':>18}{'parameters':>14}{'FLOPs':>12}{'seconds':>14}")
    for variant in VARIANTS:
        figures = [r[2][variant] for r in results]
        accuracy = format_mean_std([f.accuracy for f in figures], ">10.2f", "<5.2f")
        losses = format_mean_std([f.loss for f in figures], *((">10.4g", "<5.2g") if MODELS[name].loss else
                                                              (">10.4f", "<5.3f")))
        seconds = format_mean_std([f.seconds for f in figures], ">8.1f", "<4.1f")
        print(f"  {variant:14}{accuracy}{losses}"
              f"{statistics.fmean(f.parameters for f in figures):>14,.0f}"
              f"{format_flops(statistics.fmean(f.flops for f in figures)):>12}{seconds}")
    for variant in VARIANTS:  # in seed order: how far apart runs land says what a mean of five can show
        by_seed = [f"{r[2][variant].loss:.4g}" if MODELS[name].loss else f"{r[2][variant].accuracy:.2f}"
                   for r in results]
        print(f"  {variant + ' by seed:':24}" + "  ".join(by_seed))
    for other in VARIANTS[1:]:
        if MODELS[name].loss:  # a loss of its own, on any scale: compared as the relative change of the loss
            changes = [100 * (r[2]["grown"].loss / r[2][other].loss - 1) for r in results]
            print(f"  grown vs {other}, validation loss: {format_mean_error(changes, '+.1f', '.1f')}% "
                  "(mean ± standard error)")
            continue
        differences = [r[2]["grown"].accuracy - r[2][other].accuracy for r in results]
        print(f"  grown - {other}: {format_mean_error(differences)} points (mean ± standard error)")
    ratios = [r[2]["grown"].flops / r[2]["from scratch"].flops for r in results]
    print(f"  grown / from scratch, training FLOPs: {statistics.fmean(ratios):.2f} (mean over seeds; "
          f"{min(ratios):.2f} to {max(ratios):.2f})")
    print("  final architectures: " + "; ".join(", ".join(f"{b}@{s}" for s, b in r[3].items()) or "-"
                                                for r in results))


def main(argv: Sequence[str] | None = None) -> None:
    parser = BenchmarkParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet,mlp")
    parser.add_argument("--seeds", type=count, default=5)
    parser.add_argument("--first-seed", type=int, default=0, help="seeds run from here (fresh seeds: 5)")
    parser.add_argument("--epochs", type=count, default=30)
    parser.add_argument("--jobs", type=count, default=2, help="worker processes, one torch thread each")
    parser.add_argument("--fixed-widths", type=whole_numbers(), default="",
                        help="also train a model at these widths, no growth")
    parser.add_argument("--fixed-model", default="resnet", choices=sorted(FIXED_FAMILIES),
                        help="the model --fixed-widths trains: the ResNet (base width), the MLP (hidden width) "
                             "or a small CNN, cnn1d or cnn2d (first stage's channels)")
    parser.add_argument("--schedule", default="constant", choices=SCHEDULES,
                        help="learning-rate schedule of host and seeds (the models train with SGD, lr 0.01)")
    parser.add_argument("--criterion", default=None, choices=[c.value for c in Criterion],
                        help="what the gates and the heuristic judge seeds by (default: accuracy points for a "
                             "classifier, the task's criterion for the regression)")
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.models.split(",") if name.strip()]
    unknown = [name for name in names if name not in MODELS]
    if unknown:
        parser.error(f"unknown model {', '.join(unknown)}; known: {', '.join(MODELS)}")
    widths = args.fixed_widths
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    jobs = [(name, seed, args.epochs, args.schedule, args.criterion) for name in names for seed in seeds]
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        fixed_jobs = [(args.fixed_model, width, seed, args.epochs, args.schedule) for width in widths for seed in seeds]
        fixed = pool.map(run_fixed, fixed_jobs)  # submitted now, beside the growth jobs
        results = list(pool.map(run_job, jobs))
        fixed_results = list(fixed)
    judged = f", gates judge by {args.criterion or 'score (a classifier) or the task criterion'}"
    print(f"your-model benchmark: {args.epochs} epochs, {args.schedule} learning rate{judged}, "
          f"seeds {seeds[0]}..{seeds[-1]}, {args.jobs} processes x 1 thread, "
          f"{time.perf_counter() - started:.0f} s in all")
    for name in names:
        print_table(name, [r for r in results if r[0] == name])
    if fixed_results:
        print_fixed_widths(args.fixed_model, fixed_results, results)


if __name__ == "__main__":
    run_script(main)
