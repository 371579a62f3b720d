"""Results are safe to fetch (issue 24 item 3): an archive that would write outside DEST is
refused whole, and only the node that ran a replica may send its results.

The crafted archive is the issue's: ``d/up -> ..``, then ``x1 -> d/up/..`` (lexically inside,
really one folder up), then ``x1/escaped.txt``; and ``x2 -> x1/..`` with ``x2/escaped2.txt``
(two folders up). It is sent as the node that ran the job would send it (a node whose agent
was taken over, or a job that raced the packing): the agent id is read from the node's state
folder. A second agent token, as any other node's agent holds, is refused (403).
"""

from __future__ import annotations

import contextlib
import io
import json
import tarfile
from pathlib import Path

import httpx

from tests.e2e.pool import PY, Pool, wait_for
from tests.e2e.test_results import gpupool


def crafted() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:

        def link(name: str, target: str) -> None:
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)

        def file(name: str, text: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text))

        d = tarfile.TarInfo("d")
        d.type = tarfile.DIRTYPE
        tar.addfile(d)
        link("d/up", "..")
        link("x1", "d/up/..")
        file("x1/escaped.txt", b"one folder up\n")
        link("x2", "x1/..")
        file("x2/escaped2.txt", b"two folders up\n")
        file("ok.txt", b"fine\n")
    return out.getvalue()


def _finished_upload_job(pool: Pool, tmp_path: Path, admin: str) -> tuple[str, str, str]:
    """A finished job with an uploaded folder: (job id, assignment id, node)."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "input.txt").write_text("x\n")
    ran = gpupool(
        pool, tmp_path, admin, "run", "--workdir", str(project), "-g", "0.25", "--", PY, "-c", "0"
    )
    assert ran.returncode == 0, ran.stderr
    job_id = ran.stderr.split()[2]
    job = pool.job(job_id)
    assert job["state"] == "COMPLETED", job

    def record() -> tuple[str, str] | None:
        for path in (pool.root / "agents").glob("*/*/*/assignment.json"):
            with contextlib.suppress(OSError, ValueError):
                data = json.loads(path.read_text())["assignment"]
                if data["job_id"] == job_id:
                    return data["assignment_id"], path.parents[2].name
        return None

    assignment, node = wait_for(record, 30, "the replica's record on its node")
    return job_id, assignment, node


def test_fetch_refuses_an_archive_whose_links_lead_outside_dest(pool: Pool, tmp_path: Path) -> None:
    admin = (pool.home / "admin-token").read_text().strip()
    job_id, assignment, node = _finished_upload_job(pool, tmp_path, admin)
    agent_id = (pool.state_dir(node) / "agent-id").read_text().strip()
    token = pool.agent_token.read_text().strip()
    r = httpx.post(
        f"{pool.url}/v1/agent/results/{assignment}",
        content=crafted(),
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/gzip",
            "X-Gpupool-Agent-Id": agent_id,
        },
        timeout=30,
    )
    assert r.status_code == 204, r.text
    top = tmp_path / "a" / "b"
    dest = top / "dest"
    got = gpupool(pool, tmp_path, admin, "fetch", job_id, str(dest))
    written = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "a").rglob("escaped*"))
    assert written == [], f"fetch wrote outside {dest}: {written}"
    assert got.returncode != 0, got.stderr
    assert "the results archive" in got.stderr
    assert "nothing was written" in got.stderr
    assert not dest.exists() or not any(dest.iterdir())


def test_results_from_an_agent_that_did_not_run_the_replica_are_refused(
    pool: Pool, tmp_path: Path
) -> None:
    admin = (pool.home / "admin-token").read_text().strip()
    job_id, assignment, _ = _finished_upload_job(pool, tmp_path, admin)
    pool.post("/v1/users", {"name": "other-node", "role": "agent"})
    other = pool.post("/v1/tokens", {"user": "other-node", "name": "n9"})["secret"]
    before = pool.http.get(f"/v1/jobs/{job_id}/results")  # type: ignore[union-attr]
    assert before.status_code == 200, before.text
    for headers in ({}, {"X-Gpupool-Agent-Id": "0" * 32}):
        r = httpx.post(
            f"{pool.url}/v1/agent/results/{assignment}",
            content=crafted(),
            headers={"Authorization": f"Bearer {other}", **headers},
            timeout=30,
        )
        assert r.status_code == 403, (r.status_code, r.text)
        assert "only that node's agent may send its results" in json.dumps(r.json())
    after = pool.http.get(f"/v1/jobs/{job_id}/results")  # type: ignore[union-attr]
    assert after.content == before.content  # what the node sent is still what a fetch gets
