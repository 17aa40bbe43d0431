"""`HostBuildError`, and a user's exception told in one line: its kind, first line and the line of the user's code."""

from __future__ import annotations

import os
import traceback
from pathlib import Path

import torch


class HostBuildError(ValueError):
    """A model that cannot be made a host with the slots asked for; the message names the submodule and why."""


def first_line(error: BaseException) -> str:
    """The error's kind and first line, and the line of the user's code it came from (`_line_of_yours`)."""
    text = str(error).strip().splitlines()
    first = f"{type(error).__name__}: {text[0][:300]}" if text else type(error).__name__
    where = _line_of_yours(error)
    return f"{first}, at {where}" if where else first


#: Where torch's and morphogen's own code lies: a traceback's frames outside them are the user's.
_LIBRARY_FOLDERS = tuple(str(folder) + os.sep for folder in (Path(torch.__file__).resolve().parent,
                                                              Path(__file__).resolve().parents[1]))


def _line_of_yours(error: BaseException) -> str:
    """`FILE:LINE: `SOURCE`` of the innermost frame of `error`'s traceback outside torch and morphogen (the `assert`
    on a length that fx cannot trace, the embedding call an index overran); "" where there is none."""
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        path = frame.filename
        if path.startswith("<") or str(Path(path).resolve()).startswith(_LIBRARY_FOLDERS):
            continue  # fx's generated code, or a library's own
        source = (frame.line or "").strip()
        return f"{path}:{frame.lineno}" + (f": `{source[:120]}`" if source else "")
    return ""
