"""PostgreSQL stopped under load: the API answers 503 with a clear message, and recovers by
itself when the database returns. The test runs its own throwaway cluster (``initdb`` and
``pg_ctl`` as the ``postgres`` OS user, in a temporary folder, on a free port)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.api.server_proc import ServerProcess
from tests.ports import free_port
from tests.store.fixtures import IN_CI

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

BIN_DIRS = ("/usr/local/bin", "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/15/bin")


def _tool(name: str) -> str | None:
    for folder in BIN_DIRS:
        path = Path(folder) / name
        if path.exists():
            return str(path)
    return shutil.which(name)


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"cannot run a throwaway PostgreSQL: {reason}", pytrace=False)
    pytest.skip(f"cannot run a throwaway PostgreSQL: {reason}")


class Cluster:
    def __init__(self) -> None:
        initdb, pg_ctl = _tool("initdb"), _tool("pg_ctl")
        if initdb is None or pg_ctl is None:
            _unavailable("initdb/pg_ctl not found")
        self.pg_ctl = str(pg_ctl)
        try:
            self.user = pwd.getpwnam("postgres")
        except KeyError:
            _unavailable("no 'postgres' OS user to run initdb as (it refuses root)")
        self.dir = Path(tempfile.mkdtemp(prefix="gpupool-pg-"))
        os.chown(self.dir, self.user.pw_uid, self.user.pw_gid)
        self.data = self.dir / "data"
        self.port = free_port()
        self._as_pg([str(initdb), "-D", str(self.data), "-A", "trust", "-U", "postgres"])

    def _as_pg(self, args: list[str]) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        result = subprocess.run(
            prefix + args, check=False, capture_output=True, text=True, timeout=120
        )
        if result.returncode != 0:
            _unavailable(f"{args[0]} failed: {result.stderr.strip()[-300:]}")

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1"
        self._as_pg(
            [
                self.pg_ctl,
                "-D",
                str(self.data),
                "-o",
                opts,
                "-l",
                str(self.dir / "log"),
                "-w",
                "start",
            ]
        )

    def stop(self) -> None:
        self._as_pg([self.pg_ctl, "-D", str(self.data), "-m", "fast", "-w", "stop"])

    def destroy(self) -> None:
        subprocess.run(
            [
                "runuser",
                "-u",
                "postgres",
                "--",
                self.pg_ctl,
                "-D",
                str(self.data),
                "-m",
                "immediate",
                "stop",
            ],
            capture_output=True,
            check=False,
        )
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    pg = Cluster()
    pg.start()
    try:
        yield pg
    finally:
        pg.destroy()


def test_a_database_outage_answers_503_and_heals_itself(cluster: Cluster, tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "home", database_url=cluster.url) as server:
        headers = {"Authorization": f"Bearer {server.admin_token()}"}
        statuses: list[tuple[float, int, str]] = []
        stop = threading.Event()

        def load() -> None:
            with httpx.Client(base_url=server.url, headers=headers, timeout=10) as client:
                i = 0
                while not stop.is_set():
                    i += 1
                    body = {"spec": {"name": f"j{i}", "command": ["true"]}}
                    r = client.post("/v1/jobs", json=body)
                    statuses.append((time.monotonic(), r.status_code, r.text))
                    time.sleep(0.02)

        worker = threading.Thread(target=load)
        worker.start()
        try:
            time.sleep(1.0)
            stopping = time.monotonic()
            cluster.stop()
            stopped = time.monotonic()
            time.sleep(2.0)
            down = httpx.get(server.url + "/readyz", timeout=10)
            starting = time.monotonic()
            cluster.start()
            restarted = time.monotonic()
            deadline = restarted + 30
            while time.monotonic() < deadline:
                if statuses and statuses[-1][0] > restarted and statuses[-1][1] == 201:
                    break
                time.sleep(0.2)
        finally:
            stop.set()
            worker.join()
    before = [s for t, s, _ in statuses if t < stopping]
    during = [(s, text) for t, s, text in statuses if stopped + 0.5 < t < starting]
    after = [s for t, s, _ in statuses if t > restarted + 0.1]
    assert before, "no load before the outage"
    assert set(before) == {201}, [x for x in statuses if x[0] < stopping and x[1] != 201][:2]
    assert during, "no requests during the outage"
    assert {s for s, _ in during} == {503}, during[:3]
    assert "database is unavailable" in during[0][1]
    assert "try again" in during[0][1]
    assert down.status_code == 503
    assert after, "no requests after the database returned"
    assert after[-1] == 201, "the server did not recover by itself"
