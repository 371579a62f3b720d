"""One budget per replica: processes, forks and threads of a replica share the region's limits;
dead processes are reaped; a resize is seen by running processes; an escaped job is reported."""

from __future__ import annotations

import os
import signal

from tests.shim.conftest import MIB, shim_env
from tests.shim.helpers import Natives, Probe, fake_uuid, wait_for

OOM = 2
GPU0 = fake_uuid(0)


def start(natives: Natives, env: dict[str, str], probes: list[Probe]) -> Probe:
    p = Probe(natives.probe, env)
    probes.append(p)
    p.ok("init")
    return p


def test_four_processes_share_one_budget_and_a_killed_one_is_reaped(natives, make_region, probes):
    region = make_region(limit=100 * MIB)
    env = shim_env(natives, region)
    procs = [start(natives, env, probes) for _ in range(4)]
    for p in procs[:3]:
        p.ok(f"alloc {30 * MIB}")
    assert region.read().device(GPU0).used_bytes == 90 * MIB
    assert procs[3].err(f"alloc {30 * MIB}") == OOM
    procs[3].ok(f"alloc {10 * MIB}")  # exactly what is left
    assert procs[3].err("alloc 1") == OOM
    assert set(region.read().attached_pids) == {p.pid for p in procs}

    os.kill(procs[0].pid, signal.SIGKILL)
    procs[0].proc.wait()
    # The next allocation that would not fit reaps the dead process's usage first.
    procs[3].ok(f"alloc {30 * MIB}")
    snap = region.read()
    assert snap.device(GPU0).used_bytes == 100 * MIB
    assert procs[0].pid not in snap.attached_pids


def test_the_agent_reaps_a_killed_process(natives, make_region, probes):
    region = make_region(limit=100 * MIB)
    p = start(natives, shim_env(natives, region), probes)
    p.ok(f"alloc {40 * MIB}")
    os.kill(p.pid, signal.SIGKILL)
    p.proc.wait()
    assert region.reap() == 1
    assert region.read().device(GPU0).used_bytes == 0
    assert not region.read().attached


def test_a_process_that_ends_releases_its_usage(natives, make_region, probes):
    region = make_region(limit=100 * MIB)
    p = start(natives, shim_env(natives, region), probes)
    p.ok(f"alloc {40 * MIB}")
    assert region.read().attached_pids == (p.pid,)
    p.ok("exit")
    p.proc.wait()
    assert region.read().device(GPU0).used_bytes == 0
    assert not region.read().attached


def test_forked_children_count_in_the_replica_budget(natives, make_region, probes):
    region = make_region(limit=10 * MIB)
    p = start(natives, shim_env(natives, region), probes)
    p.ok(f"alloc {6 * MIB}")
    rc, _pid = p.ok(f"fork {5 * MIB} 0")
    assert int(rc) == OOM  # 6 + 5 > 10
    rc, child = p.ok(f"fork {4 * MIB} 1")  # the child holds its 4 MiB
    assert int(rc) == 0
    snap = region.read()
    assert snap.device(GPU0).used_bytes == 10 * MIB
    assert int(child) in snap.attached_pids
    assert p.err("alloc 1") == OOM
    os.kill(int(child), signal.SIGKILL)
    wait_for(lambda: region.reap() == 1 or int(child) not in region.read().attached_pids,
             "the killed child to be reaped")  # fmt: skip
    assert region.read().device(GPU0).used_bytes == 6 * MIB
    p.ok(f"alloc {4 * MIB}")


def test_a_process_that_execs_starts_with_a_clean_slot(natives, make_region, probes):
    region = make_region(limit=10 * MIB)
    p = start(natives, shim_env(natives, region), probes)
    p.ok(f"alloc {8 * MIB}")
    assert p.proc.stdin is not None
    p.proc.stdin.write("exec\n")  # exec frees the old image's memory; no answer comes
    p.proc.stdin.flush()
    p.ok("init")
    p.ok(f"alloc {8 * MIB}")
    snap = region.read()
    assert snap.device(GPU0).used_bytes == 8 * MIB
    assert snap.attached_pids == (p.pid,)


def test_a_process_that_execs_with_its_next_command_already_sent_starts_with_a_clean_slot(
    natives, make_region, probes
):
    """On a loaded machine the command after exec can already wait in the pipe when the old
    image reads "exec": the new image must still get it (a stdio read-ahead that exec throws away
    would leave it waiting for ever)."""
    region = make_region(limit=10 * MIB)
    p = start(natives, shim_env(natives, region), probes)
    p.ok(f"alloc {8 * MIB}")
    assert p.proc.stdin is not None
    p.proc.stdin.write("exec\ninit\n")  # one write: both lines are in the pipe before it reads
    p.proc.stdin.flush()
    p.ok_answer("init", p.answer("init"))  # exec itself gives no answer
    p.ok(f"alloc {8 * MIB}")
    snap = region.read()
    assert snap.device(GPU0).used_bytes == 8 * MIB
    assert snap.attached_pids == (p.pid,)


def test_threads_allocating_at_once_never_pass_the_limit(natives, make_region, probes):
    region = make_region(limit=10 * MIB)
    p = start(natives, shim_env(natives, region), probes)
    assert p.ok(f"threads 32 {MIB}") == ["10"]
    assert region.read().device(GPU0).used_bytes == 10 * MIB


def test_a_live_resize_is_seen_by_running_processes(natives, make_region, probes):
    region = make_region(limit=10 * MIB)
    env = shim_env(natives, region)
    a, b = start(natives, env, probes), start(natives, env, probes)
    a.ok(f"alloc {10 * MIB}")
    assert b.err("alloc 1") == OOM
    region.set_limit(GPU0, 30 * MIB)
    assert b.ok("info")[1] == str(30 * MIB)
    b.ok(f"alloc {20 * MIB}")
    assert b.err("alloc 1") == OOM
    region.set_limit(GPU0, 15 * MIB)  # under usage: nothing taken back, nothing new
    assert a.err("alloc 1") == OOM
    assert a.ok("info") == ["0", str(15 * MIB)]
    assert region.read().device(GPU0).mem_limit_bytes == 15 * MIB


def test_a_job_that_escapes_the_shim_is_reported_unshimmed(natives, make_region, probes):
    region = make_region(limit=10 * MIB)
    env = shim_env(natives, region)
    env["LD_LIBRARY_PATH"] = str(natives.fake.parent)  # e.g. a script that resets the path
    escaped = start(natives, env, probes)
    escaped.ok(f"alloc {20 * MIB}")  # nothing holds it
    snap = region.read()
    assert not snap.attached
    assert snap.device(GPU0).used_bytes == 0
    shimmed = start(natives, shim_env(natives, region), probes)
    assert region.read().attached_pids == (shimmed.pid,)
