"""``/v1/agent``: the node-agent protocol (see :mod:`gpupool.schemas.agent`)."""

from __future__ import annotations

from fastapi import APIRouter

from gpupool.api.deps import Act, Svc
from gpupool.schemas.agent import (
    HeartbeatRequest,
    HeartbeatResponse,
    LogAck,
    LogChunkRequest,
    RegisterRequest,
    RegisterResponse,
)

router = APIRouter(prefix="/v1/agent", tags=["agent"])


@router.post("/register", response_model=RegisterResponse)
def register(body: RegisterRequest, svc: Svc, act: Act) -> RegisterResponse:
    return svc.nodes.register(act, body)


@router.post("/heartbeat", response_model=HeartbeatResponse)
def heartbeat(body: HeartbeatRequest, svc: Svc, act: Act) -> HeartbeatResponse:
    return svc.heartbeat.heartbeat(act, body)


@router.post("/logs", response_model=LogAck)
def ship_logs(body: LogChunkRequest, svc: Svc, act: Act) -> LogAck:
    """New bytes of a replica's stdout or stderr (see :mod:`gpupool.control.logs`)."""
    return svc.logs.append(act, body)
