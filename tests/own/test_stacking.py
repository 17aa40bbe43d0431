"""Stacking a user's own convolutional blocks: `block_copy` grafts a copy of the block before a slot, weights,
batch-norm statistics and all, where that block keeps its input's shape."""

from __future__ import annotations

import copy
import dataclasses
import io
import sys
from pathlib import Path

import pytest
import torch
from models import eager_config
from torch import Tensor, nn

import morphogen
from morphogen.core.model import MorphogeneticModel
from morphogen.model_file import load_model_state, read_model_file, save_model_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
from slot_driver import EASY_CONFIG


class Block(nn.Module):
    """A residual block of a user's ResNet; `stride` 2 halves the signal and doubles the channels."""

    def __init__(self, channels: int, stride: int = 1) -> None:
        super().__init__()
        out = channels * stride
        self.conv = nn.Sequential(nn.Conv1d(channels, out, 3, stride, 1, bias=False), nn.BatchNorm1d(out),
                                  nn.ReLU(), nn.Conv1d(out, out, 3, 1, 1, bias=False), nn.BatchNorm1d(out))
        self.shortcut = nn.Identity() if stride == 1 else nn.Conv1d(channels, out, 1, stride, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(self.conv(x) + self.shortcut(x))


class ResNet1d(nn.Module):
    def __init__(self, width: int = 4, classes: int = 3) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv1d(1, width, 3, padding=1), nn.ReLU())
        self.blocks = nn.Sequential(Block(width), Block(width), Block(width, stride=2))
        self.head = nn.Linear(2 * width, classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.blocks(self.stem(x)).mean(-1))


SLOTS = ["blocks.0", "blocks.1", "blocks.2"]


def _data(count: int, seed: int) -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(seed)
    signals = torch.randn(count, 1, 16, generator=generator)
    return signals, (signals[:, 0, :8].sum(1) > signals[:, 0, 8:].sum(1)).long() + (signals.mean((1, 2)) > 0.2).long()


def _trained_net() -> ResNet1d:
    """A net whose batch norms hold running statistics of their own (a copy must carry them)."""
    torch.manual_seed(0)
    net = ResNet1d()
    with torch.no_grad():
        for _ in range(3):
            net(_data(32, 1)[0])
    return net.eval()


def test_a_copy_stacks_each_block_that_keeps_its_shape_and_no_other(tmp_path: Path) -> None:
    net = _trained_net()
    x = _data(8, 2)[0]
    host = morphogen.host_from_module(net, SLOTS, example_input=x[:2])
    model = MorphogeneticModel(host, config=EASY_CONFIG).eval()
    assert [model.can_graft(slot_id, "block_copy") for slot_id in model.slot_ids] == [True, True, False]
    with pytest.raises(ValueError, match="'block_copy' copies the host's layer just before slot blocks_2"):
        model.germinate("blocks_2", "block_copy")
    deeper = copy.deepcopy(net)
    deeper.blocks = nn.Sequential(*(copy.deepcopy(b) for b in net.blocks[:2] for _ in range(2)), net.blocks[2])
    for slot_id in model.slot_ids[:2]:
        model.install(slot_id, "block_copy")  # in the output at alpha 1
    copied = model.slot("blocks_0").seed
    assert copied is not None and copied is not net.blocks[0]
    for (name, value), original in zip(copied.state_dict().items(), net.blocks[0].state_dict().values(), strict=True):
        assert torch.equal(value, original) and value.data_ptr() != original.data_ptr(), name  # running stats too
    with torch.no_grad():
        expected = deeper.eval()(x)
        torch.testing.assert_close(model(x), expected, rtol=0, atol=1e-5)
        path = tmp_path / "model.pt"
        save_model_file(model, path)
        restored = MorphogeneticModel(morphogen.host_from_module(ResNet1d(), SLOTS, example_input=x[:2]),
                                      config=EASY_CONFIG).eval()
        load_model_state(restored, read_model_file(path), path)
        torch.testing.assert_close(restored(x), expected, rtol=0, atol=1e-5)
        program = torch.export.load(morphogen.export_model(model, x[:2], tmp_path / "grown.pt2")).module()
        torch.testing.assert_close(program(x), expected, rtol=0, atol=1e-5)


def test_the_heuristic_grows_copies_of_a_users_blocks_where_they_fit(tmp_path: Path) -> None:
    train, validation = _data(96, 3), _data(48, 4)
    task = morphogen.task_from_data("signals", train, validation, num_classes=3, batch_size=32)
    config = eager_config(4)
    config = dataclasses.replace(config, heuristic=dataclasses.replace(config.heuristic, depth_blueprint="block_copy"))
    torch.manual_seed(0)
    host = morphogen.host_from_module(ResNet1d(), SLOTS[:2], example_input=train[0][:2])
    result = morphogen.grow(task, host, epochs=4, run_dir=str(tmp_path / "run"), config=config, out=io.StringIO(),
                            baseline=True)
    assert result.model.architecture() == {"blocks_0": "block_copy", "blocks_1": "block_copy"}
    assert result.grown.parameters > result.baseline.parameters  # type: ignore[union-attr]
