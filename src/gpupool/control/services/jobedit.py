"""Changing a pending job (like Slurm's ``scontrol update job``): what may change, and how.

A job that has not started may have its **name**, **priority class**, **time limit**,
**expected duration** and **preemptibility** changed, each given as in a job file
(``time_limit: 2h``, ``expected_duration: 90``, ...) and checked by the same parser, so an
update is refused with the same messages as a bad job file. Anything else (resources, command,
pool, tenant) changes where and how the job runs: cancel it and submit it again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gpupool.control.errors import Invalid
from gpupool.domain.errors import SpecError
from gpupool.domain.jobs import JobSpec
from gpupool.domain.jobspec import build_spec

#: The job-file keys an update may give.
UPDATABLE = ("name", "priority", "time_limit", "expected_duration", "preemptible")


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
    )
    limit, expected = new.time_limit_s, new.expected_duration_s
    if limit is not None and expected is not None and expected > limit:
        raise Invalid(
            f"expected_duration ({expected:g} s) would be longer than time_limit ({limit:g} s): "
            "the job would be stopped before it is expected to end; change both"
        )
    return new
