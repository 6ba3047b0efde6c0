"""Line charts as inline SVG, rendered on the server (no JavaScript, nothing from a CDN).

A chart is a title, x labels (one per period) and series aligned with them; a None value is a
gap in its line. Series differ by colour and by dash pattern, so they stay apart without colour.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

WIDTH, HEIGHT = 640, 240
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 14, 40
# Colours with >= 4.5:1 contrast on white; dashes for readers who do not see colour.
STYLES = [("#0b57d0", ""), ("#b3261e", "6 3"), ("#146c2e", "2 3"), ("#6d28d9", "10 3 2 3"),
          ("#8a4b00", "4 4"), ("#00676b", "1 2")]


@dataclass(frozen=True)
class Series:
    name: str
    values: list[float | None]


def nice_max(value: float) -> float:
    """The smallest 1, 2 or 5 x 10^k at or above value (1 for an empty chart)."""
    if value <= 0:
        return 1.0
    exponent = math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        candidate = step * 10 ** exponent
        if candidate >= value:
            return float(candidate)
    return float(10 ** (exponent + 1))


def short_number(value: float) -> str:
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:.3g}" if value % 1 else f"{int(value)}"


def period_label(moment: datetime, granularity: str) -> str:
    return moment.strftime("%d %b %H:%M" if granularity == "hour" else "%d %b %Y")


def line_chart(chart_id: str, title: str, unit: str, labels: list[str],
               series: list[Series]) -> SafeString:
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    top = nice_max(max((v for s in series for v in s.values if v is not None), default=0.0))
    n = len(labels)

    def x(i: int) -> float:
        return LEFT + (plot_w * i / (n - 1) if n > 1 else plot_w / 2)

    def y(v: float) -> float:
        return TOP + plot_h * (1 - v / top)

    parts = [
        f'<svg class="chart" id="{chart_id}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-labelledby="{chart_id}-title {chart_id}-desc" preserveAspectRatio="xMidYMid meet">',
        f'<title id="{chart_id}-title">{escape(title)}</title>',
        f'<desc id="{chart_id}-desc">{escape(_describe(title, unit, labels, series))}</desc>',
    ]
    for frac in (0, 0.5, 1):
        ty = y(top * frac)
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{ty:.1f}" '
                     f'y2="{ty:.1f}"/>')
        parts.append(f'<text class="tick" x="{LEFT - 6}" y="{ty + 4:.1f}" text-anchor="end">'
                     f'{escape(short_number(top * frac))}</text>')
    for i, anchor in ((0, "start"), (n // 2, "middle"), (n - 1, "end")):
        if 0 <= i < n:
            parts.append(f'<text class="tick" x="{x(i):.1f}" y="{HEIGHT - BOTTOM + 18}" '
                         f'text-anchor="{anchor}">{escape(labels[i])}</text>')
    parts.append(f'<text class="unit" x="{LEFT}" y="{HEIGHT - 4}">{escape(unit)}</text>')
    for k, s in enumerate(series):
        color, dash = STYLES[k % len(STYLES)]
        path, pen_down, lone = [], False, []
        for i, v in enumerate(s.values):
            if v is None:
                pen_down = False
                continue
            path.append(f'{"L" if pen_down else "M"}{x(i):.1f},{y(v):.1f}')
            if not pen_down and (i + 1 >= n or s.values[i + 1] is None):
                lone.append((x(i), y(v)))
            pen_down = True
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        if path:
            parts.append(f'<path class="line" d="{" ".join(path)}" stroke="{color}"'
                         f'{dash_attr} data-series="{escape(s.name)}"/>')
        for cx, cy in lone:  # a point with no neighbour would be invisible as a path
            parts.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="3" fill="{color}"/>')
    parts.append("</svg>")
    legend = "".join(
        f'<li><svg width="28" height="10" aria-hidden="true"><line x1="0" x2="28" y1="5" y2="5" '
        f'stroke="{STYLES[k % len(STYLES)][0]}" stroke-width="3"'
        + (f' stroke-dasharray="{STYLES[k % len(STYLES)][1]}"' if STYLES[k % len(STYLES)][1]
           else "")
        + f'/></svg> {escape(s.name)}</li>'
        for k, s in enumerate(series))
    return mark_safe(f'<figure class="chart-figure"><figcaption>{escape(title)}</figcaption>'
                     f'{"".join(parts)}<ul class="legend">{legend}</ul></figure>')


def _describe(title: str, unit: str, labels: list[str], series: list[Series]) -> str:
    if not series:
        return f"{title}: no usage in this range."
    bits = []
    for s in series:
        values = [v for v in s.values if v is not None]
        if values:
            bits.append(f"{s.name}: peak {short_number(max(values))} {unit}")
    span = f" from {labels[0]} to {labels[-1]}" if labels else ""
    return f"{title}{span}. " + "; ".join(bits)
