"""The Philly-derived traces of Gavel as a timed workload, with run times from Philly.

Files (see ``../shared/data/README.md``):

- a **trace** ``<vc>.trace``: tab-separated, no header, one job a line with the columns
  :data:`TRACE_COLUMNS`; ``arrival_time_s`` is seconds from the start and ``scale_factor`` the
  number of GPUs. One file is one Philly virtual cluster: one **tenant**, named after the file.
- **run times** ``philly_runtime.csv``: a header ``runtime`` and one job's run time in seconds a
  line. Each trace job's work is drawn from them with the seed (Gavel's step counts need its
  throughput tables, which a pool does not have).
- a **cluster spec** ``cluster_specs.json``: ``{"philly": ["500:0:0"]}``, counts of V100, P100
  and K80 GPUs. Machines get ``gpus_per_node`` GPUs each (the last one the remainder).

Jobs above one machine become gangs of equal replicas (16 GPUs on 8-GPU machines: 2 x 8).
With ``share_mix`` (the milli-GPU of every 1-GPU pod of an Alibaba pod list), 1-GPU jobs get a
share drawn from that mix: Philly has no fractional jobs, the Alibaba trace shows how many would
be. Bad lines are refused with the file, line and column.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from gpupool.domain.nodes import Device, Node
from gpupool.sim.alibaba import TraceFormatError, read_pods
from gpupool.sim.workload import SimCluster, TraceJob, Workload, gang, trace_name

TRACE_COLUMNS = (
    "job_type",
    "command",
    "num_steps_arg",
    "needs_data_dir",
    "total_steps",
    "arrival_time_s",
    "scale_factor",
)
GAVEL_MODELS = ("V100", "P100", "K80")
MODEL_MEMORY_MIB = {"V100": 16384, "P100": 16384, "K80": 12288}


def read_runtimes(path: Path | str) -> np.ndarray:
    """Run times in seconds from a ``runtime`` CSV; refuses bad cells with file and line."""
    path = Path(path)
    values: list[float] = []
    with path.open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.reader(handle)
        header = [h.strip() for h in next(reader, [])]
        if "runtime" not in header:
            raise TraceFormatError(
                path, "the header needs a runtime column (seconds)", line=1, column="runtime"
            )
        col = header.index("runtime")
        for row in reader:
            if not row:
                continue
            try:
                value = float(row[col])
            except (ValueError, IndexError):
                raise TraceFormatError(
                    path,
                    f"{row[col] if col < len(row) else ''!r} is not a number of seconds",
                    line=reader.line_num,
                    column="runtime",
                ) from None
            if value < 0 or not np.isfinite(value):
                raise TraceFormatError(
                    path,
                    f"{value} is not a run time: use seconds >= 0",
                    line=reader.line_num,
                    column="runtime",
                )
            values.append(value)
    if not values:
        raise TraceFormatError(path, "has no run times", line=None, column="runtime")
    return np.asarray(values, dtype=np.float64)


def alibaba_share_mix(pod_list: Path | str) -> tuple[int, ...]:
    """milli-GPU of every 1-GPU pod in an Alibaba pod list (1000 for whole-GPU pods)."""
    return tuple(p.gpu_milli for p in read_pods(pod_list) if p.num_gpu == 1)


def philly_cluster(
    spec: Path | str | int, *, gpus_per_node: int = 8, cpu_per_gpu_milli: int = 8000
) -> SimCluster:
    """Machines for a Gavel cluster spec file, or ``spec`` V100s when given a number."""
    if isinstance(spec, int):
        counts, name = {"V100": spec}, f"{spec} V100"
    else:
        path = Path(spec)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            first = next(iter(data.values()))[0]
            parts = [int(x) for x in str(first).split(":")]
        except (OSError, ValueError, StopIteration, IndexError, AttributeError, TypeError):
            raise TraceFormatError(
                path,
                'is not a Gavel cluster spec: expected {"name": ["V100:P100:K80"]}',
                line=None,
                column=None,
            ) from None
        counts = dict(zip(GAVEL_MODELS, parts, strict=False))
        name = path.name
    nodes: list[Node] = []
    devices: list[Device] = []
    for model, count in counts.items():
        left = count
        while left > 0:
            gpus = min(gpus_per_node, left)
            node = f"{model.lower()}-{len(nodes):04d}"
            nodes.append(Node(node, cpu_milli=gpus * cpu_per_gpu_milli, memory_mib=gpus * 65536))
            devices.extend(
                Device(f"{node}/gpu{i}", node, i, model, MODEL_MEMORY_MIB[model])
                for i in range(gpus)
            )
            left -= gpus
    return SimCluster(name, tuple(nodes), tuple(devices))


def _trace_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(path.glob("*.trace"))
        if not files:
            raise TraceFormatError(path, "holds no *.trace files", line=None, column=None)
        return files
    return [path]


def philly_workload(
    traces: Path | str | Sequence[Path | str],
    runtimes: Path | str,
    *,
    seed: int = 0,
    gpus_per_node: int = 8,
    share_mix: Sequence[int] | None = None,
    time_scale: float = 1.0,
) -> Workload:
    """Read Gavel trace files (or a folder of them) into a workload (see module docstring)."""
    if time_scale <= 0:
        raise ValueError("time_scale must be above 0 (1 replays the trace as it was)")
    paths: list[Path] = []
    for item in [traces] if isinstance(traces, (str, Path)) else list(traces):
        paths.extend(_trace_files(Path(item)))
    pool = read_runtimes(runtimes)
    # Two generators: drawing shares must not change the run times, so a trace with and
    # without ``share_mix`` differs only in the shares.
    rng = np.random.default_rng(seed)
    share_rng = np.random.default_rng([seed, 1])
    mix = np.asarray(share_mix, dtype=np.int64) if share_mix else None
    jobs: list[TraceJob] = []
    for path in paths:
        tenant = path.stem.lower()
        for line, fields in _lines(path):
            arrival = _number(path, line, fields, "arrival_time_s")
            gpus = int(_number(path, line, fields, "scale_factor", whole=True))
            if gpus < 1:
                raise TraceFormatError(
                    path, "a job needs at least 1 GPU", line=line, column="scale_factor"
                )
            replicas, per = gang(gpus, gpus_per_node)
            milli = per * 1000
            if mix is not None and gpus == 1:
                milli = int(mix[share_rng.integers(len(mix))])
            jobs.append(
                TraceJob(
                    id=f"{tenant}-{line:05d}",
                    tenant=tenant,
                    submit_time=arrival / time_scale,
                    work_s=float(pool[rng.integers(len(pool))]),
                    gpu_milli=milli,
                    replicas=replicas,
                    cpu_milli=1000 * max(1, milli // 1000),
                    priority_class="normal",
                    preemptible=True,
                )
            )
    base = paths[0].parent.name if len(paths) > 1 else paths[0].name
    name = trace_name(base, shares=mix is not None, time_scale=time_scale)
    return Workload(name, tuple(jobs))


def _lines(path: Path) -> list[tuple[int, list[str]]]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceFormatError(
            path, f"cannot be read ({exc.strerror}): check the path", line=None, column=None
        ) from None
    rows: list[tuple[int, list[str]]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        fields = raw.split("\t")
        if len(fields) != len(TRACE_COLUMNS):
            raise TraceFormatError(
                path,
                f"has {len(fields)} tab-separated fields, expected {len(TRACE_COLUMNS)}: "
                + ", ".join(TRACE_COLUMNS),
                line=number,
                column=None,
            )
        rows.append((number, fields))
    if not rows:
        raise TraceFormatError(path, "has no jobs", line=None, column=None)
    return rows


def _number(path: Path, line: int, fields: list[str], column: str, *, whole: bool = False) -> float:
    text = fields[TRACE_COLUMNS.index(column)].strip()
    try:
        value = float(text)
    except ValueError:
        raise TraceFormatError(
            path, f"{text!r} is not a number", line=line, column=column
        ) from None
    if value < 0 or not np.isfinite(value) or (whole and not value.is_integer()):
        kind = "a whole number >= 0" if whole else "a number >= 0"
        raise TraceFormatError(path, f"{text!r} is not {kind}", line=line, column=column)
    return value
