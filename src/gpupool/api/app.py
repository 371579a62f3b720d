"""The API application factory.

``create_app(settings)`` builds the FastAPI app over one :class:`ControlPlane`: it checks the
store's schema (creating it on an empty database, refusing an unknown one), bootstraps the
defaults and the admin token on first start, mounts the ``/v1`` routers, ``/metrics``,
``/healthz``, ``/readyz`` and ``/docs`` (the API reference, served from the package; the
OpenAPI document is ``/openapi.json``), and (when ``settings.schedule``) runs the scheduling
loop in a thread for the app's lifetime. Routes stay thin: parse, authorise, call one service,
map errors.

For tests and embedding, pass ``control`` (a ready :class:`ControlPlane`, e.g. with a manual
clock) and ``loop`` (a :class:`SchedulingLoop` with a stub scheduler); nothing else changes.

The API knows no other edge package: routers served beside ``/v1`` (the dashboard of
:mod:`gpupool.web`) are given by the caller in ``routers``. The composition root is
``gpupool server`` (:mod:`gpupool.cli.server`: ``pool_app``), which mounts the dashboard.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.concurrency import run_in_threadpool

from gpupool import __version__
from gpupool.api import errors, openapi
from gpupool.api.bodylimit import BodyLimitMiddleware
from gpupool.api.clientaddr import parse_networks
from gpupool.api.deps import Services, principal
from gpupool.api.reference import api_reference_html
from gpupool.api.routers import (
    admin,
    agent,
    events,
    jobs,
    nodes,
    priority,
    results,
    uploads,
    usage,
    users,
)
from gpupool.api.shedding import AgentShedding, watch
from gpupool.api.shortway import AgentShortWay
from gpupool.control.bootstrap import bootstrap
from gpupool.control.context import ControlPlane
from gpupool.control.errors import Unavailable
from gpupool.control.machinery.loop import SchedulingLoop
from gpupool.control.services.auth import require
from gpupool.control.services.telemetry import read_sample
from gpupool.control.settings import ServerSettings
from gpupool.domain.users import Permission
from gpupool.metrics.collector import ClusterCollector
from gpupool.metrics.definitions import REGISTRY
from gpupool.scheduling.config import SchedulerConfig

log = logging.getLogger("gpupool.api")


#: Environment variable carrying the settings to worker processes of ``gpupool server --workers``.
SETTINGS_ENV = "GPUPOOL_SERVER_SETTINGS"


def settings_from_environment() -> ServerSettings:
    """The settings of one worker process of ``gpupool server --workers``."""
    return ServerSettings.from_json(os.environ[SETTINGS_ENV])


def create_app(
    settings: ServerSettings | None = None,
    *,
    control: ControlPlane | None = None,
    loop: SchedulingLoop | None = None,
    routers: Sequence[APIRouter] = (),
) -> FastAPI:
    """Build the API application (see the module docstring); ``routers`` are mounted after
    the API's own, each once (the dashboard's catch-all pages last)."""
    cp = control or ControlPlane(settings or ServerSettings.build())
    if loop is None and cp.settings.schedule:
        loop = SchedulingLoop(
            cp, config=SchedulerConfig(preempt_exempt_s=cp.settings.preempt_exempt_s)
        )
    cp.prepare()
    token_path = bootstrap(cp)
    if token_path is not None:
        log.warning("first start: the admin token is in %s (mode 0600)", token_path)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if loop is not None:
            loop.start()
        watcher = asyncio.create_task(watch(cp))  # lag, batched liveness (api/shedding.py)
        cp.start_listening()  # orders other replicas commit wake the long polls held here
        # Everything built so far (modules, the app, the ORM's mappers) lives as long as the
        # process: move it out of the collector's sight, so that a full collection scans only
        # what requests made. Without this, full collections took 100-250 ms under load and
        # stalled every request in flight (the submit p99).
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            watcher.cancel()
            cp.stop_listening()
            if loop is not None:
                loop.stop()
            app.state.services.jobs.close()  # submits queued for group commit are written
            if control is None:
                cp.close()

    app = FastAPI(
        title="gpupool",
        version=__version__,
        description="GPU pooling: fractional slices, fair scheduling, accounting.",
        lifespan=lifespan,
        # FastAPI's /docs and /redoc load their scripts from a CDN: a blank page offline.
        docs_url=None,
        redoc_url=None,
    )
    app.state.services = Services.build(cp, loop)
    app.state.admin_token_path = token_path
    app.state.trusted_proxies = parse_networks(cp.settings.trusted_proxies)
    errors.install(app)
    app.add_middleware(AgentShortWay)  # innermost: quiet heartbeats, long polls skip routing
    app.add_middleware(BodyLimitMiddleware)
    app.add_middleware(AgentShedding, cp=cp)  # outermost: sheds before anything else runs
    openapi.install(app, metrics_token=cp.settings.metrics_token)
    for module in (jobs, agent, nodes, admin, users, usage, events, uploads, results, priority):
        app.include_router(module.router)
    for router in routers:
        app.include_router(router)

    # Two views of the cluster: tenant names only for whom may see every tenant.
    registries: dict[bool, CollectorRegistry] = {}
    for named in (False, True):
        registries[named] = CollectorRegistry()
        registries[named].register(
            ClusterCollector(functools.partial(read_sample, cp, tenant_names=named))
        )

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"], response_model=None)
    def readyz() -> dict[str, str] | JSONResponse:
        """Readiness: the database answers (503 with a reason when it does not)."""
        if not cp.ping():
            raise Unavailable(
                "the database does not answer: the server keeps retrying; check PostgreSQL"
            )
        leader = "yes" if cp.epoch > 0 else "no"
        return {"status": "ready", "leader": leader}

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        """The API reference as one self-contained page (no scripts, works offline)."""
        return HTMLResponse(api_reference_html(app.openapi()))

    @app.get("/v1/version", tags=["meta"])
    def version() -> dict[str, str]:
        """The server's gpupool version."""
        return {"version": __version__}

    @app.get("/metrics", tags=["health"])
    async def metrics(request: Request) -> Response:
        """Prometheus metrics (text format); see :mod:`gpupool.metrics`. With
        ``--metrics-token`` only an admin's or operator's token may read them. Tenant names
        label the queue with ``--metrics-tenants``, or for a caller whose token sees every
        tenant (admin, operator)."""
        named = cp.settings.metrics_tenants
        if cp.settings.metrics_token or request.headers.get("authorization"):
            who = await principal(request, app.state.services)
            if cp.settings.metrics_token:
                require(who, Permission.JOB_READ_ANY)
            named = named or who.cluster_wide
        return await run_in_threadpool(_metrics_body, named)

    def _metrics_body(named: bool) -> Response:
        body = generate_latest(registries[named]) + generate_latest(REGISTRY)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return app
