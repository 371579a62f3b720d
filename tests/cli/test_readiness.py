"""Tests start servers the way a loaded machine does: slowly. They wait on readiness.

A fresh-clone ``make test`` at load average 14-28 failed with "server not ready after 30.0s"
because ``ServerProcess`` gave the server a fixed 30 s. Here a ``sitecustomize`` module delays
the server's start (as a loaded machine's imports do) past that; the test must wait for it, and
a server that dies at start must fail the wait at once with its log, not after a clock.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.api.server_proc import ServerProcess

#: Longer than the old fixed readiness timeout (30 s).
SLOW_START_S = 35


def _delayed_start(folder: Path, code: str) -> dict[str, str]:
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(code, encoding="utf-8")
    return {"PYTHONPATH": str(folder)}


def test_a_server_slow_to_start_on_a_loaded_machine_is_waited_for(tmp_path: Path) -> None:
    env = _delayed_start(tmp_path / "slow", f"import time\ntime.sleep({SLOW_START_S})\n")
    server = ServerProcess(tmp_path / "home", env=env)
    with server:
        token = server.admin_token()
        who = httpx.get(
            server.url + "/v1/whoami", headers={"Authorization": f"Bearer {token}"}, timeout=30
        )
        assert who.json()["role"] == "admin"


def test_a_server_that_dies_at_start_fails_the_wait_at_once_with_its_log(tmp_path: Path) -> None:
    env = _delayed_start(tmp_path / "dead", "raise SystemExit('broken install: no store')\n")
    server = ServerProcess(tmp_path / "home", env=env)
    with pytest.raises(AssertionError) as failed:
        server.start()
    # The process's exit is what ends the wait, not a deadline.
    assert "exited with 1 before it was ready" in str(failed.value)
    assert "broken install: no store" in str(failed.value)
