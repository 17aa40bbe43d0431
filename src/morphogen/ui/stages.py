"""How every view shows a seed's lifecycle stage: one order, one colour and one short name per stage.

The names are the `Stage` values telemetry writes ("training", "blending", ...); this module holds them
as plain strings so that `ui` never imports `core` (it reads only what telemetry wrote).
"""

from __future__ import annotations

STAGES = ("dormant", "germinated", "training", "blending", "holding", "fossilized", "pruned", "embargoed",
          "resetting")
"""Every stage in lifecycle order (docs/architecture.md#lifecycle)."""

STAGE_COLOURS = {
    "dormant": "#9e9e9e",
    "germinated": "#80deea",
    "training": "#1e88e5",
    "blending": "#fb8c00",
    "holding": "#fdd835",
    "fossilized": "#43a047",
    "pruned": "#e53935",
    "embargoed": "#8e24aa",
    "resetting": "#6d4c41",
}
"""Hex colour of each stage, shared by the dashboard and the HTML report."""

STAGE_SHORT = {
    "dormant": "-",
    "germinated": "GERM",
    "training": "TRAIN",
    "blending": "BLEND",
    "holding": "HOLD",
    "fossilized": "FOSSIL",
    "pruned": "PRUNED",
    "embargoed": "EMBARGO",
    "resetting": "RESET",
}
"""A short upper-case name of each stage for narrow columns."""


def stage_colour(stage: str) -> str:
    """The colour of `stage`; grey for a stage this version does not know (a newer run's events)."""
    return STAGE_COLOURS.get(stage, "#9e9e9e")


def stage_short(stage: str) -> str:
    """The short name of `stage`; the stage itself, upper-cased, when unknown."""
    return STAGE_SHORT.get(stage, stage.upper())

