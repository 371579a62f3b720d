"""Errors as ``application/problem+json`` (RFC 9457), and auditing refused calls.

Every service error maps to its status with its message as ``detail``; request validation
errors list each bad field. A mutating call (POST, PUT, PATCH, DELETE) that fails is written
to the audit log here, in its own transaction, rate-limited per caller by
:class:`~gpupool.control.services.audit.RefusedCalls`; successful ones were written by the service.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from gpupool.api.clientaddr import client_address
from gpupool.control.errors import ServiceError, Unauthorized, Unavailable
from gpupool.control.services.auth import Actor, authenticate
from gpupool.schemas.common import FieldProblem, Problem

log = logging.getLogger("gpupool.api")

PROBLEM = "application/problem+json"
MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: High-frequency protocol calls recorded in node state rather than the audit log.
NOT_AUDITED = ("/v1/agent/heartbeat", "/v1/agent/logs")


def problem_response(
    request: Request,
    status: int,
    title: str,
    detail: str,
    errors: list[FieldProblem] | None = None,
) -> JSONResponse:
    body = Problem(
        title=title, status=status, detail=detail, instance=request.url.path, errors=errors or []
    )
    _audit_failure(request, status)
    headers = {"Retry-After": "5"} if status == 503 else None
    return JSONResponse(
        body.model_dump(mode="json"), status_code=status, media_type=PROBLEM, headers=headers
    )


def _audit_failure(request: Request, status: int) -> None:
    if request.method not in MUTATING or request.url.path in NOT_AUDITED or status == 503:
        return
    svc = getattr(request.app.state, "services", None)
    if svc is None:
        return
    who = getattr(request.state, "principal", None)
    remote = client_address(request)
    try:
        with svc.cp.tx() as s:
            svc.refusals.record(
                s,
                Actor(principal=who) if who is not None else None,
                svc.cp.now(),
                status=status,
                method=request.method,
                path=request.url.path,
                remote=remote,
            )
    except Unavailable:
        log.warning(
            "could not audit a refused %s %s: database unavailable",
            request.method,
            request.url.path,
        )


def _unauthenticated(request: Request) -> Unauthorized | None:
    """Why the caller of a request that failed validation is not authenticated, if they are
    not: a body (or query) that does not parse is found before the route's dependencies run,
    and an anonymous caller must learn that they need a token (401), not what a valid body
    looks like (422). ``None`` when the token is valid or the store cannot tell now."""
    if getattr(request.state, "principal", None) is not None:
        return None
    svc = getattr(request.app.state, "services", None)
    if svc is None:
        return None
    from gpupool.api.deps import bearer  # deps imports the services; errors is imported early

    try:
        with svc.cp.read() as s:
            request.state.principal = authenticate(
                s, bearer(request), svc.cp.now(), svc.cp.principals
            )
    except Unauthorized as exc:
        return exc
    except Unavailable:
        return None
    return None


def install(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    def _service_error(request: Request, exc: ServiceError) -> JSONResponse:
        return problem_response(request, exc.status, exc.title, exc.message)

    @app.exception_handler(RequestValidationError)
    def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        refusal = _unauthenticated(request)
        if refusal is not None:  # who calls is judged before what they sent
            return problem_response(request, refusal.status, refusal.title, refusal.message)
        problems = [
            FieldProblem(
                field=".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body",
                message=str(err.get("msg", "invalid")),
            )
            for err in exc.errors()
        ]
        detail = "; ".join(f"{p.field}: {p.message}" for p in problems)
        return problem_response(
            request, 422, "invalid request", f"the request is not valid: {detail}", problems
        )

    @app.exception_handler(StarletteHTTPException)
    def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = str(exc.detail)
        title = "error"
        if exc.status_code == 413:
            title = "request too large"
        elif exc.status_code == 404:
            detail = f"no such endpoint {request.method} {request.url.path}: see /docs"
        elif exc.status_code == 405:
            detail = f"{request.method} is not allowed on {request.url.path}: see /docs"
        return problem_response(request, exc.status_code, title, detail)
