"""End to end: a tenant's fair share out of range (issue 18 item 5).

``fair_share`` values such as ``1e308``, ``5e-324``, ``Infinity``, ``NaN`` or ``-1`` are refused
at the API with the accepted range and change nothing; rows stored before that rule are read
safely: the scheduler keeps starting jobs and ``GET /v1/tenants`` answers.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.pool import PY, Pool

BAD = ["1e308", "5e-324", "Infinity", "-Infinity", "NaN", "-1", "0"]


@pytest.fixture
def one_node_pool(tmp_path: Path) -> Iterator[Pool]:
    p = Pool(tmp_path)
    try:
        p.start_server()
        p.start_agent("n1", "2xA100-80GB")
        yield p
    finally:
        p.close()


def _put_raw(pool: Pool, tenant: str, literal: str) -> httpx.Response:
    assert pool.http is not None
    body = '{"fair_share": ' + literal + "}"
    return pool.http.put(
        f"/v1/tenants/{tenant}", content=body, headers={"Content-Type": "application/json"}
    )


def test_tenant_put_with_an_absurd_fair_share_is_refused_with_the_range(
    one_node_pool: Pool,
) -> None:
    pool = one_node_pool
    assert _put_raw(pool, "ml", "2").status_code < 300
    for literal in BAD:
        answer = _put_raw(pool, "ml", literal)
        assert answer.status_code == 422, (literal, answer.text)
        assert "from 0.001 to 1000000" in answer.text, (literal, answer.text)
        assert _put_raw(pool, f"new-{len(literal)}", literal).status_code == 422
    assert pool.get("/v1/tenants/ml")["fair_share"] == 2.0
    names = {t["name"] for t in pool.get("/v1/tenants")}
    assert not any(n.startswith("new-") for n in names), names


def test_tenants_stored_with_absurd_fair_shares_still_list_and_their_jobs_run(
    one_node_pool: Pool,
) -> None:
    pool = one_node_pool
    stored = {"huge": 1e308, "tiny": 5e-324, "infinite": float("inf"), "negative": -1.0}
    for name in stored:
        pool.http.put(f"/v1/tenants/{name}", json={"fair_share": 1.0})  # type: ignore[union-attr]
    with sqlite3.connect(pool.home / "gpupool.db") as db:  # rows written before the rule
        for name, share in stored.items():
            db.execute("UPDATE tenants SET fair_share = ? WHERE name = ?", (share, name))
    listed = pool.get("/v1/tenants")
    shown = {t["name"]: t for t in listed}
    assert set(stored) <= set(shown)
    for name in stored:
        assert 0.001 <= shown[name]["fair_share"] <= 1_000_000, shown[name]
    jobs = []
    for name in stored:
        pool.post("/v1/users", {"name": f"u-{name}", "role": "member", "tenant": name})
        secret = pool.post("/v1/tokens", {"user": f"u-{name}"})["secret"]
        body = {
            "spec": {
                "name": f"job-{name}",
                "command": [PY, "-c", "pass"],
                "resources": {"gpus": "0.1"},
            }
        }
        r = httpx.post(
            f"{pool.url}/v1/jobs", json=body, headers={"Authorization": f"Bearer {secret}"}
        )
        assert r.status_code == 201, r.text
        jobs.append(r.json()["job"]["id"])
    for job_id in jobs:
        pool.wait_state(job_id, "COMPLETED", timeout=90)
    assert pool.http is not None
    assert pool.http.get("/v1/tenants").status_code == 200
    for name in stored:
        assert pool.http.get(f"/v1/tenants/{name}").status_code == 200
