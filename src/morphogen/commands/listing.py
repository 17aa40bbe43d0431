"""`morphogen list tasks|blueprints|slots|presets`: what can be named on the command line, without provoking errors.

Slots and blueprint sizes depend on the task's host, and only on its size: a slot's width is a block's
channels or the model width, never the number of classes, input channels or vocabulary that the data
decides. So a built-in task's host is built from its default size alone, without its data (`cifar10`
needs no `--data-dir` to be listed), on the `meta` device: listing costs no memory and no training.
A user's task (`--task package.module:function`) is built by its function, which brings its own host.
`list tasks` reads only `morphogen.data.catalog`, and `list presets` the preset files: they load no torch.
"""

from __future__ import annotations

import io
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from morphogen.config import preset_description, preset_names
from morphogen.data.catalog import (
    DEFAULT_HOST_SIZES,
    TASK_DESCRIPTIONS,
    TASK_NAMES,
    TASK_TOPOLOGIES,
    unknown_task_message,
)

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.text import Text

    from morphogen.core.hosts import SegmentedHost
    from morphogen.core.model import MorphogeneticModel

LISTINGS = ("tasks", "blueprints", "slots", "presets")

#: Constructor arguments that a built-in task's data fixes; no slot's width depends on them, so listing
#: builds the host with these stand-ins instead of loading the data.
DATA_ARGUMENTS: dict[str, dict[str, int]] = {"cnn": {"num_classes": 2, "in_channels": 1},
                                             "cnn1d": {"num_classes": 2, "in_channels": 1},
                                             "transformer": {"vocab_size": 2}}


@dataclass(frozen=True)
class ListedHost:
    """What a listing shows of a task's host: its task, topology and slot widths in execution order."""

    task: str
    topology: str
    widths: dict[str, int]
    host: SegmentedHost  # on the meta device for a built-in task: no memory


def _print(out: TextIO, *renderables: RenderableType) -> None:
    """Print through rich at the line width. Rich pads every table cell to its column's width; to a file or a
    pipe the lines go without those trailing spaces (a terminal gets rich's styled output as it is)."""
    from rich.console import Console

    from morphogen.ui.progress import LINE_WIDTH

    if getattr(out, "isatty", lambda: False)():  # a writer of the caller's may not say
        Console(file=out, width=LINE_WIDTH, highlight=False).print(*renderables)
        return
    console = Console(file=io.StringIO(), width=LINE_WIDTH, highlight=False, color_system=None)
    with console.capture() as captured:
        console.print(*renderables)
    out.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))


def listed_host(task_name: str, pool_slots: bool = False) -> ListedHost:
    """The host of a built-in task (from its default size, without data) or of a user's task (its function's)."""
    from morphogen.core.hosts import build_host
    from morphogen.data.errors import DataError
    from morphogen.task_import import import_task, is_import_path

    if is_import_path(task_name):
        from morphogen.env.episode import task_host

        task = import_task(task_name, seed=0, device="cpu")
        host = task_host(task, "cpu", pool_slots=pool_slots)
        return ListedHost(task.name, task.topology, dict(host.injection_points), host)
    if task_name not in TASK_NAMES:
        raise DataError(unknown_task_message(task_name))
    topology = TASK_TOPOLOGIES[task_name]
    arguments: dict[str, int | bool] = {**DATA_ARGUMENTS[topology], **DEFAULT_HOST_SIZES[task_name]}
    if topology in ("cnn", "cnn1d") and pool_slots:  # as `task_host` builds a run's host
        arguments["pool_slots"] = True
    host = build_host(topology, device="meta", **arguments)
    return ListedHost(task_name, topology, dict(host.injection_points), host)


def _list_named(header: tuple[str, str], rows: dict[str, str], out: TextIO) -> None:
    from rich.table import Table

    table = Table(*header, box=None, pad_edge=False)
    for name, description in rows.items():
        table.add_row(name, description)
    _print(out, table)


def list_tasks(out: TextIO) -> None:
    _list_named(("task", "what it is"), {name: TASK_DESCRIPTIONS.get(name, "") for name in TASK_NAMES}, out)


def _shown(text: str) -> Text:
    """`text`, the user's own (a slot id, a submodule's name, a task's name), as Rich shows it: its control
    characters as escapes, its brackets as written, never read as markup."""
    from rich.text import Text

    from morphogen.ui.terminal_text import printable

    return Text(printable(text))


def list_presets(out: TextIO) -> None:
    """The presets shipped with morphogen (`run --config NAME`, `grow(..., config=NAME)`), each with its purpose."""
    _list_named(("preset", "what it is for"), {name: preset_description(name) for name in preset_names()}, out)


def list_slots(host: ListedHost, out: TextIO) -> None:
    from rich.table import Column, Table

    from morphogen.core.blueprints import blueprint_names, get_blueprint
    from morphogen.core.module_host import ModuleHost

    own = host.host if isinstance(host.host, ModuleHost) else None
    topology = host.topology
    copying = [name for name in blueprint_names(topology) if get_blueprint(topology, name).copies_layer_before]
    # A user's model: the submodule after each slot, and whether the topology's copy can stack it.
    columns = ("after", *copying[:1]) if own is not None else ()
    table = Table("slot", Column("width", justify="right"), *columns, box=None, pad_edge=False)
    for slot, width in host.widths.items():
        copies = "copies it" if own is not None and own.layer_before(slot) is not None else "-"
        cells = [] if own is None else [own.submodules[slot], *([copies] if copying else [])]
        table.add_row(_shown(slot), str(width), *(_shown(cell) for cell in cells))
    _print(out, _shown(f"slots of the {host.task} host ({host.topology}), in execution order:"), table)


def _seed_parameters(model: MorphogeneticModel, slot_id: str, blueprint: str) -> str:
    """The parameters `blueprint` adds in `slot_id` (a widening or branch one: given the layers around it), or
    "-" where the slot has no site for it."""
    slot = model.slot(slot_id)
    if slot.site_problem(blueprint):
        return "-"
    return f"{sum(p.numel() for p in slot.seed_module(blueprint, device='meta').parameters()):,}"


def list_blueprints(host: ListedHost, out: TextIO) -> None:
    """Every blueprint of the host's topology with the parameters it adds in each slot."""
    from rich.table import Column, Table

    from morphogen.core.blueprints import registry_table
    from morphogen.core.model import MorphogeneticModel

    model = MorphogeneticModel(host.host)
    widths = host.widths
    first_width = next(iter(widths.values()))
    slot_columns = (Column(_shown(f"{slot} (w {width})"), justify="right") for slot, width in widths.items())
    table = Table("blueprint", *slot_columns, "what it is", box=None, pad_edge=False)
    for name, _, description in registry_table(host.topology, first_width):
        table.add_row(name, *(_seed_parameters(model, slot_id, name) for slot_id in widths), description)
    _print(out, _shown(f"blueprints of the {host.task} host ({host.topology}): parameters each adds in each slot "
                       "(w = slot width; - where the slot has no layers around it to widen or branch beside)"), table)


def list_command(what: str, *, task_name: str = "digits", pool_slots: bool = False, out: TextIO | None = None) -> None:
    """Print the listing `what` (one of LISTINGS) to `out` (default: `sys.stdout` at call time)."""
    out = sys.stdout if out is None else out
    if what in ("tasks", "presets"):
        (list_tasks if what == "tasks" else list_presets)(out)
        return
    host = listed_host(task_name, pool_slots)
    if what == "slots":
        list_slots(host, out)
    else:
        list_blueprints(host, out)
