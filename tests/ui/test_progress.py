"""Progress bars draw on a terminal only; lines always reach the output, above the bars."""

from __future__ import annotations

import io

from morphogen.ui.progress import ProgressDisplay


def test_not_a_terminal_prints_plain_lines_and_no_bars() -> None:
    out = io.StringIO()
    with ProgressDisplay(out) as display:
        task = display.add("epochs", 3)
        display.advance(task)
        display.print("epoch 1/3")
    assert task is None and out.getvalue() == "epoch 1/3\n"


def test_a_terminal_gets_bars_with_a_count_and_the_lines() -> None:
    out = io.StringIO()
    with ProgressDisplay(out, enabled=True) as display:
        task = display.add("round 1 epochs", 4, status="(2 envs)")
        display.advance(task, 2)
        display.print("round   1  return +0.100")
        display._progress.refresh()  # type: ignore[union-attr]  # draw now instead of on the timer
        drawn = out.getvalue()
    assert "round   1  return +0.100" in drawn
    assert "round 1 epochs" in drawn and "2/4" in drawn and "(2 envs)" in drawn and "eta" in drawn
