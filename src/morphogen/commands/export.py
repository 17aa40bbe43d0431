"""`morphogen export RUN_DIR`: the model a run grew, as a file that needs only torch (or an ONNX runtime).

The model is rebuilt as `run --config RUN_DIR/config.json` builds it, loaded from `RUN_DIR/model.pt`, and
traced on the CPU with the first validation inputs of the run's task (see `morphogen.export`). The output
goes to `--output`, by default `RUN_DIR/model.pt2` (or `model.onnx`). `--from-scratch` exports the grown
model's final architecture as the run trained it from scratch (`RUN_DIR/from_scratch/model.pt`), by default to
`RUN_DIR/model_from_scratch.pt2`. It never replaces one of the run's own files, and writing into the run
directory holds its lock, like every other writer.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import TextIO

from torch import Tensor

from morphogen.core.lifecycle import Stage
from morphogen.core.model import MorphogeneticModel
from morphogen.core.plain import ExportError, exported_stages
from morphogen.core.slot import SeedSlot
from morphogen.export import FORMATS, check_suffix, example_input_of, export_model, rebuild_run
from morphogen.run_directory import LockPurpose, hold_run_directory, run_of_file
from morphogen.ui.terminal_text import printable


def export_command(run_dir: str, format: str = "torch-export", output: str | None = None,
                   leave_out_blending: bool = False, out: TextIO | None = None, from_scratch: bool = False,
                   dynamic_dims: tuple[int, ...] = (), raw_inputs: bool = False) -> Path:
    """Export the grown model of `run_dir` (`from_scratch`: its final architecture as the run trained it from
    scratch); prints what went in, what inputs it takes and how to load it. `raw_inputs` folds the task's input
    standardization in. Returns the path written."""
    out = sys.stdout if out is None else out
    if format not in FORMATS:
        raise ExportError(f"unknown export format {format!r}; valid: {', '.join(FORMATS)}")
    run = Path(run_dir)
    path = _output_path(run, output, format, from_scratch)
    inside = path.resolve().parent.is_relative_to(run.resolve())
    lock = hold_run_directory(run, LockPurpose.EXPORT) if inside else contextlib.nullcontext()
    model, task = rebuild_run(run, "cpu", from_scratch=from_scratch)
    assert task is not None  # rebuilt from the run's config: its task was loaded
    standardization = task.input_standardization
    if raw_inputs and standardization is None:
        raise ExportError(f"--raw-inputs: task {task.name!r} standardizes nothing; its model reads the data as it is")
    example = example_input_of(task)
    if raw_inputs and standardization is not None:
        assert isinstance(example, Tensor)  # the built-in tasks that standardize take one image tensor
        example = standardization.to_raw(example)
    with lock:
        written = export_model(model, example, path, format=format, leave_out_blending=leave_out_blending,
                               dynamic_dims=dynamic_dims, raw_inputs=standardization if raw_inputs else None)
    _print_summary(model, written, format, out, leave_out_blending)
    if standardization is not None:
        print(f"  its inputs: {standardization.raw}, as they are (the standardization is folded in)" if raw_inputs
              else f"  its inputs: standardized, (x - mean) / std per channel from {standardization.raw}, mean "
                   f"{_numbers(standardization.mean)}, std {_numbers(standardization.std)} (--raw-inputs folds "
                   "that in)", file=out)
    return written


def _numbers(values: tuple[float, ...]) -> str:
    return "[" + ", ".join(f"{value:.4f}" for value in values) + "]"


def _output_path(run: Path, output: str | None, format: str, from_scratch: bool) -> Path:
    """`--output`, or the default file in the run directory; refused before the run is rebuilt where it ends in the
    other format's suffix (`--output grown.onnx` without `--format onnx`), names a directory (`--output exports/`)
    or a file a run keeps."""
    default = run / f"{'model_from_scratch' if from_scratch else 'model'}{FORMATS[format]}"
    given: str | Path = default if output is None else output
    check_suffix(given, format)  # the string as given: Path drops a directory's trailing separator
    path = Path(given)
    _refuse_run_file(path)
    return path


def _refuse_run_file(path: Path) -> None:
    """`ExportError` where `path` names a file a run keeps (its model, events, summary, ...), this run's or another's
    (`run_of_file`): an export must not replace it."""
    directory = run_of_file(path)
    if directory is not None:
        raise ExportError(f"--output {path} would replace the {path.name} of the run in {directory}; choose "
                          "another name")


def _print_summary(model: MorphogeneticModel, written: Path, format: str, out: TextIO,
                   leave_out_blending: bool) -> None:
    """What went into the exported file (a BLENDING seed with its alpha), what was left out, and how to load it."""
    exported = exported_stages(leave_out_blending)

    def named(slot: SeedSlot) -> str:
        alpha = f", alpha {slot.alpha.alpha:.2f}" if slot.stage is Stage.BLENDING else ""
        return printable(f"{slot.blueprint} in {slot.slot_id} ({slot.stage.value}{alpha})")  # the user's slot ids

    kept = [named(slot) for slot in model.slots() if slot.stage in exported]
    left_out = [named(slot) for slot in model.slots()
                if slot.stage in (Stage.GERMINATED, Stage.TRAINING, Stage.BLENDING) and slot.stage not in exported]
    parameters = model.host_param_count() + sum(slot.seed_parameter_count() for slot in model.slots()
                                                if slot.stage in exported)
    print(f"wrote {written} ({format}, {parameters:,} parameters)", file=out)
    print(f"  seeds folded in: {', '.join(kept) or 'none'}", file=out)
    if left_out:
        print(f"  left out: {', '.join(left_out)}", file=out)
    loader = (f"torch.export.load({str(written)!r}).module()" if format == "torch-export" else
              f"onnxruntime.InferenceSession({str(written)!r})")
    print(f"  load it without morphogen: {loader}", file=out)
