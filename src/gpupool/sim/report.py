"""Replay reports: rich tables for the terminal, JSON, and a self-contained HTML page.

The HTML page embeds its plots as base64 PNGs drawn with matplotlib's Agg backend, so it opens
anywhere with no network. :func:`write_plots` writes the same plots as PNG files (the docs use
them). Metric words are defined in :mod:`gpupool.sim.metrics`.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from gpupool.domain.units import MILLI_PER_GPU, format_duration
from gpupool.sim.metrics import Distribution, Summary
from gpupool.sim.replay import ReplayResult

MAX_SERIES_POINTS = 2000


def _secs(value: float | None) -> str:
    return "-" if value is None else format_duration(value)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def comparison_table(summaries: Sequence[Summary]) -> Table:
    """One column per scenario, one row per headline metric."""
    table = Table(title="Replay: " + (summaries[0].workload if summaries else ""))
    table.add_column("metric")
    for s in summaries:
        table.add_column(s.scenario, justify="right")

    def row(name: str, cells: Sequence[str]) -> None:
        table.add_row(name, *cells)

    def dist(name: str, pick: str, attr: str) -> None:
        row(name, [_secs(getattr(getattr(s, pick), attr)) for s in summaries])

    row("jobs (completed)", [f"{s.jobs} ({s.outcomes.get('completed', 0)})" for s in summaries])
    row(
        "rejected / unfinished",
        [f"{s.outcomes.get('rejected', 0)} / {s.outcomes.get('unfinished', 0)}" for s in summaries],
    )
    row("GPU allocation", [_pct(s.allocation) for s in summaries])
    row("GPU allocation while arriving", [_pct(s.allocation_while_arriving) for s in summaries])
    row("busy GPUs", [_pct(s.busy_gpus) for s in summaries])
    dist("queueing delay p50", "queueing_delay", "p50")
    dist("queueing delay p95", "queueing_delay", "p95")
    dist("queueing delay p99", "queueing_delay", "p99")
    dist("JCT mean", "jct", "mean")
    dist("JCT p50", "jct", "p50")
    dist("JCT p99", "jct", "p99")
    row("makespan", [_secs(s.makespan_s) for s in summaries])
    row("preemptions", [str(s.preemptions) for s in summaries])
    row("lost GPU-hours", [f"{s.lost_gpu_hours:.1f}" for s in summaries])
    row("used GPU-hours", [f"{s.used_gpu_hours:.1f}" for s in summaries])
    row(
        "fairness (Jain)",
        ["-" if s.fairness is None else f"{s.fairness:.3f}" for s in summaries],
    )
    row("fragmentation", [_pct(s.fragmentation) for s in summaries])
    row("stranded GPUs (mean)", [f"{s.stranded_gpus:.1f}" for s in summaries])
    row("scheduling cycles", [str(s.cycles) for s in summaries])
    return table


def tenant_table(summaries: Sequence[Summary]) -> Table:
    """Queueing delay p50/p95/p99 and normalised share per tenant and scenario."""
    table = Table(title="Per tenant: queueing delay p50 / p95 / p99, normalised share")
    table.add_column("tenant")
    for s in summaries:
        table.add_column(s.scenario, justify="right")
    names = [t.name for t in summaries[0].tenants] if summaries else []
    for name in names:
        cells = []
        for s in summaries:
            t = next(t for t in s.tenants if t.name == name)
            q: Distribution = t.queueing_delay
            share = "-" if t.normalised_share is None else f"{t.normalised_share:.2f}"
            cells.append(f"{_secs(q.p50)} / {_secs(q.p95)} / {_secs(q.p99)}  x{share}")
        table.add_row(name, *cells)
    return table


def report_dict(
    summaries: Sequence[Summary], results: Sequence[ReplayResult], extra: dict[str, Any]
) -> dict[str, Any]:
    """The JSON report: summaries, thinned time series, and ``extra`` (timings, options)."""
    series = {}
    for r in results:
        thin = r.series.thinned(MAX_SERIES_POINTS)
        series[r.scenario] = {
            "time_s": list(thin.time),
            "allocated_gpus": [v / MILLI_PER_GPU for v in thin.allocated_milli],
            "busy_gpus": list(thin.busy_gpus),
            "pending_jobs": list(thin.pending_jobs),
            "running_jobs": list(thin.running_jobs),
            "stranded_gpus": [v / MILLI_PER_GPU for v in thin.stranded_milli],
        }
    return {
        **extra,
        "scenarios": [s.to_dict() for s in summaries],
        "series": series,
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------- plots


def _busy_horizon(results: Sequence[ReplayResult]) -> float:
    """Where the time plots stop: a little after the last arrival or the last waiting job,
    so that a few long jobs running on alone do not squeeze the interesting part."""
    end = 0.0
    for r in results:
        last_submit = max((j.submit_time for j in r.jobs), default=0.0)
        waiting = [t for t, p in zip(r.series.time, r.series.pending_jobs, strict=True) if p]
        end = max(end, last_submit, waiting[-1] if waiting else 0.0)
    full = max((r.series.time[-1] for r in results if r.series.time), default=0.0)
    return min(full, end * 1.2) if end > 0 else full


def _figures(results: Sequence[ReplayResult]) -> dict[str, bytes]:
    """Named PNG plots of the results."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    span = _busy_horizon(results)
    unit, scale = ("days", 86400.0) if span > 3 * 86400 else ("hours", 3600.0)
    pngs: dict[str, bytes] = {}

    def save(name: str, fig: Any) -> None:
        buf = io.BytesIO()
        fig.tight_layout()
        fig.savefig(buf, format="png", dpi=90)
        plt.close(fig)
        pngs[name] = buf.getvalue()

    fig, axes = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for r in results:
        s = r.series.thinned(MAX_SERIES_POINTS)
        t = np.asarray(s.time) / scale
        axes[0].step(
            t,
            np.asarray(s.allocated_milli) / r.capacity_milli,
            where="post",
            label=f"{r.scenario} allocated",
            lw=1,
        )
        axes[0].step(
            t,
            np.asarray(s.busy_gpus) / r.gpu_count,
            where="post",
            label=f"{r.scenario} busy GPUs",
            lw=1,
            ls="--",
        )
        axes[1].step(t, s.pending_jobs, where="post", label=r.scenario, lw=1)
    axes[1].set_xlim(0, span / scale)
    axes[0].set_ylabel("share of the cluster")
    axes[0].set_ylim(0, 1.05)
    axes[0].legend(fontsize=7, loc="lower right")
    axes[1].set_ylabel("pending jobs")
    axes[1].set_xlabel(f"time ({unit})")
    axes[1].legend(fontsize=7)
    save("allocation", fig)

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for r in results:
        delays = np.sort([d for j in r.jobs if (d := j.queueing_delay_s) is not None])
        jcts = np.sort([c for j in r.jobs if (c := j.completion_time_s) is not None])
        for ax, data in ((axes[0], delays), (axes[1], jcts)):
            if data.size:
                y = np.arange(1, data.size + 1) / data.size
                ax.step(np.maximum(data, 1.0), y, where="post", label=r.scenario, lw=1)
    axes[0].set_xlabel("queueing delay (s, log)")
    axes[1].set_xlabel("job completion time (s, log)")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_ylabel("share of jobs")
        ax.legend(fontsize=7)
    save("cdf", fig)

    tenants = list(results[0].tenants) if results else []
    if tenants:
        fig, ax = plt.subplots(figsize=(9, 3.5))
        width = 0.8 / max(1, len(results))
        for k, r in enumerate(results):
            p95 = []
            for tenant in tenants:
                waits = [
                    q
                    for j in r.jobs
                    if j.tenant == tenant and (q := j.queueing_delay_s) is not None
                ]
                p95.append(float(np.percentile(waits, 95)) / 3600.0 if waits else 0.0)
            ax.bar(np.arange(len(tenants)) + k * width, p95, width, label=r.scenario)
        ax.set_xticks(np.arange(len(tenants)) + width * (len(results) - 1) / 2)
        ax.set_xticklabels(tenants, rotation=45, ha="right", fontsize=7)
        ax.set_ylabel("queueing delay p95 (hours)")
        ax.legend(fontsize=7)
        save("tenants", fig)
    return pngs


def write_plots(
    folder: Path, results: Sequence[ReplayResult], prefix: str = "replay"
) -> list[Path]:
    """Write the plots as ``<prefix>-<name>.png`` in ``folder``; returns the paths."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, png in _figures(results).items():
        path = folder / f"{prefix}-{name}.png"
        path.write_bytes(png)
        paths.append(path)
    return paths


def write_html(
    path: Path,
    summaries: Sequence[Summary],
    results: Sequence[ReplayResult],
    extra: dict[str, Any],
) -> None:
    """A self-contained page: the comparison table, per-tenant table and the plots."""
    from rich.console import Console

    console = Console(record=True, width=140, file=io.StringIO())
    console.print(comparison_table(summaries))
    console.print(tenant_table(summaries))
    tables = console.export_text()
    images = "".join(
        f'<h2>{html.escape(name)}</h2><img alt="{html.escape(name)}" '
        f'src="data:image/png;base64,{base64.b64encode(png).decode()}">'
        for name, png in _figures(results).items()
    )
    meta = "".join(
        f"<li><b>{html.escape(str(k))}</b>: {html.escape(str(v))}</li>" for k, v in extra.items()
    )
    title = html.escape(summaries[0].workload if summaries else "replay")
    page = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>gpupool replay: {title}</title>"
        "<style>body{font-family:sans-serif;max-width:1000px;margin:2em auto}"
        "pre{font-size:12px;background:#f6f6f6;padding:1em;overflow-x:auto}"
        "img{max-width:100%}</style></head><body>"
        f"<h1>gpupool replay: {title}</h1><ul>{meta}</ul>"
        f"<pre>{html.escape(tables)}</pre>{images}</body></html>"
    )
    path.write_text(page, encoding="utf-8")
