"""Job dependencies in the store: checked at submit, judged before each scheduling cycle.

The rules are :mod:`gpupool.domain.dependency`'s; this module reads what they need.

- **At submit** (:func:`unknown_targets`): every id a dependency names must be a job, or a job
  array, the submitter may see; otherwise the submit is refused naming the id.
- **Each cycle** (:func:`check_dependencies`, in the snapshot's read transaction): the pending
  jobs with a dependency are judged against their targets' states, read in one query (plus one
  for array ids and one for ``singleton`` names). A job whose dependency is not met is **held
  back**: it is left out of the scheduler's snapshot and its pending reason says
  ``Dependency: ...`` (what it waits for). A job whose dependency can never be met is ended
  ``CANCELLED`` with the reason ``DependencyNeverSatisfied: ...``; since that end is itself a
  failure, the jobs that depend on it are judged again in the same pass (a worklist over the
  reverse edges), so a whole ``afterok`` chain behind a failed link ends in one cycle.
- **Array throttles** (``sbatch --array 0-99%4``, in the same check): of an array's pending
  tasks, only as many as its throttle leaves room for beside its running ones (lowest index
  first) go to the scheduler; the others are held back with ``JobArrayTaskLimit: ...``. Their
  running tasks are counted in one query per cycle.
- **In the commit** (:func:`write_dependencies`, the loop's commit transaction): the reasons
  that changed are written and the never-satisfied jobs cancelled, each only if still pending at
  the version the snapshot read (a job released, edited or cancelled meanwhile is left alone).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpupool.control.machinery.jobstate import move
from gpupool.domain.dependency import (
    Dependency,
    DependencyKind,
    Standing,
    Target,
    evaluate,
)
from gpupool.domain.jobs import Job
from gpupool.domain.states import TERMINAL_STATES, JobState
from gpupool.scheduling.decision import PendingReason
from gpupool.scheduling.snapshot import ClusterSnapshot
from gpupool.store.models import JobModel

#: The pending reasons this module writes (Slurm's names).
DEPENDENCY = PendingReason.DEPENDENCY.value
NEVER_SATISFIED = PendingReason.DEPENDENCY_NEVER_SATISFIED.value
ARRAY_TASK_LIMIT = PendingReason.ARRAY_TASK_LIMIT.value


def _array_of(spec: object) -> tuple[str | None, int | None]:
    array = spec.get("array") if isinstance(spec, dict) else None
    if not isinstance(array, dict):
        return None, None
    return array.get("array_id"), array.get("index")


def unknown_targets(s: Session, dependency: Dependency, tenant: str | None) -> list[str]:
    """The ids ``dependency`` names that are neither a job nor a job array (of ``tenant``, when
    given: a tenant-scoped submitter may depend only on its tenant's jobs)."""
    ids = list(dependency.targets)
    if not ids:
        return []
    query = select(JobModel.id).where(JobModel.id.in_(ids))
    if tenant is not None:
        query = query.where(JobModel.tenant == tenant)
    found = set(s.scalars(query))
    rest = [i for i in ids if i not in found]
    if rest:
        array_id = JobModel.spec["array"]["array_id"].as_string()
        query = select(array_id).where(array_id.in_(rest))
        if tenant is not None:
            query = query.where(JobModel.tenant == tenant)
        found |= set(s.scalars(query.distinct()))
    return [i for i in ids if i not in found]


@dataclass
class DependencyCheck:
    """What one cycle decided about the pending jobs with a dependency.

    ``waiting`` and ``never`` map a job id to (its version as read, the reason text)."""

    waiting: dict[str, tuple[int, str]] = field(default_factory=dict)
    never: dict[str, tuple[int, str]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.waiting or self.never)

    def held_back(self, snapshot: ClusterSnapshot) -> ClusterSnapshot:
        """``snapshot`` without the jobs this check holds back (or ends)."""
        if not self:
            return snapshot
        out = self.waiting.keys() | self.never.keys()
        return replace(snapshot, pending=tuple(j for j in snapshot.pending if j.id not in out))


def _targets(s: Session, ids: Iterable[str]) -> dict[str, list[Target]]:
    """Each id -> the jobs it stands for: itself, or the tasks of the array it names."""
    wanted = list(dict.fromkeys(ids))
    out: dict[str, list[Target]] = defaultdict(list)
    cols = (JobModel.id, JobModel.state, JobModel.start_time, JobModel.spec)
    for row in s.execute(select(*cols).where(JobModel.id.in_(wanted))):
        _, index = _array_of(row.spec)
        out[row.id].append(Target(row.id, JobState(row.state), row.start_time is not None, index))
    rest = [i for i in wanted if i not in out]
    if rest:
        array_id = JobModel.spec["array"]["array_id"].as_string()
        for row in s.execute(select(*cols).where(array_id.in_(rest))):
            parent, index = _array_of(row.spec)
            if parent is not None:
                out[parent].append(
                    Target(row.id, JobState(row.state), row.start_time is not None, index)
                )
    return out


def _singleton_blockers(s: Session, jobs: Sequence[Job]) -> dict[str, str]:
    """For each job with a ``singleton`` term: an earlier unfinished job of the same name and
    user (by submit time, then id), if any."""
    names = {j.spec.name for j in jobs}
    if not names:
        return {}
    live = [st.value for st in JobState if st not in TERMINAL_STATES]
    earlier: dict[tuple[str, str], list[tuple[float, str]]] = defaultdict(list)
    for row in s.execute(
        select(JobModel.id, JobModel.name, JobModel.user, JobModel.submit_time).where(
            JobModel.name.in_(names), JobModel.state.in_(live)
        )
    ):
        earlier[(row.name, row.user)].append((row.submit_time, row.id))
    out: dict[str, str] = {}
    for job in jobs:
        mine = (job.submit_time, job.id)
        before = [x for x in earlier.get((job.spec.name, job.user), ()) if x < mine]
        if before:
            out[job.id] = min(before)[1]
    return out


def _throttle(s: Session, pending: Sequence[Job], check: DependencyCheck) -> None:
    """Hold back the tasks of throttled arrays past their limit (see the module docstring)."""
    waiting: dict[str, list[Job]] = defaultdict(list)
    limits: dict[str, int] = {}
    for job in pending:
        task = job.array
        if task is None or task.throttle is None or job.held or job.id in check.waiting:
            continue
        waiting[task.array_id].append(job)
        limits[task.array_id] = task.throttle
    if not waiting:
        return
    array_id = _array_id_column()
    live = [st.value for st in (JobState.CONFIGURING, JobState.RUNNING, JobState.COMPLETING)]
    running: dict[str, int] = {
        str(a): int(n)
        for a, n in s.execute(
            select(array_id, func.count())
            .where(array_id.in_(list(waiting)), JobModel.state.in_(live))
            .group_by(array_id)
        )
    }
    for array, jobs in waiting.items():
        now_running = running.get(array, 0)
        room = max(0, limits[array] - now_running)
        jobs.sort(key=lambda j: (j.array.index if j.array else 0, j.id))
        for job in jobs[room:]:
            check.waiting[job.id] = (
                job.version,
                f"{ARRAY_TASK_LIMIT}: at most {limits[array]} tasks of array {array} run at "
                f"once (--array ...%{limits[array]}); {now_running} running",
            )


def _array_id_column() -> Any:
    return JobModel.spec["array"]["array_id"].as_string()


def check_dependencies(s: Session, pending: Sequence[Job]) -> DependencyCheck:
    """Judge every pending job with a dependency, and the tasks of throttled arrays (see the
    module docstring)."""
    check = DependencyCheck()
    _check_links(s, pending, check)
    _throttle(s, pending, check)
    return check


def _check_links(s: Session, pending: Sequence[Job], check: DependencyCheck) -> None:
    """The dependency part of :func:`check_dependencies`."""
    dependent = [j for j in pending if j.spec.dependency is not None and not j.held]
    if not dependent:
        return
    targets = _targets(s, (i for j in dependent for i in _deps(j).targets))
    singles = _singleton_blockers(
        s, [j for j in dependent if any(t.kind is DependencyKind.SINGLETON for t in _deps(j).terms)]
    )
    # Reverse edges: a target's job id (and the array id it is a task of) -> its dependents.
    by_id = {j.id: j for j in dependent}
    dependents: dict[str, list[str]] = defaultdict(list)
    for job in dependent:
        for target_id in _deps(job).targets:
            dependents[target_id].append(job.id)
    ended: dict[str, JobState] = {}  # ended by this check (as if already stored)

    def lookup(target_id: str) -> Sequence[Target]:
        found = targets.get(target_id, ())
        if not ended:
            return found
        return [replace(t, state=ended[t.id]) if t.id in ended else t for t in found]

    task_parents = {t.id: pid for pid, ts in targets.items() for t in ts if t.id != pid}
    work = list(by_id)
    while work:
        job_id = work.pop()
        if job_id in check.never:
            continue
        job = by_id[job_id]
        index = job.array.index if job.array is not None else None
        verdict = evaluate(
            _deps(job), lookup, array_index=index, singleton_blocker=singles.get(job.id)
        )
        check.waiting.pop(job_id, None)
        if verdict.standing is Standing.NEVER:
            check.never[job_id] = (job.version, f"{NEVER_SATISFIED}: {verdict.message}")
            ended[job_id] = JobState.CANCELLED
            work.extend(dependents.get(job_id, ()))
            parent = task_parents.get(job_id)
            if parent is not None:
                work.extend(dependents.get(parent, ()))
        elif verdict.standing is Standing.WAITING:
            check.waiting[job_id] = (job.version, f"{DEPENDENCY}: {verdict.message}")


def _deps(job: Job) -> Dependency:
    assert job.spec.dependency is not None
    return job.spec.dependency


def write_dependencies(
    s: Session, check: DependencyCheck, stored: Mapping[str, str | None], now: float
) -> list[str]:
    """Write the check's reasons (``stored``: each job's pending reason as read) and cancel
    its never-satisfied jobs, each only if still pending at the version read; the ids
    cancelled."""
    cancelled: list[str] = []
    # Only rows whose reason changes are read: a long chain waits cycle after cycle unchanged.
    changed = {i: v for i, v in check.waiting.items() if stored.get(i) != v[1]}
    ids = list(changed.keys() | check.never.keys())
    if not ids:
        return cancelled
    rows = {r.id: r for r in s.scalars(select(JobModel).where(JobModel.id.in_(ids)))}
    for job_id, (version, text) in changed.items():
        row = rows.get(job_id)
        if row is None or row.version != version or row.state != JobState.PENDING.value:
            continue
        row.pending_reason = text
        row.estimated_start = None
    for job_id, (version, text) in check.never.items():
        row = rows.get(job_id)
        if row is None or row.version != version or row.state != JobState.PENDING.value:
            continue
        move(s, row, JobState.CANCELLED, now, reason=text)
        row.pending_reason = text
        cancelled.append(job_id)
    return cancelled
