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

:func:`watch` runs on the event loop for the app's lifetime: it writes what shed and quiet
heartbeats left to write (:mod:`~gpupool.control.services.liveness`), at most once a second,
and notes how late the loop wakes (the server's own lag); with nothing to write and no agent
call in flight it sleeps until there is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import threading
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
#: The least time between two liveness flushes of :func:`watch`, and how often it wakes while an
#: agent call is in flight (seconds).
WATCH_EVERY_S = 1.0
#: The longest :func:`watch` sleeps with nothing heard, due or in flight (seconds; shorter
#: while tokens may need renewing: see ``_longest_sleep_s``): news wakes it before.
IDLE_WATCH_S = 60.0
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
    """Until cancelled: write what heartbeats left to write (:mod:`~gpupool.control.services.
    liveness`: nodes heard, quiet nodes' telemetry, orders moved elsewhere), at most once a
    second, and note how late the event loop wakes (the server's lag).

    It sleeps until the liveness work is due (:meth:`Liveness.due_in`) or news comes
    (:attr:`Admission.on_news`: a node heard, an agent call admitted), with at least
    ``WATCH_EVERY_S`` between two flushes, so a fleet's heard nodes are still written in one
    batch a second. While an agent call is in flight it wakes every ``WATCH_EVERY_S``, and
    each timed wake-up notes its lateness as the loop's lag. An idle server (nothing heard,
    nothing in flight) sleeps up to ``IDLE_WATCH_S``: it used to wake once a second to find
    nothing to do, about a tenth of what the idle pool was allowed to burn (issue 26)."""
    liveness = Liveness(cp)
    news = asyncio.Event()
    cp.admission.on_news = _setter(news)
    last_flush = -math.inf  # monotonic time of the last flush (tried)
    try:
        while True:
            news.clear()  # before looking: news from now on wakes the wait below
            due = liveness.due_in()
            if cp.admission.busy():
                due = WATCH_EVERY_S if due is None else min(due, WATCH_EVERY_S)
            if due is None or due > 0:
                longest = _longest_sleep_s(cp)
                wait = longest if due is None else min(due, longest)
                t0 = time.monotonic()
                if not await _woken(news, wait):  # timed: how late it came is the lag
                    cp.admission.note_loop_lag(time.monotonic() - t0 - wait)
                continue  # look again: due now, or news (not necessarily due)
            gap = WATCH_EVERY_S - (time.monotonic() - last_flush)
            if gap > 0:  # a flush a second at most: a fleet's heard nodes go in one batch
                t0 = time.monotonic()
                await asyncio.sleep(gap)  # news need not wake this one
                cp.admission.note_loop_lag(time.monotonic() - t0 - gap)
            if not liveness.pending():
                continue
            last_flush = time.monotonic()
            try:
                await run_in_threadpool(liveness.flush)
            except Unavailable as exc:
                log.warning("could not write heartbeats' liveness and telemetry: %s", exc)
            except Exception:  # the watch must go on, or nothing shed or quiet is written
                log.exception("writing heartbeats' liveness and telemetry failed; will retry")
    finally:
        cp.admission.on_news = None


def _longest_sleep_s(cp: ControlPlane) -> float:
    """The longest :func:`watch` sleeps without news: ``IDLE_WATCH_S``, or half the principal
    cache's lifetime when that is shorter (any API call may start using a cached token
    without news, and one in use is renewed in the second half of its entry's lifetime:
    ``auth.revalidate``), at least ``WATCH_EVERY_S``. 2.5 s for ``gpupool server``'s 5 s
    cache; ``gpupool up`` keeps tokens 300 s, so its watch sleeps the whole minute."""
    ttl = cp.principals.ttl_s
    if ttl <= 0:
        return IDLE_WATCH_S
    return min(IDLE_WATCH_S, max(WATCH_EVERY_S, ttl / 2))


def _setter(event: asyncio.Event) -> Callable[[], None]:
    """A function that sets ``event`` from any thread (the loop's own: directly); nothing
    when it is set already (a fleet's heartbeats, while :func:`watch` waits out a second)."""
    loop, home = asyncio.get_running_loop(), threading.get_ident()

    def set_event() -> None:
        if event.is_set():
            return
        if threading.get_ident() == home:
            event.set()
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: the server stopped
            loop.call_soon_threadsafe(event.set)

    return set_event


async def _woken(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait for ``event`` at most ``timeout_s``; whether it was set."""
    try:
        await asyncio.wait_for(event.wait(), timeout_s)
    except asyncio.TimeoutError:
        return False
    return True
