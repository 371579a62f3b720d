"""The hostile-input table: each case sent to a fresh ``gpupool server``, its answer printed.

    .venv/bin/python benchmarks/hostile_inputs.py          # markdown table on stdout

The server runs on a free port in a temporary home (SQLite). Each case is one request with
the admin token (or none, where the case says so); the table gives the status and the first
words of the problem's ``detail``. The same cases are asserted by
``tests/api/test_hostile_requests.py`` and ``tests/api/test_credentials_and_audit.py``; this
script only shows them (docs/security.md holds its output).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

HUGE = "1" * 400
_JSON = {"Content-Type": "application/json"}


def _spec(**fields: Any) -> dict[str, Any]:
    resources = fields.pop("resources", {"gpus": "0.5"})
    return {"name": "hostile", "command": ["true"], "resources": resources, **fields}


def _job(spec: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    return ("POST", "/v1/jobs", {"json": {"spec": spec}})


CASES: list[tuple[str, tuple[str, str, dict[str, Any]]]] = [
    ("gpus: 400 digits", _job(_spec(resources={"gpus": HUGE}))),
    ("gpus: 400-digit JSON number", _job(_spec(resources={"gpus": int(HUGE)}))),
    (
        "gpu_memory: 400 digits + MiB",
        _job(_spec(resources={"gpus": 1, "gpu_memory": HUGE + "MiB"})),
    ),
    ("gpu_memory: 10^20 MiB", _job(_spec(resources={"gpus": 1, "gpu_memory": f"{10**20}MiB"}))),
    ("gpu_memory: bare 10", _job(_spec(resources={"gpus": 1, "gpu_memory": 10}))),
    ("cpus: 400 digits", _job(_spec(resources={"gpus": 1, "cpus": HUGE}))),
    ("memory: 400 digits + GiB", _job(_spec(resources={"gpus": 1, "memory": HUGE + "GiB"}))),
    ("time_limit: 400 digits", _job(_spec(time_limit=HUGE))),
    ("expected_duration: 400 digits + s", _job(_spec(expected_duration=HUGE + "s"))),
    ("checkpoint.grace: 400 digits", _job(_spec(checkpoint={"grace": HUGE}))),
    ("argv with a NUL byte", _job({**_spec(), "command": ["echo", "a\x00b"]})),
    ("env value with a NUL byte", _job(_spec(env={"FOO": "a\x00b"}))),
    ("a 1 MB argument", _job({**_spec(), "command": ["echo", "x" * 2**20]})),
    (
        "a 50 MB body",
        (
            "POST",
            "/v1/jobs",
            {
                "content": b'{"spec": {"pad": "' + b"x" * (50 * 2**20) + b'"}}',
                "headers": {"Content-Type": "application/json"},
            },
        ),
    ),
    ("audit since=1e999", ("GET", "/v1/audit", {"params": {"since": "1e999"}})),
    ("usage start=nan", ("GET", "/v1/usage", {"params": {"start": "nan"}})),
    ("logs offset 2^70", ("GET", "/v1/jobs/x/logs", {"params": {"offset": str(2**70)}})),
    (
        "token ttl_s 1e999",
        (
            "POST",
            "/v1/tokens",
            {
                "content": b'{"name": "x", "ttl_s": 1e999}',
                "headers": {"Content-Type": "application/json"},
            },
        ),
    ),
    (
        "quota guaranteed_milli 10^30",
        (
            "PUT",
            "/v1/tenants/default/quotas/default",
            {"content": b'{"guaranteed_milli": 1' + b"0" * 30 + b"}", "headers": _JSON},
        ),
    ),
    (
        "pool price 1e999",
        (
            "PUT",
            "/v1/pools/default",
            {"content": b'{"default_price_per_gpu_hour": 1e999}', "headers": _JSON},
        ),
    ),
    ("no token: POST /v1/jobs", ("POST", "/v1/jobs", {"json": {"spec": {}}, "anonymous": True})),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "GPUPOOL_HOME": str(home)}
        env.pop("GPUPOOL_DATABASE_URL", None)
        args = [sys.executable, "-m", "gpupool.cli", "server", "--home", str(home)]
        proc = subprocess.Popen(
            [*args, "--port", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 300
            while True:
                try:
                    if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    print("the server did not start", file=sys.stderr)
                    return 1
                time.sleep(0.1)
            token = (home / "admin-token").read_text().strip()
            print("| case | status | detail |")
            print("|---|---|---|")
            for name, (method, path, given) in CASES:
                kw = dict(given)
                headers = dict(kw.pop("headers", {}))
                if not kw.pop("anonymous", False):
                    headers["Authorization"] = f"Bearer {token}"
                r = httpx.request(method, url + path, headers=headers, timeout=120, **kw)
                try:
                    detail = str(r.json().get("detail", ""))
                except ValueError:
                    detail = r.text
                detail = detail.replace("|", "/").replace("\n", " ")[:110]
                print(f"| {name} | {r.status_code} | {detail} |")
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
