"""Job references on the command line, as ``submit`` prints them: a job id, a job array's id
(``submit -a`` prints it: ``Submitted array 5d4c3b2a1f0e of 10 jobs``), or one task of an array
as ``ARRAY_INDEX`` (Slurm's ``123_4``) or ``ARRAY[INDEX]``.

:func:`resolve` answers a job, or an array's tasks in index order; a reference that names
neither is the server's "not found". ``show`` and ``logs`` take all three forms.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeVar

from gpupool.client.errors import ApiError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpupool.client.sdk import Client
    from gpupool.schemas.jobs import JobView


#: A job as the caller reads it: a ``JobView``, or a row of the hot path; it has ``array_index``.
J = TypeVar("J")

_TASK_RE = re.compile(r"^([0-9A-Za-z-]+)(?:_(\d+)|\[(\d+)\])$")


def _tasks(gp: Client, array_id: str) -> list[JobView]:
    return sorted(gp.list(array=array_id), key=lambda t: t.array_index or 0)


def _index(job: object) -> int | None:
    index: int | None = getattr(job, "array_index", None)
    return index


def resolve_with(
    get: Callable[[str], J], tasks_of: Callable[[str], list[J]], ref: str
) -> J | list[J]:
    """The job ``ref`` names, or the tasks of the array it names (see the module docstring),
    with ``get(job_id)`` and ``tasks_of(array_id)`` (tasks in index order) doing the asking:
    the SDK's or the hot path's (:mod:`gpupool.cli.hotjobs`)."""
    task = _TASK_RE.match(ref)
    if task is not None:
        array_id, index = task.group(1), int(task.group(2) or task.group(3))
        tasks = tasks_of(array_id)
        found = [t for t in tasks if _index(t) == index]
        if found:
            return found[0]
        if tasks:
            have = ", ".join(str(_index(t)) for t in tasks[:10])
            raise ApiError(
                404,
                "not found",
                f"job array {array_id} has no task {index} (its tasks: {have}"
                + (", ...)" if len(tasks) > 10 else ")"),
            )
    try:
        return get(ref)
    except ApiError as exc:
        if exc.status != 404:
            raise
        tasks = tasks_of(ref)
        if not tasks:
            raise
        return tasks


def resolve(gp: Client, ref: str) -> JobView | list[JobView]:
    """The job ``ref`` names, or the tasks of the array it names, through the SDK."""
    return resolve_with(gp.get, lambda array_id: _tasks(gp, array_id), ref)
