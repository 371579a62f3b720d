"""``/v1/events``: cluster events, and a server-sent-event stream of events and job changes.

The stream (``/v1/events/stream``, ``text/event-stream``) polls the store once a second, so it
works the same behind any replica. Each message is ``event: job`` (a job state change the
caller may see) or ``event: cluster`` (alerts, node changes; for roles that read nodes), with a
JSON ``data`` line. ``Last-Event-ID`` is not used; a reconnecting client reloads its view.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from sqlalchemy import func, select

from gpupool.api.deps import Svc, Who
from gpupool.control.context import ControlPlane
from gpupool.control.errors import Unavailable
from gpupool.control.services.auth import Principal, require
from gpupool.domain.users import Permission
from gpupool.schemas.nodes import ClusterEventView
from gpupool.store.models import EventModel, JobEventModel, JobModel

router = APIRouter(tags=["events"])


@router.get("/v1/events", response_model=list[ClusterEventView])
def cluster_events(
    svc: Svc,
    who: Who,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    kind: str | None = None,
) -> list[ClusterEventView]:
    require(who, Permission.NODE_READ)
    query = select(EventModel).order_by(EventModel.id.desc()).limit(limit)
    if kind is not None:
        query = query.where(EventModel.kind.startswith(kind))
    with svc.cp.read() as s:
        return [
            ClusterEventView(
                id=e.id, time=e.time, kind=e.kind, subject=e.subject, message=e.message
            )
            for e in s.scalars(query)
        ]


def poll_events(
    cp: ControlPlane, who: Principal, after: tuple[int, int]
) -> tuple[list[str], tuple[int, int]]:
    last_job, last_cluster = after
    out: list[str] = []
    with cp.read() as s:
        query = (
            select(JobEventModel, JobModel.tenant)
            .join(JobModel, JobModel.id == JobEventModel.job_id)
            .where(JobEventModel.id > last_job)
            .order_by(JobEventModel.id)
            .limit(500)
        )
        if not who.cluster_wide:
            query = query.where(JobModel.tenant == who.tenant)
        for ev, _tenant in s.execute(query):
            last_job = max(last_job, ev.id)
            data = {"job": ev.job_id, "time": ev.time, "from": ev.source, "to": ev.target}
            out.append(f"event: job\ndata: {json.dumps(data)}\n\n")
        if who.can(Permission.NODE_READ):
            for e in s.scalars(
                select(EventModel)
                .where(EventModel.id > last_cluster)
                .order_by(EventModel.id)
                .limit(500)
            ):
                last_cluster = max(last_cluster, e.id)
                data2 = {"kind": e.kind, "subject": e.subject, "message": e.message, "time": e.time}
                out.append(f"event: cluster\ndata: {json.dumps(data2)}\n\n")
    return out, (last_job, last_cluster)


def stream_cursor(cp: ControlPlane) -> tuple[int, int]:
    with cp.tx() as s:
        return (
            int(s.scalar(select(func.max(JobEventModel.id))) or 0),
            int(s.scalar(select(func.max(EventModel.id))) or 0),
        )


@router.get("/v1/events/stream")
async def stream(request: Request, svc: Svc, who: Who) -> StreamingResponse:
    require(who, Permission.JOB_READ, Permission.JOB_READ_ANY, Permission.NODE_READ)
    cursor = await asyncio.to_thread(stream_cursor, svc.cp)

    async def messages() -> AsyncIterator[str]:
        nonlocal cursor
        yield ": connected\n\n"
        while not await request.is_disconnected():
            try:
                batch, cursor = await asyncio.to_thread(poll_events, svc.cp, who, cursor)
            except Unavailable:
                batch = [": database unavailable, retrying\n\n"]
            for message in batch:
                yield message
            await asyncio.sleep(1.0)

    return StreamingResponse(messages(), media_type="text/event-stream")
