"""The scheduling snapshot reads a running replica's job through the typed spec (the same
cache as pending jobs), not the raw JSON with its defaults copied: the default CPU rule, the
stop policy's grace, the expected end and preemptibility come out as the spec says."""

from __future__ import annotations

from sqlalchemy import select

from gpupool.control.context import ControlPlane
from gpupool.control.machinery.loop import SchedulingLoop
from gpupool.control.machinery.snapshot import SpecCache, build_snapshot
from gpupool.store.models import AssignmentModel
from tests.control.builders import heartbeat, register, running, submit


def test_running_replicas_come_from_the_typed_spec(cp: ControlPlane) -> None:
    register(cp, "n1", gpus=2)  # 64 CPUs over 2 GPUs: 32 CPUs per GPU
    auto = submit(cp, "auto", gpus="0.5")
    told = submit(
        cp,
        "told",
        resources={"gpus": "0.5", "cpus": "2", "memory": "4GiB"},
        preemptible=True,
        checkpoint={"grace": "7s"},
        expected_duration="1h",
    )
    loop = SchedulingLoop(cp)
    assert loop.leadership.try_acquire()
    assert set(loop.cycle().started) == {auto.id, told.id}
    with cp.read() as s:
        ids = list(s.scalars(select(AssignmentModel.id)))
    heartbeat(cp, "n1", [running(aid) for aid in ids])
    cache = SpecCache()
    with cp.read() as s:
        snapshot, _ = build_snapshot(s, cp.now(), cache)
        again, _ = build_snapshot(s, cp.now(), cache)
    by_job = {r.job_id: r for r in snapshot.running}
    a, t = by_job[auto.id], by_job[told.id]
    assert (a.cpu_milli, a.host_memory_mib, a.grace_period_s) == (16000, 0, 30.0)
    assert (a.preemptible, a.expected_end) == (False, None)
    assert (t.cpu_milli, t.host_memory_mib, t.grace_period_s) == (2000, 4096, 7.0)
    assert t.preemptible is True
    assert t.expected_end == t.start_time + 3600.0
    assert again.running == snapshot.running
    assert cache.misses == 2  # each spec parsed once, the second snapshot from the cache
