"""Submitting a job array (see :mod:`gpupool.domain.arrays`): one job per index, one commit.

The spec is checked once; every task is then the same job named ``NAME[INDEX]``, with its task
kept beside the stored spec (``spec["array"]``, as ``workdir_upload`` is) and sent to the agent,
which sets the ``GPUPOOL_ARRAY_*`` variables. The tasks are written in one transaction (the
batch writer of :meth:`~gpupool.control.services.jobs.JobService.write_submits`): an acknowledged
submit made all of them, a refused one (unknown pool, tenant, class) none. With an idempotency key
each task gets ``KEY#INDEX``: a retry of the same array returns the same tasks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gpupool.control.errors import Invalid
from gpupool.control.services.auth import Actor
from gpupool.control.services.jobs import JobService
from gpupool.control.services.submits import new_job_id
from gpupool.control.services.uploads import UploadService
from gpupool.domain.arrays import array_tasks, array_throttle, parse_array, task_name
from gpupool.domain.errors import InvalidValue
from gpupool.domain.jobs import Job


def submit_array(
    jobs: JobService,
    actor: Actor,
    data: Mapping[str, Any],
    array: str,
    idempotency_key: str | None = None,
    *,
    held: bool = False,
    workdir_upload: str | None = None,
    queue_anyway: bool = False,
    begin: float | None = None,
) -> tuple[list[Job], bool]:
    """Store one job per index of ``array``; returns them in index order and whether they were
    created now (``False``: a retry with the same key returned the first submit's tasks)."""
    try:
        indices = parse_array(array)
        throttle = array_throttle(array)
    except InvalidValue as exc:
        raise Invalid(exc.message) from None
    if idempotency_key is not None and len(idempotency_key) > 190:
        raise Invalid(
            "an array's idempotency key must be at most 190 characters (each task adds #INDEX)"
        )
    first = replace(
        jobs.prepare(actor, data, idempotency_key), queue_anyway=queue_anyway, begin=begin
    )
    if workdir_upload is not None:
        UploadService(jobs.cp).check_for_job(actor.principal, workdir_upload, first.tenant)
    name = first.spec.name
    if len(task_name(name, indices[-1])) > 200:
        raise Invalid(f"the name {name!r} is too long for an array's task names: shorten it")
    items = [
        replace(
            first,
            spec=replace(first.spec, name=task_name(name, task.index)),
            key=None if idempotency_key is None else f"{idempotency_key}#{task.index}",
            held=held,
            workdir_upload=workdir_upload,
            array=task,
        )
        for task in array_tasks(new_job_id(), indices, throttle)
    ]
    made: list[Job] = []
    created = False
    for outcome in jobs.write_submits(items):
        if isinstance(outcome, BaseException):
            raise outcome
        job, new = outcome
        made.append(job)
        created = created or new
    return made, created
