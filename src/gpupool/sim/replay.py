"""The time-driven replay: trace events in, the real scheduler in the middle, a record out.

The loop is what a control plane does, with simulated time::

    pop every event of the next instant (the manual clock moves there)
    apply them: arrivals queue, finishes and stops free slices, failed nodes lose their jobs
    build a ClusterSnapshot, call gpupool.scheduling.scheduler.schedule(snapshot, config, memo)
    apply the Decision through the server's applier: start jobs (their finish goes on the
    heap), stop preemption victims
    record the state

The Decision is applied by :func:`gpupool.control.machinery.apply.apply_decision`, the rules
the live server's loop commits by; :class:`Replay` is that applier's in-memory adapter (its
methods under "the applier's port"), as the store is the server's. So a replay test exercises
the server's rules for starts, victims and what counts as a change.

One scheduling cycle per distinct event instant, not per event: dense traces put many events
on one instant. A cycle that decided preemptions with no grace period is followed by another
cycle at the same instant, once the victims are gone. While jobs wait, the loop's periodic tick
(``tick_s``) runs cycles even when no event happens, as a real loop does; ticks stop when
nothing is left to happen and several ticks in a row changed nothing.

Job states move only through :func:`gpupool.domain.transitions.transition`, along the same
edges the control plane uses. The events between cycles (arrivals, finishes, stops, node
failures) and the capacity account are the mixin
:class:`~gpupool.sim.replayevents.ReplayEvents`. Words (run, saved work, outcome) are defined
in :mod:`gpupool.sim.jobstate`.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from gpupool.control.machinery.apply import Room, VictimState, apply_decision, device_room
from gpupool.domain.jobs import Job
from gpupool.domain.pools import DEFAULT_POOL, Pool
from gpupool.domain.states import JobState
from gpupool.domain.tenants import DEFAULT_PRIORITY_CLASSES
from gpupool.scheduling.config import SchedulerConfig
from gpupool.scheduling.decision import Decision, PendingInfo, Preemption, Start
from gpupool.scheduling.memo import SchedulerMemo
from gpupool.scheduling.snapshot import ClusterSnapshot, RunningReplica
from gpupool.sim.engine import Event, EventKind, EventQueue
from gpupool.sim.jobstate import SimJob, last_checkpoint
from gpupool.sim.options import NodeFailure, ReplayOptions, ReplayResult
from gpupool.sim.recorder import Recorder
from gpupool.sim.replayevents import ReplayEvents
from gpupool.sim.rooms import static_rooms
from gpupool.sim.scenarios import Scenario
from gpupool.sim.workload import SimCluster, Workload, equal_quotas

__all__ = ["NodeFailure", "Replay", "ReplayOptions", "ReplayResult", "replay"]

ScheduleFn = Callable[[ClusterSnapshot, SchedulerConfig, SchedulerMemo], Decision]
ProgressFn = Callable[[int, int], None]


def _default_schedule() -> ScheduleFn:
    from gpupool.scheduling.scheduler import schedule

    return schedule


class Replay(ReplayEvents):
    """One replay of ``workload`` on ``cluster`` under ``scenario``. Call :meth:`run` once."""

    def __init__(
        self,
        workload: Workload,
        cluster: SimCluster,
        scenario: Scenario,
        options: ReplayOptions | None = None,
        *,
        schedule: ScheduleFn | None = None,
    ) -> None:
        self.options = options or ReplayOptions()
        self.scenario = scenario
        self.cluster = cluster
        if scenario.equal_quotas and not workload.quotas:
            workload = equal_quotas(workload, cluster)
        self.workload = workload
        self._traces = {tj.id: tj for tj in workload.jobs}
        self._schedule = schedule or _default_schedule()
        self.memo = SchedulerMemo()  # what this replay's cycles remember (gpupool.scheduling.memo)
        self.queue = EventQueue()
        self._priority = {p.name: p.value for p in DEFAULT_PRIORITY_CLASSES}
        self._jobs: dict[str, SimJob] = {}
        self._pending: dict[str, Job] = {}
        self._running: dict[str, tuple[RunningReplica, ...]] = {}
        self._nodes = {n.name: n for n in cluster.nodes}
        # static: every team in a pool of its own devices (gpupool.sim.rooms); else one pool.
        self._pool = Pool(DEFAULT_POOL)
        self._pools: tuple[Pool, ...] = (self._pool,)
        self._pool_of: dict[str, str] = {}
        devices = cluster.devices
        if scenario.static:
            rooms = static_rooms(workload, cluster)
            self._pools, self._pool_of, devices = rooms.pools, rooms.pool_of, rooms.devices
        self._devices = {d.uuid: d for d in devices}
        self._node_devices: dict[str, list[str]] = {}
        for d in devices:
            self._node_devices.setdefault(d.node, []).append(d.uuid)
        self._nodes_t = tuple(cluster.nodes)
        self._devices_t = tuple(devices)
        self._down: set[str] = set()
        self._used: dict[str, int] = dict.fromkeys(self._devices, 0)
        self._used_mem: dict[str, int] = dict.fromkeys(self._devices, 0)  # MiB
        self._now = 0.0  # the instant of the cycle being applied
        self._busy = 0
        self._stranded = 0
        self._allocated = 0
        self._capacity = cluster.capacity_milli
        tenants = workload.tenant_names
        self._tenant_alloc = dict.fromkeys(tenants, 0)
        self._tenant_pending = dict.fromkeys(tenants, 0)
        self._usage = dict.fromkeys(tenants, 0.0)
        self._usage_time = 0.0
        self._ckpt_heap: list[tuple[float, str, int]] = []
        weights = {t.name: t.fair_share for t in workload.tenants}
        self.recorder = Recorder(tenants, weights)
        self.cycles = 0
        self.events = 0
        self.transitions = 0
        self._tick_pending = False
        self._idle_ticks = 0
        self._ended = 0
        self._cycle_pending = False

    # ------------------------------------------------------------------ the loop

    def run(self, progress: ProgressFn | None = None) -> ReplayResult:
        """Replay to the end; ``progress(done_jobs, total_jobs)`` is called now and then."""
        for tj in self.workload.jobs:
            self.queue.push(tj.submit_time, Event(EventKind.ARRIVAL, tj.id))
        for failure in self.options.failures:
            if failure.node not in self._nodes:
                raise ValueError(f"node failure names node {failure.node!r}, not in the cluster")
            self.queue.push(failure.at, Event(EventKind.NODE_DOWN, failure.node))
            self.queue.push(failure.at + failure.repair_s, Event(EventKind.NODE_UP, failure.node))
        total = len(self.workload.jobs)
        interval = self.options.min_cycle_interval_s
        last_reported = -1
        now = 0.0
        same_instant = 0
        while len(self.queue):
            time, batch = self.queue.pop_batch()
            same_instant = same_instant + 1 if time == now else 1
            if same_instant > self.options.max_cycles_per_instant:
                raise RuntimeError(
                    f"more than {self.options.max_cycles_per_instant} scheduling cycles at "
                    f"t={time}: the scheduler keeps preempting; check its anti-loop settings"
                )
            now = time
            self._accrue_usage(now)
            due = interval is None
            only_timers = True  # the batch holds nothing but ticks and coalesced cycles
            for event in batch:
                self.events += 1
                if event.kind is EventKind.CYCLE:
                    due = True
                    self._cycle_pending = False
                else:
                    only_timers &= self._handle(event, now)
            changed = False
            if self._pending and due:
                changed = self._cycle(now)
            elif self._pending and not self._cycle_pending and interval is not None:
                # Coalesce: the next cycle runs at the next multiple of the interval.
                self.queue.push(
                    (math.floor(now / interval) + 1) * interval, Event(EventKind.CYCLE, "cycle")
                )
                self._cycle_pending = True
            self._after_cycle(now, changed, only_timers)
            self._sample(now)
            if progress is not None and self._ended != last_reported and self.events % 256 < 8:
                progress(self._ended, total)
                last_reported = self._ended
        for sim in self._jobs.values():
            if sim.outcome is None:
                sim.outcome = "unfinished"
        if progress is not None:
            progress(total, total)
        series, integrals = self.recorder.finish(now)
        return ReplayResult(
            scenario=self.scenario.name,
            workload=self.workload.name,
            cluster=self.cluster.name,
            capacity_milli=self.cluster.capacity_milli,
            gpu_count=self.cluster.gpu_count,
            tenants=self.workload.tenant_names,
            jobs=tuple(self._jobs[tj.id].outcome_record() for tj in self.workload.jobs),
            series=series,
            integrals=integrals,
            cycles=self.cycles,
            events=self.events,
            transitions=self.transitions,
        )

    def _after_cycle(self, now: float, changed: bool, only_timers: bool) -> None:
        """Keep the periodic tick going while jobs wait and something may still change."""
        if changed:
            self._idle_ticks = 0
        elif only_timers:
            self._idle_ticks += 1
        tick = self.options.tick_s
        if tick is None or self._tick_pending or not self._pending:
            return
        # With other events still to come, ticks are cheap insurance; with none, stop after
        # enough idle ticks to outlast the scheduler's preemption exemption (a coalesced
        # cycle after each tick counts as one more idle batch, hence the factor 2).
        others = len(self.queue) - (1 if self._cycle_pending else 0)
        limit = 2 * (math.ceil(self.scenario.config.preempt_exempt_s / tick) + 1)
        if others == 0 and self._idle_ticks > limit:
            return
        self.queue.push(now + tick, Event(EventKind.TICK, "tick"))
        self._tick_pending = True

    # ------------------------------------------------------------------ scheduling

    def _snapshot(self, now: float) -> ClusterSnapshot:
        self._refresh_checkpoints(now)
        return ClusterSnapshot(
            now=now,
            nodes=self._nodes_t,
            devices=self._devices_t,
            running=tuple(itertools.chain.from_iterable(self._running.values())),
            pending=tuple(self._pending.values()),
            pools=self._pools,
            tenants=self.workload.tenants,
            quotas=() if self.scenario.static else self.workload.quotas,
            priority_classes=DEFAULT_PRIORITY_CLASSES,
            usage=self._usage,
        )

    def _cycle(self, now: float) -> bool:
        decision = self._schedule(self._snapshot(now), self.scenario.config, self.memo)
        self.cycles += 1
        self._now = now
        applied = apply_decision(decision, self)
        # A job the scheduler says fits nowhere on this cluster (too large, no device of its
        # type) is refused rather than left to block a FIFO queue; not while a node is down,
        # as the cluster is then smaller than it will be.
        rejected = False
        if not self._down:
            for job_id in decision.unfit:
                if job_id in self._pending:
                    info = decision.pending[job_id]
                    sim = self._jobs[job_id]
                    self._dequeue(sim)
                    self._move(sim, JobState.CANCELLED, now, f"rejected: {info.message}")
                    self._end(sim, "rejected", now)
                    rejected = True
        if rejected and self._pending:  # what waited behind it gets a cycle at once
            self.queue.push(now, Event(EventKind.CYCLE, "cycle"))
        return applied.changed

    # ------------------------------------------------------------------ the applier's port
    # The in-memory adapter of gpupool.control.machinery.apply.DecisionTarget: the rules (what
    # is refused, which victims are left alone) are the applier's; these only change state.

    def still_pending(self, start: Start) -> bool:
        return start.job_id in self._pending

    def free_room(self, uuids: Iterable[str]) -> Mapping[str, Room]:
        overcommit = self._pool.memory_overcommit
        devices, used, used_mem = self._devices, self._used, self._used_mem
        return {
            uuid: device_room(devices[uuid].memory_mib, overcommit, used[uuid], used_mem[uuid])
            for uuid in uuids
            if uuid in devices
        }

    def start(self, start: Start) -> None:
        now = self._now
        sim = self._jobs[start.job_id]
        self._dequeue(sim)
        self._move(sim, JobState.CONFIGURING, now, "placed")
        self._move(sim, JobState.RUNNING, now, "started")
        spec = sim.job.spec
        replicas = tuple(
            RunningReplica(
                job_id=start.job_id,
                replica=r.rank,
                node=r.node,
                devices=r.devices,
                milli_per_device=r.milli_per_device,
                memory_per_device_mib=r.memory_per_device_mib,
                tenant=start.tenant,
                pool=start.pool,
                priority=sim.job.priority,
                preemptible=spec.preemptible,
                start_time=now,
                expected_end=now + sim.work_left,
                cpu_milli=r.cpu_milli,
                host_memory_mib=r.host_memory_mib,
                borrowing=start.borrowing,
                grace_period_s=spec.grace_period_s,
            )
            for r in start.replicas
        )
        for r in replicas:
            for uuid in r.devices:
                self._take(uuid, r.milli_per_device, r.memory_per_device_mib)
        self._running[start.job_id] = replicas
        sim.start(now, replicas)
        self._tenant_alloc[sim.trace.tenant] += sim.run_milli
        self.queue.push(now + sim.work_left, Event(EventKind.FINISH, start.job_id, sim.runs))
        interval = self.options.checkpoint_interval_s
        if interval is not None and spec.preemptible and sim.work_left > interval:
            heapq.heappush(self._ckpt_heap, (now + interval, start.job_id, sim.runs))

    def victim_state(self, job_id: str) -> VictimState:
        state = self._jobs[job_id].job.state
        if state is JobState.RUNNING:
            return VictimState.RUNNING
        if state is JobState.CONFIGURING:  # never seen here: a replay start runs at once
            return VictimState.STARTING
        return VictimState.STOPPING

    def stop(self, preemption: Preemption, *, at_once: bool, reason: str) -> None:
        now, victim = self._now, preemption.victim
        sim = self._jobs[victim]
        if at_once:
            self._interrupt(sim, now, JobState.PREEMPTED, reason)
            sim.preemptions += 1
            return
        self._move(sim, JobState.COMPLETING, now, reason)
        for_job = preemption.for_job
        replicas = tuple(replace(r, preempted_for=for_job) for r in self._running[victim])
        self._running[victim] = replicas
        sim.replicas = replicas
        self.queue.push(
            now + sim.job.spec.grace_period_s, Event(EventKind.STOPPED, victim, sim.runs)
        )

    def note_pending(self, pending: Mapping[str, PendingInfo]) -> None:
        """Waiting jobs' reasons are not part of a replay's record."""

    # ------------------------------------------------------------------ checkpoints and usage

    def _refresh_checkpoints(self, now: float) -> None:
        """Tell the scheduler each preemptible run's latest checkpoint (for victim costs).

        Only runs whose checkpoint moved since the last cycle are rewritten, from a heap of
        next checkpoint times, so a cycle does not touch every running replica.
        """
        interval = self.options.checkpoint_interval_s
        heap = self._ckpt_heap
        while heap and heap[0][0] <= now:
            _, job_id, run = heapq.heappop(heap)
            sim = self._jobs[job_id]
            if sim.runs != run or sim.run_start is None or job_id not in self._running:
                continue
            ckpt = last_checkpoint(sim.run_start, now, interval)
            replicas = tuple(replace(r, last_checkpoint_time=ckpt) for r in self._running[job_id])
            self._running[job_id] = replicas
            sim.replicas = replicas
            if interval is not None:
                upcoming = (ckpt if ckpt is not None else sim.run_start) + interval
                while upcoming <= now:  # never re-queue a time already passed
                    upcoming += interval
                heapq.heappush(heap, (upcoming, job_id, run))

    def _accrue_usage(self, now: float) -> None:
        """Decay each tenant's usage to ``now`` and add what it held since the last instant."""
        dt = now - self._usage_time
        if dt <= 0:
            return
        half = self.options.usage_half_life_s
        decay = 2.0 ** (-dt / half)
        gain = half / math.log(2.0) * (1.0 - decay)
        for tenant, usage in self._usage.items():
            self._usage[tenant] = usage * decay + self._tenant_alloc[tenant] * gain
        self._usage_time = now

    def _sample(self, now: float) -> None:
        demand = {t: self._tenant_alloc[t] + self._tenant_pending[t] for t in self._tenant_alloc}
        self.recorder.sample(
            now,
            allocated_milli=self._allocated,
            busy_gpus=self._busy,
            pending_jobs=len(self._pending),
            running_jobs=len(self._running),
            stranded_milli=self._stranded,
            capacity_milli=self._capacity,
            tenant_allocated=self._tenant_alloc,
            tenant_demand=demand,
        )


def replay(
    workload: Workload,
    cluster: SimCluster,
    scenario: Scenario,
    options: ReplayOptions | None = None,
    *,
    schedule: ScheduleFn | None = None,
    progress: ProgressFn | None = None,
) -> ReplayResult:
    """Replay ``workload`` on ``cluster`` under ``scenario`` (rounding up for whole-GPU ones)."""
    if scenario.whole_gpus:
        workload = replace(workload, jobs=tuple(j.rounded_up() for j in workload.jobs))
    return Replay(workload, cluster, scenario, options, schedule=schedule).run(progress)
