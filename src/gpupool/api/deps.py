"""Request dependencies: the services, and who is calling.

``principal`` authenticates the bearer token (401 with a hint when missing or bad) and stores
the principal on ``request.state`` so the error handler can audit refused calls; ``actor``
adds where the call came from, for the audit log.

The dependencies are coroutines so that they run on the event loop, not each in a worker
thread: a token found in the principal cache costs no thread hop and no query; only a cache
miss reads the store, in a worker thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Query, Request
from starlette.concurrency import run_in_threadpool

from gpupool.api.clientaddr import client_address
from gpupool.control.context import ControlPlane
from gpupool.control.machinery.loop import SchedulingLoop
from gpupool.control.services.accounting import AccountingService
from gpupool.control.services.audit import RefusedCalls
from gpupool.control.services.auth import Actor, Principal, authenticate
from gpupool.control.services.heartbeat import HeartbeatService
from gpupool.control.services.jobs import JobService
from gpupool.control.services.logs import LogService
from gpupool.control.services.nodes import NodeService
from gpupool.control.services.pools import PoolService
from gpupool.control.services.tenants import TenantService
from gpupool.control.services.uploads import UploadService
from gpupool.control.services.users import UserService
from gpupool.domain.bounds import EPOCH_S

#: A time in a query string: epoch seconds, finite, from 1970 to the year 9999 (``1e999`` and
#: ``nan`` are a 422, not a comparison that matches everything or nothing).
EpochQuery = Annotated[
    float | None,
    Query(ge=0, le=EPOCH_S.high, allow_inf_nan=False, description="epoch seconds"),
]
#: A byte offset or count in a query string (fits the store's 64-bit integers).
OffsetQuery = Annotated[int | None, Query(ge=0, le=2**62)]


@dataclass
class Services:
    cp: ControlPlane
    jobs: JobService
    nodes: NodeService
    heartbeat: HeartbeatService
    pools: PoolService
    tenants: TenantService
    users: UserService
    accounting: AccountingService
    logs: LogService
    uploads: UploadService
    refusals: RefusedCalls
    loop: SchedulingLoop | None = None

    @classmethod
    def build(cls, cp: ControlPlane, loop: SchedulingLoop | None) -> Services:
        return cls(
            cp=cp,
            jobs=JobService(cp),
            nodes=NodeService(cp),
            heartbeat=HeartbeatService(cp),
            pools=PoolService(cp),
            tenants=TenantService(cp),
            users=UserService(cp),
            accounting=AccountingService(cp),
            logs=LogService(cp),
            uploads=UploadService(cp),
            refusals=RefusedCalls(),
            loop=loop,
        )


async def services(request: Request) -> Services:
    svc: Services = request.app.state.services
    return svc


def bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def _authenticate(cp: ControlPlane, secret: str | None, now: float) -> Principal:
    with cp.read() as s:
        return authenticate(s, secret, now, cp.principals)


async def principal(request: Request, svc: Annotated[Services, Depends(services)]) -> Principal:
    secret, now = bearer(request), svc.cp.now()
    who = svc.cp.principals.get(secret, now) if secret else None
    if who is None:
        who = await run_in_threadpool(_authenticate, svc.cp, secret, now)
    request.state.principal = who
    return who


async def actor(request: Request, who: Annotated[Principal, Depends(principal)]) -> Actor:
    return actor_of(request, who)


def actor_of(request: Request, who: Principal) -> Actor:
    remote = client_address(request)
    return Actor(principal=who, method=request.method, path=request.scope["path"], remote=remote)


async def calling_actor(request: Request) -> tuple[Services, Actor]:
    """The services and the actor, as ``Svc`` and ``Act`` give them, for a hot route that
    takes only the request: FastAPI's dependency solving costs more per request than the
    work these do (see docs/benchmarks.md, "Control plane")."""
    svc = await services(request)
    return svc, actor_of(request, await principal(request, svc))


Svc = Annotated[Services, Depends(services)]
Who = Annotated[Principal, Depends(principal)]
Act = Annotated[Actor, Depends(actor)]
