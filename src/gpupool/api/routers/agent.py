"""``/v1/agent``: the node-agent protocol (see :mod:`gpupool.schemas.agent`)."""

from __future__ import annotations

from fastapi import APIRouter

from gpupool.api.deps import Act, Svc
from gpupool.schemas.agent import (
    HeartbeatRequest,
    HeartbeatResponse,
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
