"""The control plane under a fleet: N fake agents against real ``gpupool server`` replicas.

    python benchmarks/bench_fleet.py --nodes 200 --join 30 --duration 120
    python benchmarks/bench_fleet.py --nodes 1000 --join 30 --duration 600   # the full scale
    python benchmarks/bench_fleet.py --nodes 5000 --join 60 --duration 300 --interval 15 \
        --node-timeout 60 --replicas 2 --freeze-leader-at 90 --freeze-s 30

Starts ``gpupool server`` (PostgreSQL by default: a fresh database on ``$GPUPOOL_TEST_PG``,
dropped at the end; ``--store sqlite`` for a file under a temporary home), makes an agent
token, then starts ``--nodes`` fake agents (``fleet.py``: the agent protocol as ``gpupool
agent`` speaks it, 8 simulated GPUs each) at random moments within ``--join`` seconds, and
keeps them heartbeating for ``--duration`` seconds after the last one started. Meanwhile it
submits a job mix (``--jobs`` jobs, spread over the run: 1 GPU, half a GPU, 8 GPUs, 2 GPUs,
each ``sleep`` 15-40 s) through the API (through each replica in turn).

``--replicas 2`` starts two servers on the one store (the first leads); every fake node is
given both and starts at one of them at random, moving to the other after a failure, as
``gpupool agent --server A --server B`` does. ``--freeze-leader-at S`` SIGSTOPs the server that
leads S seconds after the last node started, for ``--freeze-s`` seconds (longer than the
lease, so the standby takes over), then SIGCONTs it: the nodes that used it move to the other.

It prints: when the nodes registered (seconds after the first start: median, last, how many
never did), heartbeat latency (p50, p99, max), answers by status per request kind (503s),
timeouts, the servers' CPU (``/proc/<pid>/stat`` of every server and its worker processes:
CPU-s per second over the steady part, after every node registered, and per heartbeat
answered there), ``node.down`` events and replicas failed over (stop reason ``node``) from the
store, jobs started and the submit-to-start latency (the start order reaching the fake node),
the client's own CPU, the nodes' moves to another replica, which server was frozen and
whether another took over meanwhile, and the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from fleet import FakeNode, FleetStats, run_fleet
from rawhttp import Connection

PG_ADMIN_URL = os.environ.get(
    "GPUPOOL_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
JOB_MIX: list[tuple[Any, float]] = [(1, 20.0), ("0.5", 30.0), (8, 40.0), (2, 15.0)]
TICK = os.sysconf("SC_CLK_TCK")
#: Each fake node's last calls (``FakeNode.trail``), kept after the run to explain node.down.
TRAILS: dict[str, list[tuple[float, int, str, str]]] = {}
DOWNED: list[str] = []  # the nodes marked down (names), read from the store after the run


def show_trails(downed: list[str], servers: dict[int, int]) -> None:
    """Print the last calls of (at most four of) the nodes marked down, server by index."""
    for name in downed[:4]:
        print(f"{name}'s last calls:", file=sys.stderr)
        for at, port, kind, outcome in TRAILS.get(name, []):
            where = servers.get(port, port)
            print(f"  {at:.1f} server {where} {kind:9} {outcome}", file=sys.stderr)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its child processes (uvicorn workers)."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry.name) == pid or int(fields[1]) == pid:  # fields[1]: the parent's pid
            total += (int(fields[11]) + int(fields[12])) / TICK
    return total


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Server:
    """One ``gpupool server`` process: on a fresh store, or beside ``first`` on its store."""

    def __init__(self, args: argparse.Namespace, root: Path, first: Server | None = None) -> None:
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.pg_name: str | None = None
        if first is not None:
            self.db_url = first.db_url  # a replica: the first server drops the database
        elif args.store == "postgres":
            self.pg_name = f"gpupool_fleet_{secrets.token_hex(4)}"
            with create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT").connect() as conn:
                conn.execute(text(f'CREATE DATABASE "{self.pg_name}"'))
            url = make_url(PG_ADMIN_URL).set(database=self.pg_name)
            self.db_url = url.render_as_string(hide_password=False)
        else:
            self.db_url = f"sqlite:///{root / 'home' / 'gpupool.db'}"
        launcher = ["-m", "gpupool.cli"]
        if args.profile and first is None:
            launcher = [str(Path(__file__).with_name("profiled_server.py")), args.profile]
        cmd = [
            sys.executable, *launcher, "server", "--home", str(root / "home"),
            "--port", str(self.port), "--database-url", self.db_url,
            "--heartbeat", str(args.interval), "--node-timeout", str(args.node_timeout),
            "--workers", str(args.workers), "--leader-lease", str(args.leader_lease),
        ]  # fmt: skip
        root.mkdir(parents=True, exist_ok=True)
        self.log = open(root / "server.log", "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log, start_new_session=True)
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{self.url}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the server did not start: see {root / 'server.log'}")
            time.sleep(0.2)
        if first is not None:
            self.admin, self.agent_token = first.admin, first.agent_token
            self.node_tokens = first.node_tokens
            return
        self.admin = (root / "home" / "admin-token").read_text().strip()
        with httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self.admin}"}, timeout=30
        ) as http:
            http.post("/v1/users", json={"name": "fleet", "role": "agent"}).raise_for_status()
            made = http.post("/v1/tokens", json={"user": "fleet", "name": "fleet"})
            made.raise_for_status()
            self.agent_token = str(made.json()["secret"])
            self.node_tokens: list[str] = []
            for i in range(args.nodes if args.token_per_node else 0):  # as docs/deploy.md allows
                made = http.post("/v1/tokens", json={"user": "fleet", "name": f"node-{i}"})
                made.raise_for_status()
                self.node_tokens.append(str(made.json()["secret"]))

    def store_counts(self) -> dict[str, int]:
        engine = create_engine(self.db_url)
        try:
            with engine.connect() as conn:

                def one(sql: str) -> int:
                    return int(conn.execute(text(sql)).scalar() or 0)

                downs = conn.execute(
                    text("SELECT time, message FROM events WHERE kind='node.down' ORDER BY time")
                ).all()
                for at, message in downs[:5]:  # what judged them, for the record
                    print(f"node.down at {at:.1f}: {message}", file=sys.stderr)
                DOWNED[:] = [str(m).split()[1] for _, m in downs]
                return {
                    "node.down events": len(downs),
                    "replicas failed over": one(
                        "SELECT count(*) FROM assignments WHERE stop_reason='node'"
                    ),
                    "jobs done": one("SELECT count(*) FROM jobs WHERE state='COMPLETED'"),
                    "jobs failed": one(
                        "SELECT count(*) FROM jobs WHERE state IN ('FAILED','NODE_FAIL')"
                    ),
                }
        finally:
            engine.dispose()

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()
        if self.pg_name is not None:
            with create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT").connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{self.pg_name}" WITH (FORCE)'))


async def submit_jobs(
    servers: list[Server], count: int, start: float, spread_s: float, submitted: dict[str, float]
) -> None:
    """Submit ``count`` jobs of the mix, evenly over ``spread_s`` seconds from ``start``, in
    turn through each server (a job whose server does not answer in 10 s goes to the next,
    with the same idempotency key: a frozen server may have stored it before it stopped, and
    without the key the retry made a second job, 103 jobs for 100 in one run)."""
    headers = {"Authorization": f"Bearer {servers[0].admin}"}
    run = secrets.token_hex(4)
    conns = [Connection("127.0.0.1", s.port, headers) for s in servers]
    for i in range(count):
        await asyncio.sleep(max(0.0, start + spread_s * i / max(count, 1) - time.monotonic()))
        gpus, seconds = JOB_MIX[i % len(JOB_MIX)]
        spec = {
            "name": f"fleet-{i}",
            "command": ["sleep", f"{seconds:g}"],
            "resources": {"gpus": gpus},
        }
        for k in range(len(conns)):
            conn = conns[(i + k) % len(conns)]
            try:
                status, body = await asyncio.wait_for(
                    conn.request(
                        "POST", "/v1/jobs", {"spec": spec, "idempotency_key": f"{run}-{i}"}
                    ),
                    10,
                )
            except (TimeoutError, OSError, asyncio.IncompleteReadError):
                conn.close()
                continue
            if status < 300:
                submitted[json.loads(body)["job"]["id"]] = time.monotonic()
                break
    for conn in conns:
        conn.close()


def leads(server: Server) -> bool:
    try:
        answer = httpx.get(f"{server.url}/readyz", timeout=5)
    except httpx.HTTPError:
        return False
    return answer.status_code == 200 and answer.json().get("leader") == "yes"


async def freeze_leader(
    servers: list[Server], at: float, seconds: float, log: dict[str, Any]
) -> None:
    """SIGSTOP the server that leads at monotonic ``at`` for ``seconds``, then SIGCONT it;
    notes in ``log`` which one it was and whether another took over meanwhile."""
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    leading = [s for s in servers if await asyncio.to_thread(leads, s)]
    if not leading:
        log["frozen"] = "no server led"
        return
    frozen = leading[0]
    leader = servers.index(frozen)
    os.killpg(frozen.proc.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    log["frozen"] = f"server {leader} (port {frozen.port}) for {seconds:g}s"
    log["frozen at (store time)"] = time.time()
    others = [s for s in servers if s is not frozen]
    try:
        while time.monotonic() < stopped + seconds:
            await asyncio.sleep(min(1.0, max(0.0, stopped + seconds - time.monotonic())))
            if "taken over after s" not in log and any(
                [await asyncio.to_thread(leads, s) for s in others]
            ):
                log["taken over after s"] = round(time.monotonic() - stopped, 1)
        log["taken over while frozen"] = "taken over after s" in log
    finally:
        os.killpg(frozen.proc.pid, signal.SIGCONT)


async def measure(args: argparse.Namespace, servers: list[Server]) -> dict[str, Any]:
    server = servers[0]
    stats = FleetStats()
    ports = [s.port for s in servers]
    nodes = [
        FakeNode(
            f"fleet-{i:05d}",
            "127.0.0.1",
            ports,
            server.node_tokens[i] if server.node_tokens else server.agent_token,
            stats,
            seed=i,
        )
        for i in range(args.nodes)
    ]
    stop = asyncio.Event()
    t0 = time.monotonic()

    def cpu() -> float:
        return sum(cpu_seconds(s.proc.pid) for s in servers)

    cpu0, client0 = cpu(), time.process_time()
    frozen: dict[str, Any] = {}
    freezer = (
        asyncio.create_task(
            freeze_leader(servers, t0 + args.join + args.freeze_leader_at, args.freeze_s, frozen)
        )
        if args.freeze_leader_at is not None
        else None
    )
    fleet = asyncio.create_task(run_fleet(nodes, stop, args.join, seed=args.seed))
    submitted: dict[str, float] = {}
    jobs = asyncio.create_task(
        submit_jobs(servers, args.jobs, t0 + args.join, args.duration * 0.6, submitted)
    )
    # The steady part: from the moment every node registered (or the join window ended,
    # whichever is later) to the end.
    steady: tuple[float, float, int] | None = None
    steady_latency_from = 0
    end = t0 + args.join + args.duration
    while time.monotonic() < end:
        await asyncio.sleep(0.5)
        if steady is None and (
            len(stats.registered_at) == args.nodes or time.monotonic() > t0 + 2 * args.join + 30
        ):
            steady = (time.monotonic(), cpu(), len(stats.beat_latency))
            steady_latency_from = len(stats.beat_latency)
            if args.profile:
                server.proc.send_signal(signal.SIGUSR1)  # profiled_server.py: start
    cpu1, t1 = cpu(), time.monotonic()
    if args.profile:
        server.proc.send_signal(signal.SIGUSR2)  # profiled_server.py: write the profile
    stop.set()
    await jobs
    await fleet
    if freezer is not None:
        await freezer
    client = time.process_time() - client0
    joined = sorted(at - t0 for at in stats.registered_at.values())
    result: dict[str, Any] = {
        "nodes": args.nodes,
        "registered": len(joined),
        "registered p50 s": percentile(joined, 0.5),
        "last registered s": joined[-1] if joined else float("nan"),
        "registrations": stats.registrations,
        "server CPU-s total": cpu1 - cpu0,
        "client CPU-s": client,
        "answers": {k: dict(sorted(v.items())) for k, v in stats.answers.items()},
        "timeouts": dict(stats.timeouts),
        "refused": dict(stats.refused),
        "servers": len(servers),
        "moves to another server": stats.moves,
        **frozen,
    }
    TRAILS.update({n.name: list(n.trail) for n in nodes})
    if steady is not None:
        wall, cpu_at, beats_at = steady
        beats = len(stats.beat_latency) - beats_at
        result["steady s"] = t1 - wall
        result["server CPU-s/s steady"] = (cpu1 - cpu_at) / max(t1 - wall, 1e-9)
        result["heartbeats steady"] = beats
        result["server CPU ms/heartbeat steady"] = 1000 * (cpu1 - cpu_at) / max(beats, 1)
        lat = stats.beat_latency[steady_latency_from:]
        result["heartbeat p50 ms steady"] = 1000 * percentile(lat, 0.5)
        result["heartbeat p99 ms steady"] = 1000 * percentile(lat, 0.99)
    lat = stats.beat_latency
    result["heartbeat p50 ms"] = 1000 * percentile(lat, 0.5)
    result["heartbeat p99 ms"] = 1000 * percentile(lat, 0.99)
    result["heartbeat max ms"] = 1000 * max(lat, default=float("nan"))
    waits = [
        stats.job_started_at[j] - at for j, at in submitted.items() if j in stats.job_started_at
    ]
    result["jobs submitted"] = len(submitted)
    result["jobs started"] = len(waits)
    result["submit->start p50 s"] = percentile(waits, 0.5)
    result["submit->start max s"] = max(waits, default=float("nan"))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--join", type=float, default=30.0, help="seconds over which nodes start")
    parser.add_argument("--duration", type=float, default=120.0, help="seconds after the join")
    parser.add_argument("--interval", type=float, default=5.0, help="heartbeat interval, s")
    parser.add_argument("--node-timeout", type=float, default=30.0)
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--store", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--replicas", type=int, default=1, help="server replicas on the store")
    parser.add_argument("--leader-lease", type=float, default=15.0)
    parser.add_argument(
        "--token-per-node",
        action="store_true",
        help="each node its own agent token (docs/deploy.md: a token per node, or one for all)",
    )
    parser.add_argument(
        "--freeze-leader-at",
        type=float,
        default=None,
        help="SIGSTOP the leading server this many seconds after the join (once)",
    )
    parser.add_argument("--freeze-s", type=float, default=30.0, help="how long it stays stopped")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--profile",
        metavar="OUT.prof",
        help="cProfile the first server's event loop over the steady part (profiled_server.py)",
    )
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4 * args.nodes + 256)), hard))
    if args.replicas > 1 and args.store != "postgres":
        raise SystemExit("--replicas needs --store postgres (replicas share one PostgreSQL)")
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        first = Server(args, Path(tmp))
        servers = [first]
        try:
            for i in range(1, args.replicas):
                servers.append(Server(args, Path(tmp) / f"replica-{i}", first))
            result = asyncio.run(measure(args, servers))
            result.update(first.store_counts())
            show_trails(DOWNED, {s.port: i for i, s in enumerate(servers)})
            if DOWNED:  # keep the servers' logs, to explain the nodes marked down
                kept = Path(tempfile.mkdtemp(prefix="bench-fleet-logs-"))
                for i, server in enumerate(servers):
                    server.log.flush()
                    log = Path(server.log.name)
                    if log.exists():
                        shutil.copy(log, kept / f"server-{i}.log")
                result["server logs kept in"] = str(kept)
        finally:
            for server in reversed(servers):
                server.stop()
    result["load average"] = Path("/proc/loadavg").read_text().split()[:3]
    result["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if args.json:
        print(json.dumps(result, indent=1))
        return
    for key, value in result.items():
        shown = f"{value:.3f}" if isinstance(value, float) else value
        print(f"{key:34} {shown}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
