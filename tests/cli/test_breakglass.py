"""``gpupool admin-token``: a new admin token written straight into the store, on SQLite and
PostgreSQL, that a running server takes; bad input changes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx

from tests.api.server_proc import ServerProcess
from tests.store.fixtures import db_url, pg_database

__all__ = ["db_url", "pg_database"]


def _admin_token(home: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GPUPOOL_DATABASE_URL"}
    command = [sys.executable, "-m", "gpupool.cli", "admin-token", "--home", str(home)]
    return subprocess.run(
        [*command, "--database-url", url, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_a_break_glass_token_is_an_admin_token_the_server_takes(
    db_url: str, tmp_path: Path
) -> None:
    issued = _admin_token(tmp_path / "home", db_url, "-q", "--name", "recovery")
    assert issued.returncode == 0, issued.stderr
    secret = issued.stdout.strip()
    assert secret.startswith("gp_")
    with ServerProcess(tmp_path / "home", database_url=db_url) as server:
        auth = {"Authorization": f"Bearer {secret}"}
        who = httpx.get(f"{server.url}/v1/whoami", headers=auth, timeout=10).json()
        assert (who["user"], who["role"]) == ("admin", "admin")
        tokens = httpx.get(f"{server.url}/v1/tokens", headers=auth, timeout=10).json()
        assert "recovery" in {t["name"] for t in tokens}
        audit = httpx.get(f"{server.url}/v1/audit", headers=auth, timeout=10).json()
        assert any(a["actor"] == "admin-token" and a["target"] == "admin" for a in audit), audit

        before = len(tokens)
        refused = _admin_token(tmp_path / "home", db_url, "--user", "nobody")
        assert refused.returncode == 2
        assert refused.stderr.strip().splitlines() == [
            "error: user 'nobody' does not exist: name an admin user with --user "
            "(gpupool users lists them)"
        ]
        bad_ttl = _admin_token(tmp_path / "home", db_url, "--ttl", "soon")
        assert bad_ttl.returncode == 2
        assert "--ttl 'soon' is not a duration" in bad_ttl.stderr
        after = httpx.get(f"{server.url}/v1/tokens", headers=auth, timeout=10).json()
        assert len(after) == before


def test_an_unreachable_store_is_one_line_and_exit_5(tmp_path: Path) -> None:
    url = "postgresql+psycopg://nobody@127.0.0.1:9/none"
    refused = _admin_token(tmp_path / "home", url)
    assert refused.returncode == 5
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: cannot use the store at postgresql+psycopg://")
    assert lines[0].endswith("check --database-url and that the database answers")
