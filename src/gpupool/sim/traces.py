"""Turning what a person types (``--trace``, ``--cluster``) into a workload and a cluster.

Trace kinds, in :data:`TRACE_KINDS` (chosen with ``kind:`` or recognised by the path):

- ``alibaba``: an Alibaba v2023 pod list (``*.csv``);
- ``philly``: Gavel's Philly-derived ``*.trace`` files, or a folder of them;
- ``synthetic``: ``synthetic:jobs=100000,gpus=1000,tenants=4,load=0.9`` (every field of
  :class:`~gpupool.sim.trace_synthetic.SyntheticSpec` that is a number may be given);
- ``slurm``: a ``sacct --parsable2`` export of a Slurm cluster's jobs (recognised by its
  ``JobID|...`` header line, or ``slurm:PATH``), see :mod:`gpupool.sim.trace_slurm`;
- ``csv``: any CSV of jobs read through a column mapping (``--columns``, or ``csv:PATH``), see
  :mod:`gpupool.sim.trace_csv`.

A file read as one format that looks like another (by its first line) is refused before its
reader runs, saying what it looks like and what to pass (:mod:`gpupool.sim.sniff`).

Clusters: an Alibaba node list (``*.csv``), a Gavel cluster spec (``*.json``), or
``<GPUs>x<model>`` such as ``500xV100`` (machines of ``gpus_per_node``). A synthetic trace
brings its own cluster when none is given.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path

from gpupool.domain.errors import InvalidValue
from gpupool.sim.sniff import check_format
from gpupool.sim.trace_alibaba import alibaba_cluster, alibaba_workload
from gpupool.sim.trace_csv import COLUMNS_USAGE, csv_workload
from gpupool.sim.trace_philly import alibaba_share_mix, philly_cluster, philly_workload
from gpupool.sim.trace_slurm import slurm_workload
from gpupool.sim.trace_synthetic import SyntheticSpec, synthetic_cluster, synthetic_workload
from gpupool.sim.workload import SimCluster, Workload, uniform_cluster


@dataclass(frozen=True)
class TraceOptions:
    """Adapter settings: ``seed`` for sampling and tenant assignment; ``tenants`` for traces
    without teams; ``time_scale`` divides submit times; ``runtimes`` is Philly's run-time CSV;
    ``share_mix`` an Alibaba pod list whose 1-GPU shares fractionalise Philly jobs."""

    seed: int = 0
    tenants: int = 4
    time_scale: float = 1.0
    gpus_per_node: int = 8
    runtimes: Path | None = None
    share_mix: Path | None = None
    columns: Mapping[str, str] | None = None


def _alibaba(target: str, options: TraceOptions) -> tuple[Workload, SimCluster | None]:
    workload = alibaba_workload(
        target, tenants=options.tenants, seed=options.seed, time_scale=options.time_scale
    )
    return workload, None


def _philly(target: str, options: TraceOptions) -> tuple[Workload, SimCluster | None]:
    if options.runtimes is None:
        raise InvalidValue(
            "a Philly-derived trace needs run times: pass --runtimes "
            "../shared/data/philly/philly_runtime.csv",
            field="runtimes",
        )
    mix = alibaba_share_mix(options.share_mix) if options.share_mix is not None else None
    workload = philly_workload(
        target,
        options.runtimes,
        seed=options.seed,
        gpus_per_node=options.gpus_per_node,
        share_mix=mix,
        time_scale=options.time_scale,
    )
    return workload, None


_NUMERIC = {f.name: f.type for f in fields(SyntheticSpec) if f.type in ("int", "float")}


def parse_synthetic(text: str, seed: int = 0) -> SyntheticSpec:
    """``jobs=1000,gpus=64,load=0.8`` -> a :class:`SyntheticSpec` (seed from ``seed``)."""
    spec = SyntheticSpec(seed=seed)
    changes: dict[str, float | int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = part.partition("=")
        kind = _NUMERIC.get(key.strip())
        if kind is None:
            raise InvalidValue(
                f"synthetic trace field {key!r} is not known: use {', '.join(_NUMERIC)}",
                field="trace",
            )
        try:
            changes[key.strip()] = int(value) if kind == "int" else float(value)
        except ValueError:
            what = "a whole number" if kind == "int" else "a number"
            raise InvalidValue(
                f"synthetic trace field {key}={value!r} is not {what}", field="trace"
            ) from None
    try:
        return replace(spec, **changes)  # type: ignore[arg-type]
    except ValueError as exc:
        raise InvalidValue(f"synthetic trace: {exc}", field="trace") from None


def _slurm(target: str, options: TraceOptions) -> tuple[Workload, SimCluster | None]:
    mix = alibaba_share_mix(options.share_mix) if options.share_mix is not None else None
    workload = slurm_workload(
        target,
        seed=options.seed,
        gpus_per_node=options.gpus_per_node,
        share_mix=mix,
        time_scale=options.time_scale,
    )
    return workload, None


def _csv(target: str, options: TraceOptions) -> tuple[Workload, SimCluster | None]:
    if not options.columns:
        raise InvalidValue(
            f"a CSV of your own needs its columns mapped: pass {COLUMNS_USAGE}", field="columns"
        )
    workload = csv_workload(
        target,
        options.columns,
        gpus_per_node=options.gpus_per_node,
        time_scale=options.time_scale,
    )
    return workload, None


def _synthetic(target: str, options: TraceOptions) -> tuple[Workload, SimCluster | None]:
    spec = parse_synthetic(target, options.seed)
    return synthetic_workload(spec), synthetic_cluster(spec)


TraceLoader = Callable[[str, TraceOptions], tuple[Workload, SimCluster | None]]

#: kind -> loader
TRACE_KINDS: dict[str, TraceLoader] = {
    "alibaba": _alibaba,
    "philly": _philly,
    "slurm": _slurm,
    "synthetic": _synthetic,
    "csv": _csv,
}


def _is_sacct(path: Path) -> bool:
    """Whether ``path`` starts with a sacct ``--parsable2`` header (``JobID|...``)."""
    try:
        with path.open(encoding="utf-8-sig") as handle:
            first = handle.readline()
    except (OSError, UnicodeDecodeError):
        return False
    return "|" in first and first.split("|", 1)[0].strip().lower() in ("jobid", "jobidraw")


def _kind_of(text: str, columns: bool) -> tuple[str, str]:
    kind, sep, rest = text.partition(":")
    if sep and kind in TRACE_KINDS:
        if columns and kind != "csv":
            raise InvalidValue(
                f"--columns maps a CSV of your own, and {text!r} is read as {kind}: drop "
                f"--columns, or pass --trace csv:{rest}",
                field="columns",
            )
        return kind, rest
    if columns:
        return "csv", text
    path = Path(text)
    if path.is_dir() or path.suffix == ".trace":
        return "philly", text
    if path.is_file() and _is_sacct(path):
        return "slurm", text
    if path.suffix == ".csv":
        return "alibaba", text
    raise InvalidValue(
        f"cannot tell what trace {text!r} is: give an Alibaba pod list (.csv), Philly-derived "
        "*.trace files or their folder, a Slurm export (sacct --parsable2), "
        "synthetic:jobs=N,gpus=G, or a CSV of your own with --columns submit=COL,gpus=COL,"
        "duration=COL (or prefix alibaba:/philly:/slurm:/csv:)",
        field="trace",
    )


def load_trace(text: str, options: TraceOptions) -> tuple[Workload, SimCluster | None]:
    """The workload named by ``text`` and, for synthetic traces, its own cluster."""
    kind, target = _kind_of(text, bool(options.columns))
    if kind != "synthetic":
        check_format(Path(target), kind)
    return TRACE_KINDS[kind](target, options)


_SIZE_RE = re.compile(r"^(?P<gpus>\d+)\s*x\s*(?P<model>[A-Za-z0-9-]+)$")


def load_cluster(text: str, *, gpus_per_node: int = 8) -> SimCluster:
    """The cluster named by ``text`` (see the module docstring)."""
    match = _SIZE_RE.match(text.strip())
    if match is not None:
        gpus, model = int(match.group("gpus")), match.group("model")
        if gpus < 1:
            raise InvalidValue("a cluster needs at least 1 GPU", field="cluster")
        return uniform_cluster(gpus, model, gpus_per_node)
    path = Path(text)
    if path.suffix == ".json":
        return philly_cluster(path, gpus_per_node=gpus_per_node)
    if path.suffix == ".csv":
        return alibaba_cluster(path)
    raise InvalidValue(
        f"cannot tell what cluster {text!r} is: give an Alibaba node list (.csv), a Gavel "
        "cluster spec (.json), or a size like 500xV100",
        field="cluster",
    )
