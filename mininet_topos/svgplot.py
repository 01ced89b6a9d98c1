"""Line charts as SVG text (a browser or any image viewer shows them): side-by-side panels, one
line per series, axes with round ticks, a legend under each panel (never over its lines). A run
draws one fixed chart; writing SVG takes milliseconds where matplotlib's import alone cost a second
of CPU in every `make run`."""
from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
PANEL_W, PANEL_H, MARGIN_L, MARGIN_B, TOP = 420, 300, 70, 50, 50
LEGEND_ROW = 16  # the legend's rows, below the panel's axis label


@dataclass(frozen=True)
class Panel:
    """Series {label: (xs, ys)} over an x axis of integers; y from `ylo` (and up to `yhi` if given)."""
    xlabel: str
    ylabel: str
    series: dict[str, tuple[list[float], list[float]]]
    ylo: float = 0.0
    yhi: float | None = None


def ticks(lo: float, hi: float, n: int = 5, integer: bool = False) -> list[float]:
    """About n round values (1, 2 or 5 times a power of ten) covering [lo, hi]."""
    span = hi - lo if hi > lo else 1.0
    raw = span / n
    step = min((m * 10 ** math.floor(math.log10(raw)) for m in (1, 2, 5, 10)), key=lambda s: abs(s - raw))
    if integer:
        step = max(1.0, round(step))
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    return [round(k * step, 12) for k in range(first, max(last, first + 1) + 1)]


def label(v: float) -> str:
    return f"{v:g}"


def _panel(p: Panel, x0: float) -> list[str]:
    xs = [x for xv, _ in p.series.values() for x in xv] or [0.0, 1.0]
    ys = [y for _, yv in p.series.values() for y in yv if math.isfinite(y)] or [p.ylo + 1.0]
    xt = ticks(min(xs), max(xs), integer=True)
    top = max(ys) if max(ys) > p.ylo else p.ylo + 1.0  # all at ylo (no retransmissions): a 0..1 axis, not 0..1e-9
    yt = ticks(p.ylo, p.yhi if p.yhi is not None else top)
    (xa, xb), (ya, yb) = (xt[0], xt[-1]), (yt[0], yt[-1])
    w, h = PANEL_W - MARGIN_L - 10, PANEL_H - TOP - MARGIN_B
    left, bottom = x0 + MARGIN_L, TOP + h

    def px(x: float) -> float:
        return left + (x - xa) / ((xb - xa) or 1.0) * w

    def py(y: float) -> float:
        return bottom - (y - ya) / ((yb - ya) or 1.0) * h

    out = [f'<rect x="{left}" y="{TOP}" width="{w}" height="{h}" fill="none" stroke="#444"/>']
    for x in xt:
        out.append(f'<line x1="{px(x):.1f}" y1="{TOP}" x2="{px(x):.1f}" y2="{bottom}" stroke="#ddd"/>'
                   f'<text x="{px(x):.1f}" y="{bottom + 16}" text-anchor="middle">{label(x)}</text>')
    for y in yt:
        out.append(f'<line x1="{left}" y1="{py(y):.1f}" x2="{left + w}" y2="{py(y):.1f}" stroke="#ddd"/>'
                   f'<text x="{left - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{label(y)}</text>')
    out.append(f'<text x="{left + w / 2}" y="{bottom + 36}" text-anchor="middle">{escape(p.xlabel)}</text>')
    out.append(f'<text transform="translate({x0 + 16},{TOP + h / 2}) rotate(-90)" text-anchor="middle">'
               f'{escape(p.ylabel)}</text>')
    for i, (name, (xv, yv)) in enumerate(p.series.items()):
        color = COLORS[i % len(COLORS)]
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(xv, yv) if math.isfinite(y))
        out.append(f'<polyline class="series" points="{pts}" fill="none" stroke="{color}" stroke-width="2"/>')
        ly = PANEL_H + LEGEND_ROW * i + 4
        out.append(f'<line class="legend" x1="{left}" y1="{ly - 4}" x2="{left + 20}" y2="{ly - 4}" stroke="{color}" '
                   f'stroke-width="2"/><text x="{left + 26}" y="{ly}">{escape(name)}</text>')
    return out


def chart(panels: list[Panel], title: str) -> str:
    """The panels side by side under `title`, as an SVG document."""
    width = PANEL_W * len(panels)
    height = PANEL_H + LEGEND_ROW * max((len(p.series) for p in panels), default=0)
    body = [f'<text x="{width / 2}" y="24" text-anchor="middle" font-size="15">{escape(title)}</text>']
    for i, p in enumerate(panels):
        body += _panel(p, i * PANEL_W)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'font-family="sans-serif" font-size="12">\n<rect width="100%" height="100%" fill="white"/>\n'
            + "\n".join(body) + "\n</svg>\n")
