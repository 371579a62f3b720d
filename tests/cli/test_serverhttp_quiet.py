"""Quiet heartbeats answered in the HTTP protocol (``gpupool.cli.serverhttp``), against the real
pool app served by uvicorn on a socket, as ``gpupool server`` serves it: a quiet heartbeat gets
the route's answer without an ASGI request cycle; pipelined requests are answered in order;
``Connection: close`` closes after the answer; a body that arrives in pieces is whole; and
everything that is not a quiet heartbeat of a known agent (a malformed body, an unknown token,
news) still gets the route's answer and checks, changing nothing it should not."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import pytest
import uvicorn
from sqlalchemy import create_engine, text
from uvicorn.protocols.http import httptools_impl

from gpupool.api import deps
from gpupool.cli import serverhttp
from gpupool.cli.server import pool_app
from gpupool.control.settings import ServerSettings
from tests.api.test_permissions import AGENT_REG

BEAT: dict[str, Any] = {
    "node": "n1",
    "epoch": 1,
    "telemetry": [{"uuid": "n1-gpu0", "utilization_ratio": 0.5, "temperature_c": 50.0}],
    "replicas": [],
}


class Served:
    """The pool's app behind uvicorn with gpupool's protocol, in a thread of this process."""

    def __init__(self, home: Path, **settings_args: Any) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.db = f"sqlite:///{home / 'gpupool.db'}"
        settings = ServerSettings(home=home, database_url=self.db, port=self.port, **settings_args)
        home.mkdir(parents=True, exist_ok=True)
        app = pool_app(settings)
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=self.port,
            http=serverhttp.CoalescingHttpTools,
            log_level="error",
            access_log=False,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}"
        admin = settings.admin_token_path.read_text().strip()
        self.admin = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {admin}"})
        assert self.admin.post("/v1/users", json={"name": "a1", "role": "agent"}).is_success
        made = self.admin.post("/v1/tokens", json={"user": "a1", "name": "t"})
        self.agent = str(made.json()["secret"])

    def close(self) -> None:
        self.admin.close()
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    pool = Served(tmp_path / "home")
    try:
        yield pool
    finally:
        pool.close()


def _request(
    token: str, body: bytes, *, close: bool = False, path: str = "/v1/agent/heartbeat"
) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    )
    if close:
        head += "Connection: close\r\n"
    return head.encode() + b"\r\n" + body


def _exchange(port: int, pieces: list[bytes], answers: int) -> list[tuple[int, bytes, bytes]]:
    """Send ``pieces`` (each its own write) on one connection and read ``answers`` responses:
    ``(status, head, body)`` each."""

    async def main() -> list[tuple[int, bytes, bytes]]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.05)
        out = []
        for _ in range(answers):
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            body = await asyncio.wait_for(reader.readexactly(length), 30)
            out.append((int(head.split(b" ")[1]), head, body))
        writer.close()
        return out

    return asyncio.run(main())


def _settle(pool: Served) -> bytes:
    """Register n1 and apply its first heartbeat (news), so the next same one is quiet."""
    auth = {"Authorization": f"Bearer {pool.agent}"}
    assert httpx.post(pool.url + "/v1/agent/register", json=AGENT_REG, headers=auth).is_success
    first = httpx.post(pool.url + "/v1/agent/heartbeat", json=BEAT, headers=auth)
    assert first.status_code == 200, first.text
    return json.dumps(BEAT).encode()


@pytest.fixture
def cycles() -> Iterator[list[str]]:
    """The paths of the requests uvicorn started an ASGI request cycle for."""
    started: list[str] = []
    real = httptools_impl.RequestResponseCycle.__init__

    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        started.append(str(kwargs["scope"].get("path")))
        real(self, *args, **kwargs)

    with mock.patch.object(httptools_impl.RequestResponseCycle, "__init__", counted):
        yield started


def test_a_quiet_heartbeat_is_answered_without_a_request_cycle_with_the_routes_answer(
    served: Served, cycles: list[str]
) -> None:
    body = _settle(served)
    cycles.clear()
    [(status, head, quiet)] = _exchange(served.port, [_request(served.agent, body)], 1)
    assert status == 200
    assert cycles == [], "a quiet heartbeat went through uvicorn's request cycle"
    assert b"content-type: application/json" in head.lower()
    # The same request with a query goes the ASGI way (the route ignores the query): the
    # same answer, byte for byte.
    routed = _request(served.agent, body, path="/v1/agent/heartbeat?via=route")
    [(status2, _, answer)] = _exchange(served.port, [routed], 1)
    assert status2 == 200
    assert cycles == ["/v1/agent/heartbeat"]
    assert json.loads(quiet) == json.loads(answer)
    assert quiet == answer


def test_pipelined_requests_are_answered_in_order_and_close_is_honoured(
    served: Served, cycles: list[str]
) -> None:
    body = _settle(served)
    cycles.clear()
    quiet = _request(served.agent, body)
    health = b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n"
    answers = _exchange(
        served.port, [quiet + health + quiet + _request(served.agent, body, close=True)], 4
    )
    assert [a[0] for a in answers] == [200, 200, 200, 200]
    assert b"connection: close" in answers[3][1].lower()
    assert answers[1][2] != answers[0][2]  # the health answer came second, between the beats
    assert answers[0][2] == answers[2][2] == answers[3][2]
    # The first beat was answered in the protocol; the ones sent behind the health check,
    # while its answer was still being made, went the usual way so as to stay in order.
    assert cycles == ["/healthz", "/v1/agent/heartbeat", "/v1/agent/heartbeat"]


def test_a_body_in_pieces_is_read_whole(served: Served, cycles: list[str]) -> None:
    body = _settle(served)
    cycles.clear()
    whole = _request(served.agent, body)
    cut = len(whole) - len(body) // 2
    [(status, _, answer)] = _exchange(served.port, [whole[:20], whole[20:cut], whole[cut:]], 1)
    assert status == 200
    assert json.loads(answer)["epoch"] >= 0
    assert cycles == []


def test_anything_but_a_quiet_heartbeat_gets_the_routes_answer(
    served: Served, cycles: list[str]
) -> None:
    body = _settle(served)
    cycles.clear()
    bad_json = _request(served.agent, b"{not json")
    unknown = _request("not-a-token", body)
    admin = _request(served.admin.headers["Authorization"].split()[1], body)
    hot = dict(
        BEAT, telemetry=[{"uuid": "n1-gpu0", "utilization_ratio": 0.5, "temperature_c": 95.0}]
    )
    news = _request(served.agent, json.dumps(hot).encode())
    answers = _exchange(served.port, [bad_json, unknown, admin, news], 4)
    assert [a[0] for a in answers] == [422, 401, 403, 200], answers
    assert b"not-a-token" not in answers[1][2]
    assert len(cycles) == 4  # each went the usual way, once
    # The news was applied: the device's temperature is what the last heartbeat said.
    node = served.admin.get("/v1/nodes/n1").json()
    temps = [d.get("temperature_c") for d in node.get("devices", [])]
    assert 95.0 in temps, node


def _beats_every(pool: Served, token: str, body: bytes, every_s: float, count: int) -> list[int]:
    statuses = []
    for _ in range(count):
        [(status, _, _)] = _exchange(pool.port, [_request(token, body)], 1)
        statuses.append(status)
        time.sleep(every_s)
    return statuses


def test_a_node_with_its_own_token_stays_on_the_short_way_at_the_caches_lifetime(
    tmp_path: Path,
) -> None:
    """Each node its own token, heartbeating about as often as the principal cache keeps an
    entry: the token is renewed in the background (one query for all), so its quiet
    heartbeats do not each authenticate again through the route."""
    pool = Served(tmp_path / "home", auth_cache_s=1.0)
    try:
        body = _settle(pool)
        real = deps._authenticate
        calls: list[str] = []

        def counted(cp: Any, secret: str | None, now: float) -> Any:
            calls.append(str(secret))
            return real(cp, secret, now)

        with mock.patch.object(deps, "_authenticate", counted):
            statuses = _beats_every(pool, pool.agent, body, 1.0, 8)
        assert statuses == [200] * 8
        # On the old code every beat found the entry gone (8 authentications); renewed, the
        # token is authenticated through the route at most once, when first seen again.
        assert calls.count(pool.agent) <= 1, calls
    finally:
        pool.close()


def test_a_token_revoked_by_another_process_stops_working_within_the_caches_lifetime(
    tmp_path: Path,
) -> None:
    """Renewals read the store: a token revoked elsewhere (another server of the same store)
    is refused within about one lifetime of the cache, as before, even while in use."""
    pool = Served(tmp_path / "home", auth_cache_s=1.0)
    try:
        body = _settle(pool)
        assert _beats_every(pool, pool.agent, body, 0.25, 8) == [200] * 8
        engine = create_engine(pool.db)
        with engine.begin() as conn:  # what another server's revocation leaves in the store
            conn.execute(
                text("UPDATE tokens SET revoked_at = 1 WHERE revoked_at IS NULL AND user = 'a1'")
            )
        engine.dispose()
        revoked = time.monotonic()
        statuses: list[int] = []
        while time.monotonic() - revoked < 20.0:
            statuses += _beats_every(pool, pool.agent, body, 0.2, 1)
            if statuses[-1] == 401:
                break
        # Refused: a renewal does not keep a token the store revoked (with renewals for ever
        # it would be taken for the whole 20 s).
        assert statuses[-1] == 401, statuses
    finally:
        pool.close()
