"""Any CSV of jobs as a timed workload, through a column mapping.

A site's own job log rarely looks like a published trace. Tell the replay which of its columns
mean what, on the command line or in a small YAML file::

    gpupool simulate replay --trace jobs.csv --cluster 64xA100 \\
        --columns submit=ts,gpus=num_gpu,duration=runtime_s,team=project
    gpupool simulate replay --trace jobs.csv --cluster 64xA100 --columns columns.yaml

where ``columns.yaml`` holds the same pairs (``submit: ts``, ``gpus: num_gpu``, ...).

Fields (:data:`FIELDS`), the left side of a pair; the right side is a header name of the file:

- ``submit`` (needed): when the job arrived, seconds (any origin) or an ISO time
  (``2024-03-01T10:00:00``, naive read as UTC);
- ``gpus`` (needed): GPUs asked for; a fraction below 1 (``0.5``) is a share of one GPU, above
  one machine (``--gpus-per-node``) a gang of equal replicas;
- the run time: ``duration`` (seconds), or ``start`` and ``end`` (the same time forms);
- optional: ``job`` (an id; the line number when absent), ``team`` (``default`` when absent;
  names that are not valid tenant names are renamed as for Slurm accounts), ``priority`` (``low``,
  ``normal``, ``high``, else ``normal``; all but ``high`` preemptible), ``gpu_type`` (a model
  the job needs, e.g. ``A100``).

Arrival is ``submit`` minus the earliest ``submit``. A row whose run time is missing
(the job never ran, or has not ended) is left out and counted (``no run time``), as is a row with
no GPU (``without a GPU``); a row that cannot be read is left out and counted (``unparseable``),
the first quoted in ``Workload.notes``; a file with no usable row is refused with its first
error. A mapping naming a column the header lacks is refused before any row is read, saying
which and what the header has.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from gpupool.domain.errors import InvalidValue
from gpupool.domain.tenants import DEFAULT_PRIORITY_CLASSES
from gpupool.domain.units import MILLI_PER_GPU
from gpupool.sim.alibaba import TraceFormatError
from gpupool.sim.leftout import LeftOut
from gpupool.sim.trace_slurm import NO_GPU, tenant_names
from gpupool.sim.workload import TraceJob, Workload, gang, trace_name

FIELDS = ("submit", "gpus", "duration", "start", "end", "job", "team", "priority", "gpu_type")
NO_RUN_TIME = "no run time"
_UNSET = {"", "unknown", "none", "n/a", "nan", "null"}
_CLASSES = {p.name for p in DEFAULT_PRIORITY_CLASSES}
COLUMNS_USAGE = (
    "--columns submit=COL,gpus=COL,duration=COL (or start=COL,end=COL) "
    "[,job=COL,team=COL,priority=COL,gpu_type=COL], or a YAML file of the same pairs"
)


def _check(mapping: Mapping[str, str], origin: str) -> dict[str, str]:
    unknown = sorted(set(mapping) - set(FIELDS))
    if unknown:
        raise InvalidValue(
            f"{origin}: {', '.join(unknown)} is not a field: the fields are {', '.join(FIELDS)}",
            field="columns",
        )
    missing = [f for f in ("submit", "gpus") if f not in mapping]
    if "duration" not in mapping and not {"start", "end"} <= set(mapping):
        missing.append("duration (or start and end)")
    if missing:
        raise InvalidValue(
            f"{origin} does not map {', '.join(missing)}: use {COLUMNS_USAGE}", field="columns"
        )
    if "duration" in mapping and ({"start", "end"} & set(mapping)):
        raise InvalidValue(
            f"{origin} maps both duration and start/end: keep one way of giving the run time",
            field="columns",
        )
    return dict(mapping)


def parse_columns(text: str) -> dict[str, str]:
    """``submit=ts,gpus=num_gpu,...`` or the path of a YAML file of those pairs -> the mapping."""
    path = Path(text)
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml

        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise InvalidValue(
                f"--columns {text}: cannot be read ({exc.strerror}): check the path",
                field="columns",
            ) from None
        except yaml.YAMLError as exc:
            raise InvalidValue(f"--columns {text}: not YAML ({exc})", field="columns") from None
        if not isinstance(loaded, dict) or not all(
            isinstance(k, str) and isinstance(v, str | int) for k, v in loaded.items()
        ):
            raise InvalidValue(
                f"--columns {text}: expected pairs such as 'submit: ts' (field: column)",
                field="columns",
            )
        return _check({k.strip(): str(v).strip() for k, v in loaded.items()}, f"--columns {text}")
    mapping: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, column = part.partition("=")
        if not sep or not name.strip() or not column.strip():
            raise InvalidValue(
                f"--columns: {part!r} is not FIELD=COLUMN: use {COLUMNS_USAGE}", field="columns"
            )
        if name.strip() in mapping:
            raise InvalidValue(f"--columns maps {name.strip()} twice: keep one", field="columns")
        mapping[name.strip()] = column.strip()
    return _check(mapping, "--columns")


def _time(text: str) -> float | None:
    """Seconds from a number or an ISO time; ``None`` when unset. Raises ValueError."""
    if text.strip().lower() in _UNSET:
        return None
    try:
        value = float(text)
    except ValueError:
        try:
            moment = datetime.fromisoformat(text.strip())
        except ValueError:
            raise ValueError("is neither seconds nor a time such as 2024-03-01T10:00:00") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        return moment.timestamp()
    if not math.isfinite(value):
        raise ValueError("is not a finite number")
    return value


def _gpu_milli(text: str) -> int:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise ValueError("expected 0 or more GPUs")
    if value > 1 and not value.is_integer():
        raise ValueError("above one GPU, expected whole GPUs")
    return round(value * MILLI_PER_GPU)


@dataclass(frozen=True)
class _Row:
    submit: float
    job: str
    account: str
    work: float
    milli: int
    priority: str
    gpu_type: str


def _read(path: Path, line: int, row: Mapping[str, str], mapping: Mapping[str, str]) -> _Row | str:
    """One row as a :class:`_Row`, or the reason it is left out; TraceFormatError if unreadable."""

    def cell(name: str) -> str:
        return row.get(mapping[name], "").strip() if name in mapping else ""

    def parsed(name: str, parse: Callable[[str], float | int | None]) -> float | int | None:
        text = cell(name)
        try:
            return parse(text)
        except ValueError as exc:
            raise TraceFormatError(
                path, f"{text!r} {exc}", line=line, column=mapping[name]
            ) from None

    milli = parsed("gpus", _gpu_milli)
    if not milli:
        return NO_GPU
    submit = parsed("submit", _time)
    if submit is None:
        raise TraceFormatError(
            path, "the job has no submit time", line=line, column=mapping["submit"]
        )
    if "duration" in mapping:
        work = parsed("duration", _time)
        if work is not None and work < 0:
            raise TraceFormatError(
                path, "a negative run time", line=line, column=mapping["duration"]
            )
    else:
        start, end = parsed("start", _time), parsed("end", _time)
        if start is not None and end is not None and end < start:
            raise TraceFormatError(path, "ends before it starts", line=line, column=mapping["end"])
        work = None if start is None or end is None else end - start
    if work is None:
        return NO_RUN_TIME
    return _Row(
        submit=float(submit),
        job=cell("job") or f"line-{line}",
        account=cell("team") or "default",
        work=float(work),
        milli=int(milli),
        priority=cell("priority").lower(),
        gpu_type=cell("gpu_type").upper(),
    )


def _row(
    path: Path, line: int, header: list[str], fields: list[str], mapping: Mapping[str, str]
) -> _Row | str:
    if len(fields) != len(header):
        raise TraceFormatError(
            path, f"has {len(fields)} fields where the header has {len(header)}", line=line,
            column=None,
        )  # fmt: skip
    return _read(path, line, dict(zip(header, fields, strict=True)), mapping)


def _header(path: Path, mapping: Mapping[str, str]) -> tuple[list[str], list[list[str]]]:
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:
            rows = list(csv.reader(handle))
    except OSError as exc:
        raise TraceFormatError(
            path, f"cannot be read ({exc.strerror}): check the path", line=None, column=None
        ) from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise TraceFormatError(
            path, f"is not a CSV text file ({exc})", line=None, column=None
        ) from None
    if not rows:
        raise TraceFormatError(path, "is empty: expected a header line", line=None, column=None)
    header = [h.strip() for h in rows[0]]
    for name, column in mapping.items():
        if column not in header:
            raise TraceFormatError(
                path,
                f"the header has no column {column!r} (mapped to {name} by --columns): its "
                f"columns are {', '.join(header)}; pass --columns {name}=<one of them>",
                line=1,
                column=column,
            )
    return header, rows[1:]


def csv_workload(
    path: Path | str,
    mapping: Mapping[str, str],
    *,
    gpus_per_node: int = 8,
    time_scale: float = 1.0,
) -> Workload:
    """Read a CSV of jobs through ``mapping`` (field -> column; see the module docstring)."""
    if time_scale <= 0:
        raise ValueError("time_scale must be above 0 (1 replays the trace as it was)")
    path = Path(path)
    header, raw_rows = _header(path, mapping)
    left = LeftOut(NO_RUN_TIME, NO_GPU)
    found: list[_Row] = []
    for number, fields in enumerate(raw_rows, start=2):
        if fields and any(f.strip() for f in fields):
            read = left.read(lambda: _row(path, number, header, fields, mapping))  # noqa: B023
            if read is not None:
                found.append(read)
    if not found:
        left.refuse_empty(path, "holds no job with GPUs and a run time")
    ids = [r.job for r in found]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise TraceFormatError(
            path,
            f"job id {dup!r} appears twice: map job= to a unique column, or leave it out "
            "(line numbers are used)",
            line=None,
            column=mapping.get("job"),
        )
    names = tenant_names([r.account for r in found])
    first = min(r.submit for r in found)
    jobs = []
    for r in found:
        if r.milli < MILLI_PER_GPU:
            replicas, per_milli = 1, r.milli
        else:
            replicas, per = gang(r.milli // MILLI_PER_GPU, gpus_per_node)
            per_milli = per * MILLI_PER_GPU
        priority = r.priority if r.priority in _CLASSES else "normal"
        jobs.append(
            TraceJob(
                id=r.job,
                tenant=names[r.account],
                submit_time=(r.submit - first) / time_scale,
                work_s=r.work,
                gpu_milli=per_milli,
                replicas=replicas,
                cpu_milli=1000 * max(1, per_milli // MILLI_PER_GPU),
                gpu_types=(r.gpu_type,) if r.gpu_type else (),
                priority_class=priority,
                preemptible=priority != "high",
            )
        )
    name = trace_name(path.name, shares=False, time_scale=time_scale)
    return Workload(name, tuple(jobs), skipped=left.counts, notes=left.notes(names, "teams"))
