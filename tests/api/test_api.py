"""API behaviour beyond permissions: tokens, audit, errors, idempotency, paging, metrics,
accounting reports and the event stream."""

from __future__ import annotations

import hashlib

import pytest
from sqlalchemy import func, select

from gpupool.control.context import ControlPlane
from gpupool.control.machinery.clock import ManualClock
from gpupool.control.machinery.loop import SchedulingLoop
from gpupool.store.models import AuditModel, JobModel, TokenModel
from tests.api.helpers import Api, make_api
from tests.control.builders import register


@pytest.fixture
def api(cp: ControlPlane) -> Api:
    return make_api(cp)


def _audit_count(cp: ControlPlane) -> int:
    with cp.tx() as s:
        return int(s.scalar(select(func.count()).select_from(AuditModel)) or 0)


def test_first_start_writes_a_private_admin_token(cp: ControlPlane) -> None:
    path = cp.settings.admin_token_path
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.read_text().startswith("gp_")


def test_tokens_are_shown_once_and_stored_hashed(api: Api, cp: ControlPlane) -> None:
    issued = api.as_admin("POST", "/v1/tokens", {"name": "ci"})
    secret = issued["secret"]
    with cp.tx() as s:
        row = s.get(TokenModel, issued["id"])
        assert row is not None
        assert row.secret_sha256 == hashlib.sha256(secret.encode()).hexdigest()
        stored = [getattr(row, c) for c in ("id", "user", "name", "secret_sha256")]
    assert secret not in stored
    listed = api.as_admin("GET", "/v1/tokens")
    assert all("secret" not in t for t in listed)
    assert api.call(secret, "GET", "/v1/whoami").status_code == 200


def test_an_expired_token_is_refused(api: Api, clock: ManualClock) -> None:
    secret = api.as_admin("POST", "/v1/tokens", {"ttl_s": 60})["secret"]
    assert api.call(secret, "GET", "/v1/whoami").status_code == 200
    clock.advance(61)
    response = api.call(secret, "GET", "/v1/whoami")
    assert response.status_code == 401
    assert "expired" in response.json()["detail"]


def test_a_revoked_token_is_refused_at_once(api: Api) -> None:
    issued = api.as_admin("POST", "/v1/tokens", {})
    api.as_admin("DELETE", f"/v1/tokens/{issued['id']}")
    response = api.call(issued["secret"], "GET", "/v1/whoami")
    assert response.status_code == 401
    assert "revoked" in response.json()["detail"]


def test_missing_and_bad_tokens_answer_401_problems(api: Api) -> None:
    response = api.client.get("/v1/jobs")
    assert response.status_code == 401
    assert response.headers["content-type"].startswith("application/problem+json")
    assert "Authorization: Bearer" in response.json()["detail"]
    assert api.call("gp_nope", "GET", "/v1/jobs").status_code == 401


def test_every_mutating_call_is_audited_including_refused_ones(api: Api, cp: ControlPlane) -> None:
    calls = [
        (api.admin_token, "PUT", "/v1/pools/gpu", {}),
        (api.tokens["viewer"], "PUT", "/v1/pools/gpu2", {}),  # 403
        (api.tokens["member"], "POST", "/v1/jobs", {"spec": {"name": "a", "command": ["x"]}}),
        (api.tokens["member"], "POST", "/v1/jobs", {"spec": {"name": "a"}}),  # 422
        ("gp_bad", "POST", "/v1/jobs", {"spec": {}}),  # 401
        (api.admin_token, "DELETE", "/v1/pools/gpu", None),
    ]
    before = _audit_count(cp)
    for token, method, path, body in calls:
        api.call(token, method, path, body)
    assert _audit_count(cp) - before == len(calls)
    rows = api.as_admin("GET", f"/v1/audit?limit={len(calls)}")
    assert [r["status"] for r in reversed(rows)] == [200, 403, 200, 422, 401, 200]
    assert rows[1]["actor"] == "anonymous"
    assert rows[-1]["actor"] == "admin"
    assert rows[0]["remote"] is not None


def test_validation_errors_name_the_field_and_the_fix(api: Api) -> None:
    body = {"spec": {"name": "x", "command": ["run"], "resources": {"gpu_memory": "10 gigs"}}}
    response = api.call(api.admin_token, "POST", "/v1/jobs", body)
    assert response.status_code == 422
    assert "10GiB" in response.json()["detail"]
    response = api.call(api.admin_token, "POST", "/v1/jobs", {"spec": {}, "colour": "red"})
    assert response.status_code == 422
    assert response.json()["errors"][0]["field"] == "colour"


def test_a_retried_submit_with_the_same_key_returns_the_first_job(api: Api) -> None:
    body = {"spec": {"name": "a", "command": ["x"]}}
    headers = {"Authorization": f"Bearer {api.admin_token}", "Idempotency-Key": "abc"}
    first = api.client.post("/v1/jobs", json=body, headers=headers)
    second = api.client.post("/v1/jobs", json=body, headers=headers)
    assert (first.status_code, second.status_code) == (201, 200)
    assert first.json()["job"]["id"] == second.json()["job"]["id"]
    assert second.json()["created"] is False
    jobs = api.as_admin("GET", "/v1/jobs")["jobs"]
    assert len(jobs) == 1


def test_job_lists_page_with_a_cursor_and_filter_by_state(api: Api, clock: ManualClock) -> None:
    ids = []
    for i in range(5):
        ids.append(api.submit(api.admin_token, f"j{i}"))
        clock.advance(1)
    api.as_admin("POST", f"/v1/jobs/{ids[0]}/cancel")
    seen: list[str] = []
    cursor = None
    while True:
        query = "/v1/jobs?limit=2" + (f"&cursor={cursor}" if cursor else "")
        page = api.as_admin("GET", query)
        seen += [j["id"] for j in page["jobs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(ids))
    cancelled = api.as_admin("GET", "/v1/jobs?state=CA")["jobs"]
    assert [j["id"] for j in cancelled] == [ids[0]]
    response = api.call(api.admin_token, "GET", "/v1/jobs?state=nope")
    assert response.status_code == 422


def test_another_tenants_job_is_indistinguishable_from_a_missing_one(api: Api) -> None:
    theirs = api.submit(api.blue_member, "secret-project")
    hidden = api.call(api.tokens["member"], "GET", f"/v1/jobs/{theirs}")
    missing = api.call(api.tokens["member"], "GET", "/v1/jobs/000000000000")
    assert hidden.status_code == missing.status_code == 404
    assert "secret-project" not in hidden.text


def test_metrics_are_prefixed_and_carry_no_job_labels(api: Api) -> None:
    api.submit(api.tokens["member"], "queued")
    text = api.client.get("/metrics").text
    names = {
        line.split("{")[0].split(" ")[0]
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert names
    assert all(n.startswith("gpupool_") for n in names), sorted(names)
    assert 'gpupool_scheduler_queue{pool="default",tenant=""} 1.0' in text  # names: opt-in
    assert 'gpupool_jobs{state="PENDING"} 1.0' in text
    assert "job" not in {
        kv.split("=")[0]
        for line in text.splitlines()
        for kv in line[line.find("{") + 1 :].split(",")
        if "{" in line
    }
    assert "gpupool_scheduler_cycle_seconds_bucket" in text


def test_readyz_reports_the_database(api: Api) -> None:
    response = api.client.get("/readyz")
    assert response.status_code == 200
    assert response.json()["status"] == "ready"


def test_the_event_stream_sends_job_changes_the_caller_may_see(api: Api, cp: ControlPlane) -> None:
    from gpupool.api.routers.events import poll_events, stream_cursor
    from gpupool.control.services.auth import Principal
    from gpupool.domain.users import Role

    cursor = stream_cursor(cp)
    mine = api.submit(api.tokens["member"], "mine")
    theirs = api.submit(api.blue_member, "theirs")
    member = Principal("member-red", Role.MEMBER, "red", "t")
    batch, cursor = poll_events(cp, member, cursor)
    assert any(mine in m for m in batch)
    assert not any(theirs in m for m in batch)
    assert all(m.startswith("event: job\ndata: ") for m in batch)
    again, _ = poll_events(cp, member, cursor)
    assert again == []


def _actions(cp: ControlPlane, target: str) -> list[str]:
    with cp.read() as s:
        return [a.action for a in s.scalars(select(AuditModel).where(AuditModel.target == target))]


def test_a_pending_job_is_updated_and_bad_updates_change_nothing(
    api: Api, cp: ControlPlane
) -> None:
    member = api.tokens["member"]
    job_id = api.submit(member, "upd", time_limit="2h")
    path = f"/v1/jobs/{job_id}"
    before = api.call(member, "GET", path).json()
    for body, code, fragment in [
        ({"gpus": 2}, 422, "gpus cannot be changed on a queued job"),
        ({"time_limit": "soon"}, 422, "time_limit"),
        ({"priority": "urgent"}, 422, "priority class 'urgent' does not exist"),
        ({}, 422, "nothing to change"),
    ]:
        answer = api.call(member, "PATCH", path, body)
        assert answer.status_code == code, answer.text
        assert fragment in answer.json()["detail"]
    assert api.call(member, "GET", path).json() == before
    assert "job.update" not in _actions(cp, job_id)  # refused calls are audited, not as changes
    answer = api.call(member, "PATCH", path, {"priority": "low", "time_limit": "4h", "name": "u2"})
    assert answer.status_code == 200, answer.text
    view = api.call(member, "GET", path).json()
    assert (view["name"], view["priority_class"], view["time_limit_s"]) == ("u2", "low", 14400)
    with cp.read() as s:
        row = s.get(JobModel, job_id)
        assert row is not None
        assert row.priority == 100  # the low class's value, used by the scheduler's ordering
    assert "job.update" in _actions(cp, job_id)
    assert api.call(api.blue_member, "PATCH", path, {"name": "x"}).status_code == 404


def test_a_started_job_cannot_be_updated(api: Api, cp: ControlPlane) -> None:
    job_id = api.submit(api.tokens["member"], "runs")
    register(cp, "n1", gpus=1)
    loop = SchedulingLoop(cp)
    assert loop.leadership.try_acquire()
    assert loop.cycle().started == (job_id,)
    answer = api.call(api.tokens["member"], "PATCH", f"/v1/jobs/{job_id}", {"time_limit": "1h"})
    assert answer.status_code == 409
    assert "only pending jobs can be updated" in answer.json()["detail"]
