"""Transient per-replica accounts (agent/dynuid.py): leases, stale leases, release."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from gpupool.agent.dynuid import (
    FIRST_UID,
    LAST_UID,
    UidLeases,
    processes_of,
    release_orphans,
)
from tests.agent.helpers import wait_for

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="running as a leased UID needs root")


def test_two_replicas_get_two_uids_of_the_range_and_two_agents_never_share_one(
    tmp_path: Path,
) -> None:
    registry = tmp_path / "uids"
    a = UidLeases(tmp_path / "a", registry)
    b = UidLeases(tmp_path / "b", registry)
    # no replica folder exists yet (allocation comes before the launch): the agents live
    taken = [a.allocate("r1"), a.allocate("r2"), b.allocate("r1"), b.allocate("r2")]
    assert len(set(taken)) == 4
    assert all(FIRST_UID <= uid <= LAST_UID for uid in taken)
    assert a.leased("r1") == taken[0]
    assert b.leased("r1") == taken[2]
    assert oct(registry.stat().st_mode & 0o777) == oct(0o700)


def test_a_lease_of_a_dead_agent_whose_replica_is_gone_is_taken_over(tmp_path: Path) -> None:
    registry = tmp_path / "uids"
    uid = UidLeases(tmp_path / "dead", registry).allocate("r1")
    lease = registry / str(uid)
    held = json.loads(lease.read_text())
    lease.write_text(json.dumps({**held, "pid": 2**22 + 1}))  # an agent that died holding it
    again = UidLeases(tmp_path / "other", registry).allocate("r1")
    assert again == uid  # the same start in the range, and the stale lease was taken over
    assert json.loads(lease.read_text())["state_dir"] == str((tmp_path / "other").resolve())


@needs_root
def test_release_kills_what_runs_as_the_uid_and_gives_the_folders_back(tmp_path: Path) -> None:
    leases = UidLeases(tmp_path / "state", tmp_path / "uids")
    (tmp_path / "state" / "jobs" / "r1").mkdir(parents=True)
    uid = leases.allocate("r1")
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "model.pt").write_text("weights")
    os.chown(folder, uid, uid)
    os.chown(folder / "model.pt", uid, uid)
    stray = subprocess.Popen(  # a daemonised child, left behind by the job
        ["sleep", "300"], user=uid, group=uid, extra_groups=[], start_new_session=True
    )
    assert stray.pid in processes_of(uid)
    assert leases.release("r1", [folder]) == uid
    assert stray.wait(timeout=30) != 0
    assert processes_of(uid) == []
    assert (folder / "model.pt").stat().st_uid == os.geteuid()
    assert folder.stat().st_mode & 0o777 == 0o700
    assert leases.leased("r1") is None


def test_a_restarted_agent_releases_the_leases_of_replicas_it_does_not_adopt(
    tmp_path: Path,
) -> None:
    leases = UidLeases(tmp_path / "state", tmp_path / "uids")
    leases.allocate("ended")
    kept = leases.allocate("running")
    done = tmp_path / "state" / "done" / "ended"
    done.mkdir(parents=True)
    (done / "assignment.json").write_text(json.dumps({"assignment": {"job_id": "j1"}}))
    release_orphans(leases, ["running"], tmp_path / "state" / "done")
    wait_for(lambda: leases.leased("ended") is None, 30, "the orphaned lease to end")
    assert leases.leased("running") == kept
