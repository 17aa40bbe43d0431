"""`morphogen list tasks|blueprints|slots`: what can be named on the command line, without provoking errors.

Slots and blueprint sizes depend on the task's host, so both load the task (digits, the default, ships
with scikit-learn; cifar10 needs `--data-dir`). The host is built on the `meta` device: listing costs
no memory and no training. `list tasks` reads only `morphogen.data.catalog`: it loads no torch.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TextIO

from morphogen.data.catalog import TASK_DESCRIPTIONS, TASK_NAMES

if TYPE_CHECKING:
    from rich.console import Console

    from morphogen.core.hosts import SegmentedHost
    from morphogen.core.model import MorphogeneticModel
    from morphogen.data import Task

LISTINGS = ("tasks", "blueprints", "slots")


def _console(out: TextIO) -> Console:
    from rich.console import Console

    from morphogen.ui.progress import LINE_WIDTH

    return Console(file=out, width=LINE_WIDTH, highlight=False)


def _host(task: Task, pool_slots: bool) -> SegmentedHost:
    """The task's host, on the meta device for a built-in one (no memory), on the CPU for a user's."""
    from morphogen.core.hosts import build_host
    from morphogen.env.episode import task_host

    if task.host is not None:  # a user's host (`--task package.module:function`)
        return task_host(task, "cpu")
    host_kwargs: dict[str, int | bool] = dict(task.host_kwargs)
    if task.topology == "cnn" and pool_slots:
        host_kwargs["pool_slots"] = True
    return build_host(task.topology, device="meta", **host_kwargs)


def slot_widths(task: Task, pool_slots: bool = False) -> dict[str, int]:
    """Slot id -> channels (or model width) of every injection point of the task's host, in execution order."""
    return dict(_host(task, pool_slots).injection_points)


def list_tasks(out: TextIO) -> None:
    from rich.table import Table

    table = Table("task", "what it is", box=None, pad_edge=False)
    for name in TASK_NAMES:
        table.add_row(name, TASK_DESCRIPTIONS.get(name, ""))
    _console(out).print(table)


def list_slots(task: Task, pool_slots: bool, out: TextIO) -> None:
    from rich.table import Column, Table

    table = Table("slot", Column("width", justify="right"), box=None, pad_edge=False)
    for slot, width in slot_widths(task, pool_slots).items():
        table.add_row(slot, str(width))
    console = _console(out)
    console.print(f"slots of the {task.name} host ({task.topology}), in execution order:")
    console.print(table)


def _seed_parameters(model: MorphogeneticModel, slot_id: str, blueprint: str) -> str:
    """The parameters `blueprint` adds in `slot_id` (a widening one: given the layers around it), or "-" where
    the slot has no layers to widen."""
    from morphogen.core.blueprints import BlueprintKind, get_blueprint, parameter_count

    slot = model.slot(slot_id)
    if get_blueprint(model.topology, blueprint).kind is BlueprintKind.WIDEN and slot.width_site is None:
        return "-"
    return f"{parameter_count(model.topology, blueprint, slot.channels, site=slot.width_site):,}"


def list_blueprints(task: Task, pool_slots: bool, out: TextIO) -> None:
    """Every blueprint of the task's topology with the parameters it adds in each slot."""
    from rich.table import Column, Table

    from morphogen.core.blueprints import registry_table
    from morphogen.core.model import MorphogeneticModel

    model = MorphogeneticModel(_host(task, pool_slots))
    widths = {slot.slot_id: slot.channels for slot in model.slots()}
    first_width = next(iter(widths.values()))
    slot_columns = (Column(f"{slot} (w {width})", justify="right") for slot, width in widths.items())
    table = Table("blueprint", *slot_columns, "what it is", box=None, pad_edge=False)
    for name, _, description in registry_table(task.topology, first_width):
        table.add_row(name, *(_seed_parameters(model, slot_id, name) for slot_id in widths), description)
    console = _console(out)
    console.print(f"blueprints of the {task.name} host ({task.topology}): parameters each adds in each slot "
                  "(w = slot width; - where the slot has no layers around it to widen)")
    console.print(table)


def list_command(what: str, *, task_name: str = "digits", pool_slots: bool = False, data_dir: str | None = None,
                 text_file: str | None = None, out: TextIO | None = None) -> None:
    """Print the listing `what` (one of LISTINGS) to `out` (default: `sys.stdout` at call time)."""
    out = sys.stdout if out is None else out
    if what == "tasks":
        list_tasks(out)
        return
    from morphogen.data import load_task
    from morphogen.task_import import import_task, is_import_path

    task = (import_task(task_name, seed=0, device="cpu") if is_import_path(task_name) else
            load_task(task_name, device="cpu", data_dir=data_dir, text_file=text_file, max_train_samples=1))
    if what == "slots":
        list_slots(task, pool_slots, out)
    else:
        list_blueprints(task, pool_slots, out)
