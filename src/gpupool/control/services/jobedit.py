"""Changing a pending job (like Slurm's ``scontrol update job``): what may change, and how.

A job that has not started may have its **name**, **priority class**, **time limit**,
**expected duration**, **preemptibility** and **resources** (``resources.gpus``,
``gpu_memory``, ``gpu_types``, ``cpus``, ``memory``) changed, each given as in a job file
(``time_limit: 2h``, ``resources: {gpus: 2}``, ...) and checked by the same parser, so an
update is refused with the same messages as a bad job file. New resources are the job's old
ones with the keys given laid over them, checked whole (``gpu_memory`` without a GPU share is
refused as at submit); the caller then checks them against the pool and the quota as a submit
is checked. Anything else (command, pool, tenant, replicas) changes what the job is: cancel it
and submit it again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gpupool.control.errors import Invalid
from gpupool.domain.errors import SpecError
from gpupool.domain.jobs import JobSpec
from gpupool.domain.jobspec import build_spec
from gpupool.domain.resources import ResourceRequest

#: The job-file keys an update may give.
UPDATABLE = ("name", "priority", "time_limit", "expected_duration", "preemptible", "resources")
#: The keys of ``resources`` an update may give.
RESOURCE_KEYS = ("gpus", "gpu_memory", "gpu_types", "cpus", "memory")


def resources_as_written(r: ResourceRequest) -> dict[str, Any]:
    """A job's resources as a job file writes them (integers in gpupool's units)."""
    out: dict[str, Any] = {"gpus": f"{r.gpu_milli}m", "memory": f"{r.host_memory_mib}MiB"}
    if r.gpu_memory_mib is not None:
        out["gpu_memory"] = f"{r.gpu_memory_mib}MiB"
    if r.gpu_types:
        out["gpu_types"] = list(r.gpu_types)
    if not r.cpu_auto:  # no cpus given: the default rule decides where it runs
        out["cpus"] = f"{r.cpu_milli}m"
    return out


def _new_resources(spec: JobSpec, given: object) -> dict[str, Any]:
    allowed = ", ".join(f"resources.{k}" for k in RESOURCE_KEYS)
    if not isinstance(given, Mapping) or not given:
        raise Invalid(f"resources must be a mapping of one or more of {allowed}")
    unknown = sorted(set(given) - set(RESOURCE_KEYS))
    if unknown:
        raise Invalid(
            f"resources.{', resources.'.join(unknown)} cannot be changed (only {allowed})"
        )
    out = resources_as_written(spec.resources)
    for key, value in given.items():
        if value is None:
            out.pop(key, None)  # null: back to the default (gpu_memory: none, cpus: auto)
        else:
            out[key] = value
    return out


def updated_spec(spec: JobSpec, changes: Mapping[str, Any]) -> JobSpec:
    """``spec`` with ``changes`` applied (job-file keys of :data:`UPDATABLE`), or ``Invalid``."""
    allowed = ", ".join(UPDATABLE)
    if not changes:
        raise Invalid(f"nothing to change: give one of {allowed}")
    unknown = sorted(set(changes) - set(UPDATABLE))
    if unknown:
        raise Invalid(
            f"{', '.join(unknown)} cannot be changed on a queued job (only {allowed}): "
            "cancel it and submit it again"
        )
    # Parse the given keys as a job file would (a stand-in command makes it complete).
    probe_data = {"name": spec.name, "command": ["-"], **changes}
    if "resources" in changes:
        probe_data["resources"] = _new_resources(spec, changes["resources"])
        probe_data["replicas"] = spec.replicas
        probe_data["isolation"] = spec.isolation.value
    try:
        probe = build_spec(probe_data, source="update")
    except SpecError as exc:
        raise Invalid("; ".join(str(p) for p in exc.problems)) from None
    new = replace(
        spec,
        name=probe.name,
        priority_class=probe.priority_class if "priority" in changes else spec.priority_class,
        time_limit_s=probe.time_limit_s if "time_limit" in changes else spec.time_limit_s,
        expected_duration_s=(
            probe.expected_duration_s
            if "expected_duration" in changes
            else spec.expected_duration_s
        ),
        preemptible=probe.preemptible if "preemptible" in changes else spec.preemptible,
        resources=probe.resources if "resources" in changes else spec.resources,
    )
    limit, expected = new.time_limit_s, new.expected_duration_s
    if limit is not None and expected is not None and expected > limit:
        raise Invalid(
            f"expected_duration ({expected:g} s) would be longer than time_limit ({limit:g} s): "
            "the job would be stopped before it is expected to end; change both"
        )
    return new
