"""One job's life in a replay: its domain job, its current run and what it has cost.

Words:

- **run**: one attempt, from its start to its finish, preemption or node failure.
- **saved work**: work covered by the run's last checkpoint. With a checkpoint interval ``c``,
  a run that started at ``s`` has checkpoints at ``s + c, s + 2c, ...``; stopping it at ``t``
  keeps ``floor((t - s) / c) * c`` seconds of work and loses the rest. With no interval (``None``)
  a job never checkpoints and an interrupted run loses everything.
- **GPU-seconds used**: allocated milli-GPU x seconds held, over every run, including the time
  a preempted job spends stopping (it still holds its slices then).
- **outcome**: how the job left the replay, exactly once: ``completed``; ``rejected`` (it can
  never fit this cluster, as the scheduler said on arrival); ``failed`` (interrupted and not
  requeued: its restarts ran out); ``unfinished`` (still waiting when nothing else could
  happen).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpupool.domain.jobs import Job
from gpupool.scheduling.snapshot import RunningReplica
from gpupool.sim.workload import TraceJob


def saved_work(elapsed_s: float, checkpoint_interval_s: float | None) -> float:
    """Work kept when a run is interrupted after ``elapsed_s`` seconds."""
    if checkpoint_interval_s is None or elapsed_s <= 0:
        return 0.0
    # The tolerance keeps a checkpoint that falls exactly on ``elapsed_s`` from being lost to
    # floating-point rounding (start + 2c - start may come out a hair below 2c).
    count = math.floor(elapsed_s / checkpoint_interval_s + 1e-9)
    return min(count * checkpoint_interval_s, elapsed_s)


def last_checkpoint(start: float, now: float, checkpoint_interval_s: float | None) -> float | None:
    """Time of the run's last checkpoint at ``now``; ``None`` before the first one."""
    kept = saved_work(now - start, checkpoint_interval_s)
    return start + kept if kept > 0 else None


@dataclass(frozen=True)
class JobOutcome:
    """How one job went. Times are seconds from the trace start, ``None`` if it never happened.

    ``gpu_milli`` is over all replicas as replayed (rounded up in whole-GPU scenarios);
    ``used_milli_s`` is GPU-seconds used in milli-GPU·s; ``lost_work_s`` is seconds of work
    redone after interruptions and ``lost_milli_s`` the GPU share those seconds held.
    ``nodes`` and ``devices`` are where its last run ran (replica order), empty if it never ran.
    """

    id: str
    tenant: str
    priority_class: str
    gpu_milli: int
    work_s: float
    submit_time: float
    first_start: float | None
    end_time: float | None
    outcome: str
    attempts: int
    preemptions: int
    node_failures: int
    used_milli_s: float
    lost_work_s: float
    lost_milli_s: float
    nodes: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()

    @property
    def queueing_delay_s(self) -> float | None:
        """Seconds from submit to first start."""
        return None if self.first_start is None else self.first_start - self.submit_time

    @property
    def completion_time_s(self) -> float | None:
        """Job completion time (JCT): seconds from submit to the end of its last run."""
        if self.outcome != "completed" or self.end_time is None:
            return None
        return self.end_time - self.submit_time


class SimJob:
    """Mutable bookkeeping of one job in a replay (the domain ``Job`` inside stays frozen)."""

    __slots__ = (
        "attempt",
        "end_time",
        "first_start",
        "job",
        "last_devices",
        "last_nodes",
        "lost_milli_s",
        "lost_work_s",
        "node_failures",
        "outcome",
        "preemptions",
        "replicas",
        "run_milli",
        "run_start",
        "runs",
        "trace",
        "used_milli_s",
        "work_left",
    )

    def __init__(self, trace: TraceJob, job: Job) -> None:
        self.trace = trace
        self.job = job
        self.attempt = 0
        self.work_left = trace.work_s
        self.run_start: float | None = None
        self.run_milli = 0
        self.runs = 0
        self.replicas: tuple[RunningReplica, ...] = ()
        self.first_start: float | None = None
        self.end_time: float | None = None
        self.preemptions = 0
        self.node_failures = 0
        self.used_milli_s = 0.0
        self.lost_work_s = 0.0
        self.lost_milli_s = 0.0
        self.outcome: str | None = None
        self.last_nodes: tuple[str, ...] = ()
        self.last_devices: tuple[str, ...] = ()

    def start(self, now: float, replicas: tuple[RunningReplica, ...]) -> None:
        self.run_start = now
        self.replicas = replicas
        self.run_milli = sum(r.gpu_milli for r in replicas)
        self.runs += 1
        self.last_nodes = tuple(dict.fromkeys(r.node for r in replicas))
        self.last_devices = tuple(d for r in replicas for d in r.devices)
        if self.first_start is None:
            self.first_start = now

    def end_run(self, now: float, *, done: bool, checkpoint_interval_s: float | None) -> None:
        """Close the current run at ``now``: finished (``done``) or interrupted."""
        start = self.run_start if self.run_start is not None else now
        elapsed = now - start
        self.used_milli_s += self.run_milli * elapsed
        if done:
            self.work_left = 0.0
        else:
            kept = min(saved_work(elapsed, checkpoint_interval_s), self.work_left)
            self.work_left -= kept
            self.lost_work_s += elapsed - kept
            self.lost_milli_s += self.run_milli * (elapsed - kept)
        self.run_start = None
        self.replicas = ()
        self.run_milli = 0

    def outcome_record(self) -> JobOutcome:
        return JobOutcome(
            id=self.trace.id,
            tenant=self.trace.tenant,
            priority_class=self.trace.priority_class,
            gpu_milli=self.trace.total_gpu_milli,
            work_s=self.trace.work_s,
            submit_time=self.trace.submit_time,
            first_start=self.first_start,
            end_time=self.end_time,
            outcome=self.outcome or "unfinished",
            attempts=self.runs,
            preemptions=self.preemptions,
            node_failures=self.node_failures,
            used_milli_s=self.used_milli_s,
            lost_work_s=self.lost_work_s,
            lost_milli_s=self.lost_milli_s,
            nodes=self.last_nodes,
            devices=self.last_devices,
        )
