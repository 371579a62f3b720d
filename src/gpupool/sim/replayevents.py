"""What happens to a replay's jobs and nodes between its scheduling cycles.

:class:`ReplayEvents` is mixed into :class:`gpupool.sim.replay.Replay`: it applies the trace's
events of one instant (a job's arrival, the end of its work, the end of a victim's grace
period, a node's failure and repair), moving each job through
:func:`gpupool.domain.transitions.transition` as the control plane does, and keeps the
*capacity* account: milli-GPU and MiB held per device, GPUs busy, milli *stranded* (free on a
partly used device), and each tenant's allocation and waiting demand. An interrupted run
(preemption, node failure) gives its slices back and is requeued when its policy allows,
with the work it saved (:mod:`gpupool.sim.jobstate`).
"""

from __future__ import annotations

from dataclasses import replace

from gpupool.domain.jobs import Job, JobSpec
from gpupool.domain.nodes import Device, DeviceHealth, Node, NodeState
from gpupool.domain.pools import DEFAULT_POOL
from gpupool.domain.states import JobState
from gpupool.domain.transitions import should_requeue, transition
from gpupool.domain.units import MILLI_PER_GPU
from gpupool.scheduling.snapshot import RunningReplica
from gpupool.sim.engine import Event, EventKind
from gpupool.sim.jobstate import SimJob
from gpupool.sim.options import ReplayOptions
from gpupool.sim.workload import TraceJob


class ReplayEvents:
    """See the module docstring. The replay provides the attributes declared here."""

    options: ReplayOptions
    transitions: int  # job state moves so far
    _traces: dict[str, TraceJob]  # the workload's jobs by id
    _priority: dict[str, int]  # priority class -> value
    _pool_of: dict[str, str]  # tenant -> its pool (static scenarios)
    _jobs: dict[str, SimJob]  # every job that arrived
    _pending: dict[str, Job]  # the queue the scheduler sees
    _running: dict[str, tuple[RunningReplica, ...]]  # running jobs' replicas
    _nodes: dict[str, Node]
    _devices: dict[str, Device]
    _node_devices: dict[str, list[str]]  # node -> its devices' uuids
    _nodes_t: tuple[Node, ...]  # the snapshot's nodes, remade when one changes
    _devices_t: tuple[Device, ...]
    _down: set[str]  # nodes down now
    _used: dict[str, int]  # device -> milli-GPU held
    _used_mem: dict[str, int]  # device -> MiB held
    _busy: int  # devices with anything held
    _stranded: int  # free milli on partly used devices
    _allocated: int  # milli-GPU held in all
    _capacity: int  # milli-GPU of the devices up
    _tenant_alloc: dict[str, int]  # tenant -> milli-GPU its running jobs hold
    _tenant_pending: dict[str, int]  # tenant -> milli-GPU its waiting jobs ask for
    _tick_pending: bool  # a tick is on the heap
    _ended: int  # jobs that reached an outcome

    def _handle(self, event: Event, now: float) -> bool:
        kind = event.kind
        if kind is EventKind.ARRIVAL:
            self._arrive(event.subject, now)
        elif kind is EventKind.FINISH:
            self._finish(event, now)
        elif kind is EventKind.STOPPED:
            self._stopped(event, now)
        elif kind is EventKind.NODE_DOWN:
            self._node_down(event.subject, now)
        elif kind is EventKind.NODE_UP:
            self._node_up(event.subject)
        elif kind is EventKind.TICK:
            self._tick_pending = False
            return True
        return False  # a real event, not a timer

    def _move(self, sim: SimJob, target: JobState, now: float, reason: str | None = None) -> None:
        sim.job, _ = transition(sim.job, target, now=now, reason=reason)
        self.transitions += 1

    def _arrive(self, job_id: str, now: float) -> None:
        tj = self._traces[job_id]
        spec = JobSpec(
            name=tj.id,
            command=("sim",),
            tenant=tj.tenant,
            pool=self._pool_of.get(tj.tenant, DEFAULT_POOL),
            priority_class=tj.priority_class,
            resources=tj.resources,
            replicas=tj.replicas,
            preemptible=tj.preemptible,
            max_restarts=self.options.max_restarts,
            expected_duration_s=tj.work_s if self.options.expected_duration == "oracle" else None,
            grace_period_s=self.options.grace_period_s,
        )
        job = Job(
            id=tj.id,
            spec=spec,
            tenant=tj.tenant,
            user="sim",
            priority=self._priority.get(tj.priority_class, 500),
            submit_time=now,
            eligible_time=now,
        )
        sim = SimJob(tj, job)
        self._jobs[job_id] = sim
        self._enqueue(sim)

    def _enqueue(self, sim: SimJob) -> None:
        self._pending[sim.job.id] = sim.job
        self._tenant_pending[sim.trace.tenant] += sim.trace.total_gpu_milli

    def _dequeue(self, sim: SimJob) -> None:
        del self._pending[sim.job.id]
        self._tenant_pending[sim.trace.tenant] -= sim.trace.total_gpu_milli

    def _end(self, sim: SimJob, outcome: str, now: float) -> None:
        if sim.outcome is not None:
            raise RuntimeError(f"job {sim.job.id} ended twice ({sim.outcome}, then {outcome})")
        sim.outcome = outcome
        sim.end_time = now
        self._ended += 1

    def _finish(self, event: Event, now: float) -> None:
        sim = self._jobs[event.subject]
        if event.attempt != sim.runs or sim.run_start is None:
            return  # the finish of a run that was interrupted
        self._release(sim)
        sim.end_run(now, done=True, checkpoint_interval_s=self.options.checkpoint_interval_s)
        self._move(sim, JobState.COMPLETED, now, "work done")
        self._end(sim, "completed", now)

    def _stopped(self, event: Event, now: float) -> None:
        sim = self._jobs[event.subject]
        if event.attempt != sim.runs or sim.job.state is not JobState.COMPLETING:
            return  # it finished (or its node failed) during its grace period
        self._interrupt(sim, now, JobState.PREEMPTED, "preempted")
        sim.preemptions += 1

    def _node_down(self, node: str, now: float) -> None:
        if node in self._down:
            return
        self._down.add(node)
        self._set_node(node, NodeState.DOWN, DeviceHealth.UNHEALTHY)
        victims = [
            self._jobs[job_id]
            for job_id, replicas in self._running.items()
            if any(r.node == node for r in replicas)
        ]
        for sim in victims:
            self._interrupt(sim, now, JobState.NODE_FAIL, f"node {node} failed")
            sim.node_failures += 1

    def _node_up(self, node: str) -> None:
        if node not in self._down:
            return
        self._down.discard(node)
        self._set_node(node, NodeState.UP, DeviceHealth.HEALTHY)

    def _set_node(self, node: str, state: NodeState, health: DeviceHealth) -> None:
        self._nodes[node] = replace(self._nodes[node], state=state)
        for uuid in self._node_devices.get(node, ()):
            self._devices[uuid] = replace(self._devices[uuid], health=health)
        self._nodes_t = tuple(self._nodes.values())
        self._devices_t = tuple(self._devices.values())
        sign = -1 if state is NodeState.DOWN else 1
        self._capacity += sign * MILLI_PER_GPU * len(self._node_devices.get(node, ()))

    def _interrupt(self, sim: SimJob, now: float, target: JobState, reason: str) -> None:
        """Stop the current run (preemption or node failure) and requeue the job if allowed."""
        self._release(sim)
        sim.end_run(now, done=False, checkpoint_interval_s=self.options.checkpoint_interval_s)
        self._move(sim, target, now, reason)
        if should_requeue(sim.job):
            self._move(sim, JobState.REQUEUED, now, reason)
            self._move(sim, JobState.PENDING, now, "requeued")
            expected = sim.work_left if sim.job.spec.expected_duration_s is not None else None
            sim.job = sim.job.with_changes(spec=replace(sim.job.spec, expected_duration_s=expected))
            self._enqueue(sim)
        else:
            self._end(sim, "failed", now)

    # ------------------------------------------------------------------ capacity

    def _take(self, uuid: str, milli: int, memory_mib: int) -> None:
        self._change(uuid, self._used[uuid] + milli)
        self._used_mem[uuid] += memory_mib

    def _change(self, uuid: str, new: int) -> None:
        old = self._used[uuid]
        self._busy += (new > 0) - (old > 0)
        self._stranded += _stranded(new) - _stranded(old)
        self._used[uuid] = new
        self._allocated += new - old

    def _release(self, sim: SimJob) -> None:
        replicas = self._running.pop(sim.job.id, ())
        for r in replicas:
            for uuid in r.devices:
                self._change(uuid, self._used[uuid] - r.milli_per_device)
                self._used_mem[uuid] -= r.memory_per_device_mib
        self._tenant_alloc[sim.trace.tenant] -= sim.run_milli


def _stranded(used: int) -> int:
    """Free milli on a device that is partly used (0 for idle or full devices)."""
    return MILLI_PER_GPU - used if 0 < used < MILLI_PER_GPU else 0
