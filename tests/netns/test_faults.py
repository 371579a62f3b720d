"""Faults across real hosts (issue 18): a pool spread over network namespaces, with its own
PostgreSQL, and the network or the store taken away under running jobs.

1. One agent's link is cut past the node timeout: the node goes down, its jobs start on the
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

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.netns.hosts import Network
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

    def start(self, agents: tuple[str, ...] = ("a1", "a2")) -> Api:
        first = self.servers[0]
        first.start()
        wait_for(lambda: first.leads() == "yes", 60, "the first server to lead")
        for server in self.servers[1:]:
            server.start()
        self.api = Api(first)
        token = self.api.agent_token(self.root / "agent-token")
        for name in agents:
            agent = Agent(self.network.add(name), self.root, first.url, token)
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


def test_a_cut_agent_link_moves_its_jobs_and_never_runs_two_copies(pool: Pool) -> None:
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
        cut.host.cut()
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


def _explain(api: Api, job_id: str) -> str:
    events = api.get(f"/v1/jobs/{job_id}/events")
    return f"job {api.job(job_id)}\nevents {events}\nnodes {api.get('/v1/nodes')}"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False
