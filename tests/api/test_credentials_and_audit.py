"""Credentials, the audit log, /metrics and the OpenAPI, against a real server process.

- a token may not mint one that outlives it (a 60 s token minted one that never expired);
- refused calls do not each write an audit row: the first ones are kept, then one row
  counts the rest (1,000 unauthenticated POSTs wrote 1,000 rows);
- ``/metrics`` shows no tenant's name unless the server is told to, and can require a token;
- the OpenAPI declares the bearer scheme and each route's problem+json error answers.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.server_proc import ServerProcess


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path_factory.mktemp("creds") / "home")
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def _admin(server: ServerProcess) -> httpx.Client:
    headers = {"Authorization": f"Bearer {server.admin_token()}"}
    return httpx.Client(base_url=server.url, headers=headers, timeout=60)


def _as(server: ServerProcess, secret: str) -> httpx.Client:
    headers = {"Authorization": f"Bearer {secret}"}
    return httpx.Client(base_url=server.url, headers=headers, timeout=60)


def test_a_60_second_token_cannot_mint_one_that_outlives_it(server: ServerProcess) -> None:
    with _admin(server) as admin:
        short = admin.post("/v1/tokens", json={"name": "short", "ttl_s": 60}).json()
    parent_expiry = short["expires_at"]
    assert parent_expiry is not None
    with _as(server, short["secret"]) as child:
        forever = child.post("/v1/tokens", json={"name": "forever"})
        assert forever.status_code == 201, forever.text
        assert forever.json()["expires_at"] is not None
        assert forever.json()["expires_at"] <= parent_expiry
        longer = child.post("/v1/tokens", json={"name": "longer", "ttl_s": 30 * 86400})
        assert longer.status_code == 422, longer.text
        assert "expires" in longer.json()["detail"]
        names = [t["name"] for t in child.get("/v1/tokens").json()]
    assert "longer" not in names


def test_a_token_lifetime_must_be_a_finite_number(server: ServerProcess) -> None:
    with _admin(server) as admin:
        for ttl in ("1e999", str(10**30)):
            r = admin.post(
                "/v1/tokens",
                content='{"name": "x", "ttl_s": ' + ttl + "}",
                headers={"Content-Type": "application/json"},
            )
            assert r.status_code == 422, (ttl, r.status_code, r.text[:300])


def _audit(admin: httpx.Client, **params: Any) -> list[dict[str, Any]]:
    return list(admin.get("/v1/audit", params={"limit": 1000, **params}).json())


def test_a_thousand_refused_posts_keep_the_first_rows_and_a_count(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as anonymous:
        for _ in range(1000):
            r = anonymous.post("/v1/jobs", json={"spec": {}})
            assert r.status_code == 401
    with _admin(server) as admin:
        rows = [r for r in _audit(admin, user="anonymous") if r["status"] == 401]
    assert 1 <= len(rows) <= 20, len(rows)
    counted = [r for r in rows if r["action"] == "refused.more"]
    assert len(counted) == 1, rows[:3]
    match = re.match(r"(\d+) more", counted[0]["target"] or "")
    assert match is not None, counted[0]
    assert int(match.group(1)) + len(rows) - 1 == 1000


def test_metrics_show_no_tenant_names_by_default(server: ServerProcess) -> None:
    with _admin(server) as admin:
        admin.put("/v1/tenants/secret-project", json={"fair_share": 1.0})
        spec = {"name": "q", "command": ["true"], "tenant": "secret-project"}
        assert admin.post("/v1/jobs", json={"spec": {**spec, "resources": {"gpus": "0.5"}}})
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    assert "gpupool_scheduler_queue" in text
    assert "secret-project" not in text


def test_metrics_can_require_a_token_and_name_tenants(tmp_path: Path) -> None:
    with ServerProcess(
        tmp_path / "home", extra_args=("--metrics-token", "--metrics-tenants")
    ) as proc:
        with _admin(proc) as admin:
            admin.put("/v1/tenants/vision", json={"fair_share": 1.0})
            spec = {"name": "q", "command": ["true"], "tenant": "vision"}
            admin.post("/v1/jobs", json={"spec": {**spec, "resources": {"gpus": "0.5"}}})
            named = admin.get("/metrics")
        assert named.status_code == 200
        assert 'tenant="vision"' in named.text
        bare = httpx.get(f"{proc.url}/metrics", timeout=30)
        assert bare.status_code == 401
        assert bare.headers["content-type"].startswith("application/problem+json")


def test_the_openapi_declares_the_bearer_scheme_and_error_answers(server: ServerProcess) -> None:
    spec = httpx.get(f"{server.url}/openapi.json", timeout=30).json()
    schemes = spec["components"]["securitySchemes"]
    assert any(s.get("type") == "http" and s.get("scheme") == "bearer" for s in schemes.values())
    submit = spec["paths"]["/v1/jobs"]["post"]
    assert submit["security"]
    for status in ("401", "403", "413", "422", "503"):
        assert status in submit["responses"], status
        assert "application/problem+json" in submit["responses"][status]["content"]
    assert "security" not in spec["paths"]["/healthz"]["get"]
    assert "401" not in spec["paths"]["/healthz"]["get"]["responses"]


def test_metrics_name_tenants_to_an_admin_token_only(server: ServerProcess) -> None:
    with _admin(server) as admin:
        admin.put("/v1/tenants/vision-team", json={"fair_share": 1.0})
        spec = {"name": "q", "command": ["true"], "tenant": "vision-team"}
        admin.post("/v1/jobs", json={"spec": {**spec, "resources": {"gpus": "0.5"}}})
        admin.post("/v1/users", json={"name": "mia", "role": "member", "tenant": "vision-team"})
        member = admin.post("/v1/tokens", json={"user": "mia", "name": "t"}).json()["secret"]
        as_admin = admin.get("/metrics").text
    with _as(server, member) as mia:
        as_member = mia.get("/metrics").text
    assert 'tenant="vision-team"' in as_admin
    assert "vision-team" not in as_member
    assert "vision-team" not in httpx.get(f"{server.url}/metrics", timeout=30).text
