"""``gpupool report``: usage and cost per tenant, user, pool or GPU model over a time window.

Per group: jobs, allocated GPU-hours (milli-GPU-seconds / 1000 / 3600), used GPU-hours (busy
time from telemetry), idle GPU-hours (allocated minus used), utilisation, GPU memory
GiB-hours and cost (the pool's price per GPU model per hour). Formats: ``table`` (default),
``csv``, ``json`` and ``html`` (a self-contained page with charts, see
:mod:`gpupool.cli.report_html`; its time chart asks the server for ``--buckets`` sub-windows).
"""

from __future__ import annotations

import csv
import enum
import io
import sys
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer

from gpupool.cli import render
from gpupool.cli.report_html import render_html, used_hours
from gpupool.cli.session import ServerOpt, TokenOpt, emit, fail, handle_errors, print_json, session
from gpupool.domain.clock import SystemClock
from gpupool.domain.units import parse_duration
from gpupool.schemas.nodes import UsageReport

GROUPS = ("tenant", "user", "pool", "gpu_model")
ALIASES = {"gpu-type": "gpu_model", "gpu_type": "gpu_model", "gpu-model": "gpu_model"}


class Format(str, enum.Enum):
    table = "table"
    csv = "csv"
    json = "json"
    html = "html"


def parse_time(text: str, now: float) -> float:
    """``2026-11-01``, ``2026-11-01T08:00`` (local time), or a duration ago: ``7d``, ``12h``."""
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        pass
    try:
        return now - parse_duration(text, field="time")
    except ValueError:
        raise fail(
            f"{text!r} is not a time: use a date like 2026-11-01, 2026-11-01T08:00, or an "
            "age like 7d or 12h"
        ) from None


def to_csv(report: UsageReport) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(
        [
            *report.group_by,
            "jobs",
            "gpu_hours",
            "used_gpu_hours",
            "idle_gpu_hours",
            "utilization_ratio",
            "idle_ratio",
            "gpu_memory_gib_hours",
            "cost",
        ]
    )
    for x in report.lines:
        used = used_hours(x)
        w.writerow(
            [
                *(x.key.get(g, "") for g in report.group_by),
                x.jobs,
                f"{x.gpu_hours:.6f}",
                f"{used:.6f}",
                f"{max(0.0, x.gpu_hours - used):.6f}",
                f"{x.utilization_ratio:.4f}",
                f"{x.idle_ratio:.4f}",
                f"{x.mib_seconds / 1024 / 3600:.6f}",
                f"{x.cost:.4f}",
            ]
        )
    return out.getvalue()


def report(  # noqa: PLR0917 - typer options
    by: Annotated[
        list[str] | None,
        typer.Option("--by", "-b", help="group by tenant, user, pool, gpu_model (repeat)"),
    ] = None,
    since: Annotated[
        str, typer.Option("--since", "-S", help="window start: 2026-11-01 or an age like 7d")
    ] = "30d",
    until: Annotated[
        str | None, typer.Option("--until", "-E", help="window end (default: now)")
    ] = None,
    account: Annotated[str | None, typer.Option("-A", "--account", help="only this tenant")] = None,
    fmt: Annotated[Format, typer.Option("--format", "-F", help="output format")] = Format.table,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="write to this file instead of stdout")
    ] = None,
    buckets: Annotated[
        int, typer.Option("--buckets", help="time-chart columns in the HTML page (0: none)")
    ] = 12,
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """Usage and cost: allocated vs used vs idle GPU time per group over a time window.

    Examples:

      gpupool report

      gpupool report --by tenant --by gpu_model --since 7d

      gpupool report --by user -A vision --format csv -o vision.csv

      gpupool report --format html -o usage.html     # a standalone page with charts
    """
    groups = [ALIASES.get(b, b) for b in (by or ["tenant"])]
    bad = [b for b in groups if b not in GROUPS]
    if bad:
        raise fail(f"--by {bad[0]!r} is not a grouping: use {', '.join(GROUPS)}")
    if not 0 <= buckets <= 100:
        raise fail("--buckets must be between 0 and 100")
    with handle_errors():
        now = SystemClock().now()
        start = parse_time(since, now)
        end = parse_time(until, now) if until else now
    if end <= start:
        raise fail("the window is empty: --since must be before --until")
    with session(server, token) as gp:
        usage = gp.usage(start=start, end=end, group_by=groups, tenant=account)
        if fmt is Format.table:
            emit(render.usage_table(usage))
            return
        if fmt is Format.json:
            if output is None:
                print_json(usage)
                return
            text = usage.model_dump_json(indent=2) + "\n"
        elif fmt is Format.csv:
            text = to_csv(usage)
        else:
            step = (end - start) / buckets if buckets else 0.0
            parts = [
                gp.usage(
                    start=start + i * step,
                    end=start + (i + 1) * step,
                    group_by=groups,
                    tenant=account,
                )
                for i in range(buckets)
            ]
            text = render_html(usage, parts, server=gp.server)
    if output is None:
        sys.stdout.write(text)
    else:
        try:
            output.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise fail(f"cannot write {output}: {exc.strerror}") from None
        typer.echo(f"wrote {output}", err=True)


def install(app: typer.Typer) -> None:
    app.command(name="report")(report)
