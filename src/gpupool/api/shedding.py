"""Load shedding for the agents' calls (see :mod:`gpupool.control.machinery.admission`).

:class:`AgentShedding` is an ASGI middleware in front of ``POST /v1/agent/register`` and
``POST /v1/agent/heartbeat``: a call over its kind's limit of calls in flight, or one that would
have to wait for a store connection (:func:`store_pool_has_room`), is answered at once with
``503``, a ``Retry-After`` in whole seconds (random, spread over the server's
backlog; a heartbeat's at most the heartbeat interval) and a problem body that says so, before
the request's body is parsed, its token looked up in the store or a worker thread taken. A
shed heartbeat that names its node (``X-Gpupool-Node``, sent by agents since this version)
counts as heard: at once when its token is in the principal cache, else once the token is
checked, with every other such token in one query, before the heard nodes are written.

:func:`watch` runs on the event loop for the app's lifetime: it notes how late the loop
wakes (the server's own lag) and, once a second, writes what shed and quiet heartbeats left to
write (:mod:`~gpupool.control.services.liveness`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.concurrency import run_in_threadpool

from gpupool.control.context import ControlPlane
from gpupool.control.errors import Unavailable
from gpupool.control.services.auth import hash_secret
from gpupool.control.services.liveness import Liveness
from gpupool.domain.users import Permission

log = logging.getLogger("gpupool.api.shedding")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: Path -> kind of the calls admitted by :class:`~.admission.Admission`.
KINDS = {"/v1/agent/register": "register", "/v1/agent/heartbeat": "heartbeat"}
#: The header an agent names its node in on a heartbeat (so a shed one counts as heard).
NODE_HEADER = b"x-gpupool-node"
#: How often :func:`watch` wakes (seconds).
WATCH_EVERY_S = 1.0
#: Store connections kept for everything but agents' calls: an agent's call is shed rather
#: than wait for a connection when fewer than this are free.
POOL_RESERVE = 2


def store_pool_has_room(cp: ControlPlane) -> bool:
    """Whether the store's connection pool could lend a connection without a wait (more than
    ``POOL_RESERVE`` free, overflow included). Pools that do not count say yes."""
    pool = cp.engine.pool
    size, out = getattr(pool, "size", None), getattr(pool, "checkedout", None)
    if not callable(size) or not callable(out):
        return True
    overflow = max(0, int(getattr(pool, "_max_overflow", 0)))
    return int(out()) + POOL_RESERVE < int(size()) + overflow


class AgentShedding:
    """See the module docstring."""

    def __init__(self, app: ASGIApp, cp: ControlPlane) -> None:
        self.app = app
        self.cp = cp

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = KINDS.get(scope.get("path", "")) if scope["type"] == "http" else None
        if kind is None or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        admission = self.cp.admission
        if not store_pool_has_room(self.cp):
            admission.shed(kind)  # would wait for a store connection: shed instead
        elif admission.try_enter(kind):
            t0 = time.monotonic()
            try:
                await self.app(scope, receive, send)
            finally:
                admission.leave(kind, time.monotonic() - t0)
            return
        if kind == "heartbeat":
            self._heard(scope)
        settings = self.cp.settings
        cap = settings.heartbeat_interval_s if kind == "heartbeat" else None
        wait = admission.retry_after(kind, cap)
        await _busy(send, kind, wait, scope.get("path", ""))

    def _heard(self, scope: Scope) -> None:
        headers = dict(scope.get("headers") or ())
        node = headers.get(NODE_HEADER, b"").decode("latin-1").strip()
        scheme, _, secret = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        if not node or scheme.lower() != "bearer" or not secret.strip():
            return
        now = self.cp.now()
        who = self.cp.principals.get(secret.strip(), now)
        if who is None:
            # Not in memory (a busy server's cache may have run out while it shed the calls
            # that would have renewed it): heard once the token is checked, in one query for
            # all such nodes before the next write (``NodeService.record_heard``).
            self.cp.admission.heard_by_token(node[:64], hash_secret(secret.strip()), now)
        elif who.can(Permission.AGENT):
            self.cp.admission.heard(node[:64], now)


async def _busy(send: Send, kind: str, wait: int, path: str) -> None:
    detail = (
        f"the server is busy and sheds {kind} calls for now: retry after {wait} s "
        "(agents do so by themselves; this node is not marked down meanwhile)"
    )
    body = json.dumps(
        {
            "type": "about:blank",
            "title": "Service Unavailable",
            "status": 503,
            "detail": detail,
            "instance": path,
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"application/problem+json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", str(wait).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def watch(cp: ControlPlane) -> None:
    """Once a second until cancelled: note the event loop's lateness (the server's lag), and
    write what heartbeats left to write (:mod:`~gpupool.control.services.liveness`: nodes
    heard, quiet nodes' telemetry, orders moved elsewhere). An idle server only wakes."""
    liveness = Liveness(cp)
    while True:
        t0 = time.monotonic()
        await asyncio.sleep(WATCH_EVERY_S)
        cp.admission.note_loop_lag(time.monotonic() - t0 - WATCH_EVERY_S)
        if not liveness.pending():
            continue  # the usual case of an idle server: no thread hop, no store
        try:
            await run_in_threadpool(liveness.flush)
        except Unavailable as exc:
            log.warning("could not write heartbeats' liveness and telemetry: %s", exc)
