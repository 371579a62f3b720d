"""The job tables of ``queue`` and ``show``, as plain text, without rich.

:mod:`gpupool.cli.render` builds every table of the CLI with rich; rich costs about 20 ms to
import and about 2 ms a row to lay out, more than a whole hot verb may spend (see
:mod:`gpupool.cli.hot`). The cells of the job tables are computed here, once, for both: the
rich tables of :mod:`~gpupool.cli.render` are filled from :func:`detail_rows`,
:func:`factor_rows` and :func:`event_rows`, and :func:`queue_table` is a
:class:`~gpupool.cli.fit.FitTable`, which writes plain text itself. :func:`detail_text` lays
``show`` out as rich does, character for character (``tests/cli/test_golden.py`` holds both to
one golden file), or answers ``None`` where only rich can (a line wider than the page: rich
wraps it), and the caller asks rich.

A job here is a :class:`~gpupool.schemas.jobs.JobView` or a :class:`Row` over the API's JSON
(the hot verbs never build pydantic models): both answer the same attribute names.
"""

from __future__ import annotations

import time

from gpupool.cli.fit import Cut, Drop, FitTable, _as_rich_prints, cell_len
from gpupool.domain.units import format_duration, format_gpus, format_memory

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, ClassVar

    from gpupool.cli.fit import Move
    from gpupool.schemas.jobs import JobEventView, JobView

DASH = "-"

#: Spaces between the columns of a table as :func:`gpupool.cli.render.table` makes it.
TABLE_GAP = 3


class Row:
    """One object of an API answer with attribute access (``row.state``), nested objects
    wrapped too; a field the answer lacks has the wire model's default (an older server's
    answer). ``_data`` is the answer itself. The fields are the instance's attributes, so
    reading one costs what reading any attribute costs (``queue`` reads 20 per job)."""

    #: The defaults of :class:`~gpupool.schemas.jobs.JobView`'s optional fields.
    DEFAULTS: ClassVar[dict[str, Any]] = {
        "memory_oversubscription": "fail",
        "spilled_bytes": 0,
    }
    _NESTED = ("container", "priority_factors", "slices")

    def __init__(self, data: dict[str, Any]) -> None:
        fields = self.__dict__
        fields.update(data)
        fields["_data"] = data
        for key in self._NESTED:
            value = fields.get(key)
            if isinstance(value, dict):
                fields[key] = Row(value)
            elif isinstance(value, list) and value and isinstance(value[0], dict):
                fields[key] = [Row(v) for v in value]

    def __getattr__(self, name: str) -> Any:  # only for a field the answer lacks
        if name.startswith("__"):
            raise AttributeError(name)
        value = self.DEFAULTS.get(name)
        return [] if name in ("nodes", "slices", "nodelist", "exclude", "mail_type") else value


def rows(data: list[dict[str, Any]]) -> list[Any]:
    """The API's objects (jobs, events) as rows the renderers read like the wire models."""
    return [Row(d) for d in data]


def data_of(row: Any) -> dict[str, Any]:
    """The API's answer a :class:`Row` was made from."""
    data: dict[str, Any] = row._data
    return data


def when(t: float | None) -> str:
    if t is None:
        return DASH
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


def ago(t: float | None, now: float) -> str:
    if t is None:
        return DASH
    delta = now - t
    if delta < 0:
        return "in " + format_duration(-delta)
    return format_duration(delta) + " ago"


def gpu_slice(job: JobView) -> str:
    """GPU share per replica (``2x`` for gangs), then memory and types: ``0.5 10GiB A100``."""
    parts = [format_gpus(job.gpu_milli)]
    if job.replicas > 1:
        parts[0] = f"{job.replicas}x{parts[0]}"
    if job.gpu_memory_mib is not None:
        parts.append(format_memory(job.gpu_memory_mib))
    if job.gpu_types:
        parts.append("|".join(job.gpu_types))
    return " ".join(parts)


def elapsed(job: JobView, now: float) -> str:
    if job.start_time is None:
        return format_duration(0)
    end = job.end_time if job.end_time is not None else now
    return format_duration(max(0.0, end - job.start_time))


def reason(job: JobView) -> str:
    if job.held:
        return "JobHeld"
    if job.state == "PENDING":
        return job.pending_reason or "Priority"
    if job.nodes:
        return ",".join(job.nodes)
    return job.reason or DASH


def exit_code(job: JobView) -> str:
    """sacct's ``ExitCode``: ``code:signal``."""
    code = DASH if job.exit_code is None else str(job.exit_code)
    sig = job.signal or "0"
    return DASH if job.exit_code is None and job.signal is None else f"{code}:{sig}"


#: How ``gpupool queue`` fits a narrow terminal (see :mod:`gpupool.cli.fit`): job id, state,
#: time and slice are never cut; the reason is cut last.
QUEUE_MOVES: tuple[Move, ...] = (
    Cut("NODELIST(REASON)", 32),
    Cut("NAME", 16),
    Drop("START"),
    Drop("PRIO"),
    Drop("POOL"),
    Drop("TENANT"),
    Cut("NAME", 10),
    Cut("USER", 8),
    Cut("NAME", 6),
    Cut("NODELIST(REASON)", 10),
)

QUEUE_COLUMNS = (
    "JOBID",
    "NAME",
    "USER",
    "TENANT",
    "POOL",
    "ST",
    "TIME",
    "GPU SLICE",
    "PRIO",
    "START",
    "NODELIST(REASON)",
)


def queue_table(jobs: Sequence[JobView], now: float) -> FitTable:
    """``gpupool queue``: squeue's columns plus the GPU slice, REASON and START estimate."""
    t = FitTable(QUEUE_COLUMNS, right=("TIME",), moves=QUEUE_MOVES)
    add = t.rows.append  # the cells are known to match the columns: no check per row
    for j in jobs:
        if j.state == "PENDING":
            start = when(j.estimated_start) if j.estimated_start is not None else "N/A"
            where = f"({reason(j)})"
        else:
            start = when(j.start_time)
            where = ",".join(j.nodes) if j.nodes else (f"({j.reason})" if j.reason else DASH)
        add(
            [
                j.id,
                j.name,
                j.user,
                j.tenant,
                j.pool,
                j.state_code,
                elapsed(j, now),
                gpu_slice(j),
                f"{j.priority_class}",
                start,
                where,
            ]
        )
    return t


def queue_order(j: JobView) -> tuple[int, float, str]:
    """``queue``'s order: running jobs first, then by submit time."""
    return (0 if j.state != "PENDING" else 1, j.submit_time, j.id)


# ------------------------------------------------------------------ show


def detail_rows(job: JobView, now: float) -> list[tuple[str, str]]:
    """``show``'s fields, as (key, value) lines: Slurm's ``scontrol show job`` in words, a
    field a job does not use left out (no array task, no ``--begin``, no ``--constraint``...)."""
    command = " ".join(job.command) if job.command else f"sh -c {job.script!r}"
    limit = format_duration(job.time_limit_s) if job.time_limit_s is not None else "pool default"
    rows: list[tuple[str, str]] = [("JobId", job.id), ("Name", job.name)]
    if job.array_id is not None:
        rows.append(("Array task", f"{job.array_id}_{job.array_index}"))
    rows += [
        ("State", f"{job.state} ({job.state_code})" + (" held" if job.held else "")),
        ("User / Tenant", f"{job.user} / {job.tenant}"),
        ("Pool", job.pool),
        ("Priority", f"{job.priority_class} ({job.priority})"),
        (
            "GPU slice",
            gpu_slice(job) + (" (gang: all replicas start together)" if job.replicas > 1 else ""),
        ),
        ("Preemptible", "yes" if job.preemptible else "no"),
    ]
    if job.requeue is not None:  # an older server does not say
        rows.append(("Requeue", f"{job.requeue} (at most {job.max_restarts} restarts)"))
    rows.append(("Isolation", job.isolation or DASH))
    if job.memory_oversubscription == "spill" or job.spilled_bytes:  # the pool's choice (shim)
        spilled = format_memory(-(-job.spilled_bytes // (1 << 20))) if job.spilled_bytes else "none"
        rows.append(("Oversubscription", f"{job.memory_oversubscription}; spilled: {spilled}"))
    rows += _placement_rows(job)
    c = job.container
    if c is not None:  # submit --image: the image and what the job adds to it
        extra = [
            f"engine {c.engine}" if c.engine else "",
            f"workdir {c.workdir}" if c.workdir else "",
        ]
        extra += [f"mount {m}" for m in c.mounts or ()] + [f"env {k}" for k in sorted(c.env or {})]
        rows.append(("Image", "; ".join([c.image, *filter(None, extra)])))
    rows.append(("Command", command))
    rows += _io_rows(job)
    rows.append(("Time limit", limit))
    if job.time_min_s is not None:
        rows.append(("Time min", format_duration(job.time_min_s)))
    rows.append(("Submitted", f"{when(job.submit_time)} ({ago(job.submit_time, now)})"))
    if job.eligible_time > job.submit_time + 0.5:  # --begin (or a hold's release): not before
        rows.append(("Begin", f"{when(job.eligible_time)} ({ago(job.eligible_time, now)})"))
    rows += [
        ("Started", when(job.start_time)),
        ("Ended", when(job.end_time)),
        ("Elapsed", elapsed(job, now)),
        ("Restarts", str(job.restart_count)),
        ("Exit code", exit_code(job)),
        ("Nodes", ",".join(job.nodes) or DASH),
    ]
    if job.dependency:
        rows.append(("Dependency", job.dependency))
    if job.state == "PENDING":
        rows.append(("Why pending", job.pending_reason or "waiting for the next scheduling cycle"))
        est = job.estimated_start
        rows.append(("Est. start", f"{when(est)} ({ago(est, now)})" if est else "unknown"))
    if job.reason:
        rows.append(("Last reason", job.reason))
    return rows


def _placement_rows(job: JobView) -> list[tuple[str, str]]:
    """Where it may run: ``--constraint``, ``--nodelist``, ``--exclude`` (those given)."""
    rows = []
    if job.constraint:
        rows.append(("Constraint", job.constraint))
    if job.nodelist:
        rows.append(("Node list", ",".join(job.nodelist)))
    if job.exclude:
        rows.append(("Exclude", ",".join(job.exclude)))
    return rows


def _io_rows(job: JobView) -> list[tuple[str, str]]:
    """Its terminal (``run --pty``), ``-o``/``--error`` patterns and ``--mail-type`` notices."""
    rows = []
    if job.pty:
        rows.append(("Terminal", "yes (run --pty)"))
    if job.output:
        rows.append(("Output", job.output))
    if job.error or job.output:
        rows.append(("Error", job.error or f"{job.output} (with the output)"))
    if job.mail_type:
        to = job.mail_user or "the server's webhook"
        rows.append(("Mail", f"{','.join(job.mail_type)} to {to}"))
    return rows


FACTOR_COLUMNS = ("FACTOR", "WEIGHT", "VALUE", "CONTRIBUTION", "MEANING")
FACTOR_RIGHT = ("WEIGHT", "VALUE", "CONTRIBUTION")
EVENT_COLUMNS = ("TIME", "FROM", "TO", "VERSION", "REASON")
EVENT_RIGHT = ("VERSION",)


def factor_rows(job: JobView) -> list[list[str]]:
    """The priority factor table's rows, its ``total`` last; empty without factors."""
    out: list[list[str]] = []
    total = 0.0
    for factor in job.priority_factors or ():
        total += factor.contribution
        out.append(
            [
                factor.name,
                f"{factor.weight:.2f}",
                f"{factor.value:.3f}",
                f"{factor.contribution:.3f}",
                factor.meaning,
            ]
        )
    if out:
        out.append(["total", "", "", f"{total:.3f}", ""])
    return out


def event_rows(events: Sequence[JobEventView]) -> list[list[str]]:
    return [
        [when(ev.time), ev.source, ev.target, str(ev.version), ev.reason or DASH] for ev in events
    ]


def _grid(
    title: str, columns: Sequence[str], cells: list[list[str]], right: Sequence[str], width: int
) -> list[str] | None:
    """A titled table as :func:`gpupool.cli.render.table` prints it; ``None`` if too wide."""
    texts = []
    for row in cells:
        line = [_as_rich_prints(c) for c in row]
        if any(t is None or "\n" in t for t in line):
            return None
        texts.append(line)
    widths = [cell_len(c) for c in columns]
    for line in texts:
        widths = [max(w, cell_len(t or "")) for w, t in zip(widths, line, strict=True)]
    total = sum(widths) + TABLE_GAP * (len(widths) - 1)
    if total > width or cell_len(title) > total:
        return None

    def fmt(line: Sequence[str]) -> str:
        out = []
        for name, w, text in zip(columns, widths, line, strict=True):
            pad = " " * (w - cell_len(text))
            out.append(pad + text if name in right else text + pad)
        return (" " * TABLE_GAP).join(out).rstrip()

    return [title, fmt(columns), "─" * total, *(fmt(t) for t in texts)]  # type: ignore[arg-type]


def detail_text(job: JobView, events: Sequence[JobEventView], now: float, width: int) -> str | None:
    """``show`` as rich prints :func:`gpupool.cli.render.job_detail` at ``width`` columns,
    trailing spaces removed; ``None`` when rich would wrap a line (only rich can, then)."""
    fields = detail_rows(job, now)
    key_width = max(len(k) for k, _ in fields)
    lines = []
    for key, value in fields:
        text = _as_rich_prints(value)
        if text is None or "\n" in text or key_width + 2 + cell_len(text) > width:
            return None
        lines.append((key.ljust(key_width) + "  " + text).rstrip())
    factors = factor_rows(job)
    if factors:
        grid = _grid("Priority factors", FACTOR_COLUMNS, factors, FACTOR_RIGHT, width)
        if grid is None:
            return None
        lines += ["", *grid]
    if events:
        grid = _grid("Events", EVENT_COLUMNS, event_rows(events), EVENT_RIGHT, width)
        if grid is None:
            return None
        lines += ["", *grid]
    return "\n".join(lines) + "\n"
