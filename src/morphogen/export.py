"""A grown model out of morphogen: a file that plain torch (or any ONNX runtime) loads and runs.

    model = morphogen.load_grown_model("runs/my-run")        # or result.model after morphogen.grow
    morphogen.export_model(model, example_input, "grown.pt2")  # torch.export program
    program = torch.export.load("grown.pt2").module()          # elsewhere: torch only, no morphogen

`export_model` folds the seeds of the model's output into the host (`morphogen.core.plain`: HOLDING and
FOSSILIZED seeds in at alpha 1, BLENDING seeds at the alpha they reached unless `leave_out_blending`, TRAINING
seeds left out), traces that network with `torch.export` with a dynamic batch dimension, checks the program
against the network on the example input, and writes it atomically: a `torch.export` program (`.pt2`,
`torch.export.save`) or, with the `onnx` extra, an ONNX model. The network is traced on the device and in the
dtype of the model, with any autocast of the caller's turned off.

`load_grown_model(run_dir)` rebuilds a run's model: the host from the run's `config.json` as `run --config`
builds it (a built-in task with its `[host]` table, or the user's task function named by its import path),
then the state of `RUN_DIR/model.pt`. A task built in Python (`morphogen.grow`) has no import path, so its
host is passed in: `load_grown_model(run_dir, host=morphogen.host_from_module(MyNet(), ...))` loads the
grown weights into that host, and so into `MyNet`'s own parameters, which it shares. With
`from_scratch=True` it rebuilds the grown model's final architecture as the run trained it from scratch
(`RUN_DIR/from_scratch/model.pt`, written when that comparison ran).
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from morphogen.commands.run import RunConfig
from morphogen.config import ConfigError, build_config, read_config_file
from morphogen.core.hosts import SegmentedHost
from morphogen.core.model import MorphogeneticModel
from morphogen.core.plain import ExportError, grown_network, refuse_other_than_a_grown_model
from morphogen.data import Task
from morphogen.data.tasks import InputStandardization
from morphogen.devices import resolve_device
from morphogen.env.episode import MorphogenesisEpisode
from morphogen.inputs import Inputs, InputSpec, dtype_mismatch, repeat_rows, rows, take_rows, tensors, to_device
from morphogen.inputs import problem as inputs_problem
from morphogen.model_file import load_model_state, read_model_file
from morphogen.run_directory import (
    CONFIG_FILENAME,
    FROM_SCRATCH_DIRNAME,
    MODEL_FILENAME,
    is_seeds_directory,
    write_atomic,
)
from morphogen.session import PYTHON_TASK, load_session_task
from morphogen.user_paths import user_path

#: Export formats and the file suffix each is written with by default.
FORMATS = {"torch-export": ".pt2", "onnx": ".onnx"}
#: Largest difference allowed between the exported program and the network it was traced from (or 4 units of the
#: precision of a 16-bit output), times the network's largest output where that is above 1.
TOLERANCE = 1e-5


def export_model(model: MorphogeneticModel, example_input: Inputs, path: str | Path, *,
                 format: str = "torch-export", leave_out_blending: bool = False,
                 dynamic_dims: Sequence[int] = (), raw_inputs: InputStandardization | None = None) -> Path:
    """Write `model`'s grown architecture to `path` as a `torch.export` program or an ONNX model; returns the path.

    `example_input` is a batch of real inputs (one sample is enough), as the model takes them: a tensor, or a
    tuple or dict of tensors, which the program then takes as positional or keyword arguments, as the user's
    own model does. The batch dimension stays dynamic; `dynamic_dims` (such as `(1,)`: a language model's sequence)
    keeps those dimensions of every input dynamic too, from 1 up to their size in `example_input` (one size shared
    by all inputs that have the dimension, as token ids and their padding mask do). `leave_out_blending` drops
    seeds still BLENDING (folded in at their alpha otherwise, as the model computes). `raw_inputs` (a built-in task's
    `input_standardization`) is folded in front of the network: the program takes raw values, and `example_input`
    must be raw too. Raises `ExportError` for a
    network `torch.export` cannot trace (or cannot keep `dynamic_dims` dynamic in), a missing `onnx` extra or a
    path that cannot be written.
    """
    _check_export_arguments(model, example_input, format, dynamic_dims)
    path = user_path(path)
    check_suffix(path, format)
    grown = grown_network(model, leave_out_blending=leave_out_blending)
    reference = next(grown.parameters(), None)
    network: nn.Module = grown if raw_inputs is None else nn.Sequential(_Standardize(raw_inputs, reference), grown)
    example = example_input if reference is None else to_device(example_input, reference.device)
    if rows(example) == 1:  # torch.export specializes a dimension of size 1; two samples keep it dynamic
        example = repeat_rows(example, 2)
    path = Path(path)
    if path.is_dir():  # a directory, or a link to one: the user meant a file in it, which is theirs to name
        raise ExportError(f"cannot write {path}: it is a directory{' (a link to one)' if path.is_symlink() else ''}; "
                          f"name the file, e.g. {path / ('model' + FORMATS[format])}")
    program = _traced(network, example, tuple(dict.fromkeys(dynamic_dims)))
    data = _program_bytes(program) if format == "torch-export" else _onnx_bytes(program)
    try:
        write_atomic(path, data)
    except OSError as error:
        blocking = _file_in_the_way(path)
        reason = f"{blocking} is not a directory" if blocking else error.strerror or error
        raise ExportError(f"cannot write {path}: {reason}") from None
    return path


def _file_in_the_way(path: Path) -> Path | None:
    """The nearest folder of `path` that exists but is not a directory (a file named as one), or None: the OS
    tells it as "File exists" or "Not a directory", naming neither."""
    existing = next((folder for folder in path.parents if os.path.lexists(folder)), None)
    return existing if existing is not None and not existing.is_dir() else None


def _check_export_arguments(model: MorphogeneticModel, example_input: Inputs, format: str,
                            dynamic_dims: Sequence[int]) -> None:
    """`ExportError` for an argument of `export_model` it cannot work with, saying what it needs."""
    if format not in FORMATS:
        raise ExportError(f"unknown export format {format!r}; valid: {', '.join(FORMATS)}")
    refuse_other_than_a_grown_model(model, "export_model")
    if any(parameter.is_meta for parameter in model.parameters()):
        raise ExportError("the model is on the meta device: it holds no weights to export; load its weights on a "
                          "real device first (morphogen.load_grown_model(RUN_DIR, device='cpu'))")
    if any(isinstance(dim, bool) or not isinstance(dim, int) or dim < 1 for dim in dynamic_dims):
        raise ExportError(f"dynamic_dims must be dimensions after the batch's (integers >= 1), got "
                          f"{list(dynamic_dims)}")
    problem = inputs_problem(example_input)
    if problem is not None or rows(example_input) == 0:
        raise ExportError("example_input must be a batch of the model's inputs (a tensor, or a tuple or dict of "
                          f"tensors) with a leading sample dimension; got {problem or 'no samples'}")
    if any(tensor.is_meta for tensor in tensors(example_input)):
        raise ExportError("example_input is on the meta device: it holds no values to trace and check the program "
                          "with; give a batch of real inputs (on the CPU, or on the model's device)")


def check_suffix(path: str | Path, format: str) -> None:
    """`ExportError` for a path whose suffix names the other format (`grown.onnx` written as a torch.export
    program, which an ONNX runtime cannot read), or that ends in a separator, as a directory's name does (`Path`
    drops it: the program went to a file of the directory's name); any other suffix is the user's to choose."""
    if isinstance(path, str) and path.endswith(("/", os.sep)):
        raise ExportError(f"cannot write {path}: it ends in {path[-1]}, which names a directory; name the file, e.g. "
                          f"{path}model{FORMATS.get(format, '.pt2')}")
    suffix = Path(path).suffix.lower()
    named = next((name for name, own in FORMATS.items() if own == suffix), format)
    if named != format:
        what = "an ONNX model" if named == "onnx" else "a torch.export program"
        raise ExportError(f"{path} ends in {suffix}, which names {what}, but the format is {format!r}: pass "
                          f"format={named!r} (morphogen export: --format {named}), or name the file *{FORMATS[format]}")


class _Standardize(nn.Module):
    """`(x - mean) / std` per channel (dimension 1): a built-in task's standardization, in front of an export, in
    the dtype and on the device of the network's weights (`like`), which take what it gives."""

    mean: Tensor
    std: Tensor

    def __init__(self, standardization: InputStandardization, like: Tensor | None) -> None:
        super().__init__()
        dtype = like.dtype if like is not None and like.is_floating_point() else None
        device = like.device if like is not None else None
        self.register_buffer("mean", torch.tensor(standardization.mean, dtype=dtype, device=device))
        self.register_buffer("std", torch.tensor(standardization.std, dtype=dtype, device=device))

    def forward(self, x: Tensor) -> Tensor:
        shape = (1, -1) + (1,) * (x.dim() - 2)
        return (x - self.mean.view(shape)) / self.std.view(shape)


class _CalledAsTheModel(nn.Module):
    """`network`, which takes a model's several inputs as one tuple or dict, called with them as arguments: by
    position (`kind` "tuple" or "list") or by name ("dict"), as the user's own model is."""

    def __init__(self, network: nn.Module, kind: str) -> None:
        super().__init__()
        self.network, self.kind = network, kind

    def forward(self, *args: Tensor, **kwargs: Tensor) -> Tensor:
        inputs: Inputs = kwargs if self.kind == "dict" else tuple(args) if self.kind == "tuple" else list(args)
        output: Tensor = self.network(inputs)
        return output


def _export_arguments(network: nn.Module, example: Inputs, dims: dict[int, Any] | None) -> tuple[
        nn.Module, tuple[Tensor, ...], dict[str, Tensor], dict[str, Any] | tuple[Any, ...] | None]:
    """What `torch.export` traces for `example`: the module, its positional and keyword arguments, and their
    dynamic shapes (`dims`: dimension -> `torch.export.Dim`, in every tensor that has the dimension; None: every
    dimension static)."""

    def dynamic_of(tensor: Tensor) -> dict[int, Any]:
        return {dim: size for dim, size in (dims or {}).items() if dim < tensor.dim()}

    if dims is None:
        shapes: Any = None
    elif isinstance(example, Tensor):
        shapes = (dynamic_of(example),)
    elif isinstance(example, dict):
        shapes = {key: dynamic_of(value) for key, value in example.items()}
    else:
        shapes = {"args": tuple(dynamic_of(value) for value in example)}
    if isinstance(example, Tensor):
        return network, (example,), {}, shapes
    if isinstance(example, dict):
        # torch.export reads the arguments' names from the forward's signature: give it the dict's keys.
        by_name = inspect.Signature([inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
                                     *(inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY) for key in example)])

        def forward(self: _CalledAsTheModel, *args: Tensor, **kwargs: Tensor) -> Tensor:
            return _CalledAsTheModel.forward(self, *args, **kwargs)

        forward.__signature__ = by_name  # type: ignore[attr-defined]
        called = type("CalledByName", (_CalledAsTheModel,), {"forward": forward})(network, "dict")
        return called, (), dict(example), shapes
    called = _CalledAsTheModel(network, InputSpec.of(example).kind)
    return called, tuple(example), {}, shapes


def _dynamic_dims(example: Inputs, dims: tuple[int, ...]) -> dict[int, Any]:
    """The batch dimension and `dims` as `torch.export.Dim`s, each of `dims` from 1 to its smallest size among
    the inputs that have it; `ExportError` for a dimension no input has."""
    shapes = [tensor.shape for tensor in tensors(example)]
    dynamic: dict[int, Any] = {0: torch.export.Dim("batch")}
    for dim in dims:
        sizes = [shape[dim] for shape in shapes if dim < len(shape)]
        if not sizes:
            raise ExportError(f"dynamic_dims: no input has a dimension {dim} (their shapes: "
                              f"{', '.join(str(tuple(shape)) for shape in shapes)})")
        dynamic[dim] = torch.export.Dim(f"dim{dim}", min=1, max=min(sizes))
    return dynamic


def _traced(network: nn.Module, example: Inputs, dims: tuple[int, ...] = ()) -> torch.export.ExportedProgram:
    """`network` traced by `torch.export` with a dynamic batch (and `dims`), checked against the network on
    `example`, in the dtype of its weights whatever autocast the caller is under."""
    with torch.no_grad(), _without_autocast(), warnings.catch_warnings():
        # torch's RNNs keep `_flat_weights`, references to their own parameters, which torch.export sees assigned
        # and warns should be buffers: the program holds those parameters all the same (checked below).
        warnings.filterwarnings("ignore", message=r"The tensor attributes .*\._flat_weights\[", category=UserWarning)
        try:
            expected = network(example)
        except Exception as error:  # the user's example: another dtype, another structure, another shape
            dtypes = dtype_mismatch(example, network.parameters(), error)
            raise ExportError(f"running the grown network on example_input failed: {_first_line(error)}"
                              + (f" ({dtypes})" if dtypes else "")) from None
        try:
            module, args, kwargs, shapes = _export_arguments(network, example, _dynamic_dims(example, dims))
            program = torch.export.export(module, args, kwargs, dynamic_shapes=shapes)
        except ExportError:
            raise
        except Exception as dynamic_error:  # a model whose code fixes the batch size: export that size
            if dims:  # asked for: a program of fixed sizes would not be what was asked
                raise ExportError(f"dimensions {list(dims)} cannot stay dynamic in the grown network: "
                                  f"{_first_line(dynamic_error)}") from None
            try:
                module, args, kwargs, _ = _export_arguments(network, example, None)
                program = torch.export.export(module, args, kwargs)
            except Exception as error:  # torch.export raises many kinds for code it cannot trace
                raise ExportError(f"torch.export cannot trace the grown network: {_first_line(error)}") from None
            one_sample = isinstance(example, Tensor) and example.dim() == 1  # most often x[0] for x[:2]
            warnings.warn(f"exported with a fixed batch size of {rows(example)}: the batch dimension could not "
                          f"stay dynamic ({_first_line(dynamic_error)})"
                          + ("; example_input's first dimension is the batch: was it one sample's values (give "
                             "x[:2], not x[0])?" if one_sample else ""), stacklevel=3)
        difference = (program.module()(*args, **kwargs) - expected).abs().max().item()
        # The program's kernels may round otherwise than the network's by a unit in the last place: relative to
        # outputs larger than 1 (2.4e-4 at 3,000 in float32), and a few units of a 16-bit dtype's precision.
        precision = torch.finfo(expected.dtype).eps if expected.is_floating_point() else 0.0
        allowed = max(TOLERANCE, 4 * precision) * max(1.0, expected.abs().max().item())
    if not difference <= allowed:
        raise ExportError(f"the exported program differs from the grown network by {difference:.2e} on the example "
                          f"input (more than {allowed:.2e}); please report this")
    return program


@contextlib.contextmanager
def _without_autocast() -> Iterator[None]:
    """Every autocast the caller turned on, turned off: traced under one, the program's graph asserts the dtypes
    autocast produced and fails where it is called without it, as it is elsewhere."""
    with contextlib.ExitStack() as stack:
        for device_type in ("cpu", "cuda", "xpu", "mps"):
            if torch.is_autocast_enabled(device_type):
                stack.enter_context(torch.autocast(device_type, enabled=False))
        yield


def _program_bytes(program: torch.export.ExportedProgram) -> bytes:
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    return buffer.getvalue()


def _onnx_bytes(program: torch.export.ExportedProgram) -> bytes:
    try:
        import onnxscript  # noqa: F401  # the ONNX exporter needs it; say so before torch.onnx fails deep inside
    except ImportError:
        raise ExportError("ONNX export needs the onnx extra: pip install 'morphogen[onnx]'") from None
    # torch.onnx prints its progress, logs that torchvision's operators are missing and warns about its own
    # deprecated internals: none of it concerns the user's network.
    onnx_logger = logging.getLogger("torch.onnx")
    level = onnx_logger.level
    onnx_logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            onnx_program = torch.onnx.export(program, dynamo=True, verbose=False, external_data=False)
    except Exception as error:
        raise ExportError(f"torch.onnx cannot translate the grown network: {_first_line(error)}") from None
    finally:
        onnx_logger.setLevel(level)
    assert onnx_program is not None  # the dynamo exporter always returns its program
    return bytes(onnx_program.model_proto.SerializeToString())


def load_grown_model(run_dir: str | Path, host: SegmentedHost | Callable[[], SegmentedHost] | None = None, *,
                     device: str = "cpu", from_scratch: bool = False) -> MorphogeneticModel:
    """The model a run grew (`RUN_DIR/model.pt`), rebuilt on `device`; see the module docstring. `from_scratch`:
    its final architecture as the run trained it from scratch instead (`RUN_DIR/from_scratch/model.pt`).

    `host` (from `morphogen.host_from_module`, or a function of no arguments building one, as `grow` takes it) is
    required for a task built in Python, and receives the model's host weights. `device`: cpu, cuda, cuda:N, mps,
    auto or meta (no memory). Raises `ModelFileError` or `ConfigError` (both `ValueError`s), the latter also for a
    device this machine lacks.
    """
    model, _ = rebuild_run(run_dir, device, host, from_scratch=from_scratch)
    return model


def rebuild_run(run_dir: str | Path, device: str = "cpu",
                host: SegmentedHost | Callable[[], SegmentedHost] | None = None, *,
                from_scratch: bool = False) -> tuple[MorphogeneticModel, Task | None]:
    """A run's grown model (or, `from_scratch`, its final architecture trained from scratch) on `device`, and
    its task (None when `host` was given and no task was loaded). A device this machine lacks is a `ConfigError`
    line, before anything is read; `meta` rebuilds the model without memory."""
    device = resolve_device(str(device), allow_meta=True, fix="device='cpu'")
    run = Path(user_path(run_dir))
    if not run.is_dir():
        raise ConfigError(f"{run} is not a run directory")
    if is_seeds_directory(run):
        raise ConfigError(f"{run} holds a run over several seeds: name one of its runs, {run}/seed_<s>")
    model_file = run / FROM_SCRATCH_DIRNAME / MODEL_FILENAME if from_scratch else run / MODEL_FILENAME
    if from_scratch and not model_file.exists() and (run / MODEL_FILENAME).exists():
        raise ConfigError(f"run {run} trained no final architecture from scratch (no seed was kept, or "
                          "from_scratch was off): it has no from_scratch/model.pt")
    payload = read_model_file(model_file)  # first: a run without a model fails before any data loads
    config = build_config(RunConfig, read_config_file(run / CONFIG_FILENAME))
    task = None
    if host is not None:
        model = MorphogeneticModel(_given_host(host).to(device), config.slots, config.episode.slots)
    else:
        if config.task == PYTHON_TASK:
            raise ConfigError(f"run {run} grew a task built in Python (morphogen.grow), which its config.json cannot "
                              "rebuild; in Python: morphogen.load_grown_model(RUN_DIR, host=YOUR_HOST), then "
                              "morphogen.export_model(model, example_input, PATH)")
        task = load_session_task(config, device)
        model = MorphogenesisEpisode(task, config.episode, seed=config.seed, slots=config.slots,
                                     pool_slots=config.pool_slots).build_model()
    load_model_state(model, payload, model_file)
    return model, task


def _given_host(host: object) -> SegmentedHost:
    """`host=` of `load_grown_model` as a host: the one given, or the one a function of no arguments builds (the
    host `grow` took, either way). Anything else, such as the model itself rather than a host cut from it, is one
    `ConfigError` line."""
    built = host() if callable(host) and not isinstance(host, nn.Module) else host
    if not isinstance(built, SegmentedHost):
        what = "host function returned" if built is not host else "host is"
        raise ConfigError(f"load_grown_model: its {what} a {type(built).__name__}, not a host; pass "
                          "morphogen.host_from_module(model, slots=..., example_input=...) as the run grew it, or a "
                          "function of no arguments returning one")
    return built


def example_input_of(task: Task, samples: int = 2) -> Inputs:
    """The first `samples` validation inputs of `task`: what an export traces the network with."""
    for inputs, _ in task.validation.iterate_batches(samples, shuffle=False):
        return take_rows(inputs, slice(0, samples))
    raise ExportError(f"task {task.name!r} has no validation data to trace the network with")


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0][:300]}" if lines else type(error).__name__
