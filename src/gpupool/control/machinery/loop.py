"""The scheduling loop: snapshot -> schedule -> commit -> dispatch.

One cycle:

1. **snapshot**: read the store in one transaction (:func:`~.snapshot.build_snapshot`);
2. **schedule**: call the pure scheduler (no transaction is open while it runs);
3. **commit**: in one transaction, check the leader epoch, then for each start check that the
   job is still pending at the version the snapshot read (optimistic concurrency: a job
   cancelled or held meanwhile is skipped, not started) and that every device still has room,
   then write the job's transition, its assignments and slices; stop orders for preemption
   victims; the pending reasons and start estimates that changed since the snapshot read them
   (one batched UPDATE, each row only if still pending at the version read);
4. **dispatch**: assignments are now visible to agents, which pull them on their next heartbeat
   (the agent protocol is pull-based, so no network call is made from the loop).

The loop runs in a thread of the server. It wakes on events (:meth:`ControlPlane.poke`: a
submit, a finish, a node change) and on a periodic tick; only the leader runs cycles.
"""

from __future__ import annotations

import importlib
import logging
import secrets
import threading
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sqlalchemy import bindparam, func, select, update
from sqlalchemy.orm import Session

from gpupool.control.context import ControlPlane
from gpupool.control.errors import NotLeader, Unavailable
from gpupool.control.machinery.jobstate import move, order_stop, requeue_if_allowed
from gpupool.control.machinery.leader import Leadership, check_epoch
from gpupool.control.machinery.orders import mark
from gpupool.control.machinery.snapshot import PendingRead, SpecCache, build_snapshot
from gpupool.control.services.nodes import NodeService
from gpupool.control.services.uploads import UploadService
from gpupool.domain.states import JobState
from gpupool.metrics.definitions import SCHEDULER_CYCLE_SECONDS
from gpupool.scheduling.config import SchedulerConfig
from gpupool.scheduling.decision import Decision, PriorityFactors, Start
from gpupool.scheduling.memo import SchedulerMemo
from gpupool.scheduling.snapshot import ClusterSnapshot
from gpupool.store.models import (
    AssignmentModel,
    Base,
    DeviceModel,
    JobModel,
    PoolModel,
    SliceModel,
)

log = logging.getLogger("gpupool.control.machinery.loop")

#: How often the leader deletes uploads past their retention (see control/services/uploads.py).
PRUNE_EVERY_S = 3600.0

ScheduleFn = Callable[[ClusterSnapshot, SchedulerConfig, SchedulerMemo], Decision]


def default_schedule() -> ScheduleFn:
    """The scheduler's ``schedule`` function (imported when first needed)."""
    module = importlib.import_module("gpupool.scheduling.scheduler")
    fn: ScheduleFn = module.schedule
    return fn


@dataclass(frozen=True)
class CycleResult:
    started: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    preempted: tuple[str, ...] = ()
    pending: int = 0
    seconds: float = 0.0


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


def _room_left(s: Session, start: Start) -> bool:
    """Defence in depth: every device of the start still has the milli and memory it needs."""
    need_milli: dict[str, int] = {}
    need_mem: dict[str, int] = {}
    for r in start.replicas:
        for uuid in r.devices:
            need_milli[uuid] = need_milli.get(uuid, 0) + r.milli_per_device
            need_mem[uuid] = need_mem.get(uuid, 0) + r.memory_per_device_mib
    rows = s.execute(
        select(SliceModel.device_uuid, func.sum(SliceModel.milli), func.sum(SliceModel.memory_mib))
        .where(SliceModel.device_uuid.in_(need_milli), SliceModel.active.is_(True))
        .group_by(SliceModel.device_uuid)
    )
    used = {uuid: (int(m or 0), int(mem or 0)) for uuid, m, mem in rows}
    for uuid, milli in need_milli.items():
        dev = s.get(DeviceModel, uuid)
        if dev is None:
            return False
        pool = s.get(PoolModel, dev.pool)
        overcommit = pool.memory_overcommit if pool is not None else 1.0
        u_milli, u_mem = used.get(uuid, (0, 0))
        if u_milli + milli > 1000 or u_mem + need_mem[uuid] > int(dev.memory_mib * overcommit):
            return False
    return True


class SchedulingLoop:
    def __init__(
        self,
        cp: ControlPlane,
        *,
        config: SchedulerConfig | None = None,
        schedule: ScheduleFn | None = None,
        leadership: Leadership | None = None,
    ) -> None:
        self.cp = cp
        self.config = config or SchedulerConfig()
        self._schedule = schedule
        self.memo = SchedulerMemo()  # what this loop's cycles remember (gpupool.scheduling.memo)
        self.leadership = leadership or Leadership(cp)
        self.nodes = NodeService(cp)
        self.uploads = UploadService(cp)
        self._next_prune = 0.0
        # Since when this loop has led with its store reachable, without a break (None: not
        # now). Heartbeats are judged only on silence after it (see mark_silent_nodes_down).
        self.watching_since: float | None = None
        self.priorities: Mapping[str, PriorityFactors] = {}
        self.specs = SpecCache()  # parsed specs of queued jobs, across cycles
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def schedule(self) -> ScheduleFn:
        if self._schedule is None:
            self._schedule = default_schedule()
        return self._schedule

    # ------------------------------------------------------------------ one cycle
    def cycle(self) -> CycleResult:
        """Run one cycle as the leader (raises NotLeader if the lease is not ours)."""
        t0 = self.cp.clock.monotonic()
        now = self.cp.now()
        with self.cp.read() as s:
            snapshot, reads = build_snapshot(s, now, self.specs)
        if not snapshot.pending:
            return CycleResult(seconds=self.cp.clock.monotonic() - t0)
        decision = self.schedule(snapshot, self.config, self.memo)
        result = self._commit(decision, reads, now)
        self.priorities = decision.priorities  # read-only, built for this cycle
        seconds = self.cp.clock.monotonic() - t0
        SCHEDULER_CYCLE_SECONDS.observe(seconds)
        return CycleResult(
            result.started, result.skipped, result.preempted, result.pending, seconds
        )

    def _commit(
        self, decision: Decision, reads: Mapping[str, PendingRead], now: float
    ) -> CycleResult:
        started: list[str] = []
        skipped: list[str] = []
        preempted: list[str] = []
        with self.cp.tx() as s:
            check_epoch(s, self.cp.epoch)
            for start in decision.starts:
                row = s.get(JobModel, start.job_id)
                if (
                    row is None
                    or row.state != JobState.PENDING.value
                    or start.job_id not in reads
                    or row.version != reads[start.job_id].version
                    or row.held
                    or not _room_left(s, start)
                ):
                    skipped.append(start.job_id)
                    continue
                self._start(s, row, start, now)
                started.append(start.job_id)
            for p in decision.preemptions:
                row = s.get(JobModel, p.victim)
                if row is None:
                    continue
                state = JobState(row.state)
                signal = row.spec.get("checkpoint_signal", "SIGTERM")
                grace = float(row.spec.get("grace_period_s", 30.0))
                why = f"preempted for job {p.for_job}: {p.message}"
                if state is JobState.RUNNING:
                    move(s, row, JobState.COMPLETING, now, reason=why)
                    order_stop(s, row.id, "preempt", signal, grace, for_job=p.for_job)
                    preempted.append(row.id)
                elif state is JobState.CONFIGURING:
                    order_stop(s, row.id, "preempt", signal, grace, for_job=p.for_job)
                    move(s, row, JobState.PREEMPTED, now, reason=why)
                    requeue_if_allowed(s, row, now)
                    preempted.append(row.id)
            changed = [
                {
                    "b_id": job_id,
                    "b_version": read.version,
                    "b_reason": text,
                    "b_estimate": info.estimated_start,
                }
                for job_id, info in decision.pending.items()
                if (read := reads.get(job_id)) is not None
                and (
                    (text := f"{info.reason.value}: {info.message}") != read.pending_reason
                    or info.estimated_start != read.estimated_start
                )
            ]
            if changed:
                s.connection().execute(_SET_PENDING_INFO, changed)
        if started or preempted:
            log.info("cycle: started %d, preempted %d", len(started), len(preempted))
        return CycleResult(tuple(started), tuple(skipped), tuple(preempted), len(decision.pending))

    def _start(self, s: Session, row: JobModel, start: Start, now: float) -> None:
        nodes = sorted({r.node for r in start.replicas})
        mark(s, nodes)
        move(s, row, JobState.CONFIGURING, now, reason=f"placed on {', '.join(nodes)}")
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
                    epoch=self.cp.epoch,
                    state="dispatched",
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

    # ------------------------------------------------------------------ the thread
    def run_once(self) -> CycleResult | None:
        """Failure detection and one cycle if we lead; ``None`` when not leading.

        The grace period: after this server starts, takes over as leader, or gets its store
        back after an outage (an :class:`Unavailable` from a cycle), nodes are not judged
        until they have had ``node_timeout_s`` to heartbeat again.
        """
        if not self.leadership.try_acquire():
            self.watching_since = None
            return None
        if self.watching_since is None:
            self.watching_since = self.cp.now()
        try:
            self.nodes.mark_silent_nodes_down(self.watching_since)
        except Unavailable:
            self.watching_since = None
            raise
        if self.cp.now() >= self._next_prune:
            gone = self.uploads.prune()
            if gone:
                log.info("deleted %d upload(s) past their retention", len(gone))
            self._next_prune = self.cp.now() + PRUNE_EVERY_S
        return self.cycle()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.cp.wakeup.wait(self.cp.settings.tick_s)
            self.cp.wakeup.clear()
            if self._stop.is_set():
                break
            try:
                self.run_once()
            except NotLeader as exc:
                log.warning("%s; stepping down", exc)
                self.watching_since = None
                self.leadership.release()
            except Unavailable as exc:
                log.warning("scheduling paused: %s", exc)
                self.watching_since = None  # heartbeats could not be recorded meanwhile
                self._stop.wait(1.0)
            except Exception:
                log.exception("scheduling cycle failed; retrying at the next tick")
                self._stop.wait(1.0)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gpupool-scheduler", daemon=True)
            self._thread.start()
            self.leadership.start_renewing()
            self.cp.poke()

    def stop(self) -> None:
        self._stop.set()
        self.cp.poke()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self.leadership.stop_renewing()
        self.leadership.release()
