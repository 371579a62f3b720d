"""``/v1/agent``: the node-agent protocol (see :mod:`gpupool.schemas.agent`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from gpupool.api.deps import Act, Svc, Who, calling_actor
from gpupool.control.services.auth import require
from gpupool.domain.users import Permission
from gpupool.schemas.agent import (
    DELTA_ANSWER_FIELDS,
    HeartbeatRequest,
    HeartbeatResponse,
    LogAck,
    LogChunkRequest,
    OrdersAnswer,
    RegisterRequest,
    RegisterResponse,
)

router = APIRouter(prefix="/v1/agent", tags=["agent"])


@router.post("/register", response_model=RegisterResponse)
def register(body: RegisterRequest, svc: Svc, act: Act) -> RegisterResponse:
    return svc.nodes.register(act, body)


@router.post("/heartbeat", response_model=HeartbeatResponse)
async def heartbeat(body: HeartbeatRequest, request: Request) -> Response:
    """The hottest route: a quiet heartbeat (nothing new, see
    ``control/machinery/settled.py``) is answered on the event loop with the kept answer's
    bytes; any other is applied in a worker thread."""
    svc, act = await calling_actor(request)
    answer = svc.heartbeat.quietly(act, body)
    if answer is None:
        answer = await run_in_threadpool(svc.heartbeat.heartbeat, act, body)
    # an agent that sends no seq rejects answer fields it does not know: none are sent to it
    unknown = set(DELTA_ANSWER_FIELDS) if body.seq is None else None
    return Response(answer.model_dump_json(exclude=unknown), media_type="application/json")


@router.post("/logs", response_model=LogAck)
def ship_logs(body: LogChunkRequest, svc: Svc, act: Act) -> LogAck:
    """New bytes of a replica's stdout or stderr (see :mod:`gpupool.control.services.logs`)."""
    return svc.logs.append(act, body)


@router.get("/nodes/{name}/orders", response_model=OrdersAnswer)
async def wait_for_orders(
    name: str,
    svc: Svc,
    who: Who,
    since: Annotated[int, Query(ge=-1, le=2**62)] = -1,
    timeout: Annotated[float, Query(ge=0, le=60)] = 25.0,
) -> OrdersAnswer:
    """The long poll: answers as soon as this server commits a start or stop for the node
    (its order sequence passes ``since``), else after ``timeout`` s. Holds no thread."""
    require(who, Permission.AGENT)
    seq = await svc.cp.orders.wait(name, since, timeout)
    return OrdersAnswer(seq=seq, changed=seq > since)
