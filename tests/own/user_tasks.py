"""Task functions as a user writes them for `morphogen run --task user_tasks:NAME` (tests/own on the path)."""

from __future__ import annotations

from collections import OrderedDict

import torch
from models import (
    PaddedClassifier,
    ResNet,
    TinyGPT,
    UNet,
    blobs,
    counting_sequences,
    mlp,
    padded_sequences,
    quadrant_images,
    shape_scenes,
)
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import morphogen
from morphogen import Task


def resnet(seed: int = 0) -> tuple[Task, morphogen.ModuleHost]:
    """A ResNet of the user's on image tensors; the host is returned beside the task."""
    train, validation = quadrant_images(192, seed), quadrant_images(96, 1000)
    task = morphogen.task_from_data("quadrants", train, validation, batch_size=32, num_classes=4)
    torch.manual_seed(seed)
    return task, morphogen.host_from_module(ResNet(), ["layer1", "layer2", "layer3"], example_input=train[0][:2])


def gpt() -> Task:
    """A GPT-like model over token ids, its data streamed by DataLoaders; the host inside the task."""
    train, validation = counting_sequences(192, 0), counting_sequences(64, 1)
    example = train[0][:2]
    return morphogen.task_from_data(
        "counting", DataLoader(TensorDataset(*train), batch_size=32, shuffle=True),
        DataLoader(TensorDataset(*validation), batch_size=64),
        host=lambda: morphogen.host_from_module(TinyGPT(), ["blocks.0", "blocks.1"], example_input=example))


def mlp_regression() -> Task:
    """An MLP with its own loss (mean squared error on one-hot targets) and metric (accuracy as a fraction)."""
    train, validation = blobs(192, 0), blobs(96, 1)

    def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(outputs, torch.nn.functional.one_hot(targets, 3).float())

    def hit_rate(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return (outputs.argmax(-1) == targets).float().mean()

    host = morphogen.host_from_module(mlp(), ["1", "3"], example_input=train[0][:2])
    return morphogen.task_from_data("blobs", TensorDataset(*train), TensorDataset(*validation), loss=loss,
                                    metric=hit_rate, metric_name="hit rate", host=host, batch_size=32)


def unet() -> Task:
    """A U-Net segmenting shapes, pixel by pixel: its skips cross the slots (`carry_skips=True`); its loss is the
    cross-entropy over dimension 1 and its metric the share of pixels right."""
    train, validation = shape_scenes(128, 0, size=12), shape_scenes(64, 1, size=12)

    def pixel_accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return (outputs.argmax(1) == targets).float().mean() * 100

    return morphogen.task_from_data(
        "shapes", train, validation, loss=torch.nn.functional.cross_entropy, metric=pixel_accuracy,
        metric_name="pixel accuracy", batch_size=32,
        host=lambda: morphogen.host_from_module(UNet(classes=4), ["down2", "middle", "up2"], example_input=train[0][:2],
                                                carry_skips=True))


def padded() -> Task:
    """A model of two inputs, token ids and a padding mask, its batches dicts by argument name from a DataLoader."""
    (ids, padding), labels = padded_sequences(256, 0)
    dicts = [({"ids": ids[i:i + 32], "padding": padding[i:i + 32]}, labels[i:i + 32]) for i in range(0, 256, 32)]
    example = {"ids": ids[:2], "padding": padding[:2]}
    return morphogen.task_from_data(
        "padded", dicts[:6], dicts[6:], num_classes=3,
        host=lambda: morphogen.host_from_module(PaddedClassifier(), ["blocks.0", "blocks.1"], example_input=example))


#: Named as a task function by `--task user_tasks:NOT_A_FUNCTION`, which must say it cannot be called.
NOT_A_FUNCTION = 42


def not_a_task() -> int:
    return 3


def raises() -> Task:
    raise RuntimeError("the dataset directory is missing")


def wrong_shapes() -> Task:
    """Inputs of 5 features for an MLP that takes 12: the first validation batch fails."""
    train = (torch.randn(64, 5), torch.randint(0, 3, (64,)))
    host = morphogen.host_from_module(mlp(), ["1"], example_input=torch.randn(2, 12))
    return morphogen.task_from_data("wrong", train, train, host=host)


def vector_loss() -> Task:
    """A loss that returns one value per sample instead of the batch mean."""
    train = blobs(64, 0)
    host = morphogen.host_from_module(mlp(), ["1"], example_input=train[0][:2])
    return morphogen.task_from_data("vector", train, train, host=host,
                                    loss=lambda outputs, targets: (outputs - outputs).sum(-1))


def nan_loss() -> Task:
    """A loss that is not a number (a log of a negative value, say)."""
    train = blobs(64, 0)
    host = morphogen.host_from_module(mlp(), ["1"], example_input=train[0][:2])
    return morphogen.task_from_data("nan", train, train, host=host,
                                    loss=lambda outputs, targets: outputs.mean() * float("nan"))


def escape_name() -> Task:
    """A task whose name holds a terminal escape sequence and a bidirectional override (a name from a config, say)."""
    train = blobs(64, 0)
    host = morphogen.host_from_module(mlp(), ["1"], example_input=train[0][:2])
    return morphogen.task_from_data("\x1b[2Jblobs\u202e", train, train, host=host)


#: The name of the submodule `escape_slot`'s slot follows: an escape sequence, Rich markup and a bidirectional override.
ESCAPE_SLOT = "\x1b[2J[/x]\u202e"


def escape_slot() -> Task:
    """An MLP whose slot, named by the submodule it follows, has an id of terminal escapes and Rich markup."""
    train = blobs(64, 0)
    layers = [nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 3)]
    net = nn.Sequential(OrderedDict(zip(("in", ESCAPE_SLOT, "out"), layers, strict=True)))
    host = morphogen.host_from_module(net, [ESCAPE_SLOT], example_input=train[0][:2])
    return morphogen.task_from_data("blobs", train, train, host=host)


def first_batch_beyond() -> Task:
    """A DataLoader whose first training batch holds class 7 of num_classes=3: streamed, so not read whole before
    training; the first batch that trains is checked."""
    inputs, labels = blobs(64, 0)
    labels[2] = 7
    host = morphogen.host_from_module(mlp(), ["1"], example_input=inputs[:2])
    return morphogen.task_from_data("beyond", DataLoader(TensorDataset(inputs, labels), batch_size=16), blobs(32, 1),
                                    num_classes=3, host=host)


def validation_beyond() -> Task:
    """A DataLoader validation split whose first batch holds class 7 of num_classes=3: streamed, so not read whole
    before training; the first validation checks its first batch."""
    inputs, labels = blobs(32, 1)
    labels[2] = 7
    host = morphogen.host_from_module(mlp(), ["1"], example_input=inputs[:2])
    return morphogen.task_from_data("beyond", blobs(64, 0), DataLoader(TensorDataset(inputs, labels), batch_size=16),
                                    num_classes=3, host=host)
