"""The OpenAPI document, telling the truth about authentication and errors.

FastAPI's generated document knows neither that gpupool's routes take a bearer token (the
token is read by :func:`gpupool.api.deps.principal`, not by a FastAPI security class, to keep
the hot routes cheap) nor that every error is ``application/problem+json``. This module adds:

- the ``bearer`` security scheme, and ``security`` on every operation but the public ones
  (:data:`PUBLIC_PATHS`; ``/metrics`` too unless the server requires a token for it);
- per operation, the error answers it can give, each with the :class:`Problem` schema:
  401 and 403 where a token is needed, 404 and 503 under ``/v1``, 413 where there is a body,
  400, 409, 413 and 422 on mutating calls, 422 where there are parameters or a body (replacing
  FastAPI's ``HTTPValidationError``, which gpupool never sends);
- ``text/plain`` for ``/metrics``;
- 201 beside 200 on a ``PUT`` (create-or-replace answers 201 when the object is new).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import TypeAdapter

from gpupool.schemas.common import Problem

PROBLEM = "application/problem+json"
#: Paths anyone may call without a token.
PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/v1/version", "/openapi.json", "/docs"})
MUTATING = frozenset({"post", "put", "patch", "delete"})
SCHEME = {
    "type": "http",
    "scheme": "bearer",
    "description": "an API token (gp_...): the admin token is in $GPUPOOL_HOME/admin-token; "
    "create others with `gpupool tokens create`",
}
MEANINGS = {
    400: "the request cannot be done as asked (the detail says why)",
    401: "no token, or the token is not valid, revoked or expired",
    403: "the token's role may not do this",
    404: "no such object (or not visible to this token)",
    409: "the object is in a state that does not allow this",
    413: "the request body is over the server's limit",
    422: "a parameter or the body is not valid (the errors list each field)",
    503: "the store does not answer, or this server is not the leader: retry after Retry-After",
}


def _codes(path: str, method: str, op: dict[str, Any], public: bool) -> list[int]:
    codes: set[int] = set()
    if not public:
        codes |= {401, 403}
    if path.startswith("/v1/"):
        codes |= {404, 503}
    if "requestBody" in op:
        codes |= {413, 422}
    if op.get("parameters"):
        codes.add(422)
    if method in MUTATING:  # every body is limited; a raw one (an upload) is checked by hand
        codes |= {400, 409, 413, 422}
    return sorted(codes)


def _describe(app: FastAPI, metrics_token: bool) -> dict[str, Any]:
    schema = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    components = schema.setdefault("components", {})
    components.setdefault("securitySchemes", {})["bearer"] = SCHEME
    problem = TypeAdapter(Problem).json_schema(ref_template="#/components/schemas/{model}")
    schemas = components.setdefault("schemas", {})
    schemas.update(problem.pop("$defs", {}))
    schemas["Problem"] = problem
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    ref = {"schema": {"$ref": "#/components/schemas/Problem"}}
    for path, operations in schema.get("paths", {}).items():
        for method, op in operations.items():
            public = path in PUBLIC_PATHS or (path == "/metrics" and not metrics_token)
            if not public:
                op["security"] = [{"bearer": []}]
            responses = op.setdefault("responses", {})
            if path == "/metrics":  # Prometheus' text format, not JSON
                text = {"text/plain": {"schema": {"type": "string"}}}
                responses["200"] = {"description": "Prometheus metrics", "content": text}
            if method == "put" and "200" in responses:  # create-or-replace: 201 when new
                responses.setdefault("201", {**responses["200"], "description": "created"})
            for code in _codes(path, method, op, public):
                responses[str(code)] = {"description": MEANINGS[code], "content": {PROBLEM: ref}}
    return schema


def install(app: FastAPI, *, metrics_token: bool = False) -> None:
    """Serve the described document at ``/openapi.json`` (built once, on first request)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _describe(app, metrics_token)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
