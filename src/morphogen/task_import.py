"""`--task package.module:function`: a user's own task, made by a function morphogen imports and calls.

The function takes no required arguments (it may accept `seed` and `device`, which are then passed), runs
with torch's global generator seeded by the run's seed, and returns a `Task` from
`morphogen.task_from_data` with its host, or a pair `(task, host)`. Whatever goes wrong, the module not
importable, the function missing or raising, a wrong return value, is a `ConfigError` of one line naming
the import path. The current directory is searched first, as `python -m` does, so that
`morphogen run --task my_task:make` finds `./my_task.py`.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import torch

from morphogen.config import ConfigError
from morphogen.data import Task
from morphogen.limits import short_repr

#: `package.module:function`: dotted identifiers, a colon, an identifier.
_IMPORT_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")


def is_import_path(task: str) -> bool:
    """Whether a `task` setting names a function (`module:function`) rather than a built-in task."""
    return ":" in task


def check_import_path(task: str) -> None:
    """Raise `ValueError` for a `module:function` setting that is not one."""
    if not _IMPORT_PATH.match(task):
        raise ValueError(f"task: {short_repr(task)} is neither a built-in task nor an import path "
                         f"package.module:function{file_path_hint(task)}")


def import_task(path: str, *, seed: int, device: str) -> Task:
    """Import and call the function at `path`; its task with its host attached, on `device`."""
    function = import_function(path, "task")
    offered: dict[str, Any] = {"seed": seed, "device": device}
    try:
        parameters = inspect.signature(function).parameters
        accepted = {name: value for name, value in offered.items() if name in parameters}
    except (TypeError, ValueError):  # a builtin or C function without a signature: call it bare
        accepted = {}
    from morphogen.env.seeding import seeded  # the env layer loads only when a user task does

    try:
        # Seeded: a function that builds its model or draws its data without a seed still makes the same task
        # every time, so re-running a run's config.json reproduces it.
        with seeded(seed, torch.device(device)):
            made = function(**accepted)
    except Exception as error:  # the user's code: any exception is theirs to fix, reported as one line
        raise ConfigError(f"task: {path} raised {type(error).__name__}: {_first_line(error)}") from None
    from morphogen.env.episode import task_with_host

    task, host = made if isinstance(made, tuple) and len(made) == 2 else (made, None)
    if not isinstance(task, Task):
        raise ConfigError(f"task: {path} returned {type(made).__name__}; return morphogen.task_from_data(...) "
                          "or (task, host)")
    try:
        task = task_with_host(task, host)
    except ValueError as error:
        raise ConfigError(f"task: {path}: {_first_line(error)}") from None
    return task


def import_function(path: str, what: str) -> Any:
    """The function an import path `package.module:function` names, the current directory searched first; a
    `ConfigError` line starting with `what` (the setting that named it) when it cannot be had."""
    check_import_path(path)
    module_name, function_name = path.split(":")
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # ImportError, or anything the module raises while it is imported
        hint = file_path_hint(path) if isinstance(error, ImportError) else ""
        raise ConfigError(f"{what}: cannot import {module_name!r} for {path}: {type(error).__name__}: "
                          f"{_first_line(error)}{hint}") from None
    if not hasattr(module, function_name):
        raise ConfigError(f"{what}: module {module_name!r} has no function {function_name!r}"
                          f"{_shadowed_hint(module, module_name, here)}")
    function = getattr(module, function_name)
    if not callable(function):
        raise ConfigError(f"{what}: {function_name!r} in module {module_name!r} is not callable (its type is "
                          f"{type(function).__name__}); name a function")
    return function


def _shadowed_hint(module: object, module_name: str, here: str) -> str:
    """Where the current directory holds `module_name`'s file but the module imported is another one (a standard
    library or installed module of that name, imported before), a hint saying so; else ""."""
    own = Path(here, *module_name.split(".")).with_suffix(".py")
    imported = getattr(module, "__file__", None)
    if not own.is_file() or (imported is not None and Path(imported).resolve() == own.resolve()):
        return ""
    return (f" ({module_name!r} is already the module at {imported or 'built in'}, not {own}: rename your file, "
            "since a module of that name is imported before it)")


def file_path_hint(path: str) -> str:
    """Where `path` names its module as a file (`my_task.py:make`, `./my_task:make`, `src/my_task.py:make`), a hint
    giving the import path that names it (`my_task:make`, from the folder that holds it); else ""."""
    module, _, function = path.rpartition(":")
    if not (module.endswith(".py") or "/" in module or "\\" in module) or not function:
        return ""
    file = PurePosixPath(module.replace("\\", "/"))
    stem, folder = file.name.removesuffix(".py"), str(file.parent)
    if not stem.isidentifier():
        return ""
    where = "" if folder == "." else f", run from {folder}/ or with it on PYTHONPATH"
    return f"; name the module as Python imports it, without a folder or .py: {stem}:{function}{where}"


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0][:300] if lines else ""
