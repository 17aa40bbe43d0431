"""A user's model of several inputs (token ids and a padding mask every block reads) is cut, grown and exported."""

from __future__ import annotations

import io
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from models import PaddedClassifier, eager_config, padded_sequences
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

import morphogen
from morphogen.core.lifecycle import Stage
from morphogen.core.model import MorphogeneticModel
from morphogen.core.module_host import HostBuildError
from morphogen.data import DataError
from morphogen.inputs import Inputs, call

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
from slot_driver import EASY_CONFIG, drive_to, perturb_seed


def _host(example: Inputs, seed: int = 0) -> tuple[nn.Module, morphogen.ModuleHost]:
    torch.manual_seed(seed)
    net = PaddedClassifier()
    return net, morphogen.host_from_module(net, slots=["blocks.0", "blocks.1"], example_input=example)


def _batch(count: int = 6, seed: int = 1) -> tuple[Tensor, Tensor]:
    (ids, padding), _ = padded_sequences(count, seed)
    return ids, padding


@pytest.mark.parametrize("as_dict", [False, True])
def test_the_cut_model_computes_what_the_model_computes_on_any_batch(as_dict: bool) -> None:
    ids, padding = _batch(2)
    example: Inputs = {"ids": ids, "padding": padding} if as_dict else (ids, padding)
    net, host = _host(example)
    assert host.topology == "transformer" and host.injection_points == {"blocks_0": 16, "blocks_1": 16}
    assert host.side_inputs is not None, "the blocks after the first cut read the mask"
    assert "blocks_0" not in host.measured_shapes  # a branch cannot read several inputs
    net.eval()
    model = MorphogeneticModel(host).eval()
    other_ids, other_padding = _batch(7, seed=5)
    other: Inputs = {"ids": other_ids, "padding": other_padding} if as_dict else (other_ids, other_padding)
    with torch.no_grad():
        torch.testing.assert_close(model(other), net(other_ids, other_padding), rtol=0, atol=1e-6)
        # The mask matters: the same ids with another padding give other outputs.
        assert not torch.allclose(model(other), net(other_ids, torch.zeros_like(other_padding)))


def test_a_parameter_the_example_does_not_give_keeps_its_default() -> None:
    ids, padding = _batch(3)
    net, host = _host((ids, padding))  # `scale` is not given: traced at its default 1.0
    net.eval()
    with torch.no_grad():
        torch.testing.assert_close(MorphogeneticModel(host).eval()((ids, padding)), net(ids, padding))


@pytest.mark.parametrize(("model", "example", "message"), [
    (nn.Sequential(nn.Linear(4, 4), nn.ReLU()), (torch.zeros(2, 4), torch.zeros(2, 4)), "nn.Sequential takes one"),
    (PaddedClassifier(), {"ids": torch.zeros(2, 10, dtype=torch.long), "mask": torch.zeros(2, 10)},
     "names 'mask', which PaddedClassifier.forward does not take"),
    (PaddedClassifier(), (torch.zeros(2, 10, dtype=torch.long),), "parameter 'padding' has no default"),
    (PaddedClassifier(), (torch.zeros(2, 10, dtype=torch.long), torch.zeros(3, 10, dtype=torch.bool)),
     "different numbers of samples (2, 3)"),
])
def test_inputs_that_cannot_work_are_one_clear_error(model: nn.Module, example: Inputs, message: str) -> None:
    slots = ["0"] if isinstance(model, nn.Sequential) else ["blocks.0"]
    with pytest.raises(HostBuildError, match=message.replace("(", r"\(").replace(")", r"\)")):
        morphogen.host_from_module(model, slots=slots, example_input=example)


def _training_seeds(model: MorphogeneticModel) -> None:
    """A TRAINING seed (perturbed: not the identity) in each slot."""
    for index, slot_id in enumerate(model.slot_ids):
        slot = model.germinate(slot_id, "mlp_small")
        perturb_seed(slot, torch.Generator().manual_seed(10 + index))
        drive_to(slot, Stage.TRAINING)


@pytest.mark.parametrize("shadow_rows", [None, 4])
def test_each_seeds_shadow_reads_the_mask_of_its_own_rows(shadow_rows: int | None) -> None:
    ids, padding = _batch(6)
    _, host = _host((ids[:2], padding[:2]))
    model = MorphogeneticModel(host.eval(), config=EASY_CONFIG).eval()
    _training_seeds(model)
    output, shadow = model.forward_with_shadow((ids, padding), shadow_rows)
    assert shadow is not None and shadow.slot_ids == ("blocks_0", "blocks_1")
    rows = shadow.rows
    assert rows == (shadow_rows or 6)
    for k, slot_id in enumerate(shadow.slot_ids):
        # Reference: the first rows alone, with only this seed blended in at alpha 1.
        alphas = [[1.0 if other == slot_id else 0.0 for other in model.slot_ids]]
        with torch.no_grad():
            expected = model.counterfactual_forward((ids[:rows], padding[:rows]), alphas)[0]
        torch.testing.assert_close(shadow.outputs[k].detach(), expected, rtol=0, atol=1e-5)
    # Counterfactual configurations stacked on the batch read the mask of each configuration's rows.
    table = [[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]
    with torch.no_grad():
        fused = model.counterfactual_forward((ids, padding), table)
        for row, alphas in enumerate(table):
            alone = model.counterfactual_forward((ids, padding), [alphas])[0]
            torch.testing.assert_close(fused[row], alone, rtol=0, atol=1e-5)
    torch.testing.assert_close(output.detach(), fused[0], rtol=0, atol=1e-5)


class _PaddedDataset(Dataset[tuple[dict[str, Tensor], Tensor]]):
    """Samples as a data pipeline gives them: a dict of inputs by argument name, and a label."""

    def __init__(self, count: int, seed: int) -> None:
        (self.ids, self.padding), self.labels = padded_sequences(count, seed)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[dict[str, Tensor], Tensor]:
        return {"ids": self.ids[index], "padding": self.padding[index]}, self.labels[index]


def _tensor_task() -> morphogen.Task:
    train, validation = padded_sequences(192, 0), padded_sequences(64, 1)
    return morphogen.task_from_data("padded", train, validation, num_classes=3, batch_size=32)


def _loader_task() -> morphogen.Task:
    return morphogen.task_from_data("padded-dicts", DataLoader(_PaddedDataset(192, 0), batch_size=32),
                                    _PaddedDataset(64, 1), num_classes=3, batch_size=32)


@pytest.mark.parametrize("make_task", [_tensor_task, _loader_task])
def test_a_model_of_several_inputs_grows_and_exports_a_program_called_as_the_model(
        make_task: Callable[[], morphogen.Task], tmp_path: Path,
        run_without_morphogen: Callable[..., list[Tensor]]) -> None:
    task = make_task()
    inputs = next(iter(task.validation.iterate_batches(5, shuffle=False)))[0]
    _, host = _host(inputs)
    result = morphogen.grow(task, host, run_dir=str(tmp_path / "run"), config=eager_config(epochs=5,
                            slots=("blocks_0",)), out=io.StringIO())
    assert [story.blueprint for story in result.grown.stories if "training" in story.stages], "no seed trained"
    kept = [slot for slot in result.model.slots() if slot.stage in (Stage.HOLDING, Stage.FOSSILIZED)]
    assert kept, "no seed to fold in"
    path = morphogen.export_model(result.model, inputs, tmp_path / "grown.pt2")
    with torch.no_grad():
        expected = result.model.eval()(inputs)
        program = torch.export.load(path).module()
        torch.testing.assert_close(call(program, inputs), expected, rtol=0, atol=1e-5)  # type: ignore[arg-type]
    for outputs in run_without_morphogen([path], inputs):  # where morphogen cannot be imported
        torch.testing.assert_close(outputs, expected, rtol=0, atol=1e-5)


def test_batches_whose_inputs_disagree_are_one_data_error() -> None:
    (ids, padding), labels = padded_sequences(8, 0)
    bad = [((ids[:4], padding[:3]), labels[:4])]
    task = morphogen.task_from_data("bad", bad, bad, num_classes=3)
    with pytest.raises(DataError, match="train batch 0: its inputs are a tuple of tensors with different numbers"):
        next(iter(task.train.iterate_batches(4)))
