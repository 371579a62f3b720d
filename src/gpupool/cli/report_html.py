"""The ``gpupool report --format html`` page: one self-contained file, charts as inline SVG.

No script, no font, no stylesheet and no image is fetched from anywhere: the page opens from a
file on a machine with no network. Charts (each an ``<svg class="chart">`` whose bars are
``<rect class="bar">``):

1. **GPU-hours by group**: one bar per group, split into *used* (busy GPU time from telemetry)
   and *idle* (allocated but not busy), so allocated = used + idle;
2. **cost by group**;
3. **GPU-hours over time**: allocated GPU-hours per time bucket, stacked by group.

Words: a **group** is one line of the usage report (a tenant, user, pool or GPU model, or a
combination); a **bucket** is one of the equal sub-windows of the report's time range.
"""

from __future__ import annotations

import html
import time
from collections.abc import Sequence

from gpupool.schemas.nodes import UsageLineView, UsageReport

USED = "#2f6fb0"
IDLE = "#f0a030"
COST = "#3a9a5b"
PALETTE = ("#2f6fb0", "#f0a030", "#3a9a5b", "#c0392b", "#8e44ad", "#16a085", "#7f8c8d", "#d35400")

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2rem; color: #1d1d1f; background: #fff; }
h1 { font-size: 1.4rem; } h2 { font-size: 1.1rem; margin-top: 2rem; }
table { border-collapse: collapse; margin-top: 1rem; }
th, td { padding: 0.25rem 0.75rem; border-bottom: 1px solid #ddd; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.legend span { display: inline-block; margin-right: 1rem; }
.swatch { display: inline-block; width: 0.8rem; height: 0.8rem; margin-right: 0.3rem; }
svg text { font-size: 12px; fill: #1d1d1f; }
"""


def label(line: UsageLineView, group_by: Sequence[str]) -> str:
    return " / ".join(line.key.get(g, "-") for g in group_by) or "all"


def used_hours(line: UsageLineView) -> float:
    return line.busy_milli_seconds / 1000 / 3600


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def _bars(
    title: str,
    rows: Sequence[tuple[str, Sequence[tuple[float, str, str]]]],
    unit: str,
) -> str:
    """A horizontal bar chart; each row is (label, [(value, colour, what)...]) stacked."""
    width, left, bar_h, gap = 720, 200, 22, 8
    height = max(1, len(rows)) * (bar_h + gap) + 30
    top = max((sum(v for v, _, _ in parts) for _, parts in rows), default=0.0) or 1.0
    scale = (width - left - 80) / top
    out = [
        f'<svg class="chart" role="img" aria-label="{html.escape(title)}" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">'
    ]
    for i, (name, parts) in enumerate(rows):
        y = 10 + i * (bar_h + gap)
        out.append(
            f'<text x="{left - 8}" y="{y + bar_h * 0.7:.1f}" text-anchor="end">'
            f"{html.escape(name[:30])}</text>"
        )
        x = float(left)
        for value, colour, what in parts:
            w = max(0.0, value * scale)
            out.append(
                f'<rect class="bar" x="{x:.1f}" y="{y}" width="{max(w, 1.0):.1f}" '
                f'height="{bar_h}" fill="{colour}"><title>{html.escape(name)}: {what} '
                f"{value:.3f} {unit}</title></rect>"
            )
            x += w
        total = sum(v for v, _, _ in parts)
        out.append(f'<text x="{x + 6:.1f}" y="{y + bar_h * 0.7:.1f}">{total:.2f} {unit}</text>')
    out.append("</svg>")
    return "".join(out)


def _timeline(
    buckets: Sequence[UsageReport], group_by: Sequence[str], colours: dict[str, str]
) -> str:
    width, height, left, bottom = 720, 260, 60, 40
    n = max(1, len(buckets))
    col_w = (width - left - 20) / n
    totals = [sum(x.gpu_hours for x in b.lines) for b in buckets]
    top = max(totals, default=0.0) or 1.0
    scale = (height - bottom - 20) / top
    out = [
        f'<svg class="chart" role="img" aria-label="GPU-hours over time" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">',
        f'<line x1="{left}" y1="{height - bottom}" x2="{width - 10}" y2="{height - bottom}" '
        'stroke="#999"/>',
        f'<text x="{left - 6}" y="20" text-anchor="end">{top:.2f}</text>',
        f'<text x="{left - 6}" y="{height - bottom}" text-anchor="end">0</text>',
    ]
    for i, b in enumerate(buckets):
        x = left + i * col_w + 2
        y = float(height - bottom)
        for line in sorted(b.lines, key=lambda x: label(x, group_by)):
            h = line.gpu_hours * scale
            name = label(line, group_by)
            out.append(
                f'<rect class="bar" x="{x:.1f}" y="{y - max(h, 1.0):.1f}" '
                f'width="{max(col_w - 4, 1):.1f}" height="{max(h, 1.0):.1f}" '
                f'fill="{colours.get(name, PALETTE[-1])}"><title>{html.escape(name)} '
                f"{_when(b.start)}: {line.gpu_hours:.3f} GPU-h</title></rect>"
            )
            y -= h
        if i % max(1, n // 6) == 0:
            out.append(
                f'<text x="{x:.1f}" y="{height - bottom + 16}">'
                f"{time.strftime('%m-%d %H:%M', time.localtime(b.start))}</text>"
            )
    out.append("</svg>")
    return "".join(out)


def render_html(
    report: UsageReport, buckets: Sequence[UsageReport] = (), *, server: str = ""
) -> str:
    """The whole page as one string (see the module docstring)."""
    g = report.group_by
    lines = sorted(report.lines, key=lambda x: -x.gpu_hours)
    names = [label(x, g) for x in lines]
    colours = {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)}
    for b in buckets:
        for x in b.lines:
            colours.setdefault(label(x, g), PALETTE[len(colours) % len(PALETTE)])
    hours = _bars(
        "GPU-hours by group: used and idle",
        [
            (
                label(x, g),
                (
                    (used_hours(x), USED, "used"),
                    (max(0.0, x.gpu_hours - used_hours(x)), IDLE, "idle"),
                ),
            )
            for x in lines
        ],
        "GPU-h",
    )
    cost = _bars("Cost by group", [(label(x, g), ((x.cost, COST, "cost"),)) for x in lines], "")
    rows = "".join(
        f"<tr><td>{html.escape(label(x, g))}</td><td>{x.jobs}</td><td>{x.gpu_hours:.3f}</td>"
        f"<td>{used_hours(x):.3f}</td><td>{max(0.0, x.gpu_hours - used_hours(x)):.3f}</td>"
        f"<td>{x.utilization_ratio * 100:.0f}%</td><td>{x.cost:.2f}</td></tr>"
        for x in lines
    )
    legend = "".join(
        f'<span><i class="swatch" style="background:{c}"></i>{html.escape(n)}</span>'
        for n, c in colours.items()
    )
    timeline = (
        f"<h2>GPU-hours over time</h2><p class='legend'>{legend}</p>"
        f"{_timeline(buckets, g, colours)}"
        if buckets
        else ""
    )
    by = ", ".join(g)
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>gpupool usage by {html.escape(by)}</title><style>{_CSS}</style></head><body>"
        f"<h1>gpupool usage by {html.escape(by)}</h1>"
        f"<p>{_when(report.start)} to {_when(report.end)}"
        f"{' from ' + html.escape(server) if server else ''}. Allocated GPU time = used "
        "(busy, from telemetry) + idle.</p>"
        "<h2>Allocated vs used vs idle</h2>"
        f"<p class='legend'><span><i class='swatch' style='background:{USED}'></i>used</span>"
        f"<span><i class='swatch' style='background:{IDLE}'></i>idle</span></p>{hours}"
        f"<h2>Cost</h2>{cost}{timeline}"
        "<h2>Table</h2><table><thead><tr><th>group</th><th>jobs</th><th>GPU-h</th>"
        "<th>used GPU-h</th><th>idle GPU-h</th><th>util</th><th>cost</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></body></html>\n"
    )
