"""``gpupool top``: a live, pool-wide view like nvitop, for the whole cluster.

One **frame** shows the pool totals (devices, compute allocated, GPU memory promised over
physical as ``mem_share_ratio``, mean utilisation, jobs running and queued per pool), then one
row per device (utilisation bar, memory used and allocated, temperature, power, and the
**slices** on it: ``job id share``), then the running jobs, then the queue (pending jobs, best
first, with why each waits). Load (utilisation, memory in use) and temperature are coloured
green, yellow, red (:func:`gpupool.cli.render.load_style`, :func:`~gpupool.cli.render.temp_text`).
Every table fits the terminal's width (:mod:`gpupool.cli.fit`): from 80 columns up, job ids,
states, times and slices stay whole.

It refreshes every ``--interval`` seconds. Keys: ``q`` quits, ``s`` changes the sort order (see
:data:`SORTS`). The keyboard is read from the terminal in cbreak mode, so it works over SSH;
with no terminal (a pipe) or with ``--once`` one frame is printed and the command ends. When
the server cannot be reached or fails (a restart, an outage), the last frame stays on screen
under a ``disconnected, retrying`` line, and the view comes back by itself when the server
answers again; only an error that retrying cannot fix (a revoked token) ends the command.

Which job holds which slice comes from the server (``DeviceView.slices``); a slice of another
tenant's job, which the caller may not see, shows as ``(other) share``.
"""

from __future__ import annotations

import contextlib
import select
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Annotated

import typer
from rich.console import Group, RenderableType
from rich.live import Live
from rich.text import Text

from gpupool.cli import render
from gpupool.cli.fit import Cut, Drop, FitTable, Move
from gpupool.cli.session import ServerOpt, TokenOpt, console, emit, session
from gpupool.client.errors import ApiError, ClientError, ServerUnreachable
from gpupool.client.sdk import Client
from gpupool.client.telemetry import ClusterTelemetry, DeviceSample
from gpupool.domain.clock import SystemClock
from gpupool.domain.units import format_duration, format_gpus, format_memory
from gpupool.schemas.jobs import JobView
from gpupool.schemas.nodes import DeviceView


@dataclass(frozen=True)
class Frame:
    """Everything one frame shows, read in one go."""

    devices: list[DeviceView]
    telemetry: ClusterTelemetry
    running: list[JobView]
    now: float
    pending: list[JobView] = field(default_factory=list)


#: Most pending jobs a frame lists (the queue's head; the header counts them all).
QUEUE_ROWS = 20


def _util(d: DeviceView, s: DeviceSample | None) -> float:
    return s.utilization_ratio or 0.0 if s else 0.0


#: Sort orders ``s`` cycles through: name -> key of (device, its sample).
SORTS: dict[str, Callable[[DeviceView, DeviceSample | None], tuple[object, ...]]] = {
    "node": lambda d, s: (d.node, d.index),
    "util": lambda d, s: (-_util(d, s), d.node, d.index),
    "memory": lambda d, s: (-(s.memory_used_mib or 0) if s else 0, d.node, d.index),
    "alloc": lambda d, s: (-(s.allocated_milli if s else 0), d.node, d.index),
    "temp": lambda d, s: (-(s.temperature_c or 0.0) if s else 0.0, d.node, d.index),
}


def bar(ratio: float | None, width: int = 10) -> str:
    """``[|||||     ]`` for a ratio in [0, 1]; ``None`` shows as empty."""
    filled = round(max(0.0, min(1.0, ratio or 0.0)) * width)
    return "[" + "|" * filled + " " * (width - filled) + "]"


def read_frame(gp: Client) -> Frame:
    devices = gp.devices()
    telemetry = gp.telemetry()
    running = gp.list(state=["RUNNING", "CONFIGURING", "COMPLETING"], limit=500)
    pending = gp.list(state=["PENDING", "REQUEUED"], limit=500)
    return Frame(devices, telemetry, running, SystemClock().now(), pending)


#: How top's device table fits: node, index, utilisation, memory and temperature stay; the
#: slices (also in the jobs table) and the allocation go before the health.
DEVICE_MOVES: tuple[Move, ...] = (
    Cut("SLICES (JOB SHARE)", 24),
    Drop("POWER"),
    Drop("ALLOC MEM"),
    Cut("MODEL", 9),
    Cut("SLICES (JOB SHARE)", 12),
    Drop("ALLOC"),
    Cut("MODEL", 6),
    Cut("HEALTH", 7),
    Drop("HEALTH"),
)
RUNNING_MOVES: tuple[Move, ...] = (
    Cut("NAME", 14),
    Drop("TENANT"),
    Cut("NODES", 10),
    Cut("USER", 8),
    Cut("NAME", 6),
)
QUEUE_MOVES: tuple[Move, ...] = (
    Cut("REASON", 32),
    Cut("NAME", 14),
    Drop("PRIO"),
    Cut("USER", 8),
    Cut("NAME", 6),
    Cut("REASON", 10),
)


def _util_cell(util: float | None) -> Text:
    return Text(f"{bar(util)} {render.pct(util):>4}", style=render.load_style(util))


def _memory_cell(used: int | None, total: int) -> Text:
    ratio = used / total if used is not None and total > 0 else None
    return Text(f"{render.mem(used)}/{format_memory(total)}", style=render.load_style(ratio))


def _head(frame: Frame, sort: str, problem: str | None) -> Text:
    samples = frame.telemetry.devices
    total = len(frame.devices)
    alloc = sum(s.allocated_milli for s in samples)
    utils = [s.utilization_ratio for s in samples if s.utilization_ratio is not None]
    mean_util = sum(utils) / len(utils) if utils else None
    queued = sum(sum(p.queued.values()) for p in frame.telemetry.pools)
    head = Text()
    head.append("gpupool top", style="bold")
    head.append(f"  {render.when(frame.now)}  sort: {sort} (s)  quit: q\n")
    if problem is not None:
        head.append(problem + "\n", style="bold red")
    head.append(f"devices {total}  compute allocated {format_gpus(alloc)}/{total}  mean util ")
    head.append(render.pct(mean_util), style=render.load_style(mean_util))
    head.append(f"  running {len(frame.running)}  queued {queued}\n")
    for p in frame.telemetry.pools:
        share = "-" if p.mem_share_ratio is None else f"{p.mem_share_ratio:.2f}"
        waiting = sum(p.queued.values())
        head.append(f"pool {p.name}: mem_share_ratio {share}, queue {waiting}")
        if p.queued:
            head.append(" (" + ", ".join(f"{t} {n}" for t, n in p.queued.items() if n) + ")")
        head.append("\n")
    return head


def frame_view(frame: Frame, sort: str = "node", problem: str | None = None) -> RenderableType:
    """One frame as a rich renderable (pure: the golden test pins it). ``problem``, when
    given, is shown under the title (the server cannot be reached: this is the last frame)."""
    samples = {s.uuid: s for s in frame.telemetry.devices}
    on_device: dict[str, list[str]] = {}
    node_of: dict[str, set[str]] = {}
    for d in frame.devices:
        for sl in d.slices:
            owner = sl.job_id or "(other)"
            on_device.setdefault(d.uuid, []).append(f"{owner} {format_gpus(sl.milli)}")
            if sl.job_id is not None:
                node_of.setdefault(sl.job_id, set()).add(d.node)
    t = FitTable(
        (
            "NODE",
            "IDX",
            "MODEL",
            "UTIL",
            "MEM USED",
            "ALLOC",
            "ALLOC MEM",
            "TEMP",
            "POWER",
            "HEALTH",
            "SLICES (JOB SHARE)",
        ),
        right=("IDX", "ALLOC", "ALLOC MEM", "TEMP", "POWER"),
        moves=DEVICE_MOVES,
    )
    key = SORTS.get(sort, SORTS["node"])
    for d in sorted(frame.devices, key=lambda d: key(d, samples.get(d.uuid))):
        s = samples.get(d.uuid)
        t.add_row(
            d.node,
            str(d.index),
            d.model,
            _util_cell(s.utilization_ratio if s else None),
            _memory_cell(s.memory_used_mib if s else None, d.memory_mib),
            format_gpus(s.allocated_milli) if s else "-",
            format_memory(s.allocated_memory_mib) if s else "-",
            render.temp_text(s.temperature_c if s else None),
            f"{s.power_w:.0f}W" if s and s.power_w is not None else "-",
            render.health_text(d.health),
            ", ".join(on_device.get(d.uuid, [])) or "-",
        )
    j = FitTable(
        ("JOBID", "NAME", "USER", "TENANT", "ST", "TIME", "GPU SLICE", "NODES"),
        right=("TIME",),
        moves=RUNNING_MOVES,
    )
    for job in sorted(frame.running, key=lambda x: (x.start_time or 0.0, x.id)):
        j.add_row(
            job.id,
            job.name,
            job.user,
            job.tenant,
            job.state_code,
            render.elapsed(job, frame.now),
            render.gpu_slice(job),
            ",".join(job.nodes or sorted(node_of.get(job.id, ()))) or "-",
        )
    q = FitTable(
        ("JOBID", "NAME", "USER", "ST", "WAITED", "GPU SLICE", "PRIO", "REASON"),
        right=("WAITED",),
        moves=QUEUE_MOVES,
    )
    best_first = sorted(frame.pending, key=lambda x: (-x.priority, x.submit_time, x.id))
    for job in best_first[:QUEUE_ROWS]:
        q.add_row(
            job.id,
            job.name,
            job.user,
            job.state_code,
            format_duration(max(0.0, frame.now - job.submit_time)),
            render.gpu_slice(job),
            job.priority_class,
            render.reason(job),
        )
    more = len(best_first) - QUEUE_ROWS
    parts: list[RenderableType] = [_head(frame, sort, problem), t, Text(""), j, Text(""), q]
    if more > 0:
        parts.append(Text(f"... and {more} more pending (gpupool queue lists them all)"))
    return Group(*parts)


def disconnected(server: str, exc: ClientError, interval: float) -> str:
    """The line a frame shows while the server cannot be reached."""
    return f"disconnected from {server}, retrying every {interval:g}s: {exc}"


def retryable(exc: ClientError) -> bool:
    """Whether waiting can fix ``exc``: the server is down, restarting or failing (5xx)."""
    if isinstance(exc, ServerUnreachable):
        return True
    return isinstance(exc, ApiError) and exc.status >= 500


@contextlib.contextmanager
def _keys() -> Iterator[Callable[[float], str | None]]:
    """Read single keys from the terminal (cbreak mode) with a timeout; restores it on exit."""
    import termios
    import tty

    fd = sys.stdin.fileno()
    old = termios.tcgetattr(fd)
    tty.setcbreak(fd)

    def read(timeout: float) -> str | None:
        ready, _, _ = select.select([sys.stdin], [], [], timeout)
        return sys.stdin.read(1) if ready else None

    try:
        yield read
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, old)


def top(
    interval: Annotated[
        float, typer.Option("-d", "--interval", help="seconds between frames")
    ] = 2.0,
    sort: Annotated[str, typer.Option("--sort", help=f"first sort: {', '.join(SORTS)}")] = "node",
    once: Annotated[bool, typer.Option("--once", help="print one frame and exit")] = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """A live view of the whole pool, like nvitop: devices, slices, jobs, queue.

    Keys: q quits, s changes the sort (node, util, memory, alloc, temp).

    Examples:

      gpupool top

      gpupool top -d 5 --sort util

      gpupool top --once > snapshot.txt
    """
    if sort not in SORTS:
        raise typer.BadParameter(f"{sort!r} is not a sort: use {', '.join(SORTS)}")
    order: Sequence[str] = list(SORTS)
    with session(server, token) as gp:
        interactive = sys.stdout.isatty() and sys.stdin.isatty() and not once
        if not interactive:
            emit(frame_view(read_frame(gp), sort))
            return
        last: Frame | None = None
        with _keys() as key, Live(console=console(), screen=True, auto_refresh=False) as live:
            while True:
                problem: str | None = None
                try:
                    last = read_frame(gp)
                except ClientError as exc:
                    if not retryable(exc):
                        raise
                    problem = disconnected(gp.server, exc, interval)
                view = frame_view(last, sort, problem) if last else Text(problem or "")
                live.update(view, refresh=True)
                pressed = key(max(0.2, interval))
                if pressed in ("q", "Q", "\x1b"):
                    return
                if pressed in ("s", "S"):
                    sort = order[(order.index(sort) + 1) % len(order)]


def install(app: typer.Typer) -> None:
    app.command(name="top")(top)
