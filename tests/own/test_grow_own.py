"""A user's own model and data, end to end: grown through `morphogen.grow` and through `run --task module:function`."""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import math
import re
import shutil
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import user_tasks
from models import ResNet, TinyGPT, blobs, counting_sequences, eager_config, mlp, quadrant_images

import morphogen
from morphogen.cli import EXIT_USER_ERROR, main
from morphogen.core.lifecycle import BLENDED_STAGES
from morphogen.export import example_input_of, rebuild_run
from morphogen.inputs import call
from morphogen.run_directory import EVENTS_FILENAME
from morphogen.telemetry.events import EpochCompleted
from morphogen.telemetry.sinks import read_events

HERE = Path(__file__).resolve().parent
EAGER = HERE / "eager.toml"


def grown_seeds(result: morphogen.RunResult) -> list[str]:
    """Blueprints of the seeds that trained (reached TRAINING or later) in the grown episode."""
    return [story.blueprint for story in result.grown.stories if "training" in story.stages]


@pytest.mark.parametrize(("make", "slot"), [(user_tasks.resnet, "layer1"), (user_tasks.gpt, "blocks_0"),
                                            (user_tasks.mlp_regression, "1"), (user_tasks.unet, "down2")])
def test_each_users_model_grows_a_seed_and_exports_through_the_public_api(
        make: object, slot: str, tmp_path: Path, run_without_morphogen: Callable[..., list[torch.Tensor]]) -> None:
    made = make()  # type: ignore[operator]
    task, host = made if isinstance(made, tuple) else (made, None)
    # One slot, 5 epochs: its seed trains and blends in (ending BLENDING or HOLDING; either is folded in).
    result = morphogen.grow(task, host, run_dir=str(tmp_path / "run"), config=eager_config(epochs=5, slots=(slot,)),
                            out=io.StringIO())
    assert grown_seeds(result), "no seed trained"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["grown"]["seeds"]
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["task"] == "python" and config["task_name"] == task.name
    # Export: the kept seeds folded in, loaded and run where morphogen cannot be imported, on another batch size.
    assert any(slot.stage in BLENDED_STAGES for slot in result.model.slots()), "no seed to fold in"
    inputs = next(iter(task.validation.iterate_batches(5, shuffle=False)))[0][:5]
    files = [morphogen.export_model(result.model, inputs[:2], tmp_path / "grown.pt2"),
             morphogen.export_model(result.model, inputs[:2], tmp_path / "grown.onnx", format="onnx")]
    with torch.no_grad():
        expected = result.model.eval()(inputs)
    for outputs in run_without_morphogen(files, inputs):
        torch.testing.assert_close(outputs, expected, rtol=0, atol=1e-5)


def test_a_language_model_exports_with_a_dynamic_sequence_length(tmp_path: Path) -> None:
    task = user_tasks.gpt()
    result = morphogen.grow(task, run_dir=str(tmp_path / "run"), config=eager_config(epochs=4, slots=("blocks_0",)),
                            out=io.StringIO())
    assert result.model.architecture(), "a seed is part of the exported network"
    ids = next(iter(task.validation.iterate_batches(4, shuffle=False)))[0][:4]
    path = morphogen.export_model(result.model, ids[:2], tmp_path / "lm.pt2", dynamic_dims=(1,))
    program, model = torch.export.load(path).module(), result.model.eval()
    with torch.no_grad():
        for length in (1, 3, ids.shape[1]):  # a prompt shorter than the training windows, as generation feeds
            torch.testing.assert_close(program(ids[:, :length]), model(ids[:, :length]), rtol=0, atol=1e-5)
    with pytest.raises(morphogen.ExportError, match=r"dynamic_dims: no input has a dimension 2"):
        morphogen.export_model(result.model, ids[:2], tmp_path / "x.pt2", dynamic_dims=(2,))
    with pytest.raises(morphogen.ExportError, match=r"dynamic_dims must be dimensions after the batch's"):
        morphogen.export_model(result.model, ids[:2], tmp_path / "x.pt2", dynamic_dims=(0,))


class _ScaledGPT(torch.nn.Module):
    """TinyGPT's logits times 1,000: outputs in the thousands, as a regression in raw units gives."""

    def __init__(self) -> None:
        super().__init__()
        self.gpt = TinyGPT()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.gpt(ids) * 1000.0


def test_a_model_of_large_outputs_exports_within_a_tolerance_relative_to_them(tmp_path: Path) -> None:
    """The program rounds such outputs otherwise than the model by a unit in their last place (2.4e-4 at 3,000 in
    float32), which the absolute 1e-5 of the export's check refused as a broken program ("please report this")."""
    torch.manual_seed(0)
    ids, _ = counting_sequences(8, 0)
    host = morphogen.host_from_module(_ScaledGPT().eval(), ["gpt.blocks.0", "gpt.blocks.1"], example_input=ids[:2])
    model = morphogen.MorphogeneticModel(host).eval()
    program = torch.export.load(morphogen.export_model(model, ids[:4], tmp_path / "lm.pt2")).module()
    with torch.no_grad():
        expected = model(ids)
        assert expected.abs().max() > 1000
        torch.testing.assert_close(program(ids), expected, rtol=0, atol=1e-5 * expected.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_transformer_converted_to_a_16_bit_dtype_exports(dtype: torch.dtype, tmp_path: Path) -> None:
    """Converted to ship in 16 bits, as the README says to: the program's attention rounds a unit of bfloat16 (7.8e-3
    near 1) otherwise than the model's, which the export's check of 1e-5 refused as a broken program."""
    torch.manual_seed(0)
    ids, _ = counting_sequences(8, 0)
    host = morphogen.host_from_module(TinyGPT().eval(), ["blocks.0", "blocks.1"], example_input=ids[:2])
    model = morphogen.MorphogeneticModel(host).to(dtype).eval()
    program = torch.export.load(morphogen.export_model(model, ids[:4], tmp_path / "lm.pt2")).module()
    with torch.no_grad():
        output, expected = program(ids), model(ids)
        assert output.dtype == dtype
        scale = max(1.0, expected.abs().max().item())
        torch.testing.assert_close(output, expected, rtol=0, atol=4 * torch.finfo(dtype).eps * scale)


@pytest.mark.parametrize(("training", "said"), [
    (lambda x, y: (x.double(), y), "(the training batch differs: inputs float64 [12], not float32 [12]; the inputs "
                                   "are float64, the model's parameters float32: convert the inputs"),
    (lambda x, y: (x, y.int()), "(the training batch differs: targets int32 [], not int64 [])"),
    (lambda x, y: (x, y + 3), "IndexError: Target"),
    (lambda x, y: ({"features": x}, y), "(the training batch differs: inputs are a dict of 'features', not a tensor)"),
], ids=["float64", "int32-targets", "labels-out-of-range", "dict"])
def test_training_data_unlike_the_validation_data_is_one_line_naming_the_difference(
        training: Callable[[torch.Tensor, torch.Tensor], tuple[Any, torch.Tensor]], said: str) -> None:
    # The first validation checks the validation data; the training data is the user's too, and may differ.
    (x, y), validation = blobs(64, 0), blobs(32, 1)
    inputs, targets = training(x, y)
    loader = torch.utils.data.DataLoader(list(zip(inputs if isinstance(inputs, torch.Tensor) else
                                                  [{"features": row} for row in x], targets, strict=True)),
                                         batch_size=16)
    task = morphogen.task_from_data("blobs", loader, validation)
    host = morphogen.host_from_module(mlp(), ["1"], example_input=validation[0][:2])
    with pytest.raises(morphogen.DataError) as raised:
        morphogen.grow(task, host, epochs=1, baseline=False, from_scratch=False, out=io.StringIO())
    message = str(raised.value)
    assert message.startswith("task 'blobs': the model and its loss failed on the first training batch, though not "
                              "on the validation data: ") and "\n" not in message
    assert said in message


class _WeightsToo(torch.nn.Module):
    """A block that returns its attention weights beside its output, as some users' blocks do."""

    def __init__(self, block: torch.nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.block(x), x.mean(-1)


class _UnpacksItsBlocks(TinyGPT):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.Sequential(*(_WeightsToo(block) for block in self.blocks))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) + self.position[:, :ids.shape[1]]
        for block in self.blocks:
            x, _ = block(x)
        return self.head(self.norm(x))


def test_a_transformer_whose_blocks_cannot_be_copied_says_what_it_grows_instead() -> None:
    train, validation = counting_sequences(64, 0), counting_sequences(32, 1)
    task = morphogen.task_from_data("counting", train, validation)
    host = morphogen.host_from_module(_UnpacksItsBlocks(), ["blocks.0", "blocks.1"], example_input=train[0][:2])
    out = io.StringIO()
    morphogen.grow(task, host, epochs=2, baseline=False, from_scratch=False, out=out)
    note = "\n".join(out.getvalue().splitlines()).replace("\n      ", " ")
    assert "note: the default 'block_copy' cannot be grafted into blocks_0, blocks_1 (" in note
    assert "a block that returns a tuple, such as (x, attention weights), cannot be copied)); the heuristic grows " \
           "'block' instead" in note


def test_grow_compares_with_no_growth_and_from_scratch_on_a_users_resnet(tmp_path: Path) -> None:
    task, host = user_tasks.resnet()
    out = io.StringIO()
    result = morphogen.grow(task, host, run_dir=str(tmp_path / "run"), out=out,
                            config=eager_config(epochs=4, baseline=True, from_scratch=True))
    assert result.baseline is not None
    assert result.baseline.parameters == sum(p.numel() for p in host.parameters())
    table = out.getvalue()
    assert "grown" in table and "no growth" in table and "final val accuracy" in table
    if result.model.architecture():
        assert result.from_scratch is not None and result.from_scratch.parameters == result.grown.parameters


def test_the_table_says_the_architecture_is_the_host_only_when_no_seed_was_kept(tmp_path: Path) -> None:
    """A run without the from-scratch comparison must not claim that nothing was blended in."""
    task, host = user_tasks.resnet()
    out = io.StringIO()
    result = morphogen.grow(task, host, run_dir=str(tmp_path / "run"), out=out, baseline=True, from_scratch=False,
                            config=eager_config(epochs=5, slots=("layer1",)))
    assert result.model.architecture(), "the seed was not kept"
    assert result.from_scratch is None and "no seed was blended in" not in out.getvalue()
    out = io.StringIO()
    host_only = morphogen.grow(task, host, run_dir=str(tmp_path / "host only"), out=out, epochs=2, baseline=False)
    assert not host_only.model.architecture()  # two epochs: too short for a seed to blend in
    assert "no seed was blended in, so the final architecture is the host itself" in out.getvalue()


def test_the_users_own_module_holds_the_grown_host_weights_after_growth(tmp_path: Path) -> None:
    train, validation = blobs(96, 0), blobs(48, 1)
    net = mlp()
    initial = {name: value.clone() for name, value in net.state_dict().items()}
    host = morphogen.host_from_module(net, ["1"], example_input=train[0][:2])
    task = morphogen.task_from_data("blobs", train, validation, num_classes=3, batch_size=32)
    result = morphogen.grow(task, host, run_dir=str(tmp_path / "run"), config=eager_config(epochs=2), out=io.StringIO())
    grown_host = result.model.host.state_dict()
    for name, value in net.state_dict().items():  # the user's own keys, holding the trained host's values
        assert not torch.equal(value, initial[name]), f"{name} was not trained"
    assert all(torch.equal(value, grown_host[name]) for name, value in host.state_dict().items())
    with torch.no_grad():
        torch.testing.assert_close(net.eval()(validation[0]), result.model.host.eval()(validation[0]), rtol=0, atol=0)


def test_load_grown_model_takes_the_host_as_grow_took_it_and_refuses_a_bare_model_in_one_line(
        tmp_path: Path) -> None:
    """A run grown from a host function is loaded back with that function; the model itself, not cut into a host,
    is one line saying what to pass (both were an AttributeError from inside morphogen)."""
    train, validation = blobs(96, 0), blobs(48, 1)
    task = morphogen.task_from_data("blobs", train, validation, num_classes=3, batch_size=32)

    def host() -> morphogen.ModuleHost:
        return morphogen.host_from_module(mlp(), ["1"], example_input=train[0][:2])

    result = morphogen.grow(task, host, run_dir=str(tmp_path / "run"), config=eager_config(epochs=5, slots=("1",)),
                            out=io.StringIO())
    assert result.model.architecture(), "no seed was kept"
    loaded = morphogen.load_grown_model(result.run_dir, host=host)
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(validation[0]), result.model.eval()(validation[0]), rtol=0, atol=0)
    with pytest.raises(morphogen.ConfigError, match=r"^load_grown_model: its host is a Sequential, not a host; pass "
                                                    r"morphogen.host_from_module\(") as refused:
        morphogen.load_grown_model(result.run_dir, host=mlp())
    assert "\n" not in str(refused.value)
    with pytest.raises(morphogen.ConfigError, match="its host function returned a Sequential, not a host"):
        morphogen.load_grown_model(result.run_dir, host=mlp)
    # A host of another width is named as such, not as a seed that "does not match the weights saved for it".
    with pytest.raises(ValueError, match=r"holds segments\.0\.0\.weight of shape \(16, 12\), the host built here of "
                                         r"shape \(24, 12\): build the host as the run grew it"):
        morphogen.load_grown_model(result.run_dir, host=morphogen.host_from_module(mlp(hidden=24), ["1"],
                                                                                   example_input=train[0][:2]))


THREADS_SEEN: set[int] = set()


def cross_entropy_counting_threads(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The cross-entropy, recording torch's thread count at every call in `THREADS_SEEN`."""
    THREADS_SEEN.add(torch.get_num_threads())
    return torch.nn.functional.cross_entropy(outputs, targets)


def test_grow_trains_with_the_threads_asked_for_and_gives_the_process_its_count_back(tmp_path: Path) -> None:
    train, validation = blobs(96, 0), blobs(48, 1)
    task = morphogen.task_from_data("blobs", train, validation, num_classes=3, batch_size=32,
                                    loss=cross_entropy_counting_threads)
    before = torch.get_num_threads()
    asked = 2 if before == 1 else 1
    host = morphogen.host_from_module(mlp(), ["1"], example_input=train[0][:2])
    THREADS_SEEN.clear()
    morphogen.grow(task, host, run_dir=str(tmp_path / "run"), config=eager_config(epochs=2), out=io.StringIO(),
                   threads=asked)
    assert sorted(THREADS_SEEN) == [asked] and torch.get_num_threads() == before
    with pytest.raises(morphogen.ConfigError, match=r"^threads must be >= 1, got 0$"):
        morphogen.grow(task, host, run_dir=str(tmp_path / "refused"), threads=0)
    assert not (tmp_path / "refused").exists()


def test_per_pixel_classes_train_under_the_default_loss_and_accuracy_counts_pixels(tmp_path: Path) -> None:
    # Per-pixel classes, as a segmentation network gives them: scores on dimension 1 of [N, C, H, W].
    images = torch.randn(48, 1, 6, 6, generator=torch.Generator().manual_seed(0))
    labels = (images[:, 0] > 0).long()  # (48, 6, 6)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(4, 2, 1))
    host = morphogen.host_from_module(net, ["1"], example_input=images[:2])
    task = morphogen.task_from_data("pixels", (images[:32], labels[:32]), (images[32:], labels[32:]))
    result = morphogen.grow(task, host, run_dir=str(tmp_path / "default"), config=eager_config(epochs=4, baseline=True),
                            out=io.StringIO())
    assert grown_seeds(result) and result.metric_name == "accuracy"
    # The accuracy it reports counts pixels: a multiple of 100 / (16 samples x 36 pixels), not of 100 / 16.
    for outcome in (result.grown, result.baseline):
        assert outcome is not None and math.isfinite(outcome.final_loss)
        pixels_right = outcome.final_accuracy * 16 * 36 / 100
        assert pixels_right == pytest.approx(round(pixels_right), abs=1e-6)
    assert any(round(o.final_accuracy * 16 / 100, 6) % 1 for o in (result.grown, result.baseline) if o is not None)
    # Where both layouts line up with the targets (6 classes over 6x6 pixels), class_dim says which.
    ambiguous = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(4, 6, 1))
    six = morphogen.task_from_data("six", (images[:32], labels[:32]), (images[32:], labels[32:]))
    with pytest.raises(morphogen.DataError, match=r"could hold the classes on dimension 1 or on the last: say which "
                                                  r"with task_from_data\(\.\.\., class_dim=1 or -1\)$"):
        morphogen.grow(six, morphogen.host_from_module(ambiguous, ["1"], example_input=images[:2]),
                       run_dir=str(tmp_path / "ambiguous"), config=eager_config(epochs=2), out=io.StringIO())
    said = morphogen.task_from_data("six", (images[:32], labels[:32]), (images[32:], labels[32:]), class_dim=1)
    morphogen.grow(said, morphogen.host_from_module(ambiguous, ["1"], example_input=images[:2]),
                   run_dir=str(tmp_path / "said"), config=eager_config(epochs=2), out=io.StringIO())
    with pytest.raises(morphogen.DataError, match=r"^class_dim must be 1, -1 or None"):
        morphogen.task_from_data("six", (images[:32], labels[:32]), (images[32:], labels[32:]), class_dim=2)


def test_a_host_with_another_number_of_class_scores_than_num_classes_is_refused_before_training(
        tmp_path: Path) -> None:
    # Such a model trains (targets below 7 are valid class indices of 7 scores), but its accuracy means nothing.
    x, y = blobs(96, seed=0, inputs=4, classes=4)
    task = morphogen.task_from_data("blobs", (x[:64], y[:64]), (x[64:], y[64:]), num_classes=4)

    def host(classes: int) -> morphogen.SegmentedHost:
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, classes))
        return morphogen.host_from_module(model, ["1"], example_input=x[:2])

    said = ("task 'blobs': the model's outputs have shape (2, 7) for targets (2,): 7 class scores on the last "
            "dimension, but the task has num_classes=4 (give the model 4 outputs there, or the task num_classes=7)")
    with pytest.raises(morphogen.DataError) as caught:
        morphogen.grow(task, host(7), run_dir=str(tmp_path / "grown"), config=eager_config(epochs=1),
                       out=io.StringIO())
    assert str(caught.value) == said and not (tmp_path / "grown").exists()
    with pytest.raises(morphogen.DataError) as caught:
        morphogen.grow(task, host(4), run_dir=str(tmp_path / "compared"), config=eager_config(epochs=1),
                       out=io.StringIO(), compare_with={"wide": lambda: host(7)})
    assert str(caught.value) == "compare_with: 'wide': " + said.removeprefix("task 'blobs': ")
    assert not (tmp_path / "compared").exists()
    # Per-pixel scores [N, C, H, W] are counted on dimension 1.
    images = torch.randn(16, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    pixels = morphogen.task_from_data("pixels", (images, (images[:, 0] > 0).long()),
                                      (images, (images[:, 0] > 0).long()), num_classes=2)
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(4, 3, 1))
    with pytest.raises(morphogen.DataError, match=r"3 class scores on dimension 1, but the task has num_classes=2"):
        morphogen.grow(pixels, morphogen.host_from_module(net, ["1"], example_input=images[:2]),
                       run_dir=str(tmp_path / "pixels"), config=eager_config(epochs=1), out=io.StringIO())
    # A loss of the user's own reads the outputs as it likes: nothing is refused.
    own = dataclasses.replace(task, loss=lambda outputs, targets: torch.nn.functional.cross_entropy(outputs, targets))
    morphogen.grow(own, host(7), run_dir=str(tmp_path / "own"), config=eager_config(epochs=1), out=io.StringIO())


@pytest.mark.parametrize(("host", "message"), [
    (torch.nn.Sequential(torch.nn.Linear(4, 2)), "task 'plain': its host is a Sequential, not a host; pass "
                                                   "morphogen.host_from_module(model, slots=..., example_input=...)"),
    (lambda: torch.nn.Linear(4, 2), "task 'plain': its host function returned a Linear, not a host; return "
                                    "morphogen.host_from_module(model, slots=..., example_input=...)"),
    ("not a host", "task 'plain': its host is a str, neither a host nor a function that builds one "
                   "(morphogen.host_from_module(model, slots=..., example_input=...))"),
    (lambda: 1 / 0, "task 'plain': its host function raised ZeroDivisionError: division by zero"),
])
def test_a_model_given_as_it_is_says_how_to_make_it_a_host(host: object, message: str, tmp_path: Path) -> None:
    data = (torch.randn(8, 4), torch.arange(8) % 2)
    task = morphogen.task_from_data("plain", data, data)
    with pytest.raises(morphogen.DataError) as caught:
        morphogen.grow(task, host, run_dir=str(tmp_path / "run"), config=eager_config(epochs=2), out=io.StringIO())
    assert str(caught.value) == message


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_grow_on_a_device_this_machine_lacks_names_the_keyword_to_change_and_writes_nothing(tmp_path: Path) -> None:
    data = (torch.randn(8, 4), torch.arange(8) % 2)
    task = morphogen.task_from_data("plain", data, data)
    host = morphogen.host_from_module(mlp(inputs=4, classes=2), ["1"], example_input=data[0][:2])
    with pytest.raises(morphogen.ConfigError, match=r"^device: 'cuda' requested but CUDA is not available here "
                                                    r"\(torch .*\); use device='cpu'$"):
        morphogen.grow(task, host, device="cuda", run_dir=str(tmp_path / "run"), config=eager_config(epochs=2),
                       out=io.StringIO())
    assert not (tmp_path / "run").exists()
    with pytest.raises(morphogen.ConfigError, match=r"^device: 'cuda' requested but .*; use device='cpu'$"):
        morphogen.grow_over_seeds(task, host, seeds=2, device="cuda", run_dir=str(tmp_path / "seeds"),
                                  config=eager_config(epochs=2), out=io.StringIO())
    assert not (tmp_path / "seeds").exists()  # each seed's grow refused it, after the seeds' plan was written


@pytest.mark.parametrize("train", [[], "drop_last", "generator"])
def test_training_data_that_yields_no_batch_in_an_epoch_is_one_data_error(train: object, tmp_path: Path) -> None:
    """An empty split, batches larger than the split that drop_last drops, or a generator (which runs once: the
    first epoch trains, the second gets nothing) say so, naming the epoch."""
    x, y = torch.randn(24, 12), torch.arange(24) % 3
    data: object = {"drop_last": torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32,
                                                             drop_last=True),
                    "generator": ((x[i:i + 8], y[i:i + 8]) for i in range(0, 24, 8))}.get(str(train), train)
    task = morphogen.task_from_data("empty", data, (x, y), num_classes=3)
    host = morphogen.host_from_module(mlp(), ["1"], example_input=x[:2])
    epoch = 2 if train == "generator" else 1
    with pytest.raises(morphogen.DataError, match=rf"^task 'empty': its training data yielded no batch in epoch "
                                                  rf"{epoch} \(an empty split"):
        morphogen.grow(task, host, run_dir=str(tmp_path / "run"), config=eager_config(epochs=3), out=io.StringIO(),
                       baseline=False, from_scratch=False)


class _NoSamples(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """A map-style Dataset of no samples (a filter that kept none)."""

    def __len__(self) -> int:
        return 0

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        raise IndexError(index)


@pytest.mark.parametrize("split", ["tensors", "dataset", "drop_last", "generator"])
def test_validation_data_that_yields_no_batch_is_one_data_error(split: str, tmp_path: Path) -> None:
    """A validation split of no samples, a loader whose drop_last drops its only (short) batch, or a generator (the
    first validation reads it, the next gets nothing) say so as one line, not a StopIteration from inside."""
    x, y = torch.randn(24, 12), torch.arange(24) % 3
    validation: object = {
        "tensors": (x[:0], y[:0]), "dataset": _NoSamples(),
        "drop_last": torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32, drop_last=True),
        "generator": ((x[i:i + 8], y[i:i + 8]) for i in range(0, 24, 8))}[split]
    task = morphogen.task_from_data("empty", (x, y), validation, num_classes=3)
    host = morphogen.host_from_module(mlp(), ["1"], example_input=x[:2])
    with pytest.raises(morphogen.DataError, match=r"validation data yielded no batch \(an empty split"):
        morphogen.grow(task, host, run_dir=str(tmp_path / "run"), config=eager_config(epochs=2), out=io.StringIO(),
                       baseline=False, from_scratch=False)


def test_an_empty_training_dataset_is_the_data_error_of_a_split_without_batches(tmp_path: Path) -> None:
    """A map-style Dataset of no samples trains as an empty split does, not with torch's sampler's ValueError."""
    x, y = torch.randn(24, 12), torch.arange(24) % 3
    task = morphogen.task_from_data("empty", _NoSamples(), (x, y), num_classes=3)
    host = morphogen.host_from_module(mlp(), ["1"], example_input=x[:2])
    with pytest.raises(morphogen.DataError, match=r"^task 'empty': its training data yielded no batch in epoch 1"):
        morphogen.grow(task, host, run_dir=str(tmp_path / "run"), config=eager_config(epochs=2), out=io.StringIO(),
                       baseline=False, from_scratch=False)


@pytest.mark.parametrize("loss", [torch.nn.functional.mse_loss, torch.nn.L1Loss(),
                                  functools.partial(torch.nn.functional.huber_loss, delta=0.5)],
                         ids=["mse_loss", "L1Loss", "partial-huber"])
def test_a_regression_whose_targets_broadcast_against_the_outputs_is_refused(loss: Any, tmp_path: Path) -> None:
    """Targets (N,) against outputs (N, 1): torch's element-wise losses broadcast them to (N, N) with a warning,
    and the run trained and reported a loss of every output against every target. One line instead, before
    anything trains; targets of the outputs' shape train."""
    x, y = torch.randn(32, 4), torch.randn(32)
    network = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8), torch.nn.ReLU(),
                                  torch.nn.Linear(8, 1))
    host = morphogen.host_from_module(network, ["1"], example_input=x[:2])
    task = morphogen.task_from_data("regression", (x, y), (x, y), loss=loss)
    with pytest.raises(morphogen.DataError, match=r"the task's loss compares outputs \(32, 1\) with targets \(32,\) "
                                                  r"element by element: torch broadcasts them to \(32, 32\)"):
        morphogen.grow(task, host, run_dir=str(tmp_path / "run"), config=eager_config(epochs=1), out=io.StringIO())
    assert not (tmp_path / "run").exists()
    fixed = morphogen.task_from_data("regression", (x, y[:, None]), (x, y[:, None]), loss=loss)
    result = morphogen.grow(fixed, host, run_dir=str(tmp_path / "fixed"), config=eager_config(epochs=1),
                            out=io.StringIO())
    assert math.isfinite(result.grown.final_loss)


@pytest.mark.parametrize("split", ["train", "validation"])
def test_labels_counted_from_one_without_num_classes_are_refused_against_the_models_scores(split: str,
                                                                                          tmp_path: Path) -> None:
    """Labels 1..3 for a model of 3 class scores and no num_classes: one line naming the split, the class and the
    model's score count, before anything trains (on a GPU, cross-entropy met them as a device-side assert)."""
    x, y = torch.randn(24, 12), torch.arange(24) % 3
    shifted = (x, y + 1)
    task = morphogen.task_from_data("counted", shifted if split == "train" else (x, y),
                                    shifted if split == "validation" else (x, y))
    host = morphogen.host_from_module(mlp(), ["1"], example_input=x[:2])
    with pytest.raises(morphogen.DataError, match=rf"^task 'counted': {split}: targets hold class 3, outside 0\.\.2 of "
                                                  r"the model's 3 class scores \(-100"):
        morphogen.grow(task, host, run_dir=str(tmp_path / "run"), config=eager_config(epochs=1), out=io.StringIO())
    assert not (tmp_path / "run").exists()


FIRST_BATCH_BEYOND = (r"^task 'beyond': train \(the first batch\): targets hold class 7, outside 0\.\.2 of "
                      r"num_classes=3 \(-100, cross-entropy's ignore_index, marks a target to leave out\)$")


def test_a_streamed_first_training_batch_with_a_class_beyond_num_classes_is_refused_before_it_trains(
        tmp_path: Path) -> None:
    """A DataLoader (not read whole) whose first batch holds class 7 of num_classes=3: one line naming it, before
    the loss (on a GPU, cross-entropy met it as a device-side assert that ends the CUDA context) and any epoch."""
    run_dir = tmp_path / "run"
    with pytest.raises(morphogen.DataError, match=FIRST_BATCH_BEYOND):
        morphogen.grow(user_tasks.first_batch_beyond(), run_dir=str(run_dir), config=eager_config(epochs=1),
                       baseline=False, from_scratch=False, out=io.StringIO())
    assert not any(isinstance(event, EpochCompleted) for event in read_events(run_dir / EVENTS_FILENAME))


def test_a_streamed_training_split_has_its_classes_read_on_the_first_batch_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Good labels in a DataLoader (one of them -100, cross-entropy's ignore_index): the run trains as before, its
    class indices read once (one host sync), not at every step of its two epochs of four batches."""
    checked: list[str] = []
    check = morphogen.env.evaluation.check_class_indices
    monkeypatch.setattr("morphogen.env.evaluation.check_class_indices",
                        lambda targets, *args: checked.append(args[1]) or check(targets, *args))
    inputs, labels = blobs(64, 0)
    labels[1] = -100
    host = morphogen.host_from_module(mlp(), ["1"], example_input=inputs[:2])
    task = morphogen.task_from_data("streamed", torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(inputs, labels), batch_size=16), blobs(32, 1), num_classes=3)
    result = morphogen.grow(task, host, run_dir=str(tmp_path / "run"), config=eager_config(epochs=2),
                            baseline=False, from_scratch=False, out=io.StringIO())
    assert math.isfinite(result.grown.final_loss)
    assert checked == ["task 'streamed': train (the first batch)"]  # its validation split is tensors: read whole


VALIDATION_BEYOND = (r"^task 'beyond': validation \(the first batch\): targets hold class 7, outside 0\.\.2 of "
                     r"num_classes=3 \(-100, cross-entropy's ignore_index, marks a target to leave out\)$")


def test_a_streamed_first_validation_batch_with_a_class_beyond_num_classes_is_refused_in_one_line(
        tmp_path: Path) -> None:
    """A DataLoader validation split whose first batch holds class 7 of num_classes=3: one line naming the split,
    before the loss (torch's IndexError inside "failed on the validation data" before) and any epoch."""
    with pytest.raises(morphogen.DataError, match=VALIDATION_BEYOND):
        morphogen.grow(user_tasks.validation_beyond(), run_dir=str(tmp_path / "run"), config=eager_config(epochs=1),
                       baseline=False, from_scratch=False, out=io.StringIO())


def test_a_streamed_validation_split_has_its_classes_read_on_the_first_validation_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Good labels in a DataLoader validation split: the run trains, the validation's classes read once (one host
    sync a split), not at the validations after each epoch nor at the run's second reset of its episode."""
    checked: list[str] = []
    check = morphogen.env.evaluation.check_class_indices
    monkeypatch.setattr("morphogen.env.evaluation.check_class_indices",
                        lambda targets, *args: checked.append(args[1]) or check(targets, *args))
    inputs, labels = blobs(32, 1)
    host = morphogen.host_from_module(mlp(), ["1"], example_input=inputs[:2])
    task = morphogen.task_from_data("streamed", blobs(64, 0), torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(inputs, labels), batch_size=16), num_classes=3)
    result = morphogen.grow(task, host, run_dir=str(tmp_path / "run"), config=eager_config(epochs=2),
                            baseline=False, from_scratch=False, out=io.StringIO())
    assert math.isfinite(result.grown.final_loss)
    assert checked == ["task 'streamed': validation (the first batch)", "task 'streamed': train (the first batch)"]


@pytest.mark.parametrize(("task", "line"), [("user_tasks:first_batch_beyond", FIRST_BATCH_BEYOND),
                                            ("user_tasks:validation_beyond", VALIDATION_BEYOND)])
def test_run_refuses_a_streamed_first_batch_beyond_num_classes_in_one_line_and_exit_2(
        task: str, line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(HERE)
    code = main(["run", "--task", task, "--epochs", "1", "--run-dir", str(tmp_path / "run"), "--threads", "1"])
    _, err = capsys.readouterr()
    assert code == EXIT_USER_ERROR
    assert re.match(line, err.removeprefix("morphogen run: error: ").removesuffix("\n")), err
    assert err.count("\n") == 1, err


@pytest.mark.parametrize(("labels", "said"), [
    (lambda y: y.int(), "the targets are int32: cross-entropy takes class indices as int64 (y.long())"),
    (lambda y: y.to(torch.uint8), "the targets are uint8: cross-entropy takes class indices as int64 (y.long())"),
    (lambda y: y.float(), "the targets are float32 whole numbers: cross-entropy takes class indices as int64 "
                          "(y.long()), or class probabilities shaped as the outputs"),
], ids=["int32", "uint8", "float"])
def test_class_indices_of_another_dtype_say_to_make_them_int64(labels: Callable[[torch.Tensor], torch.Tensor],
                                                               said: str, tmp_path: Path) -> None:
    """Labels from numpy as int32, as uint8 or as floats: the default cross-entropy refuses them; the line says
    which dtype they are and the conversion, before anything trains."""
    x, y = torch.randn(24, 12), torch.arange(24) % 3
    task = morphogen.task_from_data("labels", (x, labels(y)), (x, labels(y)))
    host = morphogen.host_from_module(mlp(), ["1"], example_input=x[:2])
    with pytest.raises(morphogen.DataError) as raised:
        morphogen.grow(task, host, run_dir=str(tmp_path / "run"), config=eager_config(epochs=1), out=io.StringIO())
    assert str(raised.value).startswith(f"task 'labels': {said} (the loss failed on the validation data: ")


def test_features_computed_with_autograd_on_train_and_leave_their_encoder_alone(tmp_path: Path) -> None:
    """Inputs an encoder computed outside torch.no_grad (a common way to make features): the run trains on them
    (it failed in its second step, backwarding through the encoder's freed graph) and gives the encoder no gradient."""
    x, y = torch.randn(24, 4), torch.arange(24) % 3
    encoder = torch.nn.Linear(4, 12)
    features = encoder(x)
    assert features.requires_grad
    task = morphogen.task_from_data("features", (features, y), (features, y), num_classes=3, batch_size=8)
    host = morphogen.host_from_module(mlp(), ["1"], example_input=features[:2].detach())
    result = morphogen.grow(task, host, run_dir=str(tmp_path / "run"), config=eager_config(epochs=2),
                            out=io.StringIO(), baseline=False, from_scratch=False)
    assert math.isfinite(result.grown.final_accuracy)
    assert encoder.weight.grad is None and encoder.bias.grad is None


@pytest.mark.parametrize("split", ["tensors", "loader"])
def test_a_last_batch_of_one_sample_that_batch_norm_cannot_train_on_is_one_data_error(split: str,
                                                                                      tmp_path: Path) -> None:
    """25 samples in batches of 8 leave a last batch of one, on which an MLP's BatchNorm1d cannot train: one line
    saying how to batch the split, where torch's ValueError came from inside the model."""
    x, y = torch.randn(25, 12), torch.arange(25) % 3
    train: object = (x, y) if split == "tensors" else torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, y), batch_size=8)
    task = morphogen.task_from_data("normed", train, (x, y), num_classes=3, batch_size=8)
    network = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                                  torch.nn.Linear(16, 3))
    host = morphogen.host_from_module(network, ["2"], example_input=x[:2])
    with pytest.raises(morphogen.DataError, match=r"^task 'normed': a training batch of one sample, on which the "
                                                  r"model's batch norm cannot train \(ValueError: Expected more than "
                                                  r"1 value per channel .*\): .*batch_size=.*drop_last=True$"):
        morphogen.grow(task, host, run_dir=str(tmp_path / "run"), config=eager_config(epochs=2), out=io.StringIO())

def test_a_frozen_backbone_stays_frozen_while_seeds_grow_behind_and_beside_it(tmp_path: Path) -> None:
    images, labels = quadrant_images(96, 0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3, padding=1),
                              torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4))
    for parameter in net[0].parameters():
        parameter.requires_grad_(False)  # a pretrained part the user does not train
    frozen, learning = [p.clone() for p in net[0].parameters()], net[2].weight.clone()
    host = morphogen.host_from_module(net, ["1", "3"], example_input=images[:2])
    task = morphogen.task_from_data("frozen", (images[:64], labels[:64]), (images[64:], labels[64:]))
    config = eager_config(epochs=4)  # the first seed chosen by growth signal, not the branch of a user's model
    config = dataclasses.replace(config, heuristic=dataclasses.replace(config.heuristic, first_seed=""))
    result = morphogen.grow(task, host, run_dir=str(tmp_path / "run"), config=config, out=io.StringIO())
    assert grown_seeds(result) and result.grown.flops.probe > 0  # the signals were measured behind the backbone
    # `net` holds the grown model's host weights: the frozen layer as it was, the next one trained.
    assert all(torch.equal(before, after) for before, after in zip(frozen, net[0].parameters(), strict=True))
    assert not any(parameter.requires_grad for parameter in net[0].parameters())
    assert not torch.equal(learning, net[2].weight)


def test_a_frozen_backbone_left_in_eval_mode_keeps_its_batch_norm_statistics_while_seeds_grow(tmp_path: Path) -> None:
    images, labels = quadrant_images(96, 0)
    backbone = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8))
    net = torch.nn.Sequential(backbone, torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                              torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4))
    backbone.requires_grad_(False)
    backbone.eval()  # a pretrained part: its batch norm normalizes by the statistics it was trained with
    statistics = [buffer.clone() for buffer in backbone.buffers()]
    learning = net[3].running_mean.clone()
    host = morphogen.host_from_module(net, ["1", "4"], example_input=images[:2])
    task = morphogen.task_from_data("frozen", (images[:64], labels[:64]), (images[64:], labels[64:]))
    result = morphogen.grow(task, host, run_dir=str(tmp_path / "run"), config=eager_config(epochs=4),
                            out=io.StringIO())
    assert grown_seeds(result)
    assert all(torch.equal(before, after) for before, after in zip(statistics, backbone.buffers(), strict=True))
    assert not torch.equal(learning, net[3].running_mean)  # the rest trained in training mode
    assert not backbone.training and net[3].training


def test_grow_under_autocast_trains_every_forward_in_bfloat16_with_float32_weights(tmp_path: Path) -> None:
    images, labels = quadrant_images(96, 0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3, padding=1),
                              torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4))
    host = morphogen.host_from_module(net, ["1", "3"], example_input=images[:2])
    seen: set[torch.dtype] = set()
    net[0].register_forward_hook(lambda module, inputs, output: seen.add(output.dtype))
    task = morphogen.task_from_data("mixed", (images[:64], labels[:64]), (images[64:], labels[64:]))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # "cuda" on a GPU
        result = morphogen.grow(task, host, run_dir=str(tmp_path / "run"), config=eager_config(epochs=4),
                                out=io.StringIO())
    assert grown_seeds(result) and math.isfinite(result.grown.final_loss)
    assert seen == {torch.bfloat16}  # training, shadow, validation and probe forwards alike
    assert {parameter.dtype for parameter in result.model.parameters()} == {torch.float32}


def test_a_run_under_one_autocast_trains_each_batch_with_the_current_weights() -> None:
    """Autocast casts each weight once per region: without clearing its cache before every batch, a run under
    one region trained with stale low-precision copies of the weights (4% higher loss here, 4.55 -> 8.69 nats on a
    small language model's first epoch)."""
    task, _ = blobs_task()
    losses = []
    for enabled in (False, True):
        torch.manual_seed(0)
        host = morphogen.host_from_module(mlp(), ["1", "3"], example_input=task.validation.inputs[:2])
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
            losses.append(morphogen.grow(task, host, config=eager_config(epochs=4), out=io.StringIO()).grown.final_loss)
    assert losses[1] == pytest.approx(losses[0], rel=5e-3)  # bfloat16's rounding, not a stale copy


def test_the_users_metric_names_the_score(tmp_path: Path) -> None:
    out = io.StringIO()
    result = morphogen.grow(user_tasks.mlp_regression(), run_dir=str(tmp_path / "run"), out=out,
                            config=eager_config(epochs=2))
    assert "final val hit rate" in out.getvalue()
    assert 0.0 <= result.grown.final_accuracy <= 1.0  # the metric's own units: a fraction here


@pytest.mark.slow
@pytest.mark.parametrize(("function", "name"), [("resnet", "quadrants"), ("gpt", "counting"),
                                                ("mlp_regression", "blobs"), ("padded", "padded")])
def test_run_grows_a_users_task_named_by_import_path(function: str, name: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(HERE)  # the current directory is searched first, as `python -m` does
    run_dir = tmp_path / "run"
    code = main(["run", "--task", f"user_tasks:{function}", "--config", str(EAGER), "--run-dir", str(run_dir),
                 "--threads", "1"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert f"task {name} (" in out
    # The first line says how the host trains: AdamW for a transformer (the GPT, the padded classifier), else SGD.
    assert ("AdamW lr 0.005" if function in ("gpt", "padded") else "SGD lr 0.01") in out.splitlines()[0]
    config = json.loads((run_dir / "config.json").read_text())
    assert config["task"] == f"user_tasks:{function}" and config["task_name"] == name
    assert json.loads((run_dir / "summary.json").read_text())["grown"]["seeds"]
    # The recorded config reproduces the run.
    code = main(["run", "--config", str(run_dir / "config.json"), "--run-dir", str(tmp_path / "again"),
                 "--threads", "1"])
    assert code == 0, capsys.readouterr().err
    first = json.loads((run_dir / "summary.json").read_text())["grown"]
    again = json.loads((tmp_path / "again" / "summary.json").read_text())["grown"]
    assert again["final_accuracy"] == first["final_accuracy"] and again["parameters"] == first["parameters"]
    # Export rebuilds the host through the import path; a seed still BLENDING after 4 epochs is left out.
    assert main(["export", str(run_dir), "--leave-out-blending"]) == 0, capsys.readouterr().err
    model, task = rebuild_run(run_dir)
    assert task is not None
    inputs = example_input_of(task, 3)
    with torch.no_grad():
        expected = morphogen.grown_network(model, leave_out_blending=True)(inputs)
        program = torch.export.load(run_dir / "model.pt2").module()
        torch.testing.assert_close(call(program, inputs), expected, rtol=0, atol=1e-5)  # as the user's model is


@pytest.mark.parametrize(("table", "first_line", "optimizer"), [
    ('schedule = "cosine"', "AdamW lr 0.005 cosine", "adamw"),  # over the transformer's default: AdamW
    ('name = "sgd"\nhost_lr = 0.05', "SGD lr 0.05", "sgd"),  # named: from SGD's defaults, and the default is told
])
def test_an_optimizer_table_is_laid_over_the_default_of_the_users_model(
        table: str, first_line: str, optimizer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The default of a task of the user's own depends on its model (AdamW for a transformer), which the command
    knows only once the user's function has built the task: a table that names no optimizer still builds on it."""
    monkeypatch.chdir(HERE)
    config = tmp_path / "run.toml"
    config.write_text(EAGER.read_text().replace("max_epochs = 4", "max_epochs = 1") + f"[episode.optimizer]\n{table}\n")
    code = main(["run", "--task", "user_tasks:gpt", "--config", str(config), "--run-dir", str(tmp_path / "run"),
                 "--threads", "1"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.splitlines()[0].endswith(first_line)
    assert ('note: the optimizer settings make this transformer train with SGD; without them, AdamW lr 0.005'
            in out) == (optimizer == "sgd")
    recorded = json.loads((tmp_path / "run" / "config.json").read_text())["episode"]["optimizer"]
    assert recorded["name"] == optimizer


def test_eval_lays_an_optimizer_table_over_the_default_of_the_users_model(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(HERE)
    config = tmp_path / "eval.toml"
    config.write_text('policy = "default"\ntask = "user_tasks:gpt"\nepisodes = 1\nepisode_length = 1\n'
                      '[optimizer]\nschedule = "cosine"\n')
    assert main(["eval", "--config", str(config), "--run-dir", str(tmp_path / "eval"), "--threads", "1"]) == 0
    recorded = json.loads((tmp_path / "eval" / "config.json").read_text())["optimizer"]
    assert (recorded["name"], recorded["schedule"]) == ("adamw", "cosine")


@pytest.mark.parametrize("command", [["run", "--epochs", "1"],
                                     ["eval", "--policy", "default", "--episodes", "1", "--episode-length", "1"]])
def test_a_task_name_reaches_the_first_line_with_its_control_characters_escaped(
        command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The task's name is the user's free text: `run` and `eval` print it as `\\x1b`-style escapes, never raw."""
    monkeypatch.chdir(HERE)
    assert main([*command, "--task", "user_tasks:escape_name", "--run-dir", str(tmp_path / "run"),
                 "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out
    assert " \\x1b[2Jblobs\\u202e " in out.splitlines()[0]


def test_a_slot_id_reaches_the_terminal_escaped_and_never_as_markup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A slot's id is the name of the user's submodule, free text: `list`, `run` and `export` print its control
    characters as escapes and its brackets as written (`list` gave Rich `[/x]` as markup, which raised)."""
    monkeypatch.chdir(HERE)
    shown = "\\x1b[2J[/x]\\u202e"
    for listing in ("slots", "blueprints"):
        assert main(["list", listing, "--task", "user_tasks:escape_slot"]) == 0
        out = capsys.readouterr().out
        assert shown in out and "\x1b" not in out and "\u202e" not in out
    run_dir = tmp_path / "run"
    assert main(["run", "--task", "user_tasks:escape_slot", "--config", str(EAGER), "--run-dir", str(run_dir),
                 "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert f"| {shown} branch_wide " in out and f"branch_wide {shown} " in out  # an epoch's line, the seed's story
    assert "\x1b" not in out and "\u202e" not in out
    assert main(["export", str(run_dir), "--output", str(tmp_path / "grown.pt2")]) == 0
    out = capsys.readouterr().out
    assert f"branch_wide in {shown} (" in out and "\x1b" not in out and "\u202e" not in out


@pytest.mark.parametrize(("task", "message"), [
    ("user_tasks:not_a_task", "task: user_tasks:not_a_task returned int; return morphogen.task_from_data(...)"),
    ("user_tasks:raises", "task: user_tasks:raises raised RuntimeError: the dataset directory is missing"),
    ("user_tasks:missing", "task: module 'user_tasks' has no function 'missing'"),
    ("user_tasks:NOT_A_FUNCTION", "task: 'NOT_A_FUNCTION' in module 'user_tasks' is not callable (its type is int); "
                                  "name a function"),
    ("no_such_module:make", "task: cannot import 'no_such_module' for no_such_module:make: ModuleNotFoundError"),
    ("user_tasks:wrong_shapes", "task 'wrong': the model and its loss failed on the validation data: RuntimeError"),
    ("user_tasks:vector_loss", "the task's loss must return a scalar tensor (the batch mean), returned (64,)"),
    ("user_tasks:nan_loss", "task 'nan': the loss or metric is not finite on the validation data before training"),
    ("user tasks:make", "task: 'user tasks:make' is neither a built-in task nor an import path"),
    ("user_tasks.py:make", "'user_tasks' is not a package; name the module as Python imports it, without a folder "
                           "or .py: user_tasks:make"),
    ("./user_tasks:make", "is neither a built-in task nor an import path package.module:function; name the module as "
                          "Python imports it, without a folder or .py: user_tasks:make"),
    ("tests/own/user_tasks.py:make", "without a folder or .py: user_tasks:make, run from tests/own/ or with it on "
                                     "PYTHONPATH"),
])
def test_a_bad_task_function_is_one_line_and_exit_2_and_writes_nothing(
        task: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(HERE)
    code = main(["run", "--task", task, "--epochs", "1", "--run-dir", str(tmp_path / "run"), "--threads", "1"])
    _, err = capsys.readouterr()
    assert code == EXIT_USER_ERROR
    assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()


def test_a_task_file_named_as_a_module_imported_before_it_says_to_rename_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """./copy.py holding the task: `copy` is the standard library's module, imported long before; the message says
    so, where it only said the module has no such function."""
    (tmp_path / "copy.py").write_text("def make_task():\n    raise AssertionError('never imported')\n")
    monkeypatch.chdir(tmp_path)
    # The import puts the current directory on sys.path: undone after the test, or worker processes spawned by later
    # tests would import this copy.py for the standard library's.
    monkeypatch.setattr(sys, "path", list(sys.path))
    code = main(["run", "--task", "copy:make_task", "--epochs", "1", "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == EXIT_USER_ERROR and err.count("\n") == 1
    assert "task: module 'copy' has no function 'make_task' ('copy' is already the module at " in err
    assert f"not {tmp_path / 'copy.py'}: rename your file" in err


def test_data_paths_given_with_a_users_task_warn_that_it_ignores_them(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """--data-dir and --text-file reach only the built-in tasks: with a user's function (called with seed and device)
    the run says it ignores them, as load_task does for a built-in task that does not read one."""
    monkeypatch.chdir(HERE)
    with pytest.warns(UserWarning) as caught:
        code = main(["run", "--task", "user_tasks:mlp_regression", "--data-dir", str(tmp_path / "cifar"),
                     "--text-file", str(tmp_path / "corpus.txt"), "--epochs", "1", "--no-baseline",
                     "--no-from-scratch", "--run-dir", str(tmp_path / "run"), "--threads", "1"])
    assert code == 0
    said = [str(warning.message) for warning in caught]
    assert f"task user_tasks:mlp_regression ignores data_dir={str(tmp_path / 'cifar')!r}: only the built-in " \
           "'cifar10' reads it; your function reads its own data" in said
    assert any("ignores text_file=" in message and "only the built-in 'text' reads it" in message for message in said)


def test_a_host_table_or_a_sample_cap_with_a_users_task_is_refused(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "--task", "user_tasks:resnet", "--max-train-samples", "10", "--run-dir", str(tmp_path)])
    assert code == EXIT_USER_ERROR
    assert "max_train_samples: caps the built-in tasks" in capsys.readouterr().err


def test_a_run_of_a_task_built_in_python_says_how_to_run_it_again(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    train = quadrant_images(64, 0)
    task = morphogen.task_from_data("quadrants", train, train)
    host = morphogen.host_from_module(ResNet(), ["layer1"], example_input=train[0][:2])
    morphogen.grow(task, host, run_dir=str(tmp_path / "run"), config=eager_config(epochs=1), out=io.StringIO())
    code = main(["run", "--config", str(tmp_path / "run" / "config.json"), "--run-dir", str(tmp_path / "again")])
    assert code == EXIT_USER_ERROR
    assert "this run's task was built in Python (morphogen.grow)" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize(("function", "shown"), [("mlp_regression", "task blobs (mlp host"),
                                               ("padded", "task padded (transformer host")])
def test_train_and_eval_a_policy_on_a_users_task(function: str, shown: str, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(HERE)
    policy = tmp_path / "policy"
    assert main(["train", "--task", f"user_tasks:{function}", "--envs", "2", "--rounds", "1",
                 "--episode-length", "3", "--hidden-size", "32", "--run-dir", str(policy), "--threads", "1"]) == 0
    assert json.loads((policy / "config.json").read_text())["task"] == f"user_tasks:{function}"
    assert main(["eval", "--policy", str(policy), "--episodes", "1", "--run-dir", str(tmp_path / "eval"),
                 "--threads", "1"]) == 0
    assert main(["run", "--policy", str(policy), "--task", f"user_tasks:{function}", "--epochs", "3",
                 "--no-baseline", "--run-dir", str(tmp_path / "run"), "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "learned" in out and shown in out
    scores = json.loads((tmp_path / "eval" / "eval.json").read_text())
    if function == "mlp_regression":  # its own loss: compared by its loss, not by accuracy points it does not have
        assert "loss vs no growth %" in out and "final acc %" not in out
        assert all(len(score["losses"]) == 1 for score in scores)
    else:  # a model of two inputs (token ids and a padding mask) under the learned controller
        assert "final acc %" in out


def test_list_shows_the_slots_and_blueprints_of_a_users_host(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(HERE)
    assert main(["list", "slots", "--task", "user_tasks:resnet"]) == 0
    out = capsys.readouterr().out
    assert "slots of the quadrants host (cnn)" in out and "layer3     16" in out
    assert main(["list", "blueprints", "--task", "user_tasks:mlp_regression"]) == 0
    assert "blueprints of the blobs host (mlp)" in capsys.readouterr().out
    # A user's transformer: the submodule after which each slot sits, and whether `block_copy` can stack it.
    assert main(["list", "slots", "--task", "user_tasks:padded"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert rows == [["slot", "width", "after", "block_copy"], ["blocks_0", "16", "blocks.0", "copies", "it"],
                    ["blocks_1", "16", "blocks.1", "copies", "it"]]


def test_report_and_runs_show_the_users_task_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    task, host = user_tasks.resnet()
    morphogen.grow(task, host, run_dir=str(tmp_path / "runs" / "mine"), config=eager_config(epochs=1),
                   out=io.StringIO())
    assert main(["report", str(tmp_path / "runs" / "mine")]) == 0
    assert "task quadrants" in capsys.readouterr().out
    assert main(["runs", str(tmp_path / "runs")]) == 0
    assert "quadrants" in capsys.readouterr().out


#: What enters each block of the test ResNet (the first block's segment starts at the image) and what leaves it.
_ENTERING, _CHANNELS = [3, 4, 4, 8, 8, 16], [4, 4, 8, 8, 16, 16]


@pytest.mark.parametrize(("blueprint", "added_weights"), [
    # a 3x3 conv to 4x the slot's channels and one back, their biases, the GroupNorm's affine
    ("conv_wide", sum(2 * 9 * 4 * c * c + 4 * c + c + 2 * 4 * c for c in _CHANNELS)),
    # the same beside the block: the first conv reads what enters it
    ("branch_wide", sum(9 * i * 4 * c + 9 * 4 * c * c + 4 * c + c + 2 * 4 * c for i, c in zip(_ENTERING, _CHANNELS,
                                                                                             strict=True))),
])
def test_a_users_resnet_grows_a_wide_block_after_every_residual_block_at_once(
        blueprint: str, added_weights: int, tmp_path: Path,
        run_without_morphogen: Callable[..., list[torch.Tensor]]) -> None:
    """Depth growth of a residual network: `conv_wide` (after each block) or `branch_wide` (beside it) grafted
    into the slot after each block in one GROW."""
    train, validation = quadrant_images(192, 0), quadrant_images(96, 1000)
    task = morphogen.task_from_data("quadrants", train, validation, batch_size=32, num_classes=4)
    torch.manual_seed(0)
    blocks = ["layer1.0", "layer1.1", "layer2.0", "layer2.1", "layer3.0", "layer3.1"]
    host = morphogen.host_from_module(ResNet(blocks=2), blocks, example_input=train[0][:2])
    config = eager_config(epochs=4)
    config = dataclasses.replace(config, heuristic=dataclasses.replace(config.heuristic, depth_blueprint=blueprint))
    result = morphogen.grow(task, host, run_dir=str(tmp_path / "run"), config=config, out=io.StringIO())
    grafted = [story for story in result.grown.stories if story.blueprint == blueprint]
    assert sorted(story.slot for story in grafted) == [block.replace(".", "_") for block in blocks]
    assert len({story.stages["training"] for story in grafted}) == 1  # all in one epoch
    added = sum(p.numel() for slot in result.model.slots() if slot.seed is not None for p in slot.seed.parameters())
    assert added == added_weights
    inputs = validation[0][:5]
    with torch.no_grad():
        expected = result.model.eval()(inputs)
    exported = morphogen.export_model(result.model, inputs[:2], tmp_path / "grown.pt2")
    torch.testing.assert_close(run_without_morphogen([exported], inputs)[0], expected, rtol=0, atol=1e-5)


def test_a_users_gpt_grows_its_mlps_wider_at_once_and_exports_them(
        tmp_path: Path, run_without_morphogen: Callable[..., list[torch.Tensor]]) -> None:
    """Width growth of a transformer: `wider` grafted into the MLP of both blocks in one GROW (torch's attention
    under a causal mask sized from the input is kept whole while the blocks are traced)."""
    task = user_tasks.gpt()
    config = eager_config(epochs=4)
    config = dataclasses.replace(config, heuristic=dataclasses.replace(config.heuristic, depth_blueprint="wider"))
    result = morphogen.grow(task, None, run_dir=str(tmp_path / "run"), config=config, out=io.StringIO())
    grafted = [story for story in result.grown.stories if story.blueprint == "wider"]
    assert sorted(story.slot for story in grafted) == ["blocks_0", "blocks_1"]
    assert len({story.stages["training"] for story in grafted}) == 1  # all in one epoch
    added = sum(p.numel() for slot in result.model.slots() if slot.seed is not None for p in slot.seed.parameters())
    assert added == 2 * (16 * 32 + 32 + 32 * 16)  # each MLP's 32 hidden neurons doubled: rows, biases, columns
    inputs = next(iter(task.validation.iterate_batches(5, shuffle=False)))[0][:5]
    with torch.no_grad():
        expected = result.model.eval()(inputs)
    exported = morphogen.export_model(result.model, inputs[:2], tmp_path / "grown.pt2")
    torch.testing.assert_close(run_without_morphogen([exported], inputs)[0], expected, rtol=0, atol=1e-5)


def _epochs(run_dir: Path) -> list[tuple[float, float]]:
    """(training loss, validation loss) of each epoch of a run's events."""
    records = [json.loads(line) for line in run_dir.read_text().splitlines()]
    return [(record["train_loss"], record["val_loss"]) for record in records if record["event"] == "epoch_completed"]


def test_a_shuffled_loader_and_dropout_give_the_grown_run_and_its_twin_the_same_batches(tmp_path: Path) -> None:
    """A user's `DataLoader(shuffle=True)` and dropout draw from torch's global generator. The grown run and its
    no-growth twin must still train on the same batches, with the same dropout masks, until something grows; and
    a run must not depend on what the process drew before it."""
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*blobs(96, 0)), batch_size=16, shuffle=True)
    task = morphogen.task_from_data("shuffled", loader, blobs(48, 1), num_classes=3)
    config = eager_config(epochs=5, baseline=True, slots=("4",))
    config = dataclasses.replace(config, heuristic=dataclasses.replace(config.heuristic, warmup_epochs=2))

    def grown_run(name: str, draw_first: int) -> morphogen.RunResult:
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3),
                                  torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
        torch.rand(draw_first)  # what a user's script draws before growing
        host = morphogen.host_from_module(net, slots=["4"], example_input=torch.zeros(2, 12))
        return morphogen.grow(task, host, run_dir=str(tmp_path / name), config=config, out=io.StringIO())

    result = grown_run("first", 0)
    germinated = min(story.stages["training"] for story in result.grown.stories if "training" in story.stages)
    assert germinated >= 2
    grown = _epochs(tmp_path / "first" / "events.jsonl")
    twin = _epochs(tmp_path / "first" / "baseline" / "events.jsonl")
    assert len(grown) == len(twin) == 5
    assert grown[:germinated] == twin[:germinated]  # bit for bit: the same batches, the same dropout masks
    assert grown != twin  # the seed changed the run once it trained
    grown_run("second", 7)
    assert _epochs(tmp_path / "second" / "events.jsonl") == grown


def test_grow_takes_a_preset_a_mapping_of_tables_or_load_configs_settings(tmp_path: Path) -> None:
    """The README's choices of growth by name, and any setting without importing morphogen's internals."""
    lean = morphogen.load_config("grow_lean", episode={"max_epochs": 2})
    assert lean.heuristic.widening == "wider_half" and lean.episode.max_epochs == 2
    compute = morphogen.load_config("grow_for_compute", heuristic={"warmup_fraction": 0.4})
    assert (compute.heuristic.warmup_fraction, compute.heuristic.depth_blueprint) == (0.4, "conv_light")
    assert compute.episode.slots.gates.loss_min_contribution == 0.0  # the preset's table, kept beside the override
    with pytest.raises(morphogen.ConfigError, match=r"^heuristic\.warmup_fractions: unknown key; accepted: "):
        morphogen.load_config(heuristic={"warmup_fractions": 0.4})

    task = user_tasks.gpt()  # a transformer of the user's: AdamW by default
    tables = {"episode": {"optimizer": {"schedule": "cosine"}}, "heuristic": {"first_growth_by": 0.5}}
    morphogen.grow(task, epochs=1, baseline=False, from_scratch=False, run_dir=str(tmp_path / "tables"),
                   config=tables, out=io.StringIO())
    recorded = json.loads((tmp_path / "tables" / "config.json").read_text())
    assert recorded["episode"]["optimizer"]["name"] == "adamw"  # the table laid over the model's own optimizer
    assert recorded["episode"]["optimizer"]["schedule"] == "cosine"
    assert recorded["heuristic"]["first_growth_by"] == 0.5
    task, host = user_tasks.resnet()  # the preset grows convolutional blocks
    morphogen.grow(task, host, epochs=1, baseline=False, from_scratch=False, run_dir=str(tmp_path / "preset"),
                   config="grow_for_compute", out=io.StringIO())
    recorded = json.loads((tmp_path / "preset" / "config.json").read_text())
    assert recorded["heuristic"]["depth_blueprint"] == "conv_light"


def resnet_of_width(task: morphogen.Task) -> Callable[[int], Callable[[], morphogen.ModuleHost]]:
    """For a width, a function building the user's ResNet of that width as a host for `task`'s images."""
    example = next(iter(task.validation.iterate_batches(2, shuffle=False)))[0]
    return lambda width: lambda: morphogen.host_from_module(ResNet(width=width), ["layer1", "layer2", "layer3"],
                                                            example_input=example)


def test_grow_compares_with_other_hosts_trained_without_growth_on_the_same_batches(tmp_path: Path) -> None:
    """`compare_with`: other sizes of the user's model beside the grown one, each trained as the no-growth twin is
    (same data, epochs and seed), so that the same host compared with equals the twin to the bit."""
    task, _ = user_tasks.resnet()
    resnet = resnet_of_width(task)
    out = io.StringIO()
    result = morphogen.grow(task, resnet(4), run_dir=str(tmp_path / "run"), out=out, baseline=True,
                            from_scratch=False, config=eager_config(epochs=2),
                            compare_with={"same host": resnet(4), "width 8": resnet(8)})
    assert result.baseline is not None and list(result.fixed) == ["same host", "width 8"]
    same, wider = result.fixed["same host"], result.fixed["width 8"]
    assert (same.final_loss, same.final_accuracy) == (result.baseline.final_loss, result.baseline.final_accuracy)
    assert wider.parameters == sum(p.numel() for p in resnet(8)().parameters()) > same.parameters
    assert wider.flops.total > same.flops.total
    table = out.getvalue().split("hosts to compare with, trained without growth", 1)[1]
    assert "same host" in table and "width 8" in table and f"{wider.parameters:,}" in table
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert [(entry["name"], entry["parameters"]) for entry in summary["fixed"]] == [
        ("same host", same.parameters), ("width 8", wider.parameters)]
    assert (tmp_path / "run" / "fixed" / "1" / "events.jsonl").is_file()


@pytest.mark.parametrize(("compare_with", "error", "message"), [
    ({1: None}, morphogen.ConfigError, "compare_with: each name is a string of 1 to 40 characters, got 1"),
    ({"plain": torch.nn.Linear(2, 2)}, morphogen.DataError, "its host is a Linear, not a host"),
])
def test_a_host_to_compare_with_that_cannot_be_used_fails_before_anything_is_written(
        compare_with: dict[object, object], error: type[Exception], message: str, tmp_path: Path) -> None:
    task, host = user_tasks.resnet()
    with pytest.raises(error, match=message):
        morphogen.grow(task, host, run_dir=str(tmp_path / "run"), out=io.StringIO(), epochs=1,
                       compare_with=compare_with)  # type: ignore[arg-type]
    assert not (tmp_path / "run").exists()


def test_grow_over_seeds_gives_means_and_differences_paired_by_seed(tmp_path: Path) -> None:
    task, _ = user_tasks.resnet()
    resnet = resnet_of_width(task)
    out = io.StringIO()
    result = morphogen.grow_over_seeds(task, resnet(4), seeds=[3, 5, 7], run_dir=str(tmp_path / "seeds"), out=out,
                                       config=eager_config(epochs=2, baseline=True),
                                       compare_with={"width 8": resnet(8)})
    assert list(result.runs) == [3, 5, 7] and list(result.differences) == ["no growth", "width 8"]
    grown = [run.grown.final_accuracy for run in result.runs.values()]
    baseline = [run.baseline.final_accuracy for run in result.runs.values()]  # type: ignore[union-attr]
    losses = {run.baseline.final_loss for run in result.runs.values()}  # type: ignore[union-attr]
    assert len(losses) == 3, "each seed builds its own host and batch order"
    differences = [g - b for g, b in zip(grown, baseline, strict=True)]
    mean, error = result.differences["no growth"]
    assert math.isclose(mean, sum(differences) / 3)
    assert math.isclose(error, (sum((d - mean) ** 2 for d in differences) / 2) ** 0.5 / 3 ** 0.5)
    printed = out.getvalue()
    assert printed.startswith("seed 3: grown ") and "\nseed 7: grown " in printed
    assert "3 seeds (3, 5, 7): mean ± std over the seeds" in printed and "grown - width 8" in printed
    assert all((tmp_path / "seeds" / f"seed_{seed}" / "summary.json").is_file() for seed in (3, 5, 7))
    figures = json.loads((tmp_path / "seeds" / "seeds.json").read_text())
    assert figures["differences"]["no growth"] == {"mean": mean, "standard_error": error}
    assert figures["seeds"]["5"]["fixed"]["width 8"] == result.runs[5].fixed["width 8"].final_accuracy


def test_a_host_function_returning_the_same_module_each_time_starts_every_training_from_its_weights(
        tmp_path: Path) -> None:
    """`lambda: host` hands every training the same module: each trains a copy of it, so the grown run, its twin
    and a second `grow` all start from the module's own weights, which stay as they were."""
    task, host = user_tasks.resnet()
    before = {name: tensor.clone() for name, tensor in host.state_dict().items()}
    results = [morphogen.grow(task, lambda: host, seed=1, epochs=2, from_scratch=False, out=io.StringIO(),
                              run_dir=str(tmp_path / str(index))) for index in range(2)]
    assert [(r.grown.final_loss, r.baseline.final_loss) for r in results] == \
        [(results[0].grown.final_loss, results[0].baseline.final_loss)] * 2  # type: ignore[union-attr]
    assert all(torch.equal(before[name], tensor) for name, tensor in host.state_dict().items())


def blobs_task() -> tuple[morphogen.Task, morphogen.ModuleHost]:
    """A small MLP of the user's on Gaussian blobs (quick to grow over seeds), its host beside the task."""
    train, validation = blobs(192, 0), blobs(96, 1)
    task = morphogen.task_from_data("blobs", train, validation, batch_size=32, num_classes=3)
    return task, morphogen.host_from_module(mlp(), ["1", "3"], example_input=train[0][:2])


def test_grow_over_seeds_in_worker_processes_gives_the_figures_of_one_process(tmp_path: Path) -> None:
    """Each seed starts from the host module's own weights, which stay as they were: in one process too, where
    `grow` would load a seed's grown weights back into the module that the next seed starts from."""
    task, host = blobs_task()
    before = {name: tensor.clone() for name, tensor in host.state_dict().items()}
    figures = []
    for jobs in (1, 2):
        result = morphogen.grow_over_seeds(task, host, seeds=[2, 6], run_dir=str(tmp_path / str(jobs)),
                                           out=io.StringIO(), jobs=jobs, threads=1,
                                           config=eager_config(epochs=2, baseline=True))
        figures.append([(seed, run.grown.final_accuracy, run.grown.final_loss, run.grown.flops.total,
                         run.baseline.final_loss, run.model.architecture())  # type: ignore[union-attr]
                        for seed, run in result.runs.items()])
        assert (tmp_path / str(jobs) / "seed_6" / "summary.json").is_file()
    assert figures[0] == figures[1]
    assert figures[0][0][2] != figures[0][1][2], "the seeds differ"
    assert all(torch.equal(before[name], tensor) for name, tensor in host.state_dict().items())


def test_grown_models_with_weight_normed_layers_come_back_from_worker_processes(tmp_path: Path) -> None:
    """pickle refuses a parametrized module (weight norm, spectral norm): such a model comes back through the run
    directory it was saved in, loaded into a fresh host, and computes what the same seed's model of one process
    computes."""
    task, _ = blobs_task()
    inputs = next(iter(task.validation.iterate_batches(8, shuffle=False)))[0]

    def weight_normed() -> morphogen.ModuleHost:
        net = mlp()
        torch.nn.utils.parametrizations.weight_norm(net[0])
        return morphogen.host_from_module(net, ["1", "3"], example_input=inputs[:2])

    outputs = []
    for jobs in (1, 2):
        result = morphogen.grow_over_seeds(task, weight_normed, seeds=[1, 4], run_dir=str(tmp_path / str(jobs)),
                                           out=io.StringIO(), jobs=jobs, threads=1,
                                           config=eager_config(epochs=3, from_scratch=True))
        with torch.no_grad():
            outputs.append([(run.model.eval()(inputs), run.model.architecture()) for run in result.runs.values()])
        assert all(hasattr(run.model.host.get_submodule("segments.0.0"), "parametrizations")
                   for run in result.runs.values())
    for (one, architecture), (other, other_architecture) in zip(*outputs, strict=True):
        torch.testing.assert_close(one, other, rtol=0, atol=1e-6)
        assert architecture == other_architecture
    with pytest.raises(morphogen.ConfigError, match=r"jobs: the host holds parametrized layers .* pass a function"):
        morphogen.grow_over_seeds(task, weight_normed(), seeds=2, jobs=2, run_dir=str(tmp_path / "module"),
                                  config=eager_config(epochs=1))


def test_grow_over_seeds_resumes_reading_the_seeds_that_finished_and_playing_the_others(tmp_path: Path) -> None:
    task, host = blobs_task()
    options: dict[str, Any] = {"config": eager_config(epochs=2, baseline=True), "out": io.StringIO()}
    whole = morphogen.grow_over_seeds(task, host, seeds=[1, 4], run_dir=str(tmp_path / "seeds"), **options)
    def without_seconds() -> dict[str, Any]:  # wall time: the one figure a seed played again does not repeat
        figures: dict[str, Any] = json.loads((tmp_path / "seeds" / "seeds.json").read_text())
        for seed in figures["seeds"].values():
            for costs in seed["costs"].values():
                costs.pop("seconds")
        return figures

    figures = without_seconds()
    with pytest.raises(ValueError, match="holds a finished run over several seeds: nothing to resume"):
        morphogen.grow_over_seeds(task, host, seeds=[1, 4], run_dir=str(tmp_path / "seeds"), resume=True, **options)
    # As a run over seeds stopped before seed 4 began leaves its directory.
    (tmp_path / "seeds" / "seeds.json").unlink()
    shutil.rmtree(tmp_path / "seeds" / "seed_4")
    with pytest.raises(morphogen.ConfigError, match=re.escape("plays [1, 4], not [1, 4, 5]; resume it with its own")):
        morphogen.grow_over_seeds(task, host, seeds=[1, 4, 5], run_dir=str(tmp_path / "seeds"), resume=True,
                                  **options)
    resumed = morphogen.grow_over_seeds(task, host, seeds=[1, 4], run_dir=str(tmp_path / "seeds"), resume=True,
                                        **options)
    assert list(resumed.runs) == [4], "seed 1 finished before: read back, not played"
    assert resumed.differences == whole.differences
    assert without_seconds() == figures


def test_grow_over_seeds_sends_lambdas_and_locally_defined_models_to_worker_processes(tmp_path: Path) -> None:
    """What a notebook or a function defines (a model class, a host function as a lambda, a loss) reaches the
    workers by value, with the figures of one process; pickle would refuse all three."""

    class Residual(torch.nn.Module):  # as a notebook cell defines them: no module a worker could import them from
        def __init__(self, width: int) -> None:
            super().__init__()
            self.layer = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU())

        def forward(self, inputs: torch.Tensor) -> torch.Tensor:
            return inputs + self.layer(inputs)

    class LocalNet(torch.nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.stem, self.block, self.head = torch.nn.Linear(12, width), Residual(width), torch.nn.Linear(width, 3)

        def forward(self, inputs: torch.Tensor) -> torch.Tensor:
            return self.head(self.block(torch.relu(self.stem(inputs))))

    train, validation = blobs(192, 0), blobs(96, 1)
    task = morphogen.task_from_data("blobs", train, validation, batch_size=32, num_classes=3,
                                    loss=lambda outputs, targets: torch.nn.functional.cross_entropy(outputs, targets),
                                    metric=lambda outputs, targets: -torch.nn.functional.cross_entropy(
                                        outputs, targets).item())

    def host_of(width: int) -> Callable[[], morphogen.ModuleHost]:
        return lambda: morphogen.host_from_module(LocalNet(width), ["block"], example_input=train[0][:2])

    figures = []
    for jobs in (1, 2):
        result = morphogen.grow_over_seeds(task, host_of(8), seeds=[0, 3], run_dir=str(tmp_path / str(jobs)),
                                           out=io.StringIO(), jobs=jobs, threads=1, compare_with={"wide": host_of(16)},
                                           config=eager_config(epochs=2, baseline=True))
        figures.append([(seed, run.grown.final_loss, run.grown.flops.total, run.fixed["wide"].final_loss,
                         run.model.architecture()) for seed, run in result.runs.items()])
        # The grown model holds the user's own block, sent back from the worker as the class defined here.
        assert all(any(type(module) is Residual for module in run.model.modules()) for run in result.runs.values())
    assert figures[0] == figures[1]
    assert figures[0][0][1] != figures[0][1][1], "each seed drew its own weights"


def test_grow_over_seeds_in_one_process_runs_at_the_thread_count_given_then_restores_its_own(tmp_path: Path) -> None:
    """`jobs=1, threads=1` gives the figures of `jobs=2, threads=1`: a run's sums depend on torch's thread count."""
    task, host = blobs_task()
    seen: list[int] = []

    def counting_host() -> morphogen.ModuleHost:
        seen.append(torch.get_num_threads())
        return host

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        morphogen.grow_over_seeds(task, counting_host, seeds=[0], run_dir=str(tmp_path / "seeds"), out=io.StringIO(),
                                  jobs=1, threads=1, config=eager_config(epochs=1, baseline=False))
        assert seen and set(seen) == {1}
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_grow_over_seeds_refuses_what_worker_processes_cannot_receive_before_anything_is_written(
        tmp_path: Path) -> None:
    task, host = user_tasks.resnet()
    lock = threading.Lock()
    with pytest.raises(morphogen.ConfigError, match=r"^jobs: worker processes receive the task, host and options "
                                                    r"pickled, and this one cannot be \(cannot pickle '_thread.lock' "
                                                    r"object\); .* or use jobs=1$"):
        morphogen.grow_over_seeds(task, lambda: (lock, host)[1], seeds=2, jobs=2, run_dir=str(tmp_path / "seeds"))
    with pytest.raises(morphogen.ConfigError, match=r"^jobs must be >= 1, got 0$"):
        morphogen.grow_over_seeds(task, host, seeds=2, jobs=0, run_dir=str(tmp_path / "seeds"))
    assert not (tmp_path / "seeds").exists()


@pytest.mark.parametrize(("options", "message"), [
    ({"seeds": 0}, "seeds: must be 1 to 100 distinct seeds >= 0 (or their count), got 0"),
    ({"seeds": [1, 1]}, "seeds: must be 1 to 100 distinct seeds >= 0 (or their count), got [1, 1]"),
    ({"seeds": True}, "seeds: must be 1 to 100 distinct seeds >= 0 (or their count), got True"),
    ({"seeds": [2**63]}, "seeds: 9,223,372,036,854,775,808 is past the largest seed, 9,223,372,036,854,775,807"),
    ({"seed": 3}, "grow_over_seeds: seed is chosen per seed"),
])
def test_grow_over_seeds_refuses_what_it_cannot_play_in_one_line(options: dict[str, object], message: str) -> None:
    task, host = user_tasks.resnet()
    with pytest.raises(morphogen.ConfigError, match=f"^{re.escape(message)}"):
        morphogen.grow_over_seeds(task, host, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(("option", "message"), [
    ("epoch", "grow_over_seeds() got an unexpected keyword argument 'epoch': did you mean 'epochs'?"),
    ("colour", "grow_over_seeds() got an unexpected keyword argument 'colour' (it takes grow's: epochs, baseline, "),
])
def test_grow_over_seeds_names_itself_for_an_option_grow_does_not_take(option: str, message: str,
                                                                      tmp_path: Path) -> None:
    """A misspelt option: the line names the function called (it named the internal grow_settings()), before
    anything is written."""
    task, host = user_tasks.resnet()
    with pytest.raises(TypeError, match=f"^{re.escape(message)}"):
        morphogen.grow_over_seeds(task, host, seeds=1, run_dir=str(tmp_path / "seeds"), **{option: 1})
    assert not (tmp_path / "seeds").exists()


def test_grow_keeps_the_configs_settings_its_keywords_leave_out(tmp_path: Path) -> None:
    task, host = user_tasks.resnet()
    result = morphogen.grow(task, host, out=io.StringIO(), epochs=1,
                            config={"seed": 3, "baseline": False, "runs_root": str(tmp_path / "elsewhere")})
    assert result.baseline is None and result.run_dir.parent == tmp_path / "elsewhere"
    assert json.loads((result.run_dir / "config.json").read_text())["seed"] == 3
    again = morphogen.grow(task, host, out=io.StringIO(), epochs=1, seed=4, baseline=True,
                           config={"seed": 3, "baseline": False}, run_dir=str(tmp_path / "given"))
    assert again.baseline is not None and json.loads((again.run_dir / "config.json").read_text())["seed"] == 4


@pytest.mark.parametrize("epochs", ["3", 2.5, True])
def test_a_count_that_is_not_an_integer_is_one_line(epochs: object, tmp_path: Path) -> None:
    data = (torch.randn(8, 12), torch.arange(8) % 3)
    task = morphogen.task_from_data("counts", data, data, num_classes=3)
    host = morphogen.host_from_module(mlp(), ["1"], example_input=data[0][:2])
    with pytest.raises(morphogen.ConfigError, match=rf"^epochs must be an integer, got {re.escape(repr(epochs))}$"):
        morphogen.grow(task, host, epochs=epochs, run_dir=str(tmp_path / "run"), out=io.StringIO())  # type: ignore[arg-type]


def test_a_depth_blueprint_no_slot_can_take_is_said_once_with_the_reason() -> None:
    validation = blobs(64, 1)
    task = morphogen.task_from_data("blobs", blobs(96, 0), validation, num_classes=3)
    host = morphogen.host_from_module(mlp(), ["1", "3"], example_input=validation[0][:2])
    out = io.StringIO()  # each slot follows a Linear and its ReLU: no pair of layers inside to widen between
    morphogen.grow(task, host, epochs=2, baseline=False, from_scratch=False, out=out,
                   config={"heuristic": {"depth_blueprint": "wider_inside"}})
    lines = out.getvalue().splitlines()
    assert all(len(line) <= 120 for line in lines)
    notes = [line for line in "\n".join(lines).replace("\n      ", " ").splitlines()
             if line.startswith("note: [heuristic]")]  # a note's continuation lines are indented
    assert len(notes) == 1 and notes[0].startswith("note: [heuristic] depth_blueprint = 'wider_inside' cannot be "
                                                   "grafted into 1, 3 (slot 1 ")
    assert notes[0].endswith("; the heuristic grows seed by seed instead")
    out = io.StringIO()
    for settings in ({}, {"heuristic": {"depth_blueprint": ""}}):  # the default, and seed by seed: nothing to say
        morphogen.grow(task, host, epochs=1, baseline=False, from_scratch=False, out=out, config=settings)
        assert "note: [heuristic]" not in out.getvalue()
