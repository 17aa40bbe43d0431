"""The hosts a run trains without growth beside the grown one, to ask whether growing beat another size.

They come from the run's settings (`compare_with` in a config file, `morphogen run --compare NAME=SPEC`) or from
Python (`grow(compare_with=...)`). In settings a host is a table of sizes for a built-in task's host (`{n_blocks =
3, base_channels = 6}`, as `[host]` takes) or the import path of a function of no arguments that builds one
(`"my_task:wide_host"`, for a task of the user's own); from Python, a host or such a function itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

from morphogen.config import ConfigError
from morphogen.core.hosts import SegmentedHost
from morphogen.data import DataError, Task
from morphogen.data.catalog import TASK_NAMES
from morphogen.env.episode import task_host, task_with_host
from morphogen.env.evaluation import refuse_other_class_count
from morphogen.limits import short_repr
from morphogen.session import PYTHON_TASK, resolve_host_size
from morphogen.task_import import check_import_path, import_function, is_import_path

#: Most hosts a run compares with, and the longest name of one (the table shows its first 13 characters).
MAX_COMPARED_HOSTS, MAX_HOST_NAME = 16, 40
#: The names of the models every run has, which the tables and a run over seeds already use.
RESERVED_NAMES = ("grown", "no growth", "from scratch")


def check_names(names: object, where: str = "compare_with") -> None:
    """`ConfigError` for what the closing table cannot show: too many hosts, a name that is not short text."""
    if not isinstance(names, Mapping):
        raise ConfigError(f"{where}: expected a table of names to hosts, got {short_repr(names)}")
    if len(names) > MAX_COMPARED_HOSTS:
        raise ConfigError(f"{where}: at most {MAX_COMPARED_HOSTS} hosts, got {len(names)}")
    for name in names:
        if not isinstance(name, str) or not 0 < len(name) <= MAX_HOST_NAME:
            raise ConfigError(f"{where}: each name is a string of 1 to {MAX_HOST_NAME} characters, got "
                              f"{short_repr(name)}")
        if name in RESERVED_NAMES:
            raise ConfigError(f"{where}: {name!r} names one of the run's own models; choose another name")


def check_settings(task: str, compare_with: object) -> None:
    """`ConfigError` naming the host whose setting cannot work with `task`: a size table for a task that builds its
    own host, a bad size, a string that is not an import path."""
    check_names(compare_with)
    assert isinstance(compare_with, Mapping)
    for name, spec in compare_with.items():
        where = f"compare_with: {short_repr(name)}"
        if isinstance(spec, str):
            try:
                check_import_path(spec)
            except ValueError:
                raise ConfigError(f"{where}: {short_repr(spec)} is not an import path package.module:function of a "
                                  "function building a host") from None
        elif not isinstance(spec, Mapping):
            raise ConfigError(f"{where}: expected a table of host sizes or an import path, got {short_repr(spec)}")
        elif task in TASK_NAMES:
            _host_size(task, spec, where)
        elif is_import_path(task) or task == PYTHON_TASK:  # an unknown task name is load_task's to report
            raise ConfigError(f"{where}: host sizes fit only a built-in task's host; task {short_repr(task)} builds "
                              "its own, so name a function building one (package.module:function)")


def _host_size(task: str, sizes: Mapping[str, object], where: str) -> dict[str, int]:
    """Built-in `task`'s host size with `sizes` over its defaults; a `ConfigError` naming the key of a bad one."""
    try:
        return resolve_host_size(task, sizes)
    except ValueError as error:  # "host.n_blocks: must be >= 1, got 0"
        raise ConfigError(f"{where}: {str(error).removeprefix('host.')}") from None


def compared_tasks(settings: Mapping[str, dict[str, int] | str], given: Mapping[str, object] | None, task: Task,
                   task_setting: str, host_sizes: Mapping[str, int]) -> dict[str, Task]:
    """`task` with each host to compare with, by name: those of the settings, then those `given` from Python. A
    table of sizes changes those of the grown host (`host_sizes`, the run's `[host]` for its built-in task
    `task_setting`) it names. A host that cannot be built or imported, or a name given twice, is a `ConfigError` or
    `DataError` here, before the run writes anything."""
    if given is not None:
        check_names(given)
        twice = sorted(set(settings) & set(given))
        if twice:
            raise ConfigError(f"compare_with: {short_repr(twice[0])} is named by both the config and the argument")
        check_names({**settings, **given})
    tasks = {}
    for name, spec in settings.items():
        where = f"compare_with: {short_repr(name)}"
        if isinstance(spec, str):
            tasks[name] = _with_compared_host(task, import_function(spec, where), where)
        else:
            sizes = _host_size(task_setting, {**host_sizes, **spec}, where)
            tasks[name] = dataclasses.replace(task, host_kwargs={**task.host_kwargs, **sizes})
    for name, host in (given or {}).items():
        tasks[name] = _with_compared_host(task, host, f"compare_with: {short_repr(name)}")
    return tasks


def _with_compared_host(task: Task, host: object, where: str) -> Task:
    """`task` with the compared `host`; a host that cannot be built, or whose outputs are not the task's classes, is a
    `DataError` naming the comparison, not the task (whose own host is fine), before anything trains."""
    try:
        compared = task_with_host(task, host)
        with torch.random.fork_rng(devices=[]):  # building it again draws no number the runs would have drawn
            built = compared.host if isinstance(compared.host, SegmentedHost) else task_host(compared, "cpu")
        refuse_other_class_count(compared, built)
        return compared
    except DataError as error:
        raise DataError(f"{where}: {str(error).removeprefix(f'task {task.name!r}: ')}") from None
