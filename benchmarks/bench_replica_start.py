"""Submit to RUNNING when the agent long-polls the standby (issue 26): two real ``gpupool
server`` replicas on one fresh PostgreSQL database, one real ``gpupool agent`` given only the
standby's URL, jobs submitted one at a time through the leader and through the standby.

    python benchmarks/bench_replica_start.py [--jobs 5] [--heartbeat 5]

Prints, per way in, the seconds from the submit to the job's RUNNING state (as the API shows
it): each, the median and the maximum, and the load average. The harness is the CI test's
(``tests/fleet/replicas.py``); run it from the repository root.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fleet.replicas import Replicas, leads

# as in the tests (tests/conftest.py): jobs run as the agent's account under a private folder
os.environ.setdefault("GPUPOOL_RUN_AS", "agent")
PG_ADMIN_URL = os.environ.get(
    "GPUPOOL_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


@contextmanager
def fresh_database() -> Iterator[str]:
    """A new PostgreSQL database's URL, dropped afterwards."""
    name = f"gpupool_replica_{secrets.token_hex(4)}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=5, help="jobs through each server")
    parser.add_argument("--heartbeat", type=float, default=5.0, help="heartbeat interval, s")
    args = parser.parse_args()
    timeout = str(max(30.0, 6 * args.heartbeat))
    server_args = ("--leader-lease", "15", "--heartbeat", str(args.heartbeat))
    times: dict[str, list[float]] = {"leader": [], "standby": []}
    with fresh_database() as url, tempfile.TemporaryDirectory(prefix="bench-replica-") as tmp:
        pair = Replicas(Path(tmp), url, (*server_args, "--node-timeout", timeout))
        try:
            pair.start_servers()
            pair.start_agent(pair.b)
            for i in range(args.jobs):
                for way, server in (("leader", pair.a), ("standby", pair.b)):
                    name = f"{way}-{i}"
                    times[way].append(pair.time_to_running(server, name, 300))
                    pair.finish(server, name)  # its GPU free again for the next one
            assert leads(pair.a) == "yes", "the leader changed during the run"
        except AssertionError:
            agent_log = Path(tmp) / "agent.log"
            print(agent_log.read_text()[-3000:] if agent_log.exists() else "no agent log")
            raise
        finally:
            pair.close()
    for way, values in times.items():
        shown = ", ".join(f"{v:.2f}" for v in values)
        print(
            f"through the {way:8} submit -> RUNNING s: median {statistics.median(values):.2f}, "
            f"max {max(values):.2f} ({shown})"
        )
    print("load average", " ".join(Path("/proc/loadavg").read_text().split()[:3]))


if __name__ == "__main__":
    main()
