"""Numbers with their units (`morphogen.ui.units`)."""

from __future__ import annotations

from morphogen.ui.units import counted


def test_counted_is_singular_for_one_and_plural_otherwise() -> None:
    assert counted(1, "env") == "1 env"
    assert counted(0, "episode") == "0 episodes"
    assert counted(4, "round") == "4 rounds"
    assert counted(2, "process", "processes") == "2 processes"
    assert counted(12_000, "epoch") == "12,000 epochs"
