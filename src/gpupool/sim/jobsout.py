"""Per-job output of a replay (``gpupool simulate replay --jobs-out FILE``): one row per job and
scenario, to check a replay job by job or to feed another tool.

Columns (:data:`COLUMNS`): ``scenario``, ``job``, ``team``, ``gpus`` (over all replicas, as
replayed: rounded up in whole-GPU scenarios), ``submit``, ``start`` (first start), ``end``,
``wait`` (submit to first start), ``outcome``, ``attempts``, ``preemptions``, ``nodes`` and
``devices`` (where its last run ran). Times are seconds from the trace start; a time that never
happened is empty in CSV and ``null`` in JSON. In CSV, several nodes or devices are joined by
``;``; JSON gives lists. The format follows the file's suffix: ``.json`` or ``.csv``.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpupool.domain.errors import InvalidValue
from gpupool.domain.units import MILLI_PER_GPU
from gpupool.sim.options import ReplayResult

COLUMNS = (
    "scenario",
    "job",
    "team",
    "gpus",
    "submit",
    "start",
    "end",
    "wait",
    "outcome",
    "attempts",
    "preemptions",
    "nodes",
    "devices",
)
FORMATS = (".csv", ".json")


def check_path(path: Path) -> None:
    """Refuse a file name whose format is not known, before a replay runs."""
    if path.suffix.lower() not in FORMATS:
        raise InvalidValue(
            f"--jobs-out {path}: name a .csv or .json file (the suffix chooses the format)",
            field="jobs_out",
        )


def job_rows(results: Sequence[ReplayResult]) -> list[dict[str, Any]]:
    """One dict per job and scenario, keys :data:`COLUMNS`."""
    rows: list[dict[str, Any]] = []
    for result in results:
        for job in result.jobs:
            rows.append(
                {
                    "scenario": result.scenario,
                    "job": job.id,
                    "team": job.tenant,
                    "gpus": job.gpu_milli / MILLI_PER_GPU,
                    "submit": job.submit_time,
                    "start": job.first_start,
                    "end": job.end_time,
                    "wait": job.queueing_delay_s,
                    "outcome": job.outcome,
                    "attempts": job.attempts,
                    "preemptions": job.preemptions,
                    "nodes": list(job.nodes),
                    "devices": list(job.devices),
                }
            )
    return rows


def write_jobs(path: Path, results: Sequence[ReplayResult]) -> int:
    """Write every job of ``results`` to ``path`` (CSV or JSON by suffix); the rows written."""
    check_path(path)
    rows = job_rows(results)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".json":
        path.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
        return len(rows)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            flat = {k: ("" if v is None else v) for k, v in row.items()}
            flat["nodes"] = ";".join(row["nodes"])
            flat["devices"] = ";".join(row["devices"])
            writer.writerow(flat)
    return len(rows)
