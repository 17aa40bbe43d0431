"""`morphogen list tasks|blueprints|slots`: what can be named on the command line, without provoking errors.

Slots and blueprint sizes depend on the task's host, so both load the task (digits, the default, ships
with scikit-learn; cifar10 needs `--data-dir`). The host is built on the `meta` device: listing costs
no memory and no training.
"""

from __future__ import annotations

import sys
from typing import TextIO

from rich.console import Console
from rich.table import Column, Table

from morphogen.core.blueprints import BlueprintKind, get_blueprint, parameter_count, registry_table
from morphogen.core.hosts import SegmentedHost, build_host
from morphogen.core.model import MorphogeneticModel
from morphogen.data import TASK_NAMES, Task, load_task
from morphogen.env.episode import task_host
from morphogen.task_import import import_task, is_import_path
from morphogen.ui.progress import LINE_WIDTH

TASK_DESCRIPTIONS = {
    "digits": "scikit-learn's 8x8 handwritten digits, 10 classes (no download)",
    "cifar10": "CIFAR-10 32x32 colour images, 10 classes (needs --data-dir with cifar-10-batches-py)",
    "text": "character-level language model on the Python standard library's sources (or --text-file)",
    "mnist1d": "MNIST-1D: 40-step 1D sequences, 10 classes, generated offline (Conv1dHost)",
}
"""One line per task for `list tasks`; a task without an entry is listed with its name only."""

LISTINGS = ("tasks", "blueprints", "slots")


def _console(out: TextIO) -> Console:
    return Console(file=out, width=LINE_WIDTH, highlight=False)


def _meta_host(task: Task, pool_slots: bool) -> SegmentedHost:
    """The task's host, on the meta device for a built-in one (no memory), on the CPU for a user's."""
    if task.host is not None:  # a user's host (`--task package.module:function`)
        return task_host(task, "cpu")
    host_kwargs: dict[str, int | bool] = dict(task.host_kwargs)
    if task.topology == "cnn" and pool_slots:
        host_kwargs["pool_slots"] = True
    return build_host(task.topology, device="meta", **host_kwargs)


def slot_widths(task: Task, pool_slots: bool = False) -> dict[str, int]:
    """Slot id -> channels (or model width) of every injection point of the task's host, in execution order."""
    return dict(_meta_host(task, pool_slots).injection_points)


def list_tasks(out: TextIO) -> None:
    table = Table("task", "what it is", box=None, pad_edge=False)
    for name in TASK_NAMES:
        table.add_row(name, TASK_DESCRIPTIONS.get(name, ""))
    _console(out).print(table)


def list_slots(task: Task, pool_slots: bool, out: TextIO) -> None:
    table = Table("slot", Column("width", justify="right"), box=None, pad_edge=False)
    for slot, width in slot_widths(task, pool_slots).items():
        table.add_row(slot, str(width))
    console = _console(out)
    console.print(f"slots of the {task.name} host ({task.topology}), in execution order:")
    console.print(table)


def _seed_parameters(model: MorphogeneticModel, slot_id: str, blueprint: str) -> str:
    """The parameters `blueprint` adds in `slot_id` (a widening one: given the layers around it), or "-" where
    the slot has no layers to widen."""
    slot = model.slot(slot_id)
    if get_blueprint(model.topology, blueprint).kind is BlueprintKind.WIDEN and slot.width_site is None:
        return "-"
    return f"{parameter_count(model.topology, blueprint, slot.channels, site=slot.width_site):,}"


def list_blueprints(task: Task, pool_slots: bool, out: TextIO) -> None:
    """Every blueprint of the task's topology with the parameters it adds in each slot."""
    widths = slot_widths(task, pool_slots)
    model = MorphogeneticModel(_meta_host(task, pool_slots))
    first_width = next(iter(widths.values()))
    slot_columns = (Column(f"{slot} (w {width})", justify="right") for slot, width in widths.items())
    table = Table("blueprint", *slot_columns, "what it is", box=None, pad_edge=False)
    for name, _, description in registry_table(task.topology, first_width):
        counts = (_seed_parameters(model, slot_id, name) for slot_id in widths)
        table.add_row(name, *counts, description)
    console = _console(out)
    console.print(f"blueprints of the {task.name} host ({task.topology}): parameters each adds in each slot "
                  "(w = slot width)")
    console.print(table)


def list_command(what: str, *, task_name: str = "digits", pool_slots: bool = False, data_dir: str | None = None,
                 text_file: str | None = None, out: TextIO | None = None) -> None:
    """Print the listing `what` (one of LISTINGS) to `out` (default: `sys.stdout` at call time)."""
    out = sys.stdout if out is None else out
    if what == "tasks":
        list_tasks(out)
        return
    task = (import_task(task_name, seed=0, device="cpu") if is_import_path(task_name) else
            load_task(task_name, device="cpu", data_dir=data_dir, text_file=text_file, max_train_samples=1))
    if what == "slots":
        list_slots(task, pool_slots, out)
    else:
        list_blueprints(task, pool_slots, out)
