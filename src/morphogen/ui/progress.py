"""Progress bars with ETA for long commands, and the lines they print, on one output stream.

`ProgressDisplay(out)` draws rich progress bars on `out` only when `out` is a terminal; otherwise
(a pipe, a CI log, a test's captured stdout) it draws nothing and `print` writes plain lines, so logs
stay clean. Commands print every line through `display.print`, never straight to `out`: while bars
are drawn, rich must place lines above them, or the bars and the lines overwrite each other.

This module knows nothing of episodes or rounds: callers name a task, give its total and advance it.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import TextIO

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

LINE_WIDTH = 120
"""Printed lines and the bars are kept within this many columns."""


def is_terminal(stream: TextIO) -> bool:
    """Whether `stream` is an interactive terminal (closed or odd streams count as not)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class ProgressDisplay:
    """Bars on a terminal, plain lines elsewhere; use as a context manager around the long work.

    `enabled=None` decides by `is_terminal(out)`; True or False forces it (tests force True with a
    rich `Console` that records instead of drawing).
    """

    def __init__(self, out: TextIO | None = None, *, enabled: bool | None = None) -> None:
        self.out = sys.stdout if out is None else out
        self.enabled = is_terminal(self.out) if enabled is None else enabled
        self._progress: Progress | None = None
        if self.enabled:
            console = Console(file=self.out, width=min(LINE_WIDTH, Console(file=self.out).width),
                              force_terminal=True)
            self._progress = Progress(
                TextColumn("{task.description}"), BarColumn(bar_width=30), MofNCompleteColumn(),
                TextColumn("{task.fields[status]}"), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                console=console, transient=True, redirect_stdout=False, redirect_stderr=False)

    def __enter__(self) -> ProgressDisplay:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc_value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.stop()

    def print(self, line: str) -> None:
        """Print one line above the bars (or plainly when there are none), flushed at once."""
        if self._progress is not None:
            self._progress.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            print(line, file=self.out, flush=True)

    def add(self, description: str, total: int | None, status: str = "") -> TaskID | None:
        """A new bar of `total` steps (None: unknown); returns its id, or None when nothing is drawn."""
        if self._progress is None:
            return None
        # The bar's text column reads rich markup: a name of the user's ("[red]", "[/x]") is shown as written.
        return self._progress.add_task(escape(description), total=total, status=status)

    def advance(self, task: TaskID | None, steps: int = 1, status: str | None = None) -> None:
        """Advance `task` by `steps`, optionally changing the status text after the count."""
        if self._progress is None or task is None:
            return
        if status is None:
            self._progress.update(task, advance=steps)
        else:
            self._progress.update(task, advance=steps, status=status)

    def reset(self, task: TaskID | None, description: str | None = None, total: int | None = None) -> None:
        """Start `task` over at zero (a new round's epochs), optionally renamed or resized."""
        if self._progress is None or task is None:
            return
        self._progress.reset(task, total=total, description=description)

    def remove(self, task: TaskID | None) -> None:
        """Take `task`'s bar off the display."""
        if self._progress is not None and task is not None:
            self._progress.remove_task(task)
