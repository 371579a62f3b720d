"""A Slurm accounting export as a timed workload: replay your own cluster's GPU jobs.

Export the window to replay on the Slurm cluster (``--parsable2``: ``|``-separated, a header
line first, as sacct writes it unless told ``--noheader``)::

    sacct --allusers --parsable2 --starttime 2024-03-01 --endtime 2024-04-01 \\
        --format=JobID,Account,User,QOS,Submit,Start,End,State,AllocTRES > jobs.txt

Words and rules:

- **columns** are found by their header names, in any order and case. Needed: ``JobID``,
  ``Submit``, ``Start``, ``End`` and ``AllocTRES`` (or ``ReqTRES``). Optional: ``Account``,
  ``User``, ``QOS``, ``State``; others are ignored.
- **jobs**: job steps (a ``JobID`` with a dot: ``123.batch``, ``123.0``, ``123.extern``) are
  left out; array tasks (``123_4``) and heterogeneous components (``123+0``) are jobs.
- **GPUs**: ``gres/gpu=N`` in the TRES (``AllocTRES``, or ``ReqTRES`` when that is empty); a typed
  entry ``gres/gpu:a100=N`` names the model, which the job then asks for (upper-cased: give a
  cluster with that model, such as ``--cluster 64xA100``). Jobs without a GPU are left out: the
  pool shares GPUs. Jobs above one machine (``gpus_per_node``) become gangs of equal replicas.
- **times**: arrival is ``Submit`` minus the earliest ``Submit``; work is ``End - Start``. A job
  that never started or has not ended (``Unknown``, ``None``, empty) is left out, as the trace
  does not say how long it would run.
- **what is left out is counted** in ``Workload.skipped`` (``never started``, ``unfinished``,
  ``without a GPU``, ``unparseable``), and the replay's output says so. A row that cannot be
  read (too few fields, a bad time or TRES, times out of order) is left out and counted; the
  first one is quoted in ``Workload.notes`` with its line and column. A file with no usable row
  is refused with its first row's error.
- **teams**: the tenant is the ``Account`` (else the ``User``, else ``default``). Slurm allows
  names gpupool's tenants do not (``ml_team``, ``Vision``): they are lower-cased with every other
  character made ``-`` (``ml-team``), a note says which were renamed; two accounts that would
  get one name keep apart by a numbered suffix.
- **priority**: a ``QOS`` named like a gpupool class (``low``, ``normal``, ``high``) maps to it,
  anything else is ``normal``; jobs are preemptible except ``high`` ones (Slurm does not say
  which jobs could be checkpointed; as with the Philly traces, borrowing needs preemptible jobs).
- **shares**: Slurm jobs hold whole GPUs; ``share_mix`` (the milli-GPU of every 1-GPU pod of an
  Alibaba pod list) gives 1-GPU jobs a share drawn from that mix, to ask "what if our 1-GPU jobs
  asked for what they use?".

CPU and host memory are not replayed (each replica asks for one CPU per GPU): the replay is
about GPUs. Bad lines are counted and quoted with the file, line and column.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from gpupool.domain.errors import InvalidValue
from gpupool.domain.pools import validate_name
from gpupool.domain.tenants import DEFAULT_PRIORITY_CLASSES
from gpupool.sim.alibaba import TraceFormatError
from gpupool.sim.leftout import LeftOut
from gpupool.sim.workload import TraceJob, Workload, gang, trace_name

NEEDED = ("jobid", "submit", "start", "end")
_UNSET = {"", "unknown", "none", "n/a"}
_GPU_RE = re.compile(r"^gres/gpu(?::(?P<model>[^=]+))?=(?P<count>\d+)$")
_CLASSES = {p.name for p in DEFAULT_PRIORITY_CLASSES}


def _time(path: Path, line: int, column: str, text: str) -> float | None:
    """Seconds since the epoch of a sacct time (naive: read as UTC), ``None`` when unset."""
    if text.strip().lower() in _UNSET:
        return None
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise TraceFormatError(
            path,
            f"{text!r} is not a time: sacct writes 2024-03-01T10:00:00",
            line=line,
            column=column,
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def _gpus(path: Path, line: int, column: str, text: str) -> tuple[int, str | None]:
    """(GPUs, model or ``None``) from a TRES list such as ``cpu=8,gres/gpu:a100=2,node=1``.

    The untyped ``gres/gpu=N`` is the total; without it the typed counts add up. The model is
    the typed one when there is exactly one (a job over two models asks for any)."""
    untyped: int | None = None
    typed: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        if not item.startswith("gres/gpu"):
            continue
        match = _GPU_RE.match(item)
        if match is None:
            raise TraceFormatError(
                path,
                f"{item!r} is not a GPU count: expected gres/gpu=N or gres/gpu:MODEL=N",
                line=line,
                column=column,
            )
        count = int(match.group("count"))
        if match.group("model"):
            name = match.group("model").upper()
            typed[name] = typed.get(name, 0) + count
        else:
            untyped = count
    total = untyped if untyped is not None else sum(typed.values())
    return total, (next(iter(typed)) if len(typed) == 1 else None)


def _rows(path: Path) -> tuple[dict[str, int], list[tuple[int, list[str]]], int]:
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise TraceFormatError(
            path, f"cannot be read ({exc.strerror}): check the path", line=None, column=None
        ) from None
    lines = text.splitlines()
    if not lines:
        raise TraceFormatError(path, "is empty", line=None, column=None)
    header = [h.strip().lower() for h in lines[0].split("|")]
    columns = {name: i for i, name in enumerate(header) if name}
    missing = [c for c in NEEDED if c not in columns]
    if "alloctres" not in columns and "reqtres" not in columns:
        missing.append("alloctres")
    if missing:
        raise TraceFormatError(
            path,
            f"the header lacks {', '.join(missing)}: export with sacct --parsable2 "
            "--format=JobID,Account,User,QOS,Submit,Start,End,State,AllocTRES",
            line=1,
            column=missing[0],
        )
    rows: list[tuple[int, list[str]]] = []
    for number, raw in enumerate(lines[1:], start=2):
        if raw.strip():
            rows.append((number, raw.split("|")))
    return columns, rows, len(header)


_Found = tuple[float, str, str, float, int, str | None, str]

#: ``Workload.skipped`` keys, in the order the output lists them.
NEVER_STARTED = "never started"
UNFINISHED = "unfinished"
NO_GPU = "without a GPU"


def _record(
    path: Path, line: int, fields: list[str], columns: dict[str, int], width: int
) -> _Found | str | None:
    """One row as (submit, id, account, work, GPUs, model, QOS); a skip reason; ``None`` for a
    job step. Raises :class:`TraceFormatError` for a row that cannot be read."""
    if len(fields) < width:
        raise TraceFormatError(
            path, f"has {len(fields)} |-separated fields, the header has {width}", line=line,
            column=None,
        )  # fmt: skip

    def cell(name: str) -> str:
        index = columns.get(name)
        return fields[index].strip() if index is not None else ""

    job_id = cell("jobid")
    if not job_id:
        raise TraceFormatError(path, "the job has no id", line=line, column="JobID")
    if "." in job_id:
        return None  # a job step: its job is on its own line
    tres = "alloctres" if "alloctres" in columns else "reqtres"
    used = cell(tres) or cell("reqtres")
    gpus, model = _gpus(path, line, "AllocTRES" if tres == "alloctres" else "ReqTRES", used)
    if gpus == 0:
        return NO_GPU
    submit = _time(path, line, "Submit", cell("submit"))
    start = _time(path, line, "Start", cell("start"))
    end = _time(path, line, "End", cell("end"))
    if submit is None:
        raise TraceFormatError(path, "the job has no submit time", line=line, column="Submit")
    if start is None:
        return NEVER_STARTED
    if end is None:
        return UNFINISHED  # still running: its run time is not known
    if end < start or start < submit:
        raise TraceFormatError(
            path,
            "times are out of order: Submit <= Start <= End is expected",
            line=line,
            column="End" if end < start else "Start",
        )
    account = cell("account") or cell("user") or "default"
    return (submit, job_id, account, end - start, gpus, model, cell("qos").lower())


_BAD_CHARS = re.compile(r"[^a-z0-9-]+")


def _valid(name: str) -> bool:
    try:
        validate_name("tenant", name)
    except InvalidValue:
        return False
    return True


def tenant_names(accounts: Sequence[str]) -> dict[str, str]:
    """Slurm account -> a valid tenant name (see the module docstring). Names already
    valid are kept first, so a renamed account never takes one."""
    unique = sorted(set(accounts))
    names = {a: a for a in unique if _valid(a)}
    taken = set(names)
    for account in (a for a in unique if a not in names):
        base = _BAD_CHARS.sub("-", account.lower()).strip("-")[:60] or "account"
        name, number = base, 1
        while name in taken:
            number += 1
            name = f"{base}-{number}"
        names[account] = name
        taken.add(name)
    return names


def slurm_workload(
    path: Path | str,
    *,
    seed: int = 0,
    gpus_per_node: int = 8,
    share_mix: Sequence[int] | None = None,
    time_scale: float = 1.0,
) -> Workload:
    """Read a ``sacct --parsable2`` export into a workload (see the module docstring)."""
    if time_scale <= 0:
        raise ValueError("time_scale must be above 0 (1 replays the trace as it was)")
    path = Path(path)
    columns, rows, width = _rows(path)
    share_rng = np.random.default_rng([seed, 1])
    mix = np.asarray(share_mix, dtype=np.int64) if share_mix else None
    left = LeftOut(NEVER_STARTED, UNFINISHED, NO_GPU)
    found: list[_Found] = []
    for line, fields in rows:
        record = left.read(lambda: _record(path, line, fields, columns, width))  # noqa: B023
        if record is not None:
            found.append(record)
    if not found:
        left.refuse_empty(
            path,
            "holds no GPU job that started and ended: check the window and that AllocTRES "
            "was exported",
        )
    names = tenant_names([f[2] for f in found])
    found.sort(key=lambda f: (f[0], f[1]))
    first = found[0][0]
    jobs: list[TraceJob] = []
    for submit, job_id, account, work, gpus, model, qos in found:
        replicas, per = gang(gpus, gpus_per_node)
        milli = per * 1000
        if mix is not None and gpus == 1:
            milli = int(mix[share_rng.integers(len(mix))])
        priority = qos if qos in _CLASSES else "normal"
        jobs.append(
            TraceJob(
                id=job_id,
                tenant=names[account],
                submit_time=(submit - first) / time_scale,
                work_s=work,
                gpu_milli=milli,
                replicas=replicas,
                cpu_milli=1000 * max(1, milli // 1000),
                gpu_types=(model,) if model else (),
                priority_class=priority,
                preemptible=priority != "high",
            )
        )
    name = trace_name(path.name, shares=mix is not None, time_scale=time_scale)
    return Workload(name, tuple(jobs), skipped=left.counts, notes=left.notes(names, "accounts"))
