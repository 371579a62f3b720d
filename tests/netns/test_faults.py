"""Faults across real hosts (issue 18): a pool spread over network namespaces, with its own
PostgreSQL, and the network or the store taken away under running jobs.

1. One agent's link is cut past the node timeout (its link down, or unplugged from the bridge
   so that its packets are silently lost): the node goes down, its jobs start on the
   other agent; healed, the returning agent's copies are stopped. Never two copies of a job at
   once, counted in ``/proc`` on both hosts and from each copy's own heartbeat file.
2. The test's PostgreSQL is SIGKILLed during a burst of submits and while jobs run: 503 with
   Retry-After while it is down, recovery when it is back, every acknowledged submit kept once,
   no running job failed over.
3. The leader of two server replicas is frozen (SIGSTOP) past its lease: the standby leads,
   the old one, woken, is fenced and becomes the standby; no job assigned twice.

Run: ``.venv/bin/pytest tests/netns -q`` as root (see docs/faults.md).
"""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, func, select
from sqlalchemy.orm import Session

from gpupool.store.models import AssignmentModel, LeaderModel
from tests.netns.hosts import CUTS, Network
from tests.netns.pool import (
    Agent,
    Api,
    CopyCounter,
    Postgres,
    Server,
    beats,
    job_spec,
    overlaps,
    wait_for,
)

NODE_TIMEOUT_S = 4.0
LEASE_S = 3.0


class Pool:
    """Servers on ``srv`` (and ``srv2``), agents on ``a1`` and ``a2``, the store on ``db``."""

    def __init__(self, network: Network, postgres: Postgres, root: Path, replicas: int) -> None:
        self.network = network
        self.root = root
        self.out = root / "out"
        self.out.mkdir()
        self.servers = [
            Server(
                network.add(name),
                root,
                postgres.url,
                node_timeout_s=NODE_TIMEOUT_S,
                lease_s=LEASE_S,
            )
            for name in ("srv", "srv2")[:replicas]
        ]
        self.agents: dict[str, Agent] = {}
        self.api: Api | None = None

    def start(self, agents: tuple[str, ...] = ("a1", "a2"), agents_to: int = 0) -> Api:
        """Start the servers (the first one leads), then the agents, which talk to server
        number ``agents_to``; the admin's client talks to the first server."""
        first = self.servers[0]
        first.start()
        wait_for(lambda: first.leads() == "yes", 60, "the first server to lead")
        for server in self.servers[1:]:
            server.start()
        self.api = Api(first)
        token = self.api.agent_token(self.root / "agent-token")
        for name in agents:
            url = self.servers[agents_to].url
            agent = Agent(self.network.add(name), self.root, url, token)
            agent.start()
            self.agents[name] = agent
        for name in agents:
            wait_for(lambda n=name: self.api.node_state(n) == "up", 180, f"agent {name} up")  # type: ignore[union-attr]
        return self.api

    def submit(self, name: str, **extra: object) -> str:
        assert self.api is not None
        body = {"spec": job_spec(self.out, name, **extra)}
        return str(self.api.post("/v1/jobs", body)["job"]["id"])

    def finish(self, names: list[str]) -> None:
        for name in names:
            (self.out / f"{name}.go").write_text("")

    def close(self) -> None:
        if self.api is not None:
            self.api.close()


@pytest.fixture
def pool(network: Network, postgres: Postgres, tmp_path: Path) -> Iterator[Pool]:
    p = Pool(network, postgres, tmp_path, replicas=1)
    try:
        yield p
    finally:
        p.close()  # the hosts and their processes go with the network fixture


@pytest.mark.parametrize("how", CUTS)
def test_a_cut_agent_link_moves_its_jobs_and_never_runs_two_copies(pool: Pool, how: str) -> None:
    api = pool.start()
    names = [f"mover{i}" for i in range(4)]
    with CopyCounter(pool.network) as counter:
        jobs = {n: pool.submit(n, resources={"gpus": "0.5", "cpus": "0.25"}) for n in names}
        for job_id in jobs.values():
            wait_for(lambda j=job_id: api.job(j)["state"] == "RUNNING", 120, f"{job_id} running")
        for name in names:
            wait_for(lambda n=name: beats(pool.out, n), 60, f"{name} to beat")
        hosts = {a.host.inode: a.node for a in pool.agents.values()}
        on = {n: hosts[next(iter(beats(pool.out, n).values()))[0]] for n in names}
        cut = pool.agents[on[names[0]]]
        other = ({"a1", "a2"} - {cut.node}).pop()
        moved = [n for n in names if on[n] == cut.node]
        cut.host.cut(how)
        try:
            wait_for(lambda: api.node_state(cut.node) == "down", 60, f"{cut.node} marked down")
            for name in moved:
                try:
                    wait_for(lambda n=name: len(beats(pool.out, n)) >= 2, 120, f"{name} moved")
                except AssertionError:
                    raise AssertionError(_explain(api, jobs[name])) from None
                job = api.job(jobs[name])
                assert job["restart_count"] == 1, job
            # Past the node timeout twice over with the agent still cut off.
            time.sleep(2 * NODE_TIMEOUT_S)  # the fault's length, not a wait for a condition
        finally:
            cut.host.heal()
        wait_for(lambda: api.node_state(cut.node) == "up", 120, f"{cut.node} back up")
        for name in moved:
            wait_for(
                lambda n=name: (
                    not [pid for host, pid in counter.seen[n] if host == cut.node and _alive(pid)]
                ),
                120,
                f"{cut.node}'s copy of {name} to stop",
            )
        for name in names:
            job = api.job(jobs[name])
            assert job["state"] == "RUNNING", job
        pool.finish(names)
        for name, job_id in jobs.items():
            wait_for(lambda j=job_id: api.job(j)["state"] == "COMPLETED", 120, f"{name} done")
    for name in names:
        copies = beats(pool.out, name)
        assert overlaps(copies) == [], f"{name}: two copies alive at once: {copies}"
        assert counter.most[name] == 1, (name, counter.seen[name])
    hosts_seen = {n: sorted(h for h, _ in counter.seen[n]) for n in names}
    print(f"copies seen: {hosts_seen}; samples {counter.samples}; moved {moved} to {other}")


def _all_jobs(api: Api) -> list[dict[str, Any]]:
    jobs: list[dict[str, Any]] = []
    cursor = None
    for _ in range(1000):  # pages of 1,000: bounded far above any burst here
        page = api.get("/v1/jobs?limit=1000" + (f"&cursor={cursor}" if cursor else ""))
        jobs += page["jobs"]
        cursor = page["next_cursor"]
        if not cursor:
            return jobs
    raise AssertionError("more than a million jobs listed")


class Burst:
    """Submits jobs one after another in a thread (each name once, never retried) and records
    every answer: (name, status, Retry-After, job id)."""

    def __init__(self, pool: Pool, limit: int = 3000) -> None:
        self.pool = pool
        self.limit = limit
        self.answers: list[tuple[str, int, str | None, str | None]] = []
        self.no_answer: list[tuple[str, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="burst", daemon=True)

    def __enter__(self) -> Burst:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)

    def acked(self) -> list[tuple[str, str]]:
        return [(n, j) for n, status, _, j in self.answers if 200 <= status < 300 and j]

    def count(self, status: int) -> int:
        return sum(1 for _, s, _, _ in self.answers if s == status)

    def _run(self) -> None:
        assert self.pool.api is not None
        http = self.pool.api.http
        # Never placed (no such GPU here, queued anyway): the burst tests the store, not the
        # agents.
        resources = {"gpus": "1", "gpu_types": ["H100-80GB"]}
        for i in range(self.limit):
            if self._stop.is_set():
                return
            name = f"burst{i}"
            spec = {"name": name, "command": ["true"], "resources": resources}
            body = {"spec": spec, "queue_anyway": True}
            try:
                r = http.post("/v1/jobs", json=body)
            except httpx.HTTPError as exc:
                self.no_answer.append((name, repr(exc)))
                continue
            job_id = r.json()["job"]["id"] if r.status_code < 300 else None
            self.answers.append((name, r.status_code, r.headers.get("Retry-After"), job_id))
            self._stop.wait(0.02)


def _beats_after(api: Api, moment: float) -> bool:
    r = api.http.get("/v1/nodes")
    nodes = r.json() if r.status_code == 200 else []
    return bool(nodes) and min(n["last_heartbeat"] or 0 for n in nodes) > moment


def test_postgres_sigkilled_during_a_burst_answers_503_loses_nothing_and_fails_no_job(
    pool: Pool, postgres: Postgres
) -> None:
    api = pool.start()
    names = [f"keep{i}" for i in range(4)]
    with CopyCounter(pool.network) as counter:
        jobs = {n: pool.submit(n, resources={"gpus": "0.5", "cpus": "0.25"}) for n in names}
        for job_id in jobs.values():
            wait_for(lambda j=job_id: api.job(j)["state"] == "RUNNING", 120, f"{job_id} running")
        with Burst(pool) as burst:
            wait_for(lambda: len(burst.acked()) >= 20, 120, "20 submits acknowledged")
            postgres.sigkill()
            killed_at = len(burst.answers)
            wait_for(lambda: burst.count(503) >= 5, 120, "503s while PostgreSQL is down")
            time.sleep(2 * NODE_TIMEOUT_S)  # the outage's length: twice the node timeout
            ready = api.http.get("/readyz")
            assert ready.status_code == 503, ready.text
            postgres.start()
            back = time.time()
            acked_before = len(burst.acked())
            wait_for(lambda: len(burst.acked()) >= acked_before + 20, 120, "submits again")
        # Heartbeats recorded well past a node timeout after the store came back: the server
        # has been judging nodes again for a while by then.
        wait_for(lambda: _beats_after(api, back + 2 * NODE_TIMEOUT_S), 120, "heartbeats after")
        for job_id in jobs.values():
            job = api.job(job_id)
            assert (job["state"], job["restart_count"]) == ("RUNNING", 0), job
            targets = [e["target"] for e in api.get(f"/v1/jobs/{job_id}/events")]
            assert "NODE_FAIL" not in targets, targets
        assert [n for n in api.get("/v1/nodes") if n["state"] != "up"] == []
        assert [e for e in api.get("/v1/events") if e["kind"] == "node.down"] == []
        pool.finish(names)
        for name, job_id in jobs.items():
            wait_for(lambda j=job_id: api.job(j)["state"] == "COMPLETED", 120, f"{name} done")
    statuses = Counter(s for _, s, _, _ in burst.answers)
    during = burst.answers[killed_at:]
    assert set(statuses) <= {201, 503}, statuses
    assert all(ra for _, s, ra, _ in burst.answers if s == 503), "a 503 without Retry-After"
    assert any(s == 503 for _, s, _, _ in during)
    stored = Counter(j["name"] for j in _all_jobs(api) if j["name"].startswith("burst"))
    acked = burst.acked()
    missing = [n for n, _ in acked if stored[n] == 0]
    assert missing == [], f"acknowledged but lost: {missing}"
    assert [n for n, c in stored.items() if c > 1] == [], "a submit stored twice"
    for name in names:
        assert counter.most[name] == 1, counter.seen[name]
        assert len(counter.seen[name]) == 1, counter.seen[name]
    print(
        f"submits: {len(burst.answers)} answered ({dict(statuses)}), {len(acked)} acknowledged,"
        f" {len(burst.no_answer)} unanswered, {sum(stored.values())} stored;"
        f" job processes seen: {sum(len(counter.seen[n]) for n in names)} for {len(names)} jobs"
    )


@pytest.fixture
def replicas(network: Network, postgres: Postgres, tmp_path: Path) -> Iterator[Pool]:
    p = Pool(network, postgres, tmp_path, replicas=2)
    try:
        yield p
    finally:
        for server in p.servers:  # never leave a stopped process behind
            if server.proc is not None and server.proc.poll() is None:
                server.proc.send_signal(signal.SIGCONT)
        p.close()


def _assignments(url: str) -> list[tuple[str, int]]:
    engine = create_engine(url)
    try:
        with Session(engine) as s:
            rows = s.execute(select(AssignmentModel.job_id, AssignmentModel.epoch)).all()
            return [(str(j), int(e)) for j, e in rows]
    finally:
        engine.dispose()


def _epoch(url: str) -> int:
    engine = create_engine(url)
    try:
        with Session(engine) as s:
            return int(s.scalar(select(func.max(LeaderModel.epoch))) or 0)
    finally:
        engine.dispose()


def test_a_frozen_leader_on_its_own_host_is_replaced_and_fenced_when_it_wakes(
    replicas: Pool, postgres: Postgres
) -> None:
    pool = replicas
    pool.start(agents_to=1)  # the agents talk to the standby, which stays awake
    leader, standby = pool.servers
    assert standby.leads() == "no"
    with CopyCounter(pool.network) as counter:
        before = pool.submit("before", resources={"gpus": "0.5", "cpus": "0.25"})
        standby_api = Api(standby, leader.token())
        try:
            wait_for(lambda: standby_api.job(before)["state"] == "RUNNING", 120, "before runs")
            first_epoch = _epoch(postgres.url)
            assert leader.proc is not None
            leader.proc.send_signal(signal.SIGSTOP)  # frozen: no renewal, sockets left open
            try:
                body = {
                    "spec": job_spec(pool.out, "frozen", resources={"gpus": "0.5", "cpus": "0.25"})
                }
                frozen = str(standby_api.post("/v1/jobs", body)["job"]["id"])
                wait_for(lambda: standby_api.job(frozen)["state"] == "RUNNING", 120, "frozen runs")
                assert standby.leads() == "yes"
                new_epoch = _epoch(postgres.url)
                assert new_epoch > first_epoch
            finally:
                leader.proc.send_signal(signal.SIGCONT)
            wait_for(lambda: leader.leads() == "no", 120, "the woken server to step down")
            assert "stepping down" in leader.tail(400)
            later = pool.submit("later", resources={"gpus": "0.5", "cpus": "0.25"})  # via the old
            wait_for(lambda: standby_api.job(later)["state"] == "RUNNING", 120, "later runs")
            assert (leader.leads(), standby.leads()) == ("no", "yes")
            rows = _assignments(postgres.url)
            assert sorted(j for j, _ in rows) == sorted([before, frozen, later]), rows
            assert {e for j, e in rows if j != before} == {new_epoch}, rows
            assert standby_api.job(before)["restart_count"] == 0
            pool.finish(["before", "frozen", "later"])
            for job_id in (before, frozen, later):
                wait_for(
                    lambda j=job_id: standby_api.job(j)["state"] == "COMPLETED",
                    120,
                    f"{job_id} done",
                )
        finally:
            standby_api.close()
    for name in ("before", "frozen", "later"):
        assert counter.most[name] == 1, counter.seen[name]
        assert len(counter.seen[name]) == 1, counter.seen[name]
        assert overlaps(beats(pool.out, name)) == []
    print(f"epochs {first_epoch} -> {new_epoch}; assignments {len(rows)} for 3 jobs")


def _explain(api: Api, job_id: str) -> str:
    events = api.get(f"/v1/jobs/{job_id}/events")
    return f"job {api.job(job_id)}\nevents {events}\nnodes {api.get('/v1/nodes')}"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False
