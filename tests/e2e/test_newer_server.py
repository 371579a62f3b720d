"""A newer server adds fields to its answers: this version's CLI, SDK and agent still work.

A rolling upgrade updates the server first and the nodes and users' CLIs later, so every
answer this version reads may carry fields it does not know. Requests stay strict (a typo in a
client is an error naming the field), answers are read leniently. The test puts a proxy between
the clients and a real server that adds an unknown field to every JSON object of every answer,
then goes through the everyday path: an agent registers and heartbeats through it, and the CLI
submits, lists, shows and cancels through it.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.pool import JOB, PY, Pool, wait_for

ADDED = "zz_added_by_a_newer_server"


def _with_added_field(value: Any) -> Any:
    """``value`` with :data:`ADDED` in every object. A map of strings (a job's environment,
    labels) is data, not an object a newer server would add a field to: left as it is."""
    if isinstance(value, dict):
        if all(isinstance(v, str) for v in value.values()):  # empty too
            return value
        return {**{k: _with_added_field(v) for k, v in value.items()}, ADDED: {"nested": [1]}}
    if isinstance(value, list):
        return [_with_added_field(v) for v in value]
    return value


class NewerServerProxy:
    """Forwards every request to ``upstream`` and adds :data:`ADDED` to every JSON object."""

    def __init__(self, upstream: str) -> None:
        client = httpx.Client(base_url=upstream, timeout=60)
        self.added = 0

        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() not in ("host", "content-length", "connection")
                }
                r = client.request(self.command, self.path, content=body, headers=headers)
                content = r.content
                if r.headers.get("content-type", "").startswith("application/json") and content:
                    content = json.dumps(_with_added_field(r.json())).encode()
                    proxy.added += 1
                self.send_response(r.status_code)
                for k, v in r.headers.items():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()
        self._client = client

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._client.close()


@pytest.fixture
def newer(tmp_path: Path) -> Iterator[tuple[Pool, NewerServerProxy]]:
    pool = Pool(tmp_path)
    proxy: NewerServerProxy | None = None
    try:
        pool.start_server()
        proxy = NewerServerProxy(pool.url)
        direct = pool.url
        pool.url = proxy.url  # the agent talks through the proxy
        pool.start_agent("n1")
        pool.url = direct
        yield pool, proxy
    finally:
        pool.close()
        if proxy is not None:
            proxy.close()


def _cli(pool: Pool, proxy: NewerServerProxy, *args: str) -> subprocess.CompletedProcess[str]:
    token = (pool.home / "admin-token").read_text().strip()
    return subprocess.run(
        [PY, "-m", "gpupool.cli", *args, "--server", proxy.url, "--token", token],
        env=pool._env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_agent_and_the_cli_read_a_newer_servers_answers(
    newer: tuple[Pool, NewerServerProxy],
) -> None:
    pool, proxy = newer
    # The agent registered and heartbeats through the proxy: a job placed on it runs.
    first = pool.submit("through-proxy", resources={"gpus": 0.25})
    pool.wait_state(first, "COMPLETED", timeout=120)

    submitted = _cli(
        pool, proxy, "submit", "-g", "0.25", "-J", "held", "--hold", "--", PY, "-c", JOB
    )
    assert submitted.returncode == 0, submitted.stderr
    held = wait_for(
        lambda: next((j["id"] for j in pool.get("/v1/jobs")["jobs"] if j["name"] == "held"), None),
        what="the held job",
    )
    assert held in submitted.stdout

    queue = _cli(pool, proxy, "queue")
    assert queue.returncode == 0, queue.stderr
    assert "held" in queue.stdout

    show = _cli(pool, proxy, "show", held)
    assert show.returncode == 0, show.stderr
    assert "held" in show.stdout

    nodes = _cli(pool, proxy, "nodes")
    assert nodes.returncode == 0, nodes.stderr
    assert "n1" in nodes.stdout

    cancel = _cli(pool, proxy, "cancel", held)
    assert cancel.returncode == 0, cancel.stderr
    assert pool.job(held)["state"] == "CANCELLED"
    assert proxy.added > 10  # the answers really were rewritten
