"""Working-directory uploads through the API: stored with size and sha256 and audited; over
the limit is a 413 naming it; another tenant's upload is not found (to read or to submit
with); a submit keeps the upload and the agent's assignment carries it; only agents download."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from gpupool.api.app import create_app
from gpupool.control.context import ControlPlane
from gpupool.control.machinery.clock import ManualClock
from gpupool.control.machinery.loop import SchedulingLoop
from gpupool.control.services.uploads import UploadService
from gpupool.control.settings import ServerSettings
from gpupool.store.models import AuditModel, JobModel, UploadModel
from tests.api.helpers import Api, make_api
from tests.control.builders import register


@pytest.fixture
def api(cp: ControlPlane) -> Api:
    return make_api(cp)


def _tgz(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _upload(api: Api, token: str, data: bytes, kind: str = "application/gzip") -> Any:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": kind}
    return api.client.post("/v1/uploads", content=data, headers=headers)


def test_an_upload_is_stored_with_its_size_and_sha256_and_audited(
    api: Api, cp: ControlPlane
) -> None:
    data = _tgz({"train.py": b"print('hi')\n"})
    answer = _upload(api, api.tokens["member"], data)
    assert answer.status_code == 201, answer.text
    body = answer.json()
    assert body["size"] == len(data)
    assert body["sha256"] == hashlib.sha256(data).hexdigest()
    fetched = api.call(api.tokens["agent"], "GET", f"/v1/agent/uploads/{body['upload_id']}")
    assert fetched.content == data
    with cp.read() as s:
        targets = list(
            s.scalars(select(AuditModel.target).where(AuditModel.action == "upload.create"))
        )
    assert targets == [body["upload_id"]]


def test_an_upload_over_the_limit_is_413_naming_the_limit(api: Api, cp: ControlPlane) -> None:
    api.client.app.state.services.uploads.limit = 1000  # type: ignore[attr-defined]
    answer = _upload(api, api.tokens["member"], b"x" * 1001)
    assert answer.status_code == 413
    assert answer.headers["content-type"].startswith("application/problem+json")
    assert "limit of 1000 bytes" in answer.json()["detail"]
    assert "shrink the folder" in answer.json()["detail"]
    with cp.read() as s:
        assert s.scalar(select(func.count()).select_from(UploadModel)) == 0


def test_an_upload_that_is_not_gzip_is_refused(api: Api) -> None:
    answer = _upload(api, api.tokens["member"], b"{}", kind="application/json")
    assert answer.status_code == 422
    assert "application/gzip" in answer.json()["detail"]


def test_a_submit_keeps_its_upload_and_the_assignment_carries_it(
    api: Api, cp: ControlPlane
) -> None:
    upload_id = _upload(api, api.tokens["member"], _tgz({"a": b"1"})).json()["upload_id"]
    body = {
        "spec": {"name": "w", "command": ["true"], "resources": {"gpus": "0.5"}},
        "workdir_upload": upload_id,
    }
    answer = api.call(api.tokens["member"], "POST", "/v1/jobs", body)
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["job"]["id"]
    with cp.read() as s:
        row = s.get(JobModel, job_id)
        assert row is not None
        assert row.spec["workdir_upload"] == upload_id
    register(cp, "n1", gpus=1)
    loop = SchedulingLoop(cp)
    assert loop.leadership.try_acquire()
    assert loop.cycle().started == (job_id,)
    beat = {"node": "n1", "epoch": 0}
    got = api.call(api.tokens["agent"], "POST", "/v1/agent/heartbeat", beat)
    assert got.status_code == 200, got.text
    starts = got.json()["start"]
    assert [s["workdir_upload"] for s in starts] == [upload_id]
    member = api.call(api.tokens["member"], "GET", "/v1/whoami").json()["user"]
    assert [s["user"] for s in starts] == [member]  # agents with --run-as submitter use it


def test_another_tenants_upload_is_not_found(api: Api) -> None:
    upload_id = _upload(api, api.tokens["member"], _tgz({"a": b"1"})).json()["upload_id"]
    body = {
        "spec": {"name": "w", "command": ["true"], "resources": {"gpus": "0.5"}},
        "workdir_upload": upload_id,
    }
    answer = api.call(api.blue_member, "POST", "/v1/jobs", body)
    assert answer.status_code == 404
    assert "upload" in answer.json()["detail"]
    missing = {**body, "workdir_upload": "00" * 16}
    assert api.call(api.tokens["member"], "POST", "/v1/jobs", missing).status_code == 404


def test_only_agents_download_uploads(api: Api) -> None:
    data = _tgz({"a": b"1"})
    upload_id = _upload(api, api.tokens["member"], data).json()["upload_id"]
    path = f"/v1/agent/uploads/{upload_id}"
    assert api.call(api.tokens["member"], "GET", path).status_code == 403
    got = api.call(api.tokens["agent"], "GET", path)
    assert got.status_code == 200
    assert got.content == data
    assert api.call(api.tokens["agent"], "GET", "/v1/agent/uploads/nope").status_code == 404


def test_an_upload_taken_by_one_server_is_served_by_another(
    api: Api, cp: ControlPlane, tmp_path: Path
) -> None:
    """Two server replicas on one store, each with its own home: the agent may ask either."""
    data = _tgz({"train.py": b"print('hi')\n"})
    upload_id = _upload(api, api.tokens["member"], data).json()["upload_id"]
    other_settings = ServerSettings(
        home=tmp_path / "other-home", database_url=cp.settings.database_url, schedule=False
    )
    other = ControlPlane(other_settings, clock=cp.clock)
    try:
        other.prepare()
        other_api = Api(TestClient(create_app(control=other)), api.admin_token)
        got = other_api.call(api.tokens["agent"], "GET", f"/v1/agent/uploads/{upload_id}")
        assert got.status_code == 200, got.text
        assert got.content == data
    finally:
        other.close()


def test_old_uploads_no_unfinished_job_names_are_pruned(
    api: Api, cp: ControlPlane, clock: ManualClock
) -> None:
    def upload() -> str:
        answer = _upload(api, api.tokens["member"], _tgz({"a": b"1"}))
        return str(answer.json()["upload_id"])

    unused, for_pending = upload(), upload()
    body = {
        "spec": {"name": "w", "command": ["true"], "resources": {"gpus": "0.5"}},
        "workdir_upload": for_pending,
    }
    assert api.call(api.tokens["member"], "POST", "/v1/jobs", body).status_code == 201
    service = UploadService(cp)
    clock.advance(service.retention_s - 1)
    recent = upload()
    assert service.prune() == []  # nothing is past the retention yet
    clock.advance(2)
    assert service.prune() == [unused]
    with cp.read() as s:
        left = set(s.scalars(select(UploadModel.id)))
    assert left == {for_pending, recent}


def test_a_job_submitted_held_waits_until_released_on_both_submit_paths(
    api: Api, cp: ControlPlane
) -> None:
    # Without an upload the submit goes through group commit; with one, straight to the store.
    upload_id = _upload(api, api.tokens["member"], _tgz({"a": b"1"})).json()["upload_id"]
    spec = {"name": "w", "command": ["true"], "resources": {"gpus": "0.25"}}
    ids = []
    for extra in ({}, {"workdir_upload": upload_id}):
        answer = api.call(
            api.tokens["member"], "POST", "/v1/jobs", {"spec": spec, "hold": True, **extra}
        )
        assert answer.status_code == 201, answer.text
        assert answer.json()["job"]["held"] is True
        ids.append(answer.json()["job"]["id"])
    register(cp, "n1", gpus=1)
    loop = SchedulingLoop(cp)
    assert loop.leadership.try_acquire()
    assert loop.cycle().started == ()
    for job_id in ids:
        view = api.call(api.tokens["member"], "GET", f"/v1/jobs/{job_id}").json()
        assert view["state"] == "PENDING"
        assert view["pending_reason"].startswith("Held")
        events = api.call(api.tokens["member"], "GET", f"/v1/jobs/{job_id}/events").json()
        assert [e["reason"] for e in events] == ["submitted held"]
        released = api.call(api.tokens["member"], "POST", f"/v1/jobs/{job_id}/release")
        assert released.status_code == 200, released.text
    assert sorted(loop.cycle().started) == sorted(ids)


def test_an_array_submit_makes_one_job_per_index_and_a_retry_returns_them(
    api: Api, cp: ControlPlane
) -> None:
    member = api.tokens["member"]
    body = {
        "spec": {"name": "sweep", "command": ["true"], "resources": {"gpus": "0.25"}},
        "array": "0-4:2",
        "idempotency_key": "sweep-1",
    }
    answer = api.call(member, "POST", "/v1/jobs", body)
    assert answer.status_code == 201, answer.text
    tasks = answer.json()["array"]
    assert [t["name"] for t in tasks] == ["sweep[0]", "sweep[2]", "sweep[4]"]
    assert answer.json()["job"] == tasks[0]
    again = api.call(member, "POST", "/v1/jobs", body)
    assert again.status_code == 200, again.text
    assert [t["id"] for t in again.json()["array"]] == [t["id"] for t in tasks]
    with cp.read() as s:
        arrays = [s.get(JobModel, t["id"]).spec["array"] for t in tasks]  # type: ignore[union-attr]
    assert {a["array_id"] for a in arrays} == {arrays[0]["array_id"]}
    assert [(t["array_id"], t["array_index"]) for t in tasks] == [
        (arrays[0]["array_id"], i) for i in (0, 2, 4)
    ]
    api.submit(member, "not-in-it")
    listed = api.call(member, "GET", f"/v1/jobs?array={arrays[0]['array_id']}").json()["jobs"]
    assert sorted(j["id"] for j in listed) == sorted(t["id"] for t in tasks)
    assert [(a["index"], a["count"], a["first"], a["last"]) for a in arrays] == [
        (0, 3, 0, 4),
        (2, 3, 0, 4),
        (4, 3, 0, 4),
    ]
    # The agent is told which task each one is.
    register(cp, "n1", gpus=1)
    loop = SchedulingLoop(cp)
    assert loop.leadership.try_acquire()
    assert set(loop.cycle().started) >= {t["id"] for t in tasks}
    got = api.call(api.tokens["agent"], "POST", "/v1/agent/heartbeat", {"node": "n1", "epoch": 0})
    starts = {s["job_name"]: s["array"] for s in got.json()["start"]}
    assert starts["sweep[2]"] == {**arrays[1]}


@pytest.mark.parametrize(
    ("array", "fragment"),
    [
        ("0-9%0", "the limit after % must be"),
        ("3-1", "ends before it starts"),
        ("x", "not an index"),
    ],
)
def test_a_bad_array_is_refused_and_stores_nothing(
    api: Api, cp: ControlPlane, array: str, fragment: str
) -> None:
    spec = {"name": "sweep", "command": ["true"], "resources": {"gpus": "0.25"}}
    answer = api.call(api.tokens["member"], "POST", "/v1/jobs", {"spec": spec, "array": array})
    assert answer.status_code == 422
    assert fragment in answer.json()["detail"]
    with cp.read() as s:
        assert s.scalar(select(func.count()).select_from(JobModel)) == 0
