"""Settings every command that runs episodes shares: which task and host size, where, with what telemetry.

`load_session_task(options, device)` is the one place where a command turns these settings into a
loaded `Task`: `run`, `train`, `eval` and `run --policy` all go through it, so the `[host]` table
reaches every host they build.

The `[host]` table holds what the user changed and is checked as soon as the options are built.
A command resolves it (`with_resolved_host`) before it writes its run directory, so a run's
config.json and checkpoint record every size argument of the host it built, defaults included,
and reading them back rebuilds the same host even if the task's defaults change later.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Self

from morphogen.config import ConfigError
from morphogen.core.compilation import CompileSettings
from morphogen.core.hosts import HostSizeError, check_host_size
from morphogen.data import TASK_NAMES, TASK_TOPOLOGIES, Task, host_size, load_task
from morphogen.data.user import task_on_device
from morphogen.limits import MAX_HOST_PARAMETERS, MAX_SEED, MAX_TRAIN_SAMPLES, check_count, short_repr
from morphogen.task_import import check_import_path, import_task, is_import_path
from morphogen.telemetry.config import TelemetryConfig
from morphogen.user_paths import expand_path_settings

#: The `task` recorded for a task that Python code built and handed over (`morphogen.grow`): it has no name a
#: command could load it by.
PYTHON_TASK = "python"
#: The device a session runs on when none is named.
DEFAULT_DEVICE = "cpu"


class CompileOptions:
    """`--compile` settings of a command config: the fields `compile`, `compile_mode` and `compile_backend`,
    which each config declares last (so that its own keys come first in listings)."""

    compile: bool
    compile_mode: str
    compile_backend: str

    def check_compile_options(self) -> None:
        """Raise `ValueError` naming the field if the mode or backend is unknown."""
        CompileSettings(self.compile_mode, self.compile_backend)

    @property
    def compile_settings(self) -> CompileSettings | None:
        """The settings to compile with, or None when `compile` is off."""
        return CompileSettings(self.compile_mode, self.compile_backend) if self.compile else None


@dataclass(frozen=True)
class SessionOptions(CompileOptions):
    """The task, host size, device, slots, run directory and telemetry of a `run` or `train` session."""

    #: Task: digits, cifar10, text or mnist1d, or your own as `package.module:function` (a function that returns
    #: `morphogen.task_from_data(...)` with its host; see `morphogen.task_import`).
    task: str = "digits"
    #: Base seed of host initialisation, data order and (in training) every round's randomness.
    seed: int = 0
    #: Host size: constructor arguments of the task's host by name, e.g. `[host]` with `base_channels = 8`
    #: (CNNHost and Conv1dHost: n_blocks, base_channels, kernel_size; TransformerHost: d_model, n_heads,
    #: n_layers, block_size, n_segments). Arguments left out keep the task's default.
    host: dict[str, int] = field(default_factory=dict)
    #: Device: cpu, cuda, cuda:N, mps, or auto (cuda when available, else cpu).
    device: str = DEFAULT_DEVICE
    #: Slots to place (ids like r0c1); None places a slot at every injection point of the host.
    slots: tuple[str, ...] | None = None
    #: Also place slots after each pooling layer of the CNN host (ids r1c{i}).
    pool_slots: bool = False
    #: CIFAR-10 directory (torchvision's cifar-10-batches-py layout).
    data_dir: str | None = None
    #: Text file for the `text` task; default: the Python standard library's sources.
    text_file: str | None = None
    #: Cap on training samples (quick experiments); None uses the whole training split.
    max_train_samples: int | None = None
    #: Parent directory of run directories.
    runs_root: str = "runs"
    #: Exact run directory; None makes runs_root/<time>-<task>.
    run_dir: str | None = None
    #: The task's own name, filled in by the command from the task it loaded (a user's task names itself);
    #: reports show it. Setting it changes nothing else.
    task_name: str | None = None
    #: What the task's score is ("accuracy", "negative loss" for a task with its own loss, or its own metric's
    #: name), filled in by `run` from the task it loaded; the dashboard labels scores with it. Setting it changes
    #: nothing else.
    task_metric: str | None = None
    #: Telemetry level, TensorBoard, profiler window, anomaly thresholds.
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    #: Run the host's training forward and the policy's forward under torch.compile (see
    #: morphogen.core.compilation: what is compiled, and what recompiles when a seed changes stage).
    compile: bool = False
    #: torch.compile mode: auto (reduce-overhead on CUDA, default elsewhere), default, reduce-overhead,
    #: max-autotune or max-autotune-no-cudagraphs.
    compile_mode: str = "auto"
    #: torch.compile backend: inductor, or aot_eager / eager to tell a compiler problem from a model problem.
    compile_backend: str = "inductor"

    def __post_init__(self) -> None:
        expand_path_settings(self, ("data_dir", "text_file", "runs_root", "run_dir"))
        self.check_compile_options()
        check_count("seed", self.seed, MAX_SEED, lower=0)
        if self.max_train_samples is not None:
            check_count("max_train_samples", self.max_train_samples, MAX_TRAIN_SAMPLES)
        if self.slots is not None and not self.slots:
            raise ValueError("slots must name at least one slot (leave it out to use every slot of the host)")
        if self.slots is not None and len(set(self.slots)) != len(self.slots):
            raise ValueError(f"slots names a slot more than once: {', '.join(self.slots)}")
        check_task_host(self.task, self.host, self.max_train_samples)
        # An empty path is the current directory: the run's files would be written among the user's own.
        if self.run_dir is not None and not self.run_dir.strip():
            raise ValueError(f"run_dir must name a directory, got {self.run_dir!r} (leave it out for "
                             "runs_root/<time>-<task>)")
        if not self.runs_root.strip():
            raise ValueError(f"runs_root must name a directory, got {self.runs_root!r} (the default is runs)")

    def with_resolved_host(self) -> Self:
        """These options with `host` holding every size argument of the task's host (defaults filled in)."""
        if self.task not in TASK_NAMES:  # a user's task builds its own host
            return self
        return dataclasses.replace(self, host=resolve_host_size(self.task, self.host))


def check_task_host(task: str, host: object, max_train_samples: int | None) -> None:
    """Raise `ValueError` naming the key if `host` (a `[host]` table) or `max_train_samples` cannot go with `task`."""
    if not isinstance(host, Mapping):
        raise ValueError("host must be a table of host size arguments (e.g. base_channels = 8), "
                         f"got {short_repr(host)}")
    if is_import_path(task):
        check_import_path(task)
        if host:
            raise ValueError(f"host: a [host] table sizes the built-in hosts; task {task} builds its own")
        if max_train_samples is not None:
            raise ValueError(f"max_train_samples caps the built-in tasks; task {task} chooses its own data")
    # An unknown task is reported by load_task, with the valid names; its host cannot be checked here.
    elif task in TASK_NAMES:
        resolve_host_size(task, host)


def resolve_host_size(task: str, overrides: Mapping[str, object]) -> dict[str, int]:
    """Task `task`'s default host size with `overrides` applied, checked against its host's constructor.

    Raises `ValueError` as one line naming the key: ``host.base_channels: must be >= 1, got 0``.
    """
    size = host_size(task, overrides)  # names and positive integers (a DataError, itself a ValueError)
    sizes = ", ".join(f"{key} = {value:,}" for key, value in size.items())
    too_large = f"host {sizes} builds a host above the limit of {MAX_HOST_PARAMETERS:,} parameters (morphogen.limits)"
    try:
        parameters = check_host_size(TASK_TOPOLOGIES[task], size)
    except HostSizeError as error:
        raise ValueError(f"host.{error.argument}: {error.problem}") from None
    except RuntimeError:  # the trial build on the meta device overflowed: its tensors have > 2**63 elements
        raise ValueError(f"{too_large}; choose smaller sizes") from None
    if parameters > MAX_HOST_PARAMETERS:
        raise ValueError(f"{too_large}: at least {parameters:,}; choose smaller sizes")
    return size


def load_session_task(options: SessionOptions, device: str) -> Task:
    """Load the task of `options` on `device` with its host size, training-sample cap and data paths; a task
    named by an import path is made by the user's function (`morphogen.task_import`)."""
    if options.task == PYTHON_TASK:
        raise ConfigError("task: this run's task was built in Python (morphogen.grow); run it from Python again, or "
                          "name a function that builds it: --task package.module:function")
    if is_import_path(options.task):
        for setting, value, reader in (("data_dir", options.data_dir, "cifar10"), ("text_file", options.text_file,
                                                                                 "text")):
            if value is not None:  # the function is called with seed and device only: say so, as load_task does
                warnings.warn(f"task {options.task} ignores {setting}={value!r}: only the built-in {reader!r} reads "
                              "it; your function reads its own data", stacklevel=2)
        return dataclasses.replace(task_on_device(import_task(options.task, seed=options.seed, device=device), device),
                                   source=options.task)
    return load_task(options.task, device=device, data_dir=options.data_dir, text_file=options.text_file,
                     seed=options.seed, max_train_samples=options.max_train_samples, host=options.host)
