"""A fleet of fake agents in one process, speaking the agent protocol as ``gpupool agent`` does.

Each :class:`FakeNode` is one node agent without processes or GPUs: it registers
(``POST /v1/agent/register``, 8 simulated GPUs by default), heartbeats every interval the
server gives (``POST /v1/agent/heartbeat``, with telemetry for each device and the state of
each replica it holds), keeps the long poll open (``GET /v1/agent/nodes/{name}/orders``, 25 s)
and heartbeats at once when it answers, and runs the replicas the server starts on it: a
replica is reported running at the next heartbeat, ends (exit code 0) after the seconds of its
``sleep N`` command, and ends at once, as stopped, on a stop order; like the real agent it
sends the end of both log streams (``POST /v1/agent/logs``, ``final``) before it reports the
end, and forgets a replica when the server acknowledges it. It follows the protocol's rules
(:mod:`gpupool.schemas.agent`): answers from an older epoch are ignored, a known assignment id
is a no-op, ``registered: false`` means register again.

Heartbeats go through the agent transport's ``Reports`` as the real agent's do: deltas against
the last acknowledged report, sampled telemetry, the full state when the server asks.
Failures are handled as ``gpupool agent`` handles them (``agent/agent.py``,
``agent/transport.py``): a 5xx or 429 answer, a refused connection or a request past its 10 s
timeout is retried after the agent's own :class:`~gpupool.agent.transport.Backoff`, which
also honours the server's ``Retry-After``.

Given several server ports (replicas on one store), a node starts at one of them chosen by its
seed and moves to the next after a request that got no answer or a 5xx without
``Retry-After`` (a shed call stays), as the real agent's ``transport.Servers`` does; a long
poll on another replica than its last answer asks from ``since=-1`` and counts as changed.
``FleetStats.moves`` counts the moves.

Everything runs on one asyncio loop over lean keep-alive connections (``rawhttp``: two per
node, heartbeats and the long poll, as the real agent's two ``httpx`` clients), so a thousand
nodes cost the client little beside the server it measures. :class:`FleetStats` collects what
the benchmark (``bench_fleet.py``) and the CI test (``tests/fleet``) report.
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import time
from collections import Counter, deque
from dataclasses import dataclass, field

from gpupool import __version__
from gpupool.agent.transport import NODE_HEADER, Backoff, Reports, retry_after, wire_body
from gpupool.schemas.agent import (
    AssignmentSpec,
    DeviceInfo,
    DeviceTelemetry,
    HeartbeatRequest,
    HeartbeatResponse,
    RegisterRequest,
    RegisterResponse,
    ReplicaState,
    ReplicaStatus,
    StopReason,
)
from rawhttp import Connection

#: Seconds one long poll waits on the server (the real agent's ``LONG_POLL_S``).
LONG_POLL_S = 25.0
#: The real agent's request timeout (``HttpTransport``'s ``timeout_s``).
REQUEST_TIMEOUT_S = 10.0
#: A replica whose command is not ``sleep N`` runs this long.
DEFAULT_RUNTIME_S = 30.0


@dataclass
class FleetStats:
    """What the fleet saw, across all its nodes. Latencies in seconds."""

    #: per request kind (register, heartbeat, orders, logs): answers by HTTP status
    answers: dict[str, Counter[int]] = field(default_factory=dict)
    #: per request kind: requests that got no answer in time / no connection
    timeouts: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)
    beat_latency: list[float] = field(default_factory=list)  # answered heartbeats (200)
    #: node -> monotonic time of its first registration answer
    registered_at: dict[str, float] = field(default_factory=dict)
    registrations: int = 0  # successful registrations (re-registrations included)
    #: job id -> monotonic time its first replica's start order reached a node
    job_started_at: dict[str, float] = field(default_factory=dict)
    replicas_started: int = 0
    replicas_ended: int = 0
    stops: int = 0
    moves: int = 0  # nodes moving to another server replica after a failure

    def answered(self, kind: str, status: int) -> None:
        self.answers.setdefault(kind, Counter())[status] += 1

    def count(self, kind: str, status: int) -> int:
        return self.answers.get(kind, Counter())[status]


@dataclass
class _Replica:
    spec: AssignmentSpec
    ends_at: float
    state: ReplicaState = ReplicaState.RUNNING
    exit_code: int | None = None
    stop_reason: StopReason | None = None
    signal: str | None = None
    logs_final: bool = False


def runtime_of(spec: AssignmentSpec) -> float:
    """Seconds a fake replica runs: ``N`` of a ``sleep N`` command or script."""
    words = spec.command or (spec.script or "").split()
    if len(words) >= 2 and words[0].rsplit("/", 1)[-1] == "sleep":
        try:
            return max(0.0, float(words[1]))
        except ValueError:
            pass
    return DEFAULT_RUNTIME_S


class Unanswered(Exception):
    """A request that got no usable answer (timeout, connection error, 5xx, 429)."""

    def __init__(self, retry_after_s: float | None = None) -> None:
        super().__init__("no answer")
        self.retry_after_s = retry_after_s


class FakeNode:
    """One fake agent (see the module docstring)."""

    def __init__(
        self,
        name: str,
        host: str,
        port: int | list[int],
        token: str,
        stats: FleetStats,
        *,
        gpus: int = 8,
        seed: int | None = None,
    ) -> None:
        self.name = name
        self.stats = stats
        headers = {"Authorization": f"Bearer {token}", "User-Agent": f"gpupool-agent/{__version__}"}
        self.rng = random.Random(seed)
        self.ports = [port] if isinstance(port, int) else list(port)
        self._at = self.rng.randrange(len(self.ports))
        self._beat_conn = Connection(host, self.ports[self._at], headers)
        self._poll_conn = Connection(host, self.ports[self._at], headers)
        self.agent_id = secrets.token_hex(16)
        self.devices = [
            DeviceInfo(
                uuid=f"GPU-{name}-{i}",
                index=i,
                model="NVIDIA A100-SXM4-80GB",
                memory_mib=81920,
                compute_capability=(8, 0),
                nvlink_group=0,
            )
            for i in range(gpus)
        ]
        self.epoch = 0
        self.interval_s = 5.0
        self.registered = False
        self.backoff = Backoff(seed=seed)
        self.backoff.cap_at(self.interval_s)
        self.reports = Reports()
        self.replicas: dict[str, _Replica] = {}
        self.known: set[str] = set()  # every assignment id ever started here
        self.wake = asyncio.Event()
        #: The node's last calls: (wall time, port, kind, outcome), to explain a node.down.
        self.trail: deque[tuple[float, int, str, str]] = deque(maxlen=24)

    # ------------------------------------------------------------------ requests

    async def _call(
        self,
        conn: Connection,
        kind: str,
        method: str,
        path: str,
        body: object,
        timeout_s: float = REQUEST_TIMEOUT_S,
        headers: dict[str, str] | None = None,
    ) -> bytes:
        sent = time.time()
        try:
            status, payload = await asyncio.wait_for(
                conn.request(method, path, body, headers), timeout=timeout_s
            )
        except TimeoutError:
            self.trail.append((sent, conn.port, kind, "timeout"))
            conn.close()
            self.stats.timeouts[kind] += 1
            self._move(conn.port)
            raise Unanswered() from None
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            self.trail.append((sent, conn.port, kind, type(exc).__name__))
            conn.close()
            self.stats.refused[kind] += 1
            self._move(conn.port)
            raise Unanswered() from None
        self.stats.answered(kind, status)
        note = f"{status} in {time.time() - sent:.1f}s"
        if status >= 500:  # what kind of 503: shed (admission) or the store (Unavailable)
            note += f" {payload[:160]!r}"
        self.trail.append((sent, conn.port, kind, note))
        if status >= 500 or status == 429:
            wait = retry_after(conn.headers.get("retry-after"))
            if wait is None:  # a shed call (Retry-After) stays, as the agent's does
                self._move(conn.port)
            raise Unanswered(wait)
        if status >= 400:
            raise RuntimeError(f"{method} {path} refused ({status}): {payload[:300]!r}")
        return payload

    def _move(self, failed_port: int) -> None:
        """The server on ``failed_port`` gave no usable answer: use the next replica (the
        real agent's ``transport.Servers.failed``)."""
        if len(self.ports) < 2 or self.ports[self._at] != failed_port:
            return
        self._at = (self._at + 1) % len(self.ports)
        self.stats.moves += 1
        self._beat_conn.close()
        self._beat_conn.port = self.ports[self._at]

    async def register(self) -> None:
        request = RegisterRequest(
            node=self.name,
            address="127.0.0.1",
            cpu_milli=64000,
            memory_mib=512 * 1024,
            devices=self.devices,
            agent_version=__version__,
            isolation_modes=["exclusive", "soft"],
            agent_id=self.agent_id,
        )
        payload = await self._call(
            self._beat_conn,
            "register",
            "POST",
            "/v1/agent/register",
            request.model_dump(mode="json"),
        )
        answer = RegisterResponse.model_validate_json(payload)
        self.epoch = max(self.epoch, answer.epoch)
        self.interval_s = answer.heartbeat_interval_s
        self.backoff.cap_at(self.interval_s)
        self.registered = True
        self.stats.registrations += 1
        self.stats.registered_at.setdefault(self.name, time.monotonic())

    def heartbeat_request(self) -> HeartbeatRequest:
        rng = self.rng
        telemetry = [
            DeviceTelemetry(
                uuid=d.uuid,
                utilization_ratio=round(rng.random(), 2),
                memory_used_mib=rng.randrange(0, 80000),
                temperature_c=float(rng.randrange(35, 70)),
                power_w=float(rng.randrange(60, 400)),
            )
            for d in self.devices
        ]
        replicas = [
            ReplicaStatus(
                assignment_id=key,
                state=r.state,
                exit_code=r.exit_code,
                signal=r.signal,
                stop_reason=r.stop_reason,
                isolation="exclusive",
            )
            for key, r in sorted(self.replicas.items())
        ]
        return HeartbeatRequest(
            node=self.name,
            epoch=self.epoch,
            telemetry=telemetry,
            replicas=replicas,
            agent_id=self.agent_id,
        )

    async def ship_final_logs(self) -> None:
        """The end of both log streams of each ended replica (the real agent's LogShipper)."""
        for key, r in self.replicas.items():
            if r.state is not ReplicaState.EXITED or r.logs_final:
                continue
            for stream in ("stdout", "stderr"):
                body = {
                    "assignment_id": key,
                    "stream": stream,
                    "offset": 0,
                    "data": "",
                    "final": True,
                }
                await self._call(self._beat_conn, "logs", "POST", "/v1/agent/logs", body)
            r.logs_final = True

    async def heartbeat(self) -> None:
        """One heartbeat as the agent's transport sends it: a delta against the last
        acknowledged report when it can (``Reports``), the full state when the server asks."""
        await self.ship_final_logs()
        full = self.heartbeat_request()
        answer = await self._beat(self.reports.outgoing(full))
        if answer.want_full:
            answer = await self._beat(self.reports.outgoing(full, full=True))
        self.reports.answered(answer)
        self.handle(answer)

    async def _beat(self, request: HeartbeatRequest) -> HeartbeatResponse:
        t0 = time.monotonic()
        payload = await self._call(
            self._beat_conn,
            "heartbeat",
            "POST",
            "/v1/agent/heartbeat",
            wire_body(request),
            headers={NODE_HEADER: self.name},
        )
        self.stats.beat_latency.append(time.monotonic() - t0)
        return HeartbeatResponse.model_validate_json(payload)

    def handle(self, answer: HeartbeatResponse) -> None:
        if answer.epoch < self.epoch:
            return  # a deposed leader's late answer
        self.epoch = answer.epoch
        self.interval_s = answer.heartbeat_interval_s
        self.backoff.cap_at(self.interval_s)
        if not answer.registered:
            self.registered = False
            return
        for key in answer.finished_ack:
            r = self.replicas.get(key)
            if r is not None and r.state is ReplicaState.EXITED:
                del self.replicas[key]
        now = time.monotonic()
        for order in answer.stop:
            r = self.replicas.get(order.assignment_id)
            if order.epoch < self.epoch or r is None or r.state is ReplicaState.EXITED:
                continue
            r.state, r.stop_reason, r.signal = ReplicaState.EXITED, order.reason, order.signal
            self.stats.stops += 1
            self.stats.replicas_ended += 1
            self.wake.set()
        for spec in answer.start:
            if spec.epoch < self.epoch or spec.assignment_id in self.known:
                continue
            self.known.add(spec.assignment_id)
            self.replicas[spec.assignment_id] = _Replica(spec, now + runtime_of(spec))
            self.stats.replicas_started += 1
            self.stats.job_started_at.setdefault(spec.job_id, now)
            self.wake.set()  # report it running now, as the agent does on a state change

    def finish_due(self) -> bool:
        """End replicas whose time has come (exit 0); True when any did."""
        now = time.monotonic()
        ended = False
        for r in self.replicas.values():
            if r.state is ReplicaState.RUNNING and now >= r.ends_at:
                r.state, r.exit_code = ReplicaState.EXITED, 0
                self.stats.replicas_ended += 1
                ended = True
        return ended

    # ------------------------------------------------------------------ loops

    async def run(self, stop: asyncio.Event) -> None:
        """Register, then heartbeat until ``stop`` (the real agent's loop, without processes)."""
        poller: asyncio.Task[None] | None = None
        next_beat = time.monotonic()
        try:
            while not stop.is_set():
                now = time.monotonic()
                changed = self.finish_due()
                healthy = self.backoff.failures == 0
                if now >= next_beat or (
                    (changed or self.wake.is_set()) and healthy and self.registered
                ):
                    self.wake.clear()
                    try:
                        if not self.registered:
                            await self.register()
                            if poller is None:
                                poller = asyncio.create_task(self.long_poll(stop))
                        await self.heartbeat()
                        self.backoff.reset()
                        next_beat = time.monotonic() + self.interval_s
                    except Unanswered as exc:
                        delay = self.backoff.next_delay(exc.retry_after_s)
                        next_beat = time.monotonic() + delay
                await self._sleep_until(stop, next_beat)
        finally:
            if poller is not None:
                poller.cancel()
            self._beat_conn.close()
            self._poll_conn.close()

    async def _sleep_until(self, stop: asyncio.Event, deadline: float) -> None:
        """Sleep until ``deadline``, the next replica end, or a wake-up (the long poll, a start)."""
        ends = [r.ends_at for r in self.replicas.values() if r.state is ReplicaState.RUNNING]
        if ends and self.backoff.failures == 0:
            deadline = min(deadline, *ends)
        delay = max(0.0, deadline - time.monotonic())
        if self.wake.is_set() and self.backoff.failures == 0 and self.registered:
            return
        waits = [asyncio.ensure_future(self.wake.wait()), asyncio.ensure_future(stop.wait())]
        try:
            await asyncio.wait(waits, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def long_poll(self, stop: asyncio.Event) -> None:
        """The agent's order wait: heartbeat at once when the server has new orders."""
        seq = -1
        polled: int | None = None  # the port of the replica that answered last
        while not stop.is_set():
            port = self.ports[self._at]
            moved = polled is not None and polled != port
            if self._poll_conn.port != port:
                self._poll_conn.close()
                self._poll_conn.port = port
            since = -1 if moved else seq
            path = f"/v1/agent/nodes/{self.name}/orders?since={since}&timeout={LONG_POLL_S:g}"
            try:
                payload = await self._call(
                    self._poll_conn, "orders", "GET", path, None, LONG_POLL_S + REQUEST_TIMEOUT_S
                )
            except Unanswered:
                await asyncio.sleep(1.0)
                continue
            polled = port
            answer = json.loads(payload)
            if moved:
                answer["changed"] = True
            if answer["changed"] and seq >= 0:
                self.wake.set()
            elif not answer["changed"] and seq == answer["seq"]:
                await asyncio.sleep(0.2)
            seq = int(answer["seq"])


async def run_fleet(
    nodes: list[FakeNode], stop: asyncio.Event, join_s: float, seed: int = 1
) -> None:
    """Start ``nodes`` at random moments within ``join_s`` seconds (a rack booting), then run
    them until ``stop``."""
    rng = random.Random(seed)

    async def one(node: FakeNode) -> None:
        try:
            await asyncio.wait_for(stop.wait(), timeout=rng.uniform(0.0, join_s))
            return
        except TimeoutError:
            pass
        await node.run(stop)

    await asyncio.gather(*(one(n) for n in nodes))
