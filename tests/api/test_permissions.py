"""The permission matrix: every role against every endpoint, in its own tenant and another's.

Outcomes: ``ok`` (allowed: 2xx, or 409 when the call is allowed but the object's state refuses
it), ``403`` (the role may not do this) and ``404`` (the object belongs to another tenant and
is invisible). Roles, in column order: admin, operator, tenant-admin, member, viewer, agent.
The tenant-scoped users are in tenant ``red``; "other" objects belong to tenant ``blue``.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from gpupool.control.context import ControlPlane
from tests.api.helpers import ROLES, Api, make_api

AGENT_REG: dict[str, Any] = {
    "node": "n1",
    "cpu_milli": 1000,
    "memory_mib": 1024,
    "agent_version": "t",
    # Registering again with the same devices: a device left out would leave the node.
    "devices": [{"uuid": "n1-gpu0", "index": 0, "model": "T4", "memory_mib": 15360}],
}


@dataclass(frozen=True)
class Case:
    method: str
    route: str  # the route template as FastAPI lists it
    own: str  # expected outcome per role, in ROLES order
    other: str | None = None  # same for another tenant's object; None = not tenant-scoped
    body: Callable[[str], Any] | None = None  # body for tenant "red"/"blue"


def _archive(tenant: str) -> bytes:
    """A one-file gzip'd tar, as `gpupool submit --workdir` sends it."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        data = f"print('{tenant}')\n".encode()
        info = tarfile.TarInfo("train.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _job_body(tenant: str) -> dict[str, Any]:
    return {"spec": {"name": "x", "command": ["true"], "tenant": tenant}}


CASES = [
    Case("POST", "/v1/jobs", "ok ok ok ok 403 403", "ok ok 403 403 403 403", _job_body),
    Case("GET", "/v1/jobs", "ok ok ok ok ok 403"),
    Case("GET", "/v1/priorities", "ok ok ok ok ok 403"),
    Case("GET", "/v1/jobs/{job_id}", "ok ok ok ok ok 403", "ok ok 404 404 404 403"),
    Case("GET", "/v1/jobs/{job_id}/events", "ok ok ok ok ok 403", "ok ok 404 404 404 403"),
    Case("GET", "/v1/jobs/{job_id}/logs", "ok ok ok ok ok 403", "ok ok 404 404 404 403"),
    Case("GET", "/v1/jobs/{job_id}/results", "ok ok ok ok ok 403", "ok ok 404 404 404 403"),
    Case("POST", "/v1/jobs/{job_id}/cancel", "ok ok ok ok 403 403", "ok ok 404 404 404 403"),
    Case(
        "POST",
        "/v1/jobs/bulk",
        "ok ok ok ok 403 403",
        "ok ok 403 403 403 403",
        lambda t: {"action": "hold", "tenant": t, "name": "x"},
    ),
    Case(
        "PATCH",
        "/v1/jobs/{job_id}",
        "ok ok ok ok 403 403",
        "ok ok 404 404 404 403",
        lambda t: {"time_limit": "2h"},
    ),
    Case("POST", "/v1/jobs/{job_id}/hold", "ok ok ok ok 403 403", "ok ok 404 404 404 403"),
    Case("POST", "/v1/jobs/{job_id}/release", "ok ok ok ok 403 403", "ok ok 404 404 404 403"),
    Case("POST", "/v1/jobs/{job_id}/requeue", "ok ok ok ok 403 403", "ok ok 404 404 404 403"),
    Case(
        "POST",
        "/v1/jobs/{job_id}/resize",
        "ok ok ok ok 403 403",
        "ok ok 404 404 404 403",
        lambda t: {"gpu_memory": "1GiB"},  # a pending job: 409 for the roles that may
    ),
    Case("POST", "/v1/agent/register", "403 403 403 403 403 ok", None, lambda t: AGENT_REG),
    Case(
        "POST",
        "/v1/agent/heartbeat",
        "403 403 403 403 403 ok",
        None,
        lambda t: {"node": "n1", "epoch": 0},
    ),
    Case(
        "POST",
        "/v1/agent/logs",
        "403 403 403 403 403 ok",
        None,
        lambda t: {"assignment_id": "unknown", "stream": "stdout", "offset": 0, "data": ""},
    ),
    Case(
        "POST",
        "/v1/agent/results/{assignment_id}",
        "403 403 403 403 403 ok",
        None,
        lambda t: b"",
    ),
    Case("GET", "/v1/agent/nodes/{name}/orders", "403 403 403 403 403 ok"),
    Case("GET", "/v1/nodes", "ok ok ok ok ok 403"),
    Case("GET", "/v1/nodes/{name}", "ok ok ok ok ok 403"),
    Case(
        "POST", "/v1/nodes/{name}/state", "ok ok 403 403 403 403", None, lambda t: {"state": "up"}
    ),
    Case("DELETE", "/v1/nodes/{name}", "ok ok 403 403 403 403"),  # 409: n1 is up
    Case("GET", "/v1/devices", "ok ok ok ok ok 403"),
    Case(
        "POST",
        "/v1/devices/{uuid}/pool",
        "ok ok 403 403 403 403",
        None,
        lambda t: {"pool": "default"},
    ),
    Case("GET", "/v1/pools", "ok ok ok ok ok 403"),
    Case("GET", "/v1/pools/{name}", "ok ok ok ok ok 403"),
    Case("PUT", "/v1/pools/{name}", "ok ok 403 403 403 403", None, lambda t: {}),
    Case("DELETE", "/v1/pools/{name}", "ok ok 403 403 403 403"),
    Case("GET", "/v1/tenants", "ok ok ok ok ok 403"),
    Case("GET", "/v1/tenants/{name}", "ok ok ok ok ok 403", "ok ok 404 404 404 403"),
    Case("PUT", "/v1/tenants/{name}", "ok 403 403 403 403 403", None, lambda t: {}),
    Case("DELETE", "/v1/tenants/{name}", "ok 403 403 403 403 403"),
    Case(
        "PUT",
        "/v1/tenants/{name}/quotas/{pool}",
        "ok 403 403 403 403 403",
        None,
        lambda t: {"guaranteed_milli": 1000},
    ),
    Case("DELETE", "/v1/tenants/{name}/quotas/{pool}", "ok 403 403 403 403 403"),
    Case("GET", "/v1/priority-classes", "ok ok ok ok ok 403"),
    Case(
        "PUT",
        "/v1/priority-classes/{name}",
        "ok 403 403 403 403 403",
        None,
        lambda t: {"value": 700},
    ),
    Case("POST", "/v1/uploads", "ok ok ok ok 403 403", None, _archive),
    Case(
        "GET", "/v1/agent/uploads/{upload_id}", "403 403 403 403 403 ok", "403 403 403 403 403 ok"
    ),
    Case("GET", "/v1/whoami", "ok ok ok ok ok ok"),
    Case("GET", "/v1/users", "ok 403 ok 403 403 403"),
    Case(
        "POST",
        "/v1/users",
        "ok 403 ok 403 403 403",
        "ok 403 403 403 403 403",
        lambda t: {"name": f"new-{t}", "role": "member", "tenant": t},
    ),
    Case("DELETE", "/v1/users/{name}", "ok 403 ok 403 403 403", "ok 403 404 403 403 403"),
    Case("GET", "/v1/tokens", "ok ok ok ok ok ok"),
    # an agent token mints no token (issue 24 item 5)
    Case("POST", "/v1/tokens", "ok ok ok ok ok 403", None, lambda t: {"name": "mine"}),
    Case("DELETE", "/v1/tokens/{token_id}", "ok 404 ok 404 404 404", "ok 404 404 404 404 404"),
    Case("GET", "/v1/usage", "ok ok ok ok ok 403"),
    Case("GET", "/v1/audit", "ok ok 403 403 403 403"),
    Case("GET", "/v1/events", "ok ok ok ok ok 403"),
    Case("GET", "/v1/events/stream", "skip"),  # streaming: covered in test_api
]

#: Public: health, version, metrics, and the dashboard shell and assets (no data, no token).
UNSCOPED = {"/healthz", "/readyz", "/metrics", "/v1/version"}


class World:
    """Fresh objects for each check, so a state change in one check cannot leak into another."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.n = 0

    def fresh(self, kind: str, tenant: str) -> str:
        self.n += 1
        api = self.api
        if kind == "job_id":
            token = api.tokens["member"] if tenant == "red" else api.blue_member
            job = api.submit(token, f"j{self.n}")
            if kind == "job_id" and self._route.endswith("/release"):
                api.as_admin("POST", f"/v1/jobs/{job}/hold")
            if self._route.endswith("/requeue"):
                api.as_admin("POST", f"/v1/jobs/{job}/cancel")  # -> 409 for allowed roles
            return job
        if kind == "name" and "/users/" in self._route:
            name = f"u{self.n}-{tenant}"
            api.as_admin("POST", "/v1/users", {"name": name, "role": "member", "tenant": tenant})
            return name
        if kind == "name" and "/tenants/" in self._route:
            if self._method == "GET" or "/quotas/" in self._route:
                return tenant
            name = f"t{self.n}"
            api.as_admin("PUT", f"/v1/tenants/{name}", {})
            return name
        if kind == "name" and "/pools/" in self._route:
            if self._method == "GET":
                return "default"
            name = f"p{self.n}"
            api.as_admin("PUT", f"/v1/pools/{name}", {})
            return name
        if kind == "name" and "/priority-classes/" in self._route:
            return f"c{self.n}"
        if kind == "name":  # nodes
            return "n1"
        if kind == "uuid":
            return "n1-gpu0"
        if kind == "pool":
            if self._method == "DELETE":
                api.as_admin("PUT", f"/v1/tenants/{tenant}/quotas/default", {})
            return "default"
        if kind == "token_id":
            user = f"u{self.n}-{tenant}"
            api.as_admin("POST", "/v1/users", {"name": user, "role": "member", "tenant": tenant})
            token: str = api.as_admin("POST", "/v1/tokens", {"user": user})["id"]
            return token
        if kind == "assignment_id":
            return "unknown"  # allowed for agents; the server keeps nothing for it (409)
        if kind == "upload_id":
            token = api.tokens["member"] if tenant == "red" else api.blue_member
            response = api.call(token, "POST", "/v1/uploads", _archive(tenant))
            assert response.status_code == 201, response.text
            upload: str = response.json()["upload_id"]
            return upload
        raise AssertionError(kind)

    def path(self, case: Case, tenant: str) -> str:
        self._route, self._method = case.route, case.method
        path = case.route
        for part in ("job_id", "name", "uuid", "pool", "token_id", "upload_id", "assignment_id"):
            if "{" + part + "}" in path:
                path = path.replace("{" + part + "}", self.fresh(part, tenant))
        return path


def _outcome(status: int) -> str:
    if status in (403, 404):
        return str(status)
    assert status != 401, "every token in the matrix is valid"
    assert status < 300 or status == 409, f"unexpected status {status}"
    return "ok"


@pytest.fixture
def api(cp: ControlPlane) -> Api:
    api = make_api(cp)
    agent = api.tokens["agent"]
    assert api.call(agent, "POST", "/v1/agent/register", AGENT_REG).status_code == 200
    return api


def _endpoints(routes: list[Any], prefix: str = "") -> set[tuple[str, str]]:
    """Every (method, path) of an app, looking inside included routers."""
    found: set[tuple[str, str]] = set()
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:  # FastAPI includes routers lazily
            context = getattr(route, "include_context", None)
            found |= _endpoints(inner.routes, prefix + getattr(context, "prefix", ""))
            continue
        for method in getattr(route, "methods", None) or ():
            if method != "HEAD":
                found.add((method, prefix + route.path))
    return found


def test_every_endpoint_is_in_the_matrix(api: Api) -> None:
    routes = _endpoints(list(api.client.app.routes))  # type: ignore[attr-defined]
    assert ("POST", "/v1/jobs") in routes, "the route walk found nothing: fix _endpoints"
    listed = {(c.method, c.route) for c in CASES}
    missing = {
        r
        for r in routes
        if r not in listed
        and r[1] not in UNSCOPED
        and not r[1].startswith(("/docs", "/openapi", "/redoc", "/ui"))
        and r[1] != "/"
    }
    assert missing == set(), f"add these endpoints to the permission matrix: {sorted(missing)}"


def test_permission_matrix(api: Api) -> None:
    world = World(api)
    failures: list[str] = []
    for case in CASES:
        if case.own == "skip":
            continue
        for scope, expected in (("own", case.own), ("other", case.other)):
            if expected is None:
                continue
            tenant = "red" if scope == "own" else "blue"
            for role, want in zip(ROLES, expected.split(), strict=True):
                path = world.path(case, tenant)
                body = case.body(tenant) if case.body else None
                response = api.call(api.tokens[role], case.method, path, body)
                got = _outcome(response.status_code)
                if got != want:
                    failures.append(
                        f"{role:12} {case.method:6} {path} ({scope}): want {want}, got "
                        f"{response.status_code} {response.text[:120]}"
                    )
    assert failures == [], "\n".join(failures)


def test_a_member_lists_only_its_tenants_jobs(api: Api) -> None:
    red = api.submit(api.tokens["member"], "mine")
    blue = api.submit(api.blue_member, "theirs")
    seen = {j["id"] for j in api.call(api.tokens["member"], "GET", "/v1/jobs").json()["jobs"]}
    assert red in seen
    assert blue not in seen
    everyone = {j["id"] for j in api.call(api.tokens["operator"], "GET", "/v1/jobs").json()["jobs"]}
    assert {red, blue} <= everyone
