"""`printable_wrap` wraps a run's string into escaped lines: nothing lost, no line too wide, no escape split."""

from __future__ import annotations

import re

from morphogen.ui.terminal_text import printable, printable_wrap


def test_words_wrap_at_spaces_and_a_word_wider_than_a_line_breaks_between_whole_escapes() -> None:
    assert printable_wrap("aaa bbb ccc dddd", 7) == ["aaa bbb", "ccc", "dddd"]
    assert printable_wrap("a\x1b\x1b\x1bb", 9) == ["a\\x1b\\x1b", "\\x1bb"]  # 'a\x1b\x1b\x1' would split one
    assert printable_wrap("", 5) == [""]


def test_the_lines_joined_at_their_breaks_are_the_whole_escaped_text() -> None:
    text = "gate \x1b[31mred\x1b[0m says +0.0283 nats >= 0.005 " + "\u202e" * 9 + " end"
    lines = printable_wrap(text, 12)
    assert len(lines) > 3 and all(len(line) <= 12 for line in lines)
    assert "".join(lines).replace(" ", "") == printable(text).replace(" ", "")
    whole_escapes = re.compile(r"(?:\\x[0-9a-f]{2}|\\u[0-9a-f]{4}|[^\\])*")  # the text has no backslash of its own
    assert all(whole_escapes.fullmatch(line) for line in lines)
