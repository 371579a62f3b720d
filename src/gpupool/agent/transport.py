"""HTTP transport from the agent to the server, and the reconnect backoff.

The agent speaks the protocol of :mod:`gpupool.schemas.agent` over ``POST /v1/agent/register``
and ``POST /v1/agent/heartbeat`` with a bearer token of role ``agent``. Network errors and
5xx answers raise :class:`ServerUnavailable` (the agent keeps its jobs running and retries with
:class:`Backoff`, no sooner than a busy server's ``Retry-After``); 401/403 raise
:class:`AgentRejected`, which needs a person (a wrong or revoked token), so the agent says so
instead of retrying silently forever.

**Several servers.** An agent may be given the URLs of several server replicas (they share one
store, and any of them takes heartbeats and long polls; see docs/architecture.md, "A fleet").
:class:`Servers` starts each agent at a random one, so a fleet spreads over the replicas, and
moves to the next after a failure to get an answer or an error answer (a timeout, a refused
connection, a 5xx): the retry, after the usual backoff, goes to the next replica. A busy
replica's ``503`` with ``Retry-After`` (load shedding) keeps the agent where it is: that
replica is alive and holds the agent's acknowledged report and settled answer, which make its
heartbeats cheap; moving on every shed made a 5,000-node fleet on two replicas move 56,000
times, every move a full-state heartbeat on the other replica, and collapse
(docs/benchmarks.md). The heartbeat and the long poll share that choice; a long poll that
lands on another replica than its last answer asks from ``since=-1`` (each replica numbers
orders on its own) and counts as changed, so the agent heartbeats once there.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from gpupool import __version__
from gpupool.domain.errors import GpupoolError
from gpupool.schemas.agent import (
    DELTA_REQUEST_FIELDS,
    DeviceTelemetry,
    HeartbeatRequest,
    HeartbeatResponse,
    LogAck,
    LogChunkRequest,
    OrdersAnswer,
    RegisterRequest,
    RegisterResponse,
)
from gpupool.schemas.base import read_answer

log = logging.getLogger("gpupool.agent.transport")

M = TypeVar("M", bound=BaseModel)
#: The header naming the node on a heartbeat (see ``api/shedding.py``).
NODE_HEADER = "X-Gpupool-Node"
#: The longest wait a server's ``Retry-After`` may impose on the agent (seconds).
RETRY_AFTER_CAP_S = 60.0
#: How long an idle connection to the server is kept for the next request (seconds). httpx's
#: default, 5 s, closed it between an idle node's quiet heartbeats (every 10 s by default), so
#: every beat paid a new TCP connection at both ends (a third of the idle agent's CPU). Kept
#: under the server's own keep-alive (75 s, ``gpupool server``), so the agent does not reuse a
#: connection the server is closing; one a server or proxy closed sooner is seen closed and
#: replaced before it is used.
KEEPALIVE_S = 60.0


def _refusal(path: str, response: httpx.Response) -> str:
    """A refusal as a sentence: the problem's ``detail`` (what to do), then where it came from;
    the raw body only when it is not problem+json."""
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    if isinstance(detail, str) and detail:
        return f"{detail} (the server refused {path}: {response.status_code})"
    return f"the server rejected {path} ({response.status_code}): {response.text[:500]}"


class ServerUnavailable(GpupoolError):
    """The server did not answer usefully; try again later (``retry_after_s``: no sooner than
    this, when a busy server said so with ``Retry-After``)."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def retry_after(value: str | None) -> float | None:
    """Seconds of a ``Retry-After`` header (a number; an HTTP date or junk: ``None``)."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if 0.0 <= seconds < 86400.0 else None


class ServerSilent(ServerUnavailable):
    """No answer at all from the server's host (timeout, no route, network unreachable), as
    opposed to an error answer or a refused connection: only this counts toward the agent's
    fence (agent/fence.py)."""


def unavailable(message: str, exc: httpx.HTTPError) -> ServerUnavailable:
    """The error for a request that got no HTTP answer: refused (the host is up) or silent."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ConnectionRefusedError):
            return ServerUnavailable(message)
        cause = cause.__cause__ or cause.__context__
    return ServerSilent(message)


class AgentRejected(GpupoolError):
    """The server refused the agent (bad token, wrong role, bad request); ``status_code`` is
    the HTTP status of the refusal where there was one."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class Transport(Protocol):
    def register(self, request: RegisterRequest) -> RegisterResponse: ...

    def heartbeat(self, request: HeartbeatRequest) -> HeartbeatResponse: ...

    def close(self) -> None: ...


class Reports:
    """What the agent's heartbeats send: deltas against the last acknowledged report.

    The agent builds its full state each round (rule 1 of :mod:`gpupool.schemas.agent`);
    :meth:`outgoing` numbers it (``seq``) and, once a report was acknowledged (``ack_seq`` in
    its answer, :meth:`answered`), sends only the replicas whose report changed since, with
    ``base`` naming that report. A full state goes first, after any failure to be acknowledged
    in order, every ``FULL_EVERY`` heartbeats, and at once when the server asks
    (``want_full``: it restarted, or another replica served the agent). Telemetry is sampled:
    sent every ``telemetry_every_s`` seconds, and at once when a device's health, XID or
    temperature (by ``TEMPERATURE_STEP_C``) changed since it was last sent, so alerts are not
    delayed. ``enabled`` False (an older server refused the fields) sends plain full states.
    """

    FULL_EVERY = 12
    TEMPERATURE_STEP_C = 5.0

    def __init__(
        self, telemetry_every_s: float = 15.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.enabled = True
        self.telemetry_every_s = telemetry_every_s
        self._clock = clock
        self.seq = 0
        self._acked: tuple[int, dict[str, str]] | None = None  # seq, assignment -> report
        self._pending: tuple[int, dict[str, str]] | None = None
        self._since_full = 0
        self._telemetry_at = -math.inf
        self._telemetry_sent: dict[str, tuple[bool, int | None, float | None]] = {}

    def outgoing(self, req: HeartbeatRequest, *, full: bool = False) -> HeartbeatRequest:
        """The heartbeat to send for the full state ``req``."""
        if not self.enabled:
            return req
        self.seq += 1
        state = {r.assignment_id: r.model_dump_json() for r in req.replicas}
        self._pending = (self.seq, state)
        update: dict[str, object] = {"seq": self.seq, "telemetry": self._sampled(req.telemetry)}
        if full or self._acked is None or self._since_full >= self.FULL_EVERY:
            self._since_full = 0
            return req.model_copy(update=update)
        base, acked = self._acked
        self._since_full += 1
        update["base"] = base
        update["replicas"] = [
            r for r in req.replicas if acked.get(r.assignment_id) != state[r.assignment_id]
        ]
        return req.model_copy(update=update)

    def answered(self, answer: HeartbeatResponse) -> None:
        """The server answered the last :meth:`outgoing` (``want_full``: not acknowledged)."""
        pending, self._pending = self._pending, None
        if (
            pending is None
            or answer.want_full
            or not answer.registered
            or answer.ack_seq != pending[0]
        ):
            self._acked = None
            return
        self._acked = pending

    def _sampled(self, samples: list[DeviceTelemetry]) -> list[DeviceTelemetry]:
        now = self._clock()
        seen = {t.uuid: (t.healthy, t.xid, t.temperature_c) for t in samples}
        changed = any(self._moved(seen[u], self._telemetry_sent.get(u)) for u in seen)
        if not changed and now - self._telemetry_at < self.telemetry_every_s:
            return []
        self._telemetry_at, self._telemetry_sent = now, seen
        return samples

    def _moved(
        self,
        now: tuple[bool, int | None, float | None],
        sent: tuple[bool, int | None, float | None] | None,
    ) -> bool:
        if sent is None or now[:2] != sent[:2]:
            return True
        if now[2] is None or sent[2] is None:
            return now[2] != sent[2]
        return abs(now[2] - sent[2]) >= self.TEMPERATURE_STEP_C


def wire_body(req: HeartbeatRequest) -> dict[str, object]:
    """A heartbeat's JSON body; the delta fields only when set (an older server refuses them)."""
    unset = {name for name in DELTA_REQUEST_FIELDS if getattr(req, name) is None}
    data: dict[str, object] = req.model_dump(mode="json", exclude=unset)
    return data


def register_body(req: RegisterRequest, *, reserve: bool = True) -> dict[str, object]:
    """A registration's JSON body; a device's ``context_reserve_mib`` only when known (and
    ``reserve``): an older server refuses the field."""
    data: dict[str, object] = req.model_dump(mode="json")
    devices = data.get("devices")
    for d in devices if isinstance(devices, list) else ():
        if not reserve or d.get("context_reserve_mib") is None:
            d.pop("context_reserve_mib", None)
    return data


def server_urls(values: Sequence[str]) -> list[str]:
    """The server URLs given (each value may hold several, comma-separated), without repeats;
    a value that is not an ``http(s)://`` URL is refused with what to give instead."""
    urls: list[str] = []
    for value in values:
        for part in value.split(","):
            url = part.strip().rstrip("/")
            if not url:
                continue
            if not url.startswith(("http://", "https://")) or len(url) <= len("https://"):
                raise GpupoolError(
                    f"--server {part.strip()!r} is not a server URL: give one like "
                    "http://head:8470 (repeat --server for each replica)"
                )
            if url not in urls:
                urls.append(url)
    if not urls:
        raise GpupoolError("no server URL given: pass --server http://head:8470")
    return urls


class Servers:
    """The replicas an agent may use and the one it uses now (see the module docstring)."""

    def __init__(self, urls: Sequence[str], rng: random.Random | None = None) -> None:
        self.urls = server_urls(urls)
        self._at = (rng or random.Random()).randrange(len(self.urls))
        self._lock = threading.Lock()

    @property
    def current(self) -> str:
        return self.urls[self._at]

    def failed(self, url: str) -> None:
        """``url`` gave no useful answer: the next try goes to the next replica (once per
        failure of the one in use, whichever of the agent's threads noticed it)."""
        with self._lock:
            if len(self.urls) > 1 and self.urls[self._at] == url:
                self._at = (self._at + 1) % len(self.urls)
                log.info("server %s did not answer usefully; trying %s", url, self.current)


class HttpTransport:
    """The real transport: keep-alive ``httpx`` connections to the server in use (one for
    requests, one for the long poll), from the URLs given (:class:`Servers`)."""

    def __init__(
        self,
        server_url: str | Sequence[str],
        token: str,
        *,
        timeout_s: float = 10.0,
        transport: httpx.BaseTransport | None = None,  # tests pass httpx.MockTransport
    ) -> None:
        self.servers = Servers([server_url] if isinstance(server_url, str) else server_url)
        self._headers = {
            "Authorization": f"Bearer {token}",
            "User-Agent": f"gpupool-agent/{__version__}",
        }
        self._timeout_s = timeout_s
        self._transport = transport
        self._clients: dict[str, httpx.Client] = {}
        # the long poll gets its own connection, so it never delays a heartbeat
        self._polls: dict[str, httpx.Client] = {}
        self._polled: str | None = None  # the replica that answered the last long poll
        self.reports = Reports()  # heartbeats as deltas (see Reports)

    def _connection(self, pool: dict[str, httpx.Client], url: str) -> httpx.Client:
        client = pool.get(url)
        if client is None:
            client = httpx.Client(
                transport=self._transport,
                base_url=url,
                headers=self._headers,
                timeout=self._timeout_s,
                limits=httpx.Limits(
                    max_connections=100, max_keepalive_connections=20, keepalive_expiry=KEEPALIVE_S
                ),  # httpx's defaults but the keep-alive
            )
            pool[url] = client
        return client

    @property
    def _client(self) -> httpx.Client:
        return self._connection(self._clients, self.servers.current)

    def _post(
        self,
        path: str,
        body: BaseModel | dict[str, object],
        answer: type[M],
        headers: dict[str, str] | None = None,
    ) -> M:
        data = body if isinstance(body, dict) else body.model_dump(mode="json")
        url = self.servers.current
        try:
            response = self._connection(self._clients, url).post(path, json=data, headers=headers)
        except httpx.HTTPError as exc:
            self.servers.failed(url)
            raise unavailable(f"cannot reach the server at {url}: {exc}", exc) from None
        if response.status_code in (401, 403):
            raise AgentRejected(
                f"the server refused the agent token ({response.status_code}): create a token "
                "with role 'agent' and pass it with --token-file"
            )
        if response.status_code >= 500 or response.status_code == 429:
            wait = retry_after(response.headers.get("retry-after"))
            if wait is None:  # a busy server that says when to come back is kept (see Servers)
                self.servers.failed(url)
            raise ServerUnavailable(
                f"the server at {url} answered {response.status_code} on {path}", wait
            )
        if response.status_code >= 400:
            raise AgentRejected(_refusal(path, response), response.status_code)
        try:
            return read_answer(answer, response.json())
        except (ValidationError, ValueError) as exc:
            raise ServerUnavailable(f"unexpected answer from {path}: {exc}") from None

    def register(self, request: RegisterRequest) -> RegisterResponse:
        try:
            return self._post("/v1/agent/register", register_body(request), RegisterResponse)
        except AgentRejected as exc:
            if exc.status_code != 422 or not any(
                d.context_reserve_mib is not None for d in request.devices
            ):
                raise
            # An older server refuses the devices' context reserve: it assumes its own default.
            body = register_body(request, reserve=False)
            return self._post("/v1/agent/register", body, RegisterResponse)

    def heartbeat(self, request: HeartbeatRequest) -> HeartbeatResponse:
        """Send the full state ``request`` as :class:`Reports` decides (a delta when it can),
        and the full state at once when the server asks for it."""
        try:
            answer = self._beat(self.reports.outgoing(request))
            if answer.want_full:
                answer = self._beat(self.reports.outgoing(request, full=True))
        except AgentRejected as exc:
            if not self.reports.enabled or exc.status_code != 422:
                raise
            self.reports.enabled = False  # an older server refuses the delta fields
            answer = self._beat(request)  # plain full states from now on
        self.reports.answered(answer)
        return answer

    def _beat(self, request: HeartbeatRequest) -> HeartbeatResponse:
        # The node's name in a header too: a busy server that sheds the heartbeat unread still
        # knows the node is alive (api/shedding.py).
        headers = {NODE_HEADER: request.node}
        return self._post("/v1/agent/heartbeat", wire_body(request), HeartbeatResponse, headers)

    def ship_logs(self, chunk: LogChunkRequest) -> LogAck:
        return self._post("/v1/agent/logs", chunk, LogAck)

    def ship_results(
        self, assignment_id: str, data: bytes, problem: str | None, agent_id: str | None = None
    ) -> None:
        """Send one replica's results (``POST /v1/agent/results/{id}``, see
        :mod:`gpupool.agent.results`): the archive, or the problem that kept it from coming;
        ``agent_id`` names the node's agent (the server takes results only from it)."""
        path = f"/v1/agent/results/{assignment_id}"
        headers = {"Content-Type": "application/gzip"}
        if agent_id is not None:
            headers["X-Gpupool-Agent-Id"] = agent_id
        if problem is not None:
            headers["X-Results-Problem"] = problem
        try:
            response = self._client.post(path, content=data, headers=headers, timeout=300.0)
        except httpx.HTTPError as exc:
            raise ServerUnavailable(f"cannot send {path}: {exc}") from None
        if response.status_code >= 500 or response.status_code == 429:
            raise ServerUnavailable(f"the server answered {response.status_code} on {path}")
        if response.status_code >= 400:
            raise AgentRejected(_refusal(path, response))

    def download_upload(self, upload_id: str, dest: Path) -> None:
        """Save a working-directory upload (``GET /v1/agent/uploads/{id}``) to ``dest``."""
        path = f"/v1/agent/uploads/{upload_id}"
        try:
            with self._client.stream("GET", path, timeout=300.0) as response:
                if response.status_code >= 400:
                    response.read()
                    raise AgentRejected(
                        f"the server refused {path} ({response.status_code}): {response.text[:300]}"
                    )
                with open(dest, "wb") as f:
                    for chunk in response.iter_bytes():
                        f.write(chunk)
        except httpx.HTTPError as exc:
            raise ServerUnavailable(f"cannot download {path}: {exc}") from None

    def wait_for_orders(self, node: str, since: int, timeout_s: float) -> OrdersAnswer:
        """The long poll (see :class:`~gpupool.schemas.agent.OrdersAnswer`)."""
        path = f"/v1/agent/nodes/{node}/orders"
        url = self.servers.current
        moved = self._polled is not None and self._polled != url
        try:
            response = self._connection(self._polls, url).get(
                path,
                params={"since": -1 if moved else since, "timeout": timeout_s},
                timeout=timeout_s + 10.0,
            )
        except httpx.HTTPError as exc:
            self.servers.failed(url)
            raise ServerUnavailable(f"long poll to {url} failed: {exc}") from None
        if response.status_code >= 500 or response.status_code == 429:
            if retry_after(response.headers.get("retry-after")) is None:
                self.servers.failed(url)
            raise ServerUnavailable(
                f"the server at {url} answered {response.status_code} on {path}"
            )
        if response.status_code >= 400:
            raise AgentRejected(f"the server refused {path} ({response.status_code})")
        try:
            answer = read_answer(OrdersAnswer, response.json())
        except (ValidationError, ValueError) as exc:
            raise ServerUnavailable(f"unexpected answer from {path}: {exc}") from None
        self._polled = url
        if moved:  # another replica's numbers: start from them, and look once
            return OrdersAnswer(seq=answer.seq, changed=True)
        return answer

    def close(self) -> None:
        for client in [*self._clients.values(), *self._polls.values()]:
            client.close()


class Backoff:
    """Exponential backoff with jitter: 0.5 s, 1 s, 2 s, ... up to ``cap_s``, each ×[0.5, 1].

    An agent must be back within the server's node timeout once the server (or its store)
    returns, or its jobs are failed over: the server gives agents one node timeout of grace
    after such an outage, no more. So the agent caps its retries at its heartbeat interval
    (:meth:`cap_at`), which the server keeps well below the node timeout; retrying no faster
    than it normally heartbeats adds no load the server does not already carry.
    """

    def __init__(self, base_s: float = 0.5, cap_s: float = 5.0, seed: int | None = None) -> None:
        self.base_s = base_s
        self.cap_s = cap_s
        self.failures = 0
        self._rng = random.Random(seed)

    def cap_at(self, seconds: float) -> None:
        """Never wait longer than ``seconds`` between tries (the heartbeat interval)."""
        self.cap_s = max(seconds, 0.05)

    def next_delay(self, at_least_s: float | None = None) -> float:
        """The wait before the next try. ``at_least_s`` is a busy server's ``Retry-After``:
        the wait is then no shorter than it (up to ``RETRY_AFTER_CAP_S``), times [1, 1.25]
        of jitter of our own, so agents told the same number do not return together."""
        delay = min(self.cap_s, self.base_s * 2.0 ** min(self.failures, 30))
        self.failures += 1
        delay *= self._rng.uniform(0.5, 1.0)
        if at_least_s is not None and at_least_s > 0:
            told = min(at_least_s, RETRY_AFTER_CAP_S) * self._rng.uniform(1.0, 1.25)
            delay = max(delay, told)
        return delay

    def reset(self) -> None:
        self.failures = 0
