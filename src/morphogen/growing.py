"""`morphogen.grow`: `morphogen run` from Python, for a task and host of your own.

    task = morphogen.task_from_data("mine", (x, y), (x_val, y_val))
    host = morphogen.host_from_module(model, slots=["layer1", "layer2"], example_input=x[:2])
    result = morphogen.grow(task, host, epochs=20)

It plays one growth episode with the heuristic controller (or a learned policy: `policy="default"`), trains
the same host without growth and the grown model's final architecture from scratch beside it (each can be
turned off), prints the same lines and table as `morphogen run`, and writes the same run directory, so
`morphogen report`, `runs` and `dashboard` read it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from typing import Any, TextIO

from morphogen.commands.run import ConfigSource, RunConfig, RunResult, run_command, settings_from
from morphogen.commands.threads import torch_threads
from morphogen.config import ConfigError
from morphogen.core.hosts import SegmentedHost
from morphogen.data import Task
from morphogen.devices import resolve_device
from morphogen.env.episode import task_with_host
from morphogen.limits import MAX_EPOCHS, MAX_THREADS, check_count
from morphogen.session import PYTHON_TASK
from morphogen.task_import import is_import_path


def grow(task: Task, host: object = None, *, epochs: int | None = None, seed: int | None = None,
         baseline: bool | None = None, from_scratch: bool | None = None, device: str | None = None,
         run_dir: str | None = None, runs_root: str | None = None,
         config: ConfigSource | None = None, out: TextIO | None = None, resume: bool = False,
         policy: str | None = None, compare_with: Mapping[str, object] | None = None,
         threads: int | None = None) -> RunResult:
    """Grow `host` (from `morphogen.host_from_module`, or a function of no arguments building one; default: the
    task's own) on `task` for `epochs` epochs (default: the config's, 30); returns the three outcomes, the grown
    model and the run directory.

    Every other setting of `morphogen run` (gates, optimizer, heuristic, telemetry) comes from `config`: a
    `RunConfig` (`load_config`), a preset's name ("grow_for_compute", "grow_lean"), a config file's path, or a
    mapping of its tables (`{"heuristic": {"warmup_epochs": 5}}`). The keyword arguments here override its fields
    where given; left out (None), the config's hold (by default: seed 0, both comparisons, the CPU, `runs/`).
    Raises `DataError` or `ConfigError` (both `ValueError`s) for what cannot work, before anything is written.

    Each training (grown, no growth, from scratch) starts from a copy of `host`; when the host is a module (not a
    function), it receives the grown model's host weights at the end, and so does the model it was made from
    (`host_from_module` shares its parameters). The seeds live in `result.model` (export: `export_model`).

    Each training saves where it stands after every epoch; `resume=True` goes on from there in `run_dir`, a run
    stopped before its summary, called with the same task, host and arguments as the run it continues.

    `policy` grows with a learned growth policy instead of the heuristic, as `morphogen run --policy` does:
    "default" (the policy shipped with morphogen) or the run directory of a `morphogen train`.

    `compare_with` maps names to other hosts (or functions building them), say your model at other widths, each
    trained without growth on the same data, epochs and seed; the table puts them beside the grown model, and
    `result.fixed` holds their figures: whether growing beat simply picking another size.

    `threads` runs the trainings with that many torch intra-op threads and restores the process's count after (None:
    the process's own count; one thread is the fastest for small models while anything else shares the cores).
    """
    if threads is not None:
        _check_count("threads", threads, MAX_THREADS)
    settings, with_host = grow_settings(task, host, epochs=epochs, seed=seed, baseline=baseline,
                                        from_scratch=from_scratch, device=device, run_dir=run_dir, runs_root=runs_root,
                                        config=config, policy=policy)
    with contextlib.nullcontext() if threads is None else torch_threads(threads):  # checks the count before a write
        result = run_command(settings, task=with_host, out=out, resume=resume, compare_with=compare_with)
    if isinstance(with_host.host, SegmentedHost):
        # Each training ran on a copy of the host; the grown one's weights go back into it, and so into the user's
        # own modules, whose parameters a host from `host_from_module` shares.
        with_host.host.load_state_dict(result.model.host.state_dict())
    return result


def _check_count(name: str, value: int, upper: int) -> None:
    """`limits.check_count`, its `ValueError` raised as the `ConfigError` `grow` promises."""
    try:
        check_count(name, value, upper)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def grow_settings(task: Task, host: object = None, *, epochs: int | None = None, seed: int | None = None,
                  baseline: bool | None = None, from_scratch: bool | None = None, device: str | None = None,
                  run_dir: str | None = None, runs_root: str | None = None, config: ConfigSource | None = None,
                  policy: str | None = None) -> tuple[RunConfig, Task]:
    """The settings and the task (with its host) that `grow` runs with those arguments, checked as `grow` checks
    them: a `ConfigError` (or `DataError`) for one that cannot work."""
    with_host = task_with_host(task, host)
    base = settings_from(config, with_host.name, with_host.topology)
    if epochs is not None:
        _check_count("epochs", epochs, MAX_EPOCHS)
    # config.json records where the task came from: its import path, or that Python code built it.
    source = task.source if is_import_path(task.source) else PYTHON_TASK
    try:
        given: dict[str, Any] = {"seed": seed, "baseline": baseline, "from_scratch": from_scratch, "device": device,
                                 "run_dir": run_dir, "runs_root": runs_root, "policy": policy}
        settings = dataclasses.replace(
            base, task=source, task_name=task.name, host={}, **{k: v for k, v in given.items() if v is not None},
            episode=dataclasses.replace(base.episode, max_epochs=epochs or base.episode.max_epochs))
    except ValueError as error:
        raise ConfigError(str(error)) from None
    resolve_device(settings.device, fix="device='cpu'")  # here, to name the keyword in the fix rather than `--device`
    return settings, with_host
