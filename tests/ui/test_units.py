"""Numbers with their units (`morphogen.ui.units`)."""

from __future__ import annotations

from morphogen.telemetry.story import NEGATIVE_LOSS
from morphogen.ui.units import counted, format_difference


def test_counted_is_singular_for_one_and_plural_otherwise() -> None:
    assert counted(1, "env") == "1 env"
    assert counted(0, "episode") == "0 episodes"
    assert counted(4, "round") == "4 rounds"
    assert counted(2, "process", "processes") == "2 processes"
    assert counted(12_000, "epoch") == "12,000 epochs"


def test_a_difference_of_negative_losses_reads_as_one_of_losses_and_zero_without_a_sign_turned() -> None:
    assert format_difference(0.0, 0.0, NEGATIVE_LOSS) == "+0.0000 ± 0.0000 in loss"
    assert format_difference(-0.1021, 0.0035, NEGATIVE_LOSS) == "+0.1021 ± 0.0035 in loss"
    assert format_difference(0.25, float("nan"), NEGATIVE_LOSS) == "-0.2500 ± n/a in loss"
