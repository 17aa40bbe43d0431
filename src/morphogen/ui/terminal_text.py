"""Strings from a run directory made safe to print: control characters shown as escapes, never obeyed.

A copied run directory is untrusted, and its strings (actions, slot ids, anomaly messages, config
values) reach the terminal through `report`, `runs`, the dashboard and error lines. An escape
sequence among them could rewrite the screen, set the window title or write the clipboard (OSC 52);
a carriage return could overprint a line; a bidirectional override could reorder what is shown.
`printable` replaces every such character (Unicode categories Cc and Cf) with its Python escape,
keeping newlines only when asked. Rich markup is a separate matter: print strings from a run as
`rich.text.Text`, never as markup.
"""

from __future__ import annotations

import dataclasses
import unicodedata
from typing import TypeVar

Value = TypeVar("Value")

_KEPT = frozenset("\n")


def _escape(character: str) -> str:
    code = ord(character)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str, keep_newlines: bool = False) -> str:
    """`text` with control and format characters (and newlines, unless `keep_newlines`) as escapes."""
    if text.isprintable():  # the common case, checked in C
        return text
    return "".join(character if (keep_newlines and character in _KEPT) or
                   unicodedata.category(character) not in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")
                   else _escape(character) for character in text)


def printable_fields(value: Value) -> Value:
    """`value` (an event, or anything inside one) with `printable` applied to every string in it."""
    if isinstance(value, str):
        return printable(value)  # type: ignore[return-value]
    if isinstance(value, tuple):
        return tuple(printable_fields(item) for item in value)  # type: ignore[return-value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {item.name: printable_fields(getattr(value, item.name)) for item in dataclasses.fields(value)
                   if item.init}
        return dataclasses.replace(value, **changes)
    return value


def cut(text: str, width: int) -> str:
    """`text` cut to `width` columns (at least one), ending in an ellipsis when something was cut."""
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def printable_cut(text: str, width: int) -> str:
    """`printable(text)` cut to `width` columns (at least one) between whole escapes, never inside one, ending in an
    ellipsis when something was cut: a cut cell shows `\\x1b` whole or not at all."""
    shown = printable(text)
    if len(shown) <= width:
        return shown
    kept, length = [], 0
    for character in text:
        piece = printable(character)
        if length + len(piece) > max(width - 1, 0):
            break
        kept.append(piece)
        length += len(piece)
    return "".join(kept) + "…"



def printable_wrap(text: str, width: int) -> list[str]:
    """`printable(text)` as lines of at most `width` columns (at least one), broken at spaces, a word wider than a
    line between whole escapes: wrapped rather than cut, so that nothing of it is lost and no escape is split."""
    width = max(width, 1)
    lines: list[str] = []
    line = ""
    for index, word in enumerate(text.split(" ")):
        shown = printable(word)
        if index and len(line) + 1 + len(shown) <= width:
            line += " " + shown
            continue
        if index:  # the space between the words is where the line breaks
            lines.append(line)
            line = ""
        for piece in (printable(character) for character in word):  # a word wider than a line: between escapes
            if line and len(line) + len(piece) > width:
                lines.append(line)
                line = ""
            line += piece
    lines.append(line)
    return lines
