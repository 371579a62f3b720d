"""Hostile job specs against a real server process: every bad number, byte or size is a 4xx
that says what to do, and nothing is stored.

The cases are those of the security review (issue 18, item 6): 400-digit numbers, 1e20 MiB of
GPU memory, a 50 MB body, NUL bytes in argv and env, a 1 MB argument, and a bare
``gpu_memory`` number (issue 17: ``--gpu-mem 10`` silently meant 10 MiB).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.server_proc import ServerProcess

HUGE = "1" * 400


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path_factory.mktemp("hostile") / "home")
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {server.admin_token()}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as client:
        yield client


def _spec(**fields: Any) -> dict[str, Any]:
    resources = fields.pop("resources", {"gpus": "0.5"})
    return {"name": "hostile", "command": ["true"], "resources": resources, **fields}


def _count(http: httpx.Client) -> int:
    return len(http.get("/v1/jobs", params={"limit": 1000}).json()["jobs"])


def _refused(http: httpx.Client, spec: dict[str, Any], status: int = 422) -> str:
    before = _count(http)
    r = http.post("/v1/jobs", json={"spec": spec})
    assert r.status_code == status, (spec, r.status_code, r.text[:500])
    assert r.headers["content-type"].startswith("application/problem+json")
    assert _count(http) == before  # nothing stored
    return str(r.json()["detail"])


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        (_spec(resources={"gpus": HUGE}), "gpus"),
        (_spec(resources={"gpus": int(HUGE)}), "gpus"),
        (_spec(resources={"gpus": "0.5", "gpu_memory": HUGE + "MiB"}), "gpu memory"),
        (_spec(resources={"gpus": "0.5", "cpus": HUGE}), "cpus"),
        (_spec(resources={"gpus": "0.5", "cpus": int(HUGE)}), "cpus"),
        (_spec(time_limit=HUGE), "time_limit"),
        (_spec(time_limit=int(HUGE)), "time_limit"),
        (_spec(expected_duration=HUGE + "s"), "expected_duration"),
        (_spec(checkpoint={"grace": HUGE}), "checkpoint.grace"),
        (_spec(resources={"gpus": "0.5", "memory": HUGE + "GiB"}), "memory"),
    ],
)
def test_a_400_digit_number_in_a_job_spec_is_a_422_naming_the_field(
    http: httpx.Client, spec: dict[str, Any], says: str
) -> None:
    detail = _refused(http, spec)
    assert says in detail
    assert "digits" in detail or "more than" in detail


@pytest.mark.parametrize("amount", ["1e20MiB", str(10**20) + "MiB", "100000000000TiB"])
def test_gpu_memory_beyond_any_card_is_refused_with_the_limit(
    http: httpx.Client, amount: str
) -> None:
    detail = _refused(http, _spec(resources={"gpus": "0.5", "gpu_memory": amount}))
    assert "gpu memory" in detail
    assert "1TiB" in detail or "not a memory size" in detail


@pytest.mark.parametrize("amount", ["10", 10, 10240])
def test_a_bare_gpu_memory_number_is_refused_with_the_units_to_use(
    http: httpx.Client, amount: object
) -> None:
    detail = _refused(http, _spec(resources={"gpus": "0.5", "gpu_memory": amount}))
    assert f"use {amount}GiB or {int(str(amount)) * 1024}MiB" in detail


def test_a_nul_byte_in_argv_or_env_is_a_422(http: httpx.Client) -> None:
    assert "NUL" in _refused(http, {**_spec(), "command": ["echo", "a\x00b"]})
    assert "NUL" in _refused(http, _spec(env={"FOO": "a\x00b"}))
    assert "NUL" in _refused(http, {"name": "s", "script": "echo a\x00b"})


def test_a_one_megabyte_argument_is_refused_before_exec(http: httpx.Client) -> None:
    detail = _refused(http, {**_spec(), "command": ["echo", "x" * (1024 * 1024)]})
    assert "command" in detail
    assert "upload" in detail or "file" in detail


def test_a_50_mb_job_body_is_a_413_with_the_limit(http: httpx.Client) -> None:
    before = _count(http)
    body = (
        b'{"spec": {"name": "big", "command": ["true"], "script_pad": "'
        + b"x" * (50 * 1024 * 1024)
        + b'"}}'
    )
    r = http.post("/v1/jobs", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 413, r.text[:300]
    assert r.headers["content-type"].startswith("application/problem+json")
    detail = r.json()["detail"]
    assert "MiB" in detail
    assert "upload" in detail
    assert _count(http) == before


def test_a_huge_number_in_a_query_string_is_a_422(http: httpx.Client) -> None:
    for path, params in (
        ("/v1/audit", {"since": "1e999"}),
        ("/v1/audit", {"since": "nan"}),
        ("/v1/usage", {"start": "inf"}),
    ):
        r = http.get(path, params=params)
        assert r.status_code == 422, (path, params, r.status_code, r.text[:300])


def test_gpupool_submit_gpu_mem_10_is_refused_with_what_to_use(
    server: ServerProcess, tmp_path: Path
) -> None:
    env = {**os.environ, "GPUPOOL_HOME": str(tmp_path / "client")}
    cli = [sys.executable, "-m", "gpupool.cli", "submit", "--server", server.url]
    cli += ["--token", server.admin_token(), "-g", "0.5", "--gpu-mem", "10", "--", "true"]
    done = subprocess.run(cli, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode != 0
    assert "use 10GiB or 10240MiB" in done.stderr + done.stdout


def test_a_job_file_with_a_bare_gpu_memory_is_refused(
    server: ServerProcess, tmp_path: Path
) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("name: t\ncommand: [true]\nresources:\n  gpus: 0.5\n  gpu_memory: 10\n")
    env = {**os.environ, "GPUPOOL_HOME": str(tmp_path / "client")}
    cli = [sys.executable, "-m", "gpupool.cli", "submit", "--server", server.url]
    cli += ["--token", server.admin_token(), "-f", str(job)]
    done = subprocess.run(cli, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode != 0
    out = done.stderr + done.stdout
    assert "use 10GiB or 10240MiB" in out
    assert "line 5" in out or ":5" in out


def test_a_job_stored_before_the_bounds_still_lists_shows_and_cancels(tmp_path: Path) -> None:
    """Rows written by an older server (10^20 MiB, a NUL in argv, a 10^300 s limit) are read
    as they are: the rules apply to what enters, never to what is already stored."""
    import sqlite3

    home = tmp_path / "home"
    with ServerProcess(home) as proc:
        headers = {"Authorization": f"Bearer {proc.admin_token()}"}
        r = httpx.post(f"{proc.url}/v1/jobs", json={"spec": _spec(), "hold": True}, headers=headers)
        assert r.status_code == 201, r.text
        job_id = r.json()["job"]["id"]
    db = sqlite3.connect(next(home.glob("*.db")))
    with db:
        (raw,) = db.execute("SELECT spec FROM jobs WHERE id = ?", (job_id,)).fetchone()
        legacy = raw.replace('"gpu_memory_mib": null', '"gpu_memory_mib": 100000000000000000000')
        legacy = legacy.replace('"command": ["true"]', '"command": ["echo", "a\\u0000b"]')
        legacy = legacy.replace('"time_limit_s": null', '"time_limit_s": 1e300')
        assert legacy != raw
        db.execute("UPDATE jobs SET spec = ? WHERE id = ?", (legacy, job_id))
    db.close()
    with ServerProcess(home) as proc:
        headers = {"Authorization": f"Bearer {proc.admin_token()}"}
        with httpx.Client(base_url=proc.url, headers=headers, timeout=60) as http:
            shown = http.get(f"/v1/jobs/{job_id}")
            assert shown.status_code == 200, shown.text
            assert shown.json()["gpu_memory_mib"] == 10**20
            assert job_id in {j["id"] for j in http.get("/v1/jobs").json()["jobs"]}
            cancelled = http.post(f"/v1/jobs/{job_id}/cancel", json={})
            assert cancelled.status_code == 200, cancelled.text
            assert cancelled.json()["state"] == "CANCELLED"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/tenants/default/quotas/default", '{"guaranteed_milli": 1' + "0" * 30 + "}"),
        ("/v1/tenants/default/quotas/default", '{"limit_memory_mib": 1' + "0" * 30 + "}"),
        ("/v1/tenants/default/quotas/default", '{"gpu_hour_budget": 1e999}'),
        ("/v1/tenants/default/quotas/default", '{"budget_window_s": 1e999}'),
        ("/v1/pools/default", '{"default_price_per_gpu_hour": 1e999}'),
        ("/v1/pools/default", '{"default_price_per_gpu_hour": 1e308}'),
        ("/v1/pools/default", '{"price_per_gpu_hour": {"A100": 1e999}}'),
    ],
)
def test_an_infinite_or_huge_quota_or_price_is_a_422_and_changes_nothing(
    http: httpx.Client, path: str, body: str
) -> None:
    before = http.get("/v1/pools").json(), http.get("/v1/tenants").json()
    r = http.put(path, content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 422, (path, body, r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("application/problem+json")
    assert (http.get("/v1/pools").json(), http.get("/v1/tenants").json()) == before
