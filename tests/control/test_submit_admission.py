"""Submit admission against the store (issue 17 item 6): what no node of the pool could hold is
refused and nothing is written; a node that joins is taken into account at once; a pool without
nodes takes anything; ``queue_anyway`` stores it."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from gpupool.control.context import ControlPlane
from gpupool.control.errors import Invalid
from gpupool.control.services.jobs import JobService
from gpupool.control.services.nodes import NodeService
from gpupool.store.models import AuditModel, JobModel, NodeModel
from tests.control.builders import ADMIN, register, submit


def _jobs(cp: ControlPlane) -> int:
    with cp.read() as s:
        return int(s.scalar(select(func.count()).select_from(JobModel)) or 0)


def test_a_pool_without_nodes_takes_any_job(cp: ControlPlane) -> None:
    assert submit(cp, "big", gpus="64").id


def test_a_refused_submit_writes_nothing_and_a_joining_node_is_seen_at_once(
    cp: ControlPlane,
) -> None:
    register(cp, "n1", gpus=2)
    with cp.read() as s:
        audits = int(s.scalar(select(func.count()).select_from(AuditModel)) or 0)
    with pytest.raises(Invalid, match=r"4 GPUs per replica .*at most 2 of one model"):
        submit(cp, "four", gpus="4")
    assert _jobs(cp) == 0
    with cp.read() as s:
        assert int(s.scalar(select(func.count()).select_from(AuditModel)) or 0) == audits
    register(cp, "n2", gpus=4)  # a bigger node joins: no cache delay
    assert submit(cp, "four", gpus="4").id


def test_queue_anyway_stores_what_no_node_could_hold(cp: ControlPlane) -> None:
    register(cp, "n1", gpus=1)
    spec = {"name": "huge", "command": ["true"], "resources": {"gpus": "1", "gpu_memory": "1TiB"}}
    with pytest.raises(Invalid, match="1TiB of GPU memory per GPU"):
        JobService(cp).submit(ADMIN, spec)
    job, created = JobService(cp).submit(ADMIN, spec, queue_anyway=True)
    assert created
    assert _jobs(cp) == 1
    assert job.spec.resources.gpu_memory_mib == 1024 * 1024


def test_a_deleted_node_no_longer_counts(cp: ControlPlane) -> None:
    register(cp, "small", gpus=1)
    register(cp, "big", gpus=4)
    assert submit(cp, "three", gpus="3").id
    with cp.tx() as s:  # the big node went away for good and was marked down
        row = s.get(NodeModel, "big")
        assert row is not None
        row.state = "down"
    NodeService(cp).delete(ADMIN, "big")
    with pytest.raises(Invalid, match="at most 1 of one model"):
        submit(cp, "three-again", gpus="3")
