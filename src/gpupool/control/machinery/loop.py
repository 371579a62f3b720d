"""The scheduling loop: snapshot -> schedule -> commit -> dispatch.

One cycle:

1. **snapshot**: read the store in one transaction (:func:`~.snapshot.build_snapshot`);
2. **schedule**: call the pure scheduler (no transaction is open while it runs);
   Pending jobs whose dependency is not met are held back from it, and those whose dependency
   can never be met are ended (:mod:`~gpupool.control.machinery.dependencies`);
3. **commit**: in one transaction, check the leader epoch, then apply the decision by the rules
   of :mod:`~gpupool.control.machinery.apply` (the same ones the simulator's replay follows)
   through its store adapter (:mod:`~gpupool.control.machinery.apply_store`): starts whose job
   is still pending at the version the snapshot read (optimistic concurrency: a job cancelled or
   held meanwhile is skipped, not started) and whose devices still have room, with their
   assignments and slices; stop orders for preemption victims, naming the job each makes room
   for; the pending reasons and start estimates that changed since the snapshot read them (one
   batched UPDATE, each row only if still pending at the version read);
4. **dispatch**: assignments are now visible to agents, which pull them on their next heartbeat
   (the agent protocol is pull-based, so no network call is made from the loop).

The loop runs in a thread of the server. It wakes on events (:meth:`ControlPlane.poke`: a
submit, a finish, a node change) and on a periodic tick while jobs are pending; an idle
leader sleeps until a node could time out (:meth:`SchedulingLoop.idle_wait_s`). Only the
leader runs cycles; a standby that is poked passes it on to the leader (on PostgreSQL, a notice
on ``store.notify.WAKE_CHANNEL``), so a job submitted through any replica starts at once.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sqlalchemy import select

from gpupool.control.context import ControlPlane
from gpupool.control.errors import NotLeader, Unavailable
from gpupool.control.machinery.apply import apply_decision
from gpupool.control.machinery.apply_store import StoreTarget
from gpupool.control.machinery.dependencies import (
    DependencyCheck,
    check_dependencies,
    write_dependencies,
)
from gpupool.control.machinery.leader import Leadership, check_epoch
from gpupool.control.machinery.snapshot import (
    ClusterCache,
    PendingRead,
    SpecCache,
    build_snapshot,
)
from gpupool.control.services.nodes import NodeService
from gpupool.control.services.uploads import UploadService
from gpupool.domain.states import JobState
from gpupool.metrics.definitions import SCHEDULER_CYCLE_SECONDS
from gpupool.scheduling.config import SchedulerConfig
from gpupool.scheduling.decision import Decision, PriorityFactors
from gpupool.scheduling.memo import SchedulerMemo
from gpupool.scheduling.snapshot import ClusterSnapshot
from gpupool.store.models import JobModel

log = logging.getLogger("gpupool.control.machinery.loop")

#: How often the leader deletes uploads past their retention (see control/services/uploads.py).
PRUNE_EVERY_S = 3600.0
#: The longest the loop sleeps when idle (see :meth:`SchedulingLoop.idle_wait_s`).
IDLE_WAIT_S = 60.0

PENDING = JobState.PENDING.value

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
        self.cluster = ClusterCache()  # nodes and devices made from their rows, likewise
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
            # Nothing queued (the usual case while a fleet registers and heartbeats): one
            # indexed probe instead of reading every node, device and slice for nothing.
            if s.scalar(select(JobModel.id).where(JobModel.state == PENDING).limit(1)) is None:
                return CycleResult(seconds=self.cp.clock.monotonic() - t0)
            snapshot, reads = build_snapshot(s, now, self.specs, self.cluster)
            deps = check_dependencies(s, snapshot.pending)
        if deps:
            snapshot = deps.held_back(snapshot)
            self._commit_dependencies(deps, reads, now)
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
        """Apply ``decision`` in one transaction, by the applier's rules (control/machinery/
        apply.py), to the store; a deposed leader's commit raises ``NotLeader``."""
        with self.cp.tx() as s:
            check_epoch(s, self.cp.epoch)
            applied = apply_decision(decision, StoreTarget(s, reads, now, self.cp.epoch))
        if applied.changed:
            log.info(
                "cycle: started %d, preempted %d", len(applied.started), len(applied.preempted)
            )
        return CycleResult(
            applied.started, applied.skipped, applied.preempted, len(decision.pending)
        )

    def _commit_dependencies(
        self, deps: DependencyCheck, reads: Mapping[str, PendingRead], now: float
    ) -> None:
        """Write what :func:`check_dependencies` decided (control/machinery/dependencies.py):
        the reasons of jobs held back, the end of those whose dependency is never met."""
        stored = {i: reads[i].pending_reason for i in deps.waiting if i in reads}
        if not deps.never and all(stored.get(i) == v[1] for i, v in deps.waiting.items()):
            return  # nothing changed since the last cycle: no transaction
        with self.cp.tx() as s:
            check_epoch(s, self.cp.epoch)
            ended = write_dependencies(s, deps, stored, now)
        if ended:
            log.info("cycle: ended %d job(s) whose dependency is never satisfied", len(ended))
            self.cp.poke()  # their own dependents are judged again at once

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

    def idle_wait_s(self, last: CycleResult | None) -> float:
        """How long the loop may sleep unless poked. It ticks every ``tick_s`` while jobs are
        pending (their placement may change with time: exemptions running out, estimates) and
        while it does not lead (to take over a lapsed lease). Leading with nothing pending, it
        sleeps until the first moment a node could be marked down or uploads be pruned, at
        most ``IDLE_WAIT_S``: an idle pool does not poll. Every change that needs a cycle
        (a submit, an end, a node registering or returning) pokes it awake."""
        tick = self.cp.settings.tick_s
        if last is None or last.pending or not self.leadership.is_leader:
            return tick
        now = self.cp.now()
        until = min(self.nodes.next_judgement, self._next_prune) - now
        return max(tick, min(IDLE_WAIT_S, until))

    def _run(self) -> None:
        last: CycleResult | None = None
        while not self._stop.is_set():
            poked = self.cp.wakeup.wait(self.idle_wait_s(last))
            self.cp.wakeup.clear()
            last = None
            if self._stop.is_set():
                break
            try:
                last = self.run_once()
                if poked and not self.leadership.is_leader:
                    self.cp.wake_leader()  # a submit or an end here: the leader's loop sleeps
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
