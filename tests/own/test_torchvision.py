"""torchvision's `resnet18`, as a user brings it: grown and exported through the public API.

torchvision has no build that imports beside the CPU torch the Makefile installs, so this test runs only where
torchvision is installed (with a torch it was built for) and is skipped elsewhere.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from models import eager_config, quadrant_images

import morphogen
from morphogen.core.plain import KEPT_STAGES

torchvision = pytest.importorskip("torchvision")


def _images(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The quadrant images at 32x32, so that resnet18's five halvings leave a 1x1 map."""
    images, labels = quadrant_images(count, seed)
    return torch.nn.functional.interpolate(images, size=32, mode="nearest"), labels


def test_torchvisions_resnet18_grows_a_seed_after_its_stages_and_exports(
        tmp_path: Path, run_without_morphogen: Callable[..., list[torch.Tensor]]) -> None:
    train, validation = _images(128, 0), _images(64, 1000)
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=4)
    host = morphogen.host_from_module(model, ["layer1", "layer2", "layer3", "layer4"], example_input=train[0][:2])
    assert host.injection_points == {"layer1": 64, "layer2": 128, "layer3": 256, "layer4": 512}
    with torch.no_grad():  # the cut host computes exactly what the model computes
        torch.testing.assert_close(host.eval()(validation[0][:4]), model.eval()(validation[0][:4]), rtol=0, atol=0)
    task = morphogen.task_from_data("quadrants32", train, validation, batch_size=32, num_classes=4)
    result = morphogen.grow(task, host, run_dir=str(tmp_path / "run"), out=io.StringIO(), baseline=False,
                            from_scratch=False, config=eager_config(epochs=6, slots=("layer2",)))
    assert any(slot.stage in KEPT_STAGES for slot in result.model.slots()), "no seed kept to fold in"
    inputs = validation[0][:5]
    files = [morphogen.export_model(result.model, inputs[:2], tmp_path / "grown.pt2")]
    with torch.no_grad():
        expected = result.model.eval()(inputs)
    for outputs in run_without_morphogen(files, inputs):
        torch.testing.assert_close(outputs, expected, rtol=0, atol=1e-5)
