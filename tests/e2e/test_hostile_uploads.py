"""Hostile working-directory uploads against a real server and a real agent process.

An upload is the one job input a node agent unpacks itself, so a crafted archive must fail
that job (BOOT_FAIL with the reason) and never the node: the agent stays up, runs the next
job, and leaves no unpacked copy behind once the replica has ended.
"""

from __future__ import annotations

import gzip
import io
import tarfile
from collections.abc import Iterator

import pytest

from tests.e2e.pool import PY, Pool, wait_for


@pytest.fixture(scope="module")
def one_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    """A server and one agent, n1, so every attempt of a job lands on the same agent."""
    p = Pool(tmp_path_factory.mktemp("hostile"))
    try:
        p.start_server()
        p.start_agent("n1")
        yield p
    finally:
        p.close()


def _tar_gz(*members: tuple[str, bytes]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), compresslevel=9)


def _upload(pool: Pool, body: bytes) -> str:
    assert pool.http is not None
    r = pool.http.post("/v1/uploads", content=body, headers={"Content-Type": "application/gzip"})
    assert r.status_code == 201, r.text
    return str(r.json()["upload_id"])


def _submit_in(pool: Pool, name: str, upload_id: str, program: str) -> str:
    spec = {"name": name, "command": [PY, "-c", program], "resources": {"gpus": "0.25"}}
    body = {"spec": spec, "workdir_upload": upload_id}
    return str(pool.post("/v1/jobs", body)["job"]["id"])


def _agent_alive(pool: Pool, node: str) -> bool:
    proc = pool.agents[node]
    return proc.poll() is None


def test_a_1000_folder_deep_upload_fails_its_job_and_the_agent_runs_the_next(
    one_node: Pool,
) -> None:
    pool = one_node
    deep = "/".join(["d"] * 1000) + "/f.txt"
    body = _tar_gz((deep, b"x"))
    assert len(body) < 1024  # the attack is tiny
    poisoned = _submit_in(pool, "deep", _upload(pool, body), "print('never')")
    done = pool.wait_state(poisoned, "BOOT_FAIL", "COMPLETED", "FAILED", timeout=180)
    # Every attempt ends the same way; after max_restarts it stays BOOT_FAIL.
    assert done["state"] == "BOOT_FAIL", done
    assert "folders deep" in (done["reason"] or ""), done
    assert _agent_alive(pool, "n1"), (pool.root / "agent-n1.log").read_text()[-3000:]

    def exhausted() -> dict[str, object] | None:
        job = pool.job(poisoned)
        return job if job["state"] == "BOOT_FAIL" and job["restart_count"] >= 3 else None

    final = wait_for(exhausted, 240, "the poisoned job to use up its restarts")
    assert final["restart_count"] == 3
    assert _agent_alive(pool, "n1")

    good = _submit_in(pool, "after", _upload(pool, _tar_gz(("data.txt", b"ok\n"))), "print(1)")
    assert pool.wait_state(good, "COMPLETED", "FAILED", timeout=120)["state"] == "COMPLETED"
    assert pool.node("n1")["state"] == "up"  # type: ignore[index]
    assert _agent_alive(pool, "n1")


def test_a_zip_bomb_upload_is_refused_and_leaves_nothing_on_the_node(one_node: Pool) -> None:
    pool = one_node
    # 100 MiB of zeros in about 100 KB: a node must not expand it (nor keep it).
    bomb = _tar_gz(("zeros.bin", bytes(100 * 1024 * 1024)), ("data.txt", b"ok\n"))
    assert len(bomb) < 256 * 1024
    job = _submit_in(pool, "bomb", _upload(pool, bomb), "print('never')")
    done = pool.wait_state(job, "BOOT_FAIL", "COMPLETED", "FAILED", timeout=240)
    assert done["state"] == "BOOT_FAIL", done
    assert "unpacks to more than" in (done["reason"] or ""), done
    assert _agent_alive(pool, "n1")
    work = pool.state_dir("n1") / "work"
    wait_for(
        lambda: not any(p.is_file() for p in work.rglob("*")) or None,
        120,
        "no unpacked file left under the agent's work folder",
    )


def test_an_uploaded_copy_is_deleted_when_its_replica_ends(one_node: Pool) -> None:
    pool = one_node
    upload = _upload(pool, _tar_gz(("big.bin", bytes(8 * 1024 * 1024)), ("data.txt", b"ok\n")))
    job = _submit_in(pool, "copy", upload, "print(open('data.txt').read().strip())")
    assert pool.wait_state(job, "COMPLETED", "FAILED", timeout=120)["state"] == "COMPLETED"
    copy = pool.state_dir("n1") / "work" / job
    wait_for(lambda: not copy.exists() or None, 120, f"the unpacked copy {copy} to be deleted")
