"""After ``kill -9`` of an agent, its job never runs beside its requeued copy (issue 24 item 7).

The agent's fence (agent/fence.py) stops a cut-off agent's replicas before the server starts
them elsewhere, but a killed agent fences nothing, and its replicas' supervisors outlive it by
design: the job ran on, unseen, while the server requeued it. Here the job runs on n1, n2 has a
free GPU, n1's agent is killed with SIGKILL (and not restarted), and the test samples, every
0.1 s from the kill until the requeued copy has run for a while, whether the first copy's
process and the second's are alive at once: a two-copy moment.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.pool import Pool, wait_for

NODE_TIMEOUT_S = 8.0


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Pool]:
    with Pool.running(tmp_path, {"n1": "1xA100-80GB"}, node_timeout_s=NODE_TIMEOUT_S) as p:
        yield p


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):  # a zombie is not running
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def test_a_killed_agent_leaves_no_second_copy_running(pool: Pool) -> None:
    job_id = pool.submit("twin", "sleep=6", "forever", resources={"gpus": 1})
    first = wait_for(lambda: pool.record("twin", 0, 0), 60, "the first copy to run")
    pool.start_agent("n2", "1xA100-80GB")  # a free GPU elsewhere
    pool.kill_agent("n1")
    killed_at = time.monotonic()
    moments = 0
    second: dict[str, object] | None = None
    seen_second_at: float | None = None
    while True:
        second = second or pool.record("twin", 0, 1)
        if second is not None and seen_second_at is None:
            seen_second_at = time.monotonic()
        alive_first = _alive(int(first["pid"]))
        alive_second = second is not None and _alive(int(str(second["pid"])))
        moments += alive_first and alive_second
        if seen_second_at is not None and time.monotonic() - seen_second_at > 4.0:
            break
        assert time.monotonic() - killed_at < 120, f"no second copy after 120 s: {pool.job(job_id)}"
        time.sleep(0.1)
    assert moments == 0, f"{moments} samples (0.1 s apart) saw both copies running"
    assert not _alive(int(first["pid"]))
    fenced_after = pool.job(job_id)
    assert fenced_after["restart_count"] >= 1
