"""Tables for people, built with rich from the API's wire models.

Every function here is pure: views (and ``now``, epoch seconds) in, a rich renderable out, so
the layouts are pinned by golden files (``tests/cli/golden/``). Missing values show as ``-``.
Times are local time, ``YYYY-MM-DDTHH:MM:SS`` as ``sacct`` prints them; durations as Slurm's
``[D-]HH:MM:SS``; GPU shares as ``0.5`` (of one device) and memory as ``10GiB``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from gpupool.cli.fit import Cut, Drop, FitTable, Move
from gpupool.cli.jobtable import (
    DASH,
    EVENT_COLUMNS,
    EVENT_RIGHT,
    FACTOR_COLUMNS,
    FACTOR_RIGHT,
    QUEUE_MOVES,
    ago,
    detail_rows,
    elapsed,
    event_rows,
    exit_code,
    factor_rows,
    gpu_slice,
    queue_table,
    reason,
    when,
)
from gpupool.client.telemetry import DeviceSample
from gpupool.domain.units import MILLI_PER_GPU, format_cpus, format_gpus, format_memory
from gpupool.schemas.admin import (
    AuditView,
    PoolView,
    PriorityClassView,
    TenantView,
    TokenView,
    UserView,
)
from gpupool.schemas.jobs import JobEventView, JobView
from gpupool.schemas.nodes import DeviceView, NodeView, UsageReport


def table(*columns: str, title: str | None = None, right: Iterable[str] = ()) -> Table:
    """A borderless table like squeue's: bold header, columns separated by two spaces."""
    t = Table(
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        title=title,
        title_justify="left",
        header_style="bold",
    )
    right_set = set(right)
    for name in columns:
        t.add_column(name, justify="right" if name in right_set else "left", no_wrap=True)
    return t


def pct(ratio: float | None) -> str:
    return DASH if ratio is None else f"{ratio * 100:.0f}%"


def mem(mib: int | None) -> str:
    return DASH if mib is None else format_memory(mib)


def history_table(jobs: Sequence[JobView], now: float) -> Table:
    """``gpupool history``: like ``sacct``."""
    t = table(
        "JOBID",
        "NAME",
        "USER",
        "TENANT",
        "POOL",
        "STATE",
        "EXITCODE",
        "SUBMIT",
        "START",
        "END",
        "ELAPSED",
        "GPU SLICE",
        "RESTARTS",
        right=("ELAPSED", "RESTARTS"),
    )
    for j in jobs:
        t.add_row(
            j.id,
            j.name[:24],
            j.user,
            j.tenant,
            j.pool,
            j.state,
            exit_code(j),
            when(j.submit_time),
            when(j.start_time),
            when(j.end_time),
            elapsed(j, now),
            gpu_slice(j),
            str(j.restart_count),
        )
    return t


def audit_table(rows: Sequence[AuditView]) -> Table:
    """``gpupool audit``: the audit log, newest first."""
    columns = ("TIME", "USER", "ROLE", "ACTION", "TARGET", "CALL", "STATUS", "FROM")
    t = table(*columns, right=("STATUS",))
    for r in rows:
        call = f"{r.method} {r.path}" if r.method else DASH
        t.add_row(
            when(r.time),
            r.actor,
            r.role,
            r.action,
            r.target or DASH,
            call,
            str(r.status),
            r.remote or DASH,
        )
    return t


def job_detail(job: JobView, events: Sequence[JobEventView], now: float) -> RenderableType:
    """``gpupool show``: the job's fields, why it waits, its priority factors and events
    (the cells from :mod:`gpupool.cli.jobtable`, which prints the same without rich)."""
    kv = Table(box=None, show_header=False, pad_edge=False)
    kv.add_column(style="bold", no_wrap=True)
    kv.add_column()
    for key, value in detail_rows(job, now):
        kv.add_row(key, value)
    parts: list[RenderableType] = [kv]
    factors = factor_rows(job)
    if factors:
        f = table(*FACTOR_COLUMNS, title="Priority factors", right=FACTOR_RIGHT)
        for row in factors[:-1]:
            f.add_row(*row)
        f.add_row(Text("total", style="bold"), *factors[-1][1:])
        parts += [Text(""), f]
    if events:
        e = table(*EVENT_COLUMNS, title="Events", right=EVENT_RIGHT)
        for cells in event_rows(events):
            e.add_row(*cells)
        parts += [Text(""), e]
    return Group(*parts)


def nodes_table(nodes: Sequence[NodeView], now: float) -> Table:
    t = table(
        "NODE",
        "STATE",
        "GPUS",
        "MODELS",
        "CPUS",
        "MEMORY",
        "ISOLATION",
        "FEATURES",
        "HEARTBEAT",
        right=("GPUS",),
    )
    for n in nodes:
        models = sorted({d.model for d in n.devices})
        t.add_row(
            n.name,
            n.state,
            str(len(n.devices)),
            ", ".join(models) or DASH,
            format_cpus(n.cpu_milli),
            format_memory(n.memory_mib),
            ",".join(n.isolation_modes),
            ",".join(n.features) or DASH,  # for --constraint (gpupool agent --feature)
            ago(n.last_heartbeat, now),
        )
    return t


#: How ``gpupool gpus`` fits a narrow terminal: node and index are never cut, the UUID goes
#: first (``--json`` and a pipe keep it).
GPUS_MOVES: tuple[Move, ...] = (
    Drop("UUID"),
    Drop("POWER"),
    Drop("POOL"),
    Drop("ALLOC MEM"),
    Cut("MODEL", 8),
    Drop("MEM USED"),
    Cut("HEALTH", 7),
)

#: Utilisation (or memory in use) at or above which a value shows yellow, then red.
LOAD_WARN, LOAD_HIGH = 0.5, 0.8
#: Temperatures (Celsius) at or above which a value shows yellow, then red.
TEMP_WARN_C, TEMP_HIGH_C = 75.0, 85.0


def load_style(ratio: float | None) -> str:
    """Green, yellow or red for a load in [0, 1], like nvitop; no style when unknown."""
    if ratio is None:
        return ""
    return "red" if ratio >= LOAD_HIGH else "yellow" if ratio >= LOAD_WARN else "green"


def temp_text(celsius: float | None) -> Text:
    """``61C``, coloured by how hot it is; ``-`` when unknown."""
    if celsius is None:
        return Text(DASH)
    style = "red" if celsius >= TEMP_HIGH_C else "yellow" if celsius >= TEMP_WARN_C else "green"
    return Text(f"{celsius:.0f}C", style=style)


def _ratio(part: int | None, whole: int) -> float | None:
    return None if part is None or whole <= 0 else part / whole


def health_text(health: str) -> Text:
    return Text(health, style="" if health == "healthy" else "bold red")


def gpus_table(devices: Sequence[DeviceView], samples: dict[str, DeviceSample]) -> FitTable:
    """``gpupool gpus``: inventory joined with the latest telemetry and allocations."""
    t = FitTable(
        (
            "NODE",
            "IDX",
            "MODEL",
            "POOL",
            "HEALTH",
            "ALLOC",
            "ALLOC MEM",
            "MEMORY",
            "UTIL",
            "MEM USED",
            "TEMP",
            "POWER",
            "UUID",
        ),
        right=("IDX", "ALLOC", "ALLOC MEM", "MEMORY", "UTIL", "MEM USED", "TEMP", "POWER"),
        moves=GPUS_MOVES,
    )
    for d in sorted(devices, key=lambda x: (x.node, x.index)):
        s = samples.get(d.uuid)
        util = s.utilization_ratio if s else None
        used = s.memory_used_mib if s else None
        t.add_row(
            d.node,
            str(d.index),
            d.model,
            d.pool,
            health_text(d.health),
            format_gpus(s.allocated_milli) if s else DASH,
            format_memory(s.allocated_memory_mib) if s else DASH,
            format_memory(d.memory_mib),
            Text(pct(util), style=load_style(util)),
            Text(
                mem(used), style=load_style(used / d.memory_mib if used and d.memory_mib else None)
            ),
            temp_text(s.temperature_c if s else None),
            f"{s.power_w:.0f}W" if s and s.power_w is not None else DASH,
            d.uuid,
        )
    return t


def usage_table(report: UsageReport, currency: str = "") -> Table:
    """``gpupool report``: allocated vs used vs idle GPU time and cost per group."""
    cols = [g.upper().replace("_", " ") for g in report.group_by]
    t = table(
        *cols,
        "JOBS",
        "GPU-HOURS",
        "USED GPU-H",
        "IDLE GPU-H",
        "UTIL",
        "IDLE",
        "GPU MEM GiB-H",
        "COST",
        title=f"Usage {when(report.start)} .. {when(report.end)}",
        right=(
            "JOBS",
            "GPU-HOURS",
            "USED GPU-H",
            "IDLE GPU-H",
            "UTIL",
            "IDLE",
            "GPU MEM GiB-H",
            "COST",
        ),
    )
    total = [0, 0.0, 0.0, 0.0, 0.0, 0.0]
    for line in report.lines:
        used_h = line.busy_milli_seconds / 1000 / 3600
        idle_h = max(0.0, line.gpu_hours - used_h)
        mem_h = line.mib_seconds / 1024 / 3600
        t.add_row(
            *(line.key.get(g, DASH) for g in report.group_by),
            str(line.jobs),
            f"{line.gpu_hours:.3f}",
            f"{used_h:.3f}",
            f"{idle_h:.3f}",
            pct(line.utilization_ratio),
            pct(line.idle_ratio),
            f"{mem_h:.2f}",
            f"{currency}{line.cost:.2f}",
        )
        for i, v in enumerate((line.jobs, line.gpu_hours, used_h, idle_h, mem_h, line.cost)):
            total[i] += v
    if len(report.lines) > 1:
        util = total[2] / total[1] if total[1] else None
        t.add_row(
            Text("total", style="bold"),
            *([""] * (len(cols) - 1)),
            str(int(total[0])),
            f"{total[1]:.3f}",
            f"{total[2]:.3f}",
            f"{total[3]:.3f}",
            pct(util),
            pct(1 - util if util is not None else None),
            f"{total[4]:.2f}",
            f"{currency}{total[5]:.2f}",
        )
    return t


def pools_table(pools: Sequence[PoolView]) -> Table:
    t = table("POOL", "PLACEMENT", "MEM OVERCOMMIT", "PRICE/GPU-H", "PRICES BY MODEL")
    for p in pools:
        prices = ", ".join(f"{k}={v:g}" for k, v in sorted(p.price_per_gpu_hour.items()))
        t.add_row(
            p.name,
            p.placement,
            f"{p.memory_overcommit:g}",
            f"{p.default_price_per_gpu_hour:g}",
            prices or DASH,
        )
    return t


def _limit(milli: int | None) -> str:
    return "none" if milli is None else format_gpus(milli)


def _standing(ten: TenantView) -> tuple[str, str]:
    """Decayed usage in GPU-hours and the fairshare factor (like sshare's RawUsage, FairShare)."""
    usage = ten.decayed_usage_milli_s
    factor = ten.fair_share_factor
    return (
        DASH if usage is None else f"{usage / MILLI_PER_GPU / 3600:.1f}",
        DASH if factor is None else f"{factor:.3f}",
    )


def tenants_table(tenants: Sequence[TenantView]) -> Table:
    t = table(
        "TENANT",
        "DISPLAY NAME",
        "FAIR SHARE",
        "USAGE GPU-H",
        "FS FACTOR",
        "POOL",
        "GUARANTEED",
        "LIMIT",
        "MEM LIMIT",
        right=("USAGE GPU-H", "FS FACTOR"),
    )
    for ten in tenants:
        usage, factor = _standing(ten)
        if not ten.quotas:
            t.add_row(
                ten.name,
                ten.display_name or DASH,
                f"{ten.fair_share:g}",
                usage,
                factor,
                DASH,
                DASH,
                DASH,
                DASH,
            )
        for i, q in enumerate(ten.quotas):
            t.add_row(
                ten.name if i == 0 else "",
                (ten.display_name or DASH) if i == 0 else "",
                f"{ten.fair_share:g}" if i == 0 else "",
                usage if i == 0 else "",
                factor if i == 0 else "",
                q.pool,
                format_gpus(q.guaranteed_milli),
                _limit(q.limit_milli),
                "none" if q.limit_memory_mib is None else format_memory(q.limit_memory_mib),
            )
    return t


def priority_classes_table(classes: Sequence[PriorityClassView]) -> Table:
    t = table("CLASS", "VALUE", right=("VALUE",))
    for pc in sorted(classes, key=lambda c: c.value):
        t.add_row(pc.name, str(pc.value))
    return t


def users_table(users: Sequence[UserView]) -> Table:
    t = table("USER", "ROLE", "TENANT")
    for u in users:
        t.add_row(u.name, u.role, u.tenant or DASH)
    return t


def tokens_table(tokens: Sequence[TokenView], now: float) -> Table:
    t = table("ID", "USER", "NAME", "CREATED", "EXPIRES", "STATUS")
    for tok in tokens:
        if tok.revoked_at is not None:
            status = "revoked"
        elif tok.expires_at is not None and tok.expires_at <= now:
            status = "expired"
        else:
            status = "active"
        t.add_row(
            tok.id, tok.user, tok.name or DASH, when(tok.created_at), when(tok.expires_at), status
        )
    return t


__all__ = [
    "DASH",
    "QUEUE_MOVES",
    "ago",
    "elapsed",
    "exit_code",
    "gpu_slice",
    "job_detail",
    "queue_table",
    "reason",
    "table",
    "when",
]
