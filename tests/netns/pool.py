"""A gpupool pool spread over namespace hosts (see ``hosts.py``): PostgreSQL on ``db``, one or
two ``gpupool server`` replicas on ``srv``/``srv2``, agents with simulated GPUs on ``a1``/``a2``.

Every process is the project's own command (``gpupool server``, ``gpupool agent``) or
PostgreSQL's (``postgres`` run as the ``postgres`` Unix user: initdb refuses root), started
inside its host with ``ip netns exec``. The test reaches them over its bridge.

Jobs run :data:`JOB`: it appends ``<netns inode> <pid> <time>`` to ``out/<name>.beats`` every
0.1 s until ``out/<name>.go`` exists, so the test can tell which host ran each copy and when.
:class:`CopyCounter` samples ``/proc`` for the same jobs (their argv carries :data:`MARK`) and
records the most copies of each job alive at one moment, over the whole test.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx

from tests.netns.hosts import Host, Network

T = TypeVar("T")
PY = sys.executable
REPO = Path(__file__).resolve().parents[2]
PG_BIN_DIRS = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
PG_PORT = 5432
API_PORT = 8470

#: A word in every test job's argv, so the copy counter finds them in ``/proc``.
MARK = "gpupool-netns-job"

JOB = r"""
import os, sys, time
out, name = sys.argv[1], sys.argv[3]
ns = os.stat("/proc/self/ns/net").st_ino
go = os.path.join(out, name + ".go")
with open(os.path.join(out, name + ".beats"), "a") as beats:
    while not os.path.exists(go):
        beats.write(f"{ns} {os.getpid()} {time.time()}\n")
        beats.flush()
        time.sleep(0.1)
"""


def wait_for(probe: Callable[[], T | None], timeout: float, what: str) -> T:
    """Poll ``probe`` every 0.1 s until it returns a true value; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


def pg_unavailable() -> str | None:
    """Why a throwaway PostgreSQL cannot run here, or ``None``."""
    if not any((d / "postgres").exists() and (d / "initdb").exists() for d in PG_BIN_DIRS):
        return "no PostgreSQL server binaries under /usr/lib/postgresql/*/bin"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return "no `postgres` Unix user to run initdb as (it refuses root)"
    if shutil.which("runuser") is None:
        return "no `runuser` to start PostgreSQL as the postgres user"
    return None


class Postgres:
    """A PostgreSQL of the test's own on ``host``: its data folder, started and SIGKILLed."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.bin = next(d for d in PG_BIN_DIRS if (d / "postgres").exists())
        user = pwd.getpwnam("postgres")
        # Not under pytest's tmp_path: that is mode 0700 root, which postgres cannot enter.
        self.dir = Path(tempfile.mkdtemp(prefix="gpupool-netns-pg-"))
        os.chown(self.dir, user.pw_uid, user.pw_gid)
        self.data = self.dir / "data"
        self.log = self.dir / "postgres.log"
        self.url = f"postgresql+psycopg://postgres@{host.address}:{PG_PORT}/postgres"
        initdb = [str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres"]
        subprocess.run(
            ["runuser", "-u", "postgres", "--", *initdb],
            check=True,
            capture_output=True,
            timeout=180,
        )
        # Trust the test's own /24 only (initdb trusts loopback and the local socket).
        with open(self.data / "pg_hba.conf", "a") as hba:
            hba.write(f"host all all {host.network.subnet} trust\n")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        args = [str(self.bin / "postgres"), "-D", str(self.data), "-p", str(PG_PORT)]
        args += ["-k", str(self.dir), "-c", f"listen_addresses={self.host.address}"]
        args += ["-c", "fsync=off"]  # a crash of postgres, not of the machine: nothing lost
        with open(self.log, "ab"):
            pass
        os.chown(self.log, pwd.getpwnam("postgres").pw_uid, -1)
        self.proc = self.host.popen(args, log=self.log, user="postgres")
        wait_for(self.ready, 120, f"PostgreSQL on {self.host.address} (log {self.log})")

    def ready(self) -> bool:
        probe = [str(self.bin / "pg_isready"), "-q", "-h", self.host.address, "-p", str(PG_PORT)]
        return subprocess.run(probe, check=False, timeout=30).returncode == 0

    def sigkill(self) -> None:
        """SIGKILL the postmaster and every backend at once: a crash."""
        self.host.kill_all()
        wait_for(lambda: not self.host.pids(), 60, "PostgreSQL's processes to be gone")

    def destroy(self) -> None:
        self.host.kill_all()
        shutil.rmtree(self.dir, ignore_errors=True)


class Server:
    """``gpupool server`` on ``host``, its home in ``root``, its store the test's PostgreSQL."""

    def __init__(
        self, host: Host, root: Path, database_url: str, *, node_timeout_s: float, lease_s: float
    ) -> None:
        self.host = host
        self.home = root / f"home-{host.name}"
        self.home.mkdir(parents=True, exist_ok=True)
        self.log = root / f"server-{host.name}.log"
        self.url = f"http://{host.address}:{API_PORT}"
        self.args = [PY, "-m", "gpupool.cli", "server", "--home", str(self.home)]
        self.args += ["--host", host.address, "--port", str(API_PORT), "--heartbeat", "0.5"]
        self.args += ["--node-timeout", str(node_timeout_s), "--leader-lease", str(lease_s)]
        self.args += ["--database-url", database_url]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
        env.pop("GPUPOOL_DATABASE_URL", None)
        self.proc = self.host.popen(self.args, log=self.log, env=env)
        wait_for(self.ready, 180, f"the server on {self.host.name} (log {self.log})")

    def ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"server on {self.host.name} exited: {self.tail()}")
        try:
            return httpx.get(self.url + "/readyz", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def leads(self) -> str | None:
        """``yes``/``no`` from ``/readyz``, or ``None`` when it does not answer 200."""
        try:
            r = httpx.get(self.url + "/readyz", timeout=2)
        except httpx.HTTPError:
            return None
        return str(r.json().get("leader")) if r.status_code == 200 else None

    def token(self) -> str:
        return (self.home / "admin-token").read_text().strip()

    def tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""


class Agent:
    """``gpupool agent --simulate`` on ``host``, talking to ``server_url``."""

    def __init__(self, host: Host, root: Path, server_url: str, token_file: Path) -> None:
        self.host = host
        self.node = host.name
        self.state_dir = root / "agents" / host.name
        self.log = root / f"agent-{host.name}.log"
        self.args = [PY, "-m", "gpupool.cli", "agent", "--server", server_url]
        self.args += ["--token-file", str(token_file), "--simulate", "2xA100-80GB"]
        self.args += ["--node", host.name, "--state-dir", str(self.state_dir)]
        self.args += ["--address", host.address, "--checkpoint-root", str(root / "checkpoints")]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
        self.proc = self.host.popen(self.args, log=self.log, env=env)


class Api:
    """The admin's HTTP client to one server."""

    def __init__(self, server: Server, token: str | None = None) -> None:
        self.server = server
        token = token or server.token()  # a second replica has none: the first one made it
        self.http = httpx.Client(
            base_url=server.url, timeout=20, headers={"Authorization": f"Bearer {token}"}
        )

    def post(self, path: str, body: dict[str, Any]) -> Any:
        r = self.http.post(path, json=body)
        assert r.status_code < 300, f"{path}: {r.status_code} {r.text}"
        return r.json() if r.content else None

    def get(self, path: str) -> Any:
        r = self.http.get(path)
        assert r.status_code == 200, f"{path}: {r.status_code} {r.text}"
        return r.json()

    def agent_token(self, path: Path) -> Path:
        self.post("/v1/users", {"name": "netns-agent", "role": "agent"})
        path.write_text(self.post("/v1/tokens", {"user": "netns-agent", "name": "t"})["secret"])
        return path

    def node_state(self, name: str) -> str | None:
        r = self.http.get(f"/v1/nodes/{name}")
        return str(r.json()["state"]) if r.status_code == 200 else None

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(self.get(f"/v1/jobs/{job_id}"))

    def close(self) -> None:
        self.http.close()


def job_spec(out: Path, name: str, **extra: Any) -> dict[str, Any]:
    """The spec of a :data:`JOB` called ``name`` (it runs until ``out/<name>.go`` exists)."""
    return {"name": name, "command": [PY, "-c", JOB, str(out), MARK, name], **extra}


def beats(out: Path, name: str) -> dict[int, tuple[int, float, float]]:
    """Each copy of job ``name`` that ran: pid -> (network namespace inode, first, last beat)."""
    copies: dict[int, tuple[int, float, float]] = {}
    with contextlib.suppress(OSError):
        for line in (out / f"{name}.beats").read_text().splitlines():
            parts = line.split()
            if len(parts) != 3:
                continue  # a line cut short by SIGKILL
            ns, pid, at = int(parts[0]), int(parts[1]), float(parts[2])
            first = copies[pid][1] if pid in copies else at
            copies[pid] = (ns, first, at)
    return copies


def overlaps(copies: dict[int, tuple[int, float, float]]) -> list[tuple[int, int]]:
    """Pairs of copies (pids) whose beats overlap in time: two copies alive at once."""
    spans = sorted((first, last, pid) for pid, (_, first, last) in copies.items())
    return [
        (a[2], b[2])
        for i, a in enumerate(spans)
        for b in spans[i + 1 :]
        if b[0] <= a[1]  # b began before a's last beat
    ]


class CopyCounter:
    """Samples ``/proc`` in a thread: per job, the processes seen and the most alive at once."""

    def __init__(self, network: Network) -> None:
        self.network = network
        self.seen: dict[str, set[tuple[str, int]]] = defaultdict(set)
        self.most: dict[str, int] = defaultdict(int)
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="copy-counter", daemon=True)

    def __enter__(self) -> CopyCounter:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        hosts = {h.inode: h.name for h in self.network.hosts.values()}
        needle = MARK.encode()
        while not self._stop.is_set():
            alive: dict[str, int] = defaultdict(int)
            for entry in os.listdir("/proc"):
                if not entry.isdigit():
                    continue
                try:
                    argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
                    ns = os.stat(f"/proc/{entry}/ns/net").st_ino
                except OSError:
                    continue
                if needle not in argv:
                    continue
                name = argv[argv.index(needle) + 1].decode()
                alive[name] += 1
                self.seen[name].add((hosts.get(ns, f"ns:{ns}"), int(entry)))
            for name, count in alive.items():
                self.most[name] = max(self.most[name], count)
            self.samples += 1
            self._stop.wait(0.1)
