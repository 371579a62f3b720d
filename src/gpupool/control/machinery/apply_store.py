"""The store adapter of the decision applier (:mod:`gpupool.control.machinery.apply`).

:class:`StoreTarget` carries out what the applier tells it inside the loop's commit
transaction: a start writes the job's move to ``CONFIGURING``, one assignment per replica and
its slices, and marks the nodes to ring; a stop sets the stop order on every live assignment of
the victim (``jobstate.order_stop``, with the job it makes room for) and moves the job; the
pending reasons and estimates that changed since the snapshot are written in one batched
UPDATE, each row only if still pending at the version read.

Agents see the new assignments and stop orders on their next heartbeat (or at once, through the
order board, for the nodes marked here).
"""

from __future__ import annotations

import secrets
import zlib
from collections.abc import Iterable, Mapping

from sqlalchemy import bindparam, func, select, update
from sqlalchemy.orm import Session

from gpupool.control.machinery.apply import (
    Room,
    VictimState,
    changed_pending,
    device_room,
)
from gpupool.control.machinery.jobstate import move, order_stop, requeue_if_allowed
from gpupool.control.machinery.nodeorders import stored_job
from gpupool.control.machinery.orders import mark
from gpupool.control.machinery.snapshot import PendingRead
from gpupool.domain.assignments import AssignmentState, StopReason
from gpupool.domain.states import JobState
from gpupool.scheduling.decision import PendingInfo, Preemption, Start
from gpupool.store.models import (
    AssignmentModel,
    Base,
    DeviceModel,
    JobModel,
    PoolModel,
    SliceModel,
)

# Core UPDATE on the table (not the ORM class, whose version check would want each row loaded):
# executed with a list of rows it is one executemany. ``WHERE version``: a job changed since
# the snapshot keeps what it has; the next cycle writes its reason again.
_JOBS = Base.metadata.tables[JobModel.__tablename__]
_SET_PENDING_INFO = (
    update(_JOBS)
    .where(
        _JOBS.c.id == bindparam("b_id"),
        _JOBS.c.version == bindparam("b_version"),
        _JOBS.c.state == JobState.PENDING.value,
    )
    .values(pending_reason=bindparam("b_reason"), estimated_start=bindparam("b_estimate"))
)


def new_assignment_id() -> str:
    return "a" + secrets.token_hex(8)


class StoreTarget:
    """The store, as the applier's :class:`~gpupool.control.machinery.apply.DecisionTarget`.

    ``session`` is the commit transaction (its leader epoch already checked), ``reads`` what the
    snapshot read of each pending job, ``now`` the cycle's time and ``epoch`` the leader's epoch
    stamped on new assignments.
    """

    def __init__(
        self, session: Session, reads: Mapping[str, PendingRead], now: float, epoch: int
    ) -> None:
        self.session = session
        self.reads = reads
        self.now = now
        self.epoch = epoch

    def still_pending(self, start: Start) -> bool:
        row = self.session.get(JobModel, start.job_id)
        read = self.reads.get(start.job_id)
        return (
            row is not None
            and read is not None
            and row.state == JobState.PENDING.value
            and row.version == read.version
            and not row.held
        )

    def free_room(self, uuids: Iterable[str]) -> Mapping[str, Room]:
        s = self.session
        wanted = list(uuids)
        rows = s.execute(
            select(
                SliceModel.device_uuid, func.sum(SliceModel.milli), func.sum(SliceModel.memory_mib)
            )
            .where(SliceModel.device_uuid.in_(wanted), SliceModel.active.is_(True))
            .group_by(SliceModel.device_uuid)
        )
        used = {uuid: (int(m or 0), int(mem or 0)) for uuid, m, mem in rows}
        free: dict[str, Room] = {}
        for uuid in wanted:
            dev = s.get(DeviceModel, uuid)
            if dev is None:
                continue
            pool = s.get(PoolModel, dev.pool)
            overcommit = pool.memory_overcommit if pool is not None else 1.0
            u_milli, u_mem = used.get(uuid, (0, 0))
            free[uuid] = device_room(dev.memory_mib, overcommit, u_milli, u_mem)
        return free

    def start(self, start: Start) -> None:
        s, now = self.session, self.now
        row = s.get(JobModel, start.job_id)
        assert row is not None  # still_pending() read it in this transaction
        nodes = sorted({r.node for r in start.replicas})
        mark(s, nodes)
        reason = f"placed on {', '.join(nodes)}"
        if start.time_limit_s is not None:  # --time-min: backfill granted a shorter limit
            expected = row.spec.get("expected_duration_s")
            row.spec = {
                **row.spec,
                "time_limit_s": start.time_limit_s,
                "expected_duration_s": (
                    None if expected is None else min(float(expected), start.time_limit_s)
                ),
            }
            reason += f" with a time limit of {start.time_limit_s:.0f} s (--time-min backfill)"
        move(s, row, JobState.CONFIGURING, now, reason=reason)
        port = 20000 + zlib.crc32(f"{row.id}/{row.restart_count}".encode()) % 20000
        for r in sorted(start.replicas, key=lambda x: x.rank):
            aid = new_assignment_id()
            s.add(
                AssignmentModel(
                    id=aid,
                    job_id=row.id,
                    rank=r.rank,
                    attempt=row.restart_count,
                    node=r.node,
                    epoch=self.epoch,
                    state=AssignmentState.DISPATCHED.value,
                    created_at=now,
                    master_port=port if r.rank == 0 else None,
                )
            )
            s.flush()  # the assignment first: its slices refer to it
            for uuid in r.devices:
                s.add(
                    SliceModel(
                        assignment_id=aid,
                        job_id=row.id,
                        device_uuid=uuid,
                        milli=r.milli_per_device,
                        memory_mib=r.memory_per_device_mib,
                        active=True,
                        accounted_until=now,
                    )
                )
            s.flush()

    def victim_state(self, job_id: str) -> VictimState:
        row = self.session.get(JobModel, job_id)
        if row is None:
            return VictimState.STOPPING
        state = JobState(row.state)
        if state is JobState.RUNNING:
            return VictimState.RUNNING
        if state is JobState.CONFIGURING:
            return VictimState.STARTING
        return VictimState.STOPPING

    def stop(self, preemption: Preemption, *, at_once: bool, reason: str) -> None:
        s, now = self.session, self.now
        row = s.get(JobModel, preemption.victim)
        assert row is not None  # victim_state() read it in this transaction
        policy = stored_job(row).stop_policy
        signal, grace = policy.signal, policy.grace_s
        if at_once:
            order_stop(s, row.id, StopReason.PREEMPT, signal, grace, for_job=preemption.for_job)
            move(s, row, JobState.PREEMPTED, now, reason=reason)
            requeue_if_allowed(s, row, now)
        else:
            move(s, row, JobState.COMPLETING, now, reason=reason)
            order_stop(s, row.id, StopReason.PREEMPT, signal, grace, for_job=preemption.for_job)

    def note_pending(self, pending: Mapping[str, PendingInfo]) -> None:
        changed = [
            {"b_id": job_id, "b_version": read.version, "b_reason": text, "b_estimate": estimate}
            for job_id, read, text, estimate in changed_pending(pending, self.reads)
        ]
        if changed:
            self.session.connection().execute(_SET_PENDING_INFO, changed)
