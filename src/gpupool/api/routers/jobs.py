"""``/v1/jobs``: submit, list, get, cancel, hold, release, requeue, events."""

from __future__ import annotations

import functools
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import PlainTextResponse
from starlette.concurrency import run_in_threadpool

from gpupool.api.deps import Act, OffsetQuery, Svc, Who, calling_actor
from gpupool.api.views import event_view, job_view
from gpupool.control.errors import Invalid
from gpupool.control.services.arrays import submit_array
from gpupool.control.services.bulk import (
    BulkAction,
    BulkService,
    Selection,
    forbid_other_tenant,
    parse_states,
)
from gpupool.control.services.jobviews import JobFilter
from gpupool.control.services.resize import ResizeService
from gpupool.domain.errors import InvalidValue
from gpupool.domain.jobspec import MAX_REPLICAS
from gpupool.domain.states import JobState
from gpupool.domain.units import parse_gpus, parse_memory
from gpupool.schemas.agent import LogStream
from gpupool.schemas.jobs import (
    BulkJobChange,
    BulkJobsRequest,
    BulkJobsResponse,
    CancelJobRequest,
    JobEventView,
    JobList,
    JobView,
    ResizeJobRequest,
    SubmitJobRequest,
    SubmitJobResponse,
    UpdateJobRequest,
)

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


#: The ``Idempotency-Key`` header, documented here because the route reads it itself.
IDEMPOTENCY_HEADER = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "schema": {"type": "string", "maxLength": 200},
    "description": "retry-safe submits: the same key returns the same job",
}


@router.post(
    "",
    status_code=201,
    response_model=SubmitJobResponse,
    openapi_extra={"parameters": [IDEMPOTENCY_HEADER]},
)
async def submit(body: SubmitJobRequest, request: Request) -> Response:
    """Submit a job; with an idempotency key, a retry returns the first job (200).

    The hot route: it takes only the body and the request (see ``calling_actor``), checks on
    the event loop, and writes through group commit."""
    svc, act = await calling_actor(request)
    key = body.idempotency_key or request.headers.get("idempotency-key")
    if key is not None and len(key) > 200:
        raise Invalid("the Idempotency-Key header is too long: use at most 200 characters")
    when: dict[str, Any] = {
        "held": body.hold,
        "queue_anyway": body.queue_anyway,
        "begin": body.begin,
    }
    if body.array is not None:
        tasks, created = await run_in_threadpool(
            functools.partial(
                submit_array,
                svc.jobs,
                act,
                body.spec,
                body.array,
                key,
                workdir_upload=body.workdir_upload,
                **when,
            )
        )
        views = [job_view(t) for t in tasks]
        view = SubmitJobResponse(job=views[0], created=created, array=views)
    else:
        if body.workdir_upload is None:
            job, created = await svc.jobs.submit_async(act, body.spec, key, **when)
        else:
            job, created = await run_in_threadpool(
                functools.partial(
                    svc.jobs.submit, act, body.spec, key, workdir_upload=body.workdir_upload, **when
                )
            )
        view = SubmitJobResponse(job=job_view(job), created=created)
    # The view was validated when built: serialise it as it is (FastAPI would validate the
    # returned model again against response_model).
    return Response(
        view.model_dump_json(), status_code=201 if created else 200, media_type="application/json"
    )


@router.post("/bulk", response_model=BulkJobsResponse)
def bulk(body: BulkJobsRequest, svc: Svc, act: Act) -> BulkJobsResponse:
    """Cancel, hold or release every job the selection names, in one transaction (see
    control/services/bulk.py): ids and filters narrow together; an empty selection is 422."""
    forbid_other_tenant(act.principal, body.tenant)
    selection = Selection(
        ids=tuple(body.ids),
        user=body.user,
        name=body.name,
        states=parse_states(body.states),
        array_id=body.array,
        tenant=body.tenant,
        pool=body.pool,
    )
    done = BulkService(svc.cp).apply(act, BulkAction(body.action), selection, body.reason)
    return BulkJobsResponse(
        action=done.action.value,
        changed=[
            BulkJobChange(id=c.id, name=c.name, state=c.state, held=c.held) for c in done.changed
        ],
        not_found=done.not_found,
        skipped=[
            BulkJobChange(id=c.id, name=c.name, state=c.state, held=c.held) for c in done.skipped
        ],
        refused=done.refused,
    )


@router.get("", response_model=JobList)
def list_jobs(
    svc: Svc,
    who: Who,
    *,
    state: Annotated[list[str] | None, Query(description="names or codes, e.g. R, PD")] = None,
    tenant: str | None = None,
    user: str | None = None,
    pool: str | None = None,
    name: str | None = None,
    array: Annotated[str | None, Query(description="the tasks of this job array")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: str | None = None,
) -> JobList:
    try:
        states = tuple(JobState.parse(s) for s in state or ())
    except ValueError as exc:
        raise Invalid(str(exc)) from None
    page = svc.jobs.list_jobs(
        who, JobFilter(states, tenant, user, pool, name, array), limit=limit, cursor=cursor
    )
    return JobList(jobs=[job_view(d.job, d) for d in page.details], next_cursor=page.next_cursor)


@router.get("/{job_id}", response_model=JobView)
def get_job(job_id: str, svc: Svc, who: Who) -> JobView:
    """A job with its pending reason, estimated start and priority factor table."""
    detail = svc.jobs.get(who, job_id)
    factors = svc.loop.priorities.get(job_id) if svc.loop is not None else None
    return job_view(detail.job, detail, factors)


@router.get("/{job_id}/events", response_model=list[JobEventView])
def job_events(job_id: str, svc: Svc, who: Who) -> list[JobEventView]:
    return [event_view(e) for e in svc.jobs.events(who, job_id)]


@router.get("/{job_id}/logs", response_class=PlainTextResponse)
def job_logs(
    job_id: str,
    svc: Svc,
    who: Who,
    *,
    stream: LogStream = LogStream.STDOUT,
    replica: Annotated[int, Query(ge=0, le=MAX_REPLICAS)] = 0,
    tail: Annotated[int | None, Query(ge=0, le=100_000)] = None,
    offset: OffsetQuery = None,
) -> Response:
    """A replica's stdout or stderr, the bytes as the job wrote them: the last ``tail`` lines,
    or a page from log byte ``offset`` (at most 4 MiB; without either, from the oldest kept).

    Headers: ``X-Log-Start`` (offset of the first byte returned; past ``offset`` when the bytes
    asked for were dropped), ``X-Log-Next`` (the offset to ask for next, to follow the log),
    ``X-Log-First`` (the oldest offset still kept: the server keeps the newest
    ``log_keep_bytes``), ``X-Log-End`` (the offset after the newest byte received) and
    ``X-Log-Complete`` (``true`` once the job has ended and its node sent the end of the
    stream: read up to ``X-Log-End`` and nothing is missing)."""
    got = svc.logs.read(who, job_id, stream, replica=replica, tail=tail, offset=offset)
    return Response(
        got.data,
        media_type="text/plain; charset=utf-8",
        headers={
            "X-Log-Start": str(got.start),
            "X-Log-Next": str(got.next_offset),
            "X-Log-First": str(got.first),
            "X-Log-End": str(got.end),
            "X-Log-Complete": "true" if got.complete else "false",
        },
    )


@router.post("/{job_id}/cancel", response_model=JobView)
def cancel(job_id: str, svc: Svc, act: Act, body: CancelJobRequest | None = None) -> JobView:
    return job_view(svc.jobs.cancel(act, job_id, body.reason if body else None))


@router.patch("/{job_id}", response_model=JobView)
def update(job_id: str, body: UpdateJobRequest, svc: Svc, act: Act) -> JobView:
    """Change a pending job's name, priority class, time limit, expected duration or
    preemptibility (like scontrol update); 409 once it has started."""
    return job_view(svc.jobs.update(act, job_id, body.changes()))


@router.post("/{job_id}/resize", response_model=JobView)
def resize(job_id: str, body: ResizeJobRequest, svc: Svc, act: Act) -> JobView:
    """Resize a running shim job's slice in place (quota and free capacity admitted, audited,
    an event); 409 when it cannot be."""
    try:
        milli = parse_gpus(body.gpus) if body.gpus is not None else None
        memory = parse_memory(body.gpu_memory, field="gpu_memory") if body.gpu_memory else None
    except InvalidValue as exc:
        raise Invalid(exc.message) from None
    detail = ResizeService(svc.cp).resize(act, job_id, milli=milli, memory_mib=memory)
    return job_view(detail.job, detail)


@router.post("/{job_id}/hold", response_model=JobView)
def hold(job_id: str, svc: Svc, act: Act) -> JobView:
    return job_view(svc.jobs.set_held(act, job_id, True))


@router.post("/{job_id}/release", response_model=JobView)
def release(job_id: str, svc: Svc, act: Act) -> JobView:
    return job_view(svc.jobs.set_held(act, job_id, False))


@router.post("/{job_id}/requeue", response_model=JobView)
def requeue(job_id: str, svc: Svc, act: Act) -> JobView:
    return job_view(svc.jobs.requeue(act, job_id))
