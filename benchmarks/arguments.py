"""What every benchmark script checks of its command line: a user's mistake is one line and exit 2, not a traceback
from a worker process after minutes of training, nor an empty table."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn, TypeVar

Result = TypeVar("Result")
#: Exit status when the reader of stdout closed the pipe, as a shell reports a process stopped by SIGPIPE.
BROKEN_PIPE = 141


class BenchmarkParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, `PROG: error: MESSAGE`, and exit 2 (`--help` shows the usage)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def count(text: str) -> int:
    """An argparse type for how many of something (seeds, epochs, workers, threads, rounds): an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def whole_numbers(minimum: int = 1) -> Callable[[str], list[int]]:
    """An argparse type for a comma-separated list of whole numbers >= `minimum` (empty items skipped)."""
    def parse(text: str) -> list[int]:
        try:
            values = [int(item) for item in text.split(",") if item.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
        if any(value < minimum for value in values):
            raise argparse.ArgumentTypeError(f"every number must be at least {minimum}, got {text!r}")
        return values
    return parse


def output_file(text: str) -> str:
    """An argparse type for a file the script writes (results, cache): a path that is not a directory."""
    if Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; give a file path in it")
    return text


def fail(prog: str, message: str) -> NoReturn:
    """One line on stderr and exit 2: for a check that needs more than one argument, after parsing."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def user_error_types() -> tuple[type[Exception], ...]:
    """The morphogen errors a user's input causes (bad task, config, checkpoint, blueprint, slot, model file)."""
    from morphogen.config import ConfigError
    from morphogen.control.checkpoint import CheckpointError
    from morphogen.core.blueprints import UnknownBlueprintError
    from morphogen.core.hosts import UnknownSlotError
    from morphogen.data.errors import DataError
    from morphogen.model_file import ModelFileError
    return ConfigError, CheckpointError, UnknownBlueprintError, UnknownSlotError, DataError, ModelFileError


def run_script(main: Callable[[], Result]) -> Result:
    """Run a script's `main`; a user error raised in it (or re-raised from a worker process) is one line and exit 2,
    a closed pipe on stdout exit 141. Bugs keep their traceback."""
    try:
        return main()
    except BrokenPipeError:
        # The reader of the table went away (`... | head`): nothing more can reach it, so no traceback either.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(BROKEN_PIPE) from None
    except Exception as error:
        if isinstance(error, user_error_types()):
            fail(Path(sys.argv[0]).name, " ".join(str(error).split()))
        raise
