"""Small inline-SVG charts for the HTML report: line charts, a scatter plot and stage timelines.

Pure functions from numbers to SVG text, with no JavaScript and nothing fetched: the report stays one
self-contained file that any browser draws offline. Every mark carries a `<title>`, which browsers show
as a tooltip. Text is escaped; coordinates are rounded to 0.1 px to keep files small.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

PALETTE = ("#1e88e5", "#e53935", "#43a047", "#fb8c00", "#8e24aa", "#00897b", "#6d4c41", "#3949ab", "#c0ca33",
           "#d81b60")
"""Colours given to series in order."""

WIDTH, HEIGHT = 560, 260
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 64, 16, 28, 44


@dataclass(frozen=True)
class Series:
    """One named line: (x, y) points in x order, drawn dashed when `dashed`."""

    name: str
    points: tuple[tuple[float, float], ...]
    dashed: bool = False


@dataclass(frozen=True)
class Segment:
    """One stretch of a timeline row: [start, end) on the x axis, a colour, and a tooltip."""

    start: float
    end: float
    colour: str
    label: str


RELATIVE_RESOLUTION = 1e-9
"""Values closer than this times their magnitude are drawn as one value: their ticks would print alike."""


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values (steps of 1, 2 or 5 times a power of ten, about `count` of them) covering [low, high].

    At most `count + 3` ticks, whatever the values: ticks are indexed, never accumulated, so a step below
    the values' float resolution cannot stall the walk.
    """
    if not (math.isfinite(low) and math.isfinite(high)):
        return [0.0]
    span = high - low
    if span <= RELATIVE_RESOLUTION * max(abs(low), abs(high)):
        return [low]
    raw = span / count
    if not (math.isfinite(span) and raw > 0):  # the ends of the float range, or subnormals: no round step fits
        return [low, high]
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first, last = math.floor(low / step), math.ceil(high / step)
    return [float(f"{index * step:.12g}") for index in range(first, last + 1)]  # 0.30000000000000004 -> 0.3


def format_number(value: float) -> str:
    """A tick label: integers without decimals, large numbers with thousands separators."""
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if value == int(value):
        return f"{int(value)}"
    return f"{value:.3g}"


class _Frame:
    """Maps data coordinates into the plot area of a WIDTH x HEIGHT chart."""

    def __init__(self, x_ticks: Sequence[float], y_ticks: Sequence[float], top: float = MARGIN_TOP) -> None:
        self.top = top
        self.x_low, self.x_high = x_ticks[0], x_ticks[-1]
        self.y_low, self.y_high = y_ticks[0], y_ticks[-1]
        self.x_ticks, self.y_ticks = x_ticks, y_ticks

    def x(self, value: float) -> float:
        span = self.x_high - self.x_low or 1.0
        return MARGIN_LEFT + (value - self.x_low) / span * (WIDTH - MARGIN_LEFT - MARGIN_RIGHT)

    def y(self, value: float) -> float:
        span = self.y_high - self.y_low or 1.0
        return HEIGHT - MARGIN_BOTTOM - (value - self.y_low) / span * (HEIGHT - self.top - MARGIN_BOTTOM)

    def axes(self, title: str, x_label: str, y_label: str) -> list[str]:
        parts = [f'<text x="{WIDTH / 2:.1f}" y="16" class="title">{escape(title)}</text>']
        bottom, left, right = HEIGHT - MARGIN_BOTTOM, MARGIN_LEFT, WIDTH - MARGIN_RIGHT
        for tick in self.y_ticks:
            y = self.y(tick)
            parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" class="grid"/>')
            parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">'
                         f"{format_number(tick)}</text>")
        for tick in self.x_ticks:
            x = self.x(tick)
            parts.append(f'<text x="{x:.1f}" y="{bottom + 16}" class="tick" text-anchor="middle">'
                         f"{format_number(tick)}</text>")
        parts.append(f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" class="axis"/>')
        parts.append(f'<line x1="{left}" y1="{self.top}" x2="{left}" y2="{bottom}" class="axis"/>')
        parts.append(f'<text x="{(left + right) / 2:.1f}" y="{HEIGHT - 8}" class="label" text-anchor="middle">'
                     f"{escape(x_label)}</text>")
        middle = (self.top + bottom) / 2
        parts.append(f'<text x="14" y="{middle:.1f}" class="label" text-anchor="middle" '
                     f'transform="rotate(-90 14 {middle:.1f})">{escape(y_label)}</text>')
        return parts


def _svg(parts: Sequence[str], label: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" '
            f'height="{HEIGHT}" role="img" aria-label="{escape(label)}">' + "".join(parts) + "</svg>")


LEGEND_ROW = 16
"""Height of one row of legend entries; entries wrap onto a new row at the chart's right edge."""


def legend_layout(names: Sequence[str], left: float, per_character: float = 6.5) -> list[tuple[float, int]]:
    """(x, row) of each legend entry, laid out left to right and wrapped at the chart's right margin."""
    positions, x, row = [], left, 0
    for name in names:
        width = 28 + per_character * len(name)
        if x + width > WIDTH - MARGIN_RIGHT and x > left:
            x, row = left, row + 1
        positions.append((x, row))
        x += width
    return positions


def _legend(names: Sequence[tuple[str, str, bool]]) -> tuple[list[str], int]:
    """Legend marks under the title, and how many rows they take."""
    parts = []
    positions = legend_layout([name for name, _, _ in names], MARGIN_LEFT + 8)
    for (name, colour, dashed), (x, row) in zip(names, positions, strict=True):
        y = MARGIN_TOP + 4 + row * LEGEND_ROW
        dash = ' stroke-dasharray="5 3"' if dashed else ""
        parts.append(f'<line x1="{x}" y1="{y}" x2="{x + 16}" y2="{y}" stroke="{colour}" '
                     f'stroke-width="2.5"{dash}/>')
        parts.append(f'<text x="{x + 20}" y="{y + 4}" class="legend">{escape(name)}</text>')
    return parts, 1 + max((row for _, row in positions), default=0)


def _ticks_of(values: Sequence[float], include_zero: bool = False) -> list[float]:
    finite = [v for v in values if math.isfinite(v)]
    if include_zero:
        finite.append(0.0)
    if not finite:
        return [0.0, 1.0]
    low, high = min(finite), max(finite)
    if low == high:
        low, high = low - 1.0, high + 1.0
    return nice_ticks(low, high)


def line_chart(series: Sequence[Series], *, title: str, x_label: str, y_label: str) -> str:
    """Lines (with a dot per point) of every series on shared axes, with a legend; "" when no points."""
    drawn = [s for s in series if s.points]
    if not drawn:
        return ""
    colours = [PALETTE[index % len(PALETTE)] for index in range(len(drawn))]
    legend, legend_rows = _legend([(line.name, colour, line.dashed) for line, colour in zip(drawn, colours,
                                                                                           strict=True)])
    frame = _Frame(_ticks_of([x for s in drawn for x, _ in s.points]),
                   _ticks_of([y for s in drawn for _, y in s.points]), top=MARGIN_TOP + LEGEND_ROW * legend_rows + 4)
    parts = frame.axes(title, x_label, y_label)
    for line, colour in zip(drawn, colours, strict=True):
        parts += _polyline(frame, line, colour)
    return _svg(parts + legend, title)


def _polyline(frame: _Frame, line: Series, colour: str) -> list[str]:
    """One series as a line through its finite points, with a dot (and a tooltip) per point up to 120."""
    finite = [(x, y) for x, y in line.points if math.isfinite(y)]
    path = " ".join(f"{frame.x(x):.1f},{frame.y(y):.1f}" for x, y in finite)
    dash = ' stroke-dasharray="5 3"' if line.dashed else ""
    parts = [f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>']
    if len(finite) <= 120:
        parts += [f'<circle cx="{frame.x(x):.1f}" cy="{frame.y(y):.1f}" r="2.5" fill="{colour}">'
                  f"<title>{escape(line.name)}: {format_number(x)}, {y:.4g}</title></circle>" for x, y in finite]
    return parts


def scatter_chart(points: Sequence[tuple[float, float, str]], *, title: str, x_label: str, y_label: str,
                  value_text: Callable[[float], str] = "{:+.2f}".format) -> str:
    """Labelled (x, y) points with the diagonal y = x (where prediction equals measurement); "" when none. Each
    point's tooltip gives its values as `value_text` writes them (the text report's digits and unit)."""
    if not points:
        return ""
    values = [v for x, y, _ in points for v in (x, y)]
    ticks = _ticks_of(values, include_zero=True)
    frame = _Frame(ticks, ticks)
    parts = frame.axes(title, x_label, y_label)
    parts.append(f'<line x1="{frame.x(ticks[0]):.1f}" y1="{frame.y(ticks[0]):.1f}" x2="{frame.x(ticks[-1]):.1f}" '
                 f'y2="{frame.y(ticks[-1]):.1f}" class="diagonal"/>')
    for x, y, label in points:
        parts.append(f'<circle cx="{frame.x(x):.1f}" cy="{frame.y(y):.1f}" r="5" fill="{PALETTE[0]}" '
                     f'fill-opacity="0.75"><title>{escape(label)}: predicted {escape(value_text(x))}, measured '
                     f"{escape(value_text(y))}</title>"
                     "</circle>")
    return _svg(parts, title)


def timeline_chart(rows: Sequence[tuple[str, Sequence[Segment]]], *, title: str, x_label: str,
                   legend: Sequence[tuple[str, str]]) -> str:
    """One horizontal bar per row, made of coloured segments, with a colour legend; "" when no rows."""
    if not rows:
        return ""
    positions = legend_layout([name for name, _ in legend], 8, per_character=6.0)
    legend_rows = 1 + max((row for _, row in positions), default=0)
    row_height, top = 18, MARGIN_TOP + LEGEND_ROW * legend_rows + 6
    height = top + row_height * len(rows) + MARGIN_BOTTOM
    ends = [segment.end for _, segments in rows for segment in segments] or [1.0]
    ticks = nice_ticks(0.0, max(ends))
    left, right = 150, WIDTH - MARGIN_RIGHT

    def x_of(value: float) -> float:
        return left + value / (ticks[-1] or 1.0) * (right - left)

    parts = [f'<text x="{WIDTH / 2:.1f}" y="16" class="title">{escape(title)}</text>']
    for (name, colour), (x, row) in zip(legend, positions, strict=True):
        y = MARGIN_TOP - 2 + row * LEGEND_ROW
        parts.append(f'<rect x="{x}" y="{y}" width="10" height="10" fill="{colour}"/>'
                     f'<text x="{x + 13}" y="{y + 9}" class="legend">{escape(name)}</text>')
    for index, (label, segments) in enumerate(rows):
        y = top + index * row_height
        parts.append(f'<text x="{left - 6}" y="{y + 12}" class="tick" text-anchor="end">{escape(label)}</text>')
        for segment in segments:
            width = max(x_of(segment.end) - x_of(segment.start), 1.5)
            parts.append(f'<rect x="{x_of(segment.start):.1f}" y="{y + 2}" width="{width:.1f}" '
                         f'height="{row_height - 4}" fill="{segment.colour}"><title>{escape(segment.label)}</title>'
                         "</rect>")
    bottom = top + row_height * len(rows) + 4
    parts.append(f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" class="axis"/>')
    for tick in ticks:
        parts.append(f'<text x="{x_of(tick):.1f}" y="{bottom + 16}" class="tick" text-anchor="middle">'
                     f"{format_number(tick)}</text>")
    parts.append(f'<text x="{(left + right) / 2:.1f}" y="{bottom + 34}" class="label" text-anchor="middle">'
                 f"{escape(x_label)}</text>")
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" '
            f'height="{height}" role="img" aria-label="{escape(title)}">' + "".join(parts) + "</svg>")
