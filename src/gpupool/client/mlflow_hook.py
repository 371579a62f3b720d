"""MLflow integration: every MLflow run started inside a gpupool job is tagged with the job.

MLflow finds :class:`GpupoolRunContext` through the ``mlflow.run_context_provider`` entry point
(declared in ``pyproject.toml``), so nothing in the training script changes: a plain
``mlflow.start_run()`` inside a job gets the tags of :func:`job_tags` (job id and name, node,
slice, restart count, isolation). Outside a job (no ``GPUPOOL_JOB_ID``) it adds nothing.

This module imports MLflow; it is only loaded by MLflow itself (or by code that already uses
MLflow). gpupool does not depend on MLflow.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from mlflow.tracking.context.abstract_context import RunContextProvider

from gpupool.domain.units import format_gpus

#: Environment variable -> MLflow tag; the agent sets these for every job (see agent/env.py).
TAGS_FROM_ENV = {
    "GPUPOOL_JOB_ID": "gpupool.job_id",
    "GPUPOOL_JOB_NAME": "gpupool.job_name",
    "GPUPOOL_ASSIGNMENT_ID": "gpupool.assignment_id",
    "GPUPOOL_NODE": "gpupool.node",
    "GPUPOOL_RESTART_COUNT": "gpupool.restart_count",
    "GPUPOOL_GPU_COUNT": "gpupool.gpu_count",
    "GPUPOOL_GPU_MILLI": "gpupool.gpu_milli",
    "GPUPOOL_GPU_MEMORY_MIB": "gpupool.gpu_memory_mib",
    "GPUPOOL_ISOLATION": "gpupool.isolation",
    "CUDA_VISIBLE_DEVICES": "gpupool.devices",
}


def job_tags(env: Mapping[str, str]) -> dict[str, str]:
    """The MLflow tags for the gpupool job described by ``env`` (empty outside a job).

    Besides one tag per variable of :data:`TAGS_FROM_ENV`, ``gpupool.slice`` reads like the
    CLI's GPU SLICE column (``0.5``, ``2``)."""
    if not env.get("GPUPOOL_JOB_ID"):
        return {}
    tags = {tag: env[name] for name, tag in TAGS_FROM_ENV.items() if env.get(name)}
    milli, count = env.get("GPUPOOL_GPU_MILLI", ""), env.get("GPUPOOL_GPU_COUNT", "")
    if milli.isdigit() and count.isdigit() and int(count) > 0:
        per_device, devices = int(milli), int(count)
        if devices == 1 or per_device == 1000:
            tags["gpupool.slice"] = format_gpus(per_device * devices)
        else:
            tags["gpupool.slice"] = f"{devices}x{format_gpus(per_device)}"
    return tags


class GpupoolRunContext(RunContextProvider):
    """MLflow run context provider: tags a run with the gpupool job it runs in."""

    def in_context(self) -> bool:
        return bool(os.environ.get("GPUPOOL_JOB_ID"))

    def tags(self) -> dict[str, str]:
        return job_tags(os.environ)
