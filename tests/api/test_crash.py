"""Crash safety: SIGKILL the server at random moments during a burst of 500 concurrent submits
(some sent twice with the same idempotency key), restart it each time, then check that every
acknowledged job exists exactly once and that no device holds more than its capacity."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from gpupool.store.db import make_engine
from gpupool.store.models import JobModel
from tests.api.server_proc import ServerProcess
from tests.store.fixtures import device_load

pytestmark = pytest.mark.slow

JOBS = 500
CLIENTS = 32
KILLS = 3
# A safety net, not a speed target: on an idle 2-core machine the burst ends in well under a
# minute, but CI machines are shared, so give the clients room before calling a submit lost.
DEADLINE_S = 300.0


def _setup(server: ServerProcess) -> str:
    admin = {"Authorization": f"Bearer {server.admin_token()}"}
    with httpx.Client(base_url=server.url, headers=admin, timeout=10) as c:
        assert c.post("/v1/users", json={"name": "agent", "role": "agent"}).status_code == 201
        secret: str = c.post("/v1/tokens", json={"user": "agent"}).json()["secret"]
    devices = [
        {"uuid": f"g{i}", "index": i, "model": "A100-80GB", "memory_mib": 81920} for i in range(8)
    ]
    reg = {
        "node": "n1",
        "cpu_milli": 10**6,
        "memory_mib": 10**7,
        "agent_version": "t",
        "devices": devices,
    }
    agent = {"Authorization": f"Bearer {secret}"}
    assert httpx.post(server.url + "/v1/agent/register", json=reg, headers=agent).status_code == 200
    return server.admin_token()


@pytest.mark.timeout(420)
def test_acknowledged_jobs_survive_sigkill_exactly_once(tmp_path: Path) -> None:
    rng = random.Random(5)
    server = ServerProcess(tmp_path / "home", extra_args=("--node-timeout", "3600"))
    server.start()
    token = _setup(server)
    acked: dict[str, str] = {}  # idempotency key -> job id
    lock = threading.Lock()
    stop_at = time.monotonic() + DEADLINE_S

    def submit(i: int) -> None:
        key = f"k{i}"
        body = {"spec": {"name": f"j{i}", "command": ["true"], "resources": {"gpus": "0.3"}}}
        headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": key}
        sends = 2 if i % 5 == 0 else 1  # every fifth is retried even after success
        with httpx.Client(base_url=server.url, timeout=5) as client:
            while sends and time.monotonic() < stop_at:
                try:
                    response = client.post("/v1/jobs", json=body, headers=headers)
                except httpx.HTTPError:
                    time.sleep(0.25)
                    continue
                if response.status_code >= 500:
                    time.sleep(0.25)
                    continue
                assert response.status_code in (200, 201), response.text
                job_id = response.json()["job"]["id"]
                with lock:
                    assert acked.setdefault(key, job_id) == job_id, f"{key} got two jobs"
                sends -= 1

    def killer() -> None:
        for _ in range(KILLS):
            time.sleep(rng.uniform(0.3, 1.5))
            server.kill()
            server.start()

    kill_thread = threading.Thread(target=killer)
    kill_thread.start()
    try:
        with ThreadPoolExecutor(CLIENTS) as pool:
            list(pool.map(submit, range(JOBS)))
        kill_thread.join()
        time.sleep(1.0)  # let the scheduler place what it can
    finally:
        kill_thread.join()
        server.stop()

    assert len(acked) == JOBS, f"only {len(acked)} of {JOBS} submits were acknowledged"
    engine = make_engine(f"sqlite:///{tmp_path / 'home' / 'gpupool.db'}")
    with engine.connect() as conn:
        rows = conn.execute(select(JobModel.idempotency_key, JobModel.id)).all()
        per_device = device_load(conn)
    engine.dispose()
    by_key: dict[str, list[str]] = {}
    for key, job_id in rows:
        by_key.setdefault(key, []).append(job_id)
    duplicates = {k: v for k, v in by_key.items() if len(v) > 1}
    assert duplicates == {}
    assert {k: v[0] for k, v in by_key.items()} == acked
    assert per_device, "the scheduler placed nothing"
    for uuid, memory, milli, mem in per_device:
        assert milli <= 1000, f"device {uuid} holds {milli} milli-GPU"
        assert mem <= memory, f"device {uuid} holds {mem} MiB of {memory}"
