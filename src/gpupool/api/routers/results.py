"""Job results (:mod:`gpupool.control.services.results`): nodes send them, owners fetch them.

``POST /v1/agent/results/{assignment_id}``: a node's agent sends one replica's results as a
gzip'd tar body (``Content-Type: application/gzip``), or an empty body with
``X-Results-Problem`` saying why it cannot. ``GET /v1/jobs/{job_id}/results?replica=N``: the
archive, for whoever may read the job (tenant-checked: others' jobs are not found).
"""

from __future__ import annotations

from typing import Annotated

import anyio.to_thread
from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse, Response

from gpupool.api.deps import Act, Svc, Who
from gpupool.control.services.results import AGENT_HEADER, PROBLEM_HEADER, ResultService
from gpupool.control.services.uploads import TooLarge, too_large_message

router = APIRouter(tags=["results"])


@router.post("/v1/agent/results/{assignment_id}", status_code=204)
async def store_results(assignment_id: str, request: Request, svc: Svc, act: Act) -> Response:
    """One replica's results from its node (role ``agent``, and the agent id of the node the
    assignment ran on in ``X-Gpupool-Agent-Id``: 403 from any other)."""
    results = ResultService(svc.cp)
    problem = request.headers.get(PROBLEM_HEADER)
    agent_id = request.headers.get(AGENT_HEADER)
    received: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > results.limit:
            raise TooLarge(too_large_message(results.limit))
        received.append(chunk)
    data = b"".join(received)
    await anyio.to_thread.run_sync(
        lambda: results.store(act, assignment_id, data, problem, agent_id)
    )
    return Response(status_code=204)


@router.get("/v1/jobs/{job_id}/results", response_class=FileResponse)
def fetch_results(
    job_id: str, svc: Svc, who: Who, replica: Annotated[int, Query(ge=0)] = 0
) -> FileResponse:
    """What the job left in its uploaded working directory, as a gzip'd tar (``gpupool fetch
    JOB DEST`` unpacks it). 404 for a job that is not the caller's; 409 for a job without an
    upload, while it runs, or when its node could not send them (the detail says why)."""
    found = ResultService(svc.cp).find(who, job_id, replica)
    return FileResponse(
        found.path, media_type="application/gzip", filename=f"{job_id}.{replica}.results.tar.gz"
    )
