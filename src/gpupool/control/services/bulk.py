"""Cancel, hold or release many jobs in one request (``scancel -u alice -t PENDING``).

A **selection** names jobs by id (a job id, a job array's id for all its tasks, or
``ARRAY_INDEX`` for one task, Slurm's ``123_4``) and/or by filter: user, name, states, array,
tenant, pool. It must name something: an empty selection is refused, so a typo never cancels a
whole queue. Without ``states``, each action takes the
jobs it can change: ``cancel`` the unfinished ones, ``hold`` the pending ones not held,
``release`` the held ones.

One request is one transaction, and set-based: the pending jobs (nearly all of a large
selection) change in one ``UPDATE ... WHERE <selection> RETURNING``, their events and audit
rows go in with one multi-row ``INSERT`` each; only jobs that already hold resources (running,
being launched or stopping, a handful per node) take the per-job path of
:func:`cancel_row`, which orders their stop. Cancelling 2,000 held jobs is then a few
statements, not 2,000 requests (``benchmarks/bench_bulk_cancel.py``).

**Permissions** are those of the one-job calls: a member changes its own jobs, a tenant admin
its tenant's, an admin any. Jobs the selection matches but the caller may not change are left
alone and counted (``refused``); jobs it may not even see are not matched at all.

The answer lists the jobs changed with their new state, the ids named that match no job
(``not_found``) and the named jobs the action does not apply to (``skipped``, with their state).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import ColumnElement, and_, false, func, insert, not_, or_, select, true, update
from sqlalchemy.orm import Session

from gpupool.control.context import ControlPlane
from gpupool.control.errors import Forbidden, Invalid
from gpupool.control.machinery.jobstate import move, order_stop
from gpupool.control.machinery.nodeorders import stored_job
from gpupool.control.services import audit
from gpupool.control.services.auth import Actor, Principal, require
from gpupool.domain.assignments import StopReason
from gpupool.domain.states import TERMINAL_STATES, JobState, is_allowed
from gpupool.domain.users import Permission
from gpupool.store.models import AuditModel, Base, JobEventModel, JobModel

#: The most ids one selection may name.
MAX_IDS = 10_000

_INSERT_EVENTS = insert(Base.metadata.tables[JobEventModel.__tablename__])
_INSERT_AUDITS = insert(Base.metadata.tables[AuditModel.__tablename__])
_UNFINISHED = tuple(s for s in JobState if s not in TERMINAL_STATES)
assert is_allowed(JobState.PENDING, JobState.CANCELLED)  # the set-based edge


class BulkAction(enum.Enum):
    CANCEL = "cancel"
    HOLD = "hold"
    RELEASE = "release"


@dataclass(frozen=True)
class Selection:
    """Which jobs (see the module docstring); every field narrows, ids and filters alike."""

    ids: tuple[str, ...] = ()
    user: str | None = None
    name: str | None = None
    states: tuple[JobState, ...] = ()
    array_id: str | None = None
    tenant: str | None = None
    pool: str | None = None

    @property
    def empty(self) -> bool:
        return (
            not self.ids
            and all(
                v is None for v in (self.user, self.name, self.array_id, self.tenant, self.pool)
            )
            and not self.states
        )


@dataclass(frozen=True, order=True)
class JobMark:
    """A job as a bulk answer names it: its state (new for a changed job) and hold."""

    id: str
    name: str
    state: str
    held: bool


@dataclass(frozen=True)
class BulkResult:
    action: BulkAction
    changed: list[JobMark] = field(default_factory=list)
    not_found: list[str] = field(default_factory=list)
    skipped: list[JobMark] = field(default_factory=list)  # named by id, left as they were
    refused: int = 0


def cancel_row(s: Session, row: JobModel, why: str, now: float) -> None:
    """Cancel the unfinished job in ``row`` (one job's path: a running job is stopped with its
    checkpoint signal and grace; one being launched or stopping has its replicas stopped)."""
    state = JobState(row.state)
    policy = stored_job(row).stop_policy
    if state in (JobState.PENDING, JobState.REQUEUED, JobState.CONFIGURING):
        move(s, row, JobState.CANCELLED, now, reason=why)
    elif state is JobState.RUNNING:
        move(s, row, JobState.COMPLETING, now, reason=why)
    # COMPLETING: a stop is already under way; its replicas not yet ordered to stop are
    # cancelled (they end through the exit report, or before they started)
    order_stop(s, row.id, StopReason.CANCEL, policy.signal, policy.grace_s)


def _array_id() -> Any:
    return JobModel.spec["array"]["array_id"].as_string()


_TASK_RE = re.compile(r"^([0-9A-Za-z-]+)_(\d{1,9})$")


def _named(ids: tuple[str, ...]) -> ColumnElement[bool]:
    """Jobs named by id: job ids, array ids (every task) and ``ARRAY_INDEX`` (one task)."""
    plain = [i for i in ids if not _TASK_RE.match(i)]
    clauses: list[ColumnElement[bool]] = []
    if plain:
        clauses += [JobModel.id.in_(plain), _array_id().in_(plain)]
    for ref in ids:
        task = _TASK_RE.match(ref)
        if task is not None:
            index = JobModel.spec["array"]["index"].as_integer()
            clauses.append(and_(_array_id() == task.group(1), index == int(task.group(2))))
    return or_(*clauses)


def _matches(sel: Selection, principal: Principal) -> ColumnElement[bool]:
    """The selection as a WHERE clause, within what ``principal`` may see."""
    where: list[ColumnElement[bool]] = []
    if not principal.cluster_wide:
        where.append(JobModel.tenant == principal.tenant)
    if sel.ids:
        where.append(_named(sel.ids))
    if sel.user is not None:
        where.append(JobModel.user == sel.user)
    if sel.name is not None:
        where.append(JobModel.name == sel.name)
    if sel.array_id is not None:
        where.append(_array_id() == sel.array_id)
    if sel.tenant is not None:
        where.append(JobModel.tenant == sel.tenant)
    if sel.pool is not None:
        where.append(JobModel.pool == sel.pool)
    if sel.states:
        where.append(JobModel.state.in_([s.value for s in sel.states]))
    return and_(*where)


def _may_change(principal: Principal) -> ColumnElement[bool]:
    """The jobs ``principal`` may change, as a WHERE clause (the one-job calls' rule)."""
    if principal.can(Permission.JOB_CANCEL_ANY):
        return true()
    if principal.can(Permission.JOB_CANCEL_TENANT):
        return JobModel.tenant == principal.tenant
    if principal.can(Permission.JOB_CANCEL_OWN):
        return and_(JobModel.user == principal.user, JobModel.tenant == principal.tenant)
    return false()


def _applies(action: BulkAction) -> ColumnElement[bool]:
    """The jobs ``action`` can change."""
    if action is BulkAction.CANCEL:
        return JobModel.state.in_([s.value for s in _UNFINISHED])
    pending = JobModel.state == JobState.PENDING.value
    held = JobModel.held.is_(True)
    return and_(pending, not_(held)) if action is BulkAction.HOLD else and_(pending, held)


class BulkService:
    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp

    def apply(
        self, actor: Actor, action: BulkAction, sel: Selection, reason: str | None = None
    ) -> BulkResult:
        """``action`` on every job of ``sel`` the caller may change, in one transaction."""
        principal = actor.principal
        require(
            principal,
            Permission.JOB_CANCEL_OWN,
            Permission.JOB_CANCEL_TENANT,
            Permission.JOB_CANCEL_ANY,
        )
        if sel.empty:
            raise Invalid(
                f"nothing to {action.value}: give job ids or a filter (user, name, state, array, "
                "account, pool)"
            )
        if len(sel.ids) > MAX_IDS:
            raise Invalid(f"{len(sel.ids)} ids is more than {MAX_IDS}: select by a filter")
        now = self.cp.now()
        why = reason or (
            f"cancelled by {principal.user}"
            if action is BulkAction.CANCEL
            else f"{action.value} by {principal.user}"
        )
        matches = _matches(sel, principal)
        mine = and_(matches, _may_change(principal))
        with self.cp.tx() as s:
            refused = int(
                s.scalar(select(func.count()).where(matches, not_(_may_change(principal)))) or 0
            )
            target = and_(mine, _applies(action))
            changed = self._change(s, actor, action, target, why=why, now=now)
            named = self._named(s, sel, matches, {c.id for c in changed})
        if changed:
            self.cp.poke()
        return BulkResult(action, changed, named[0], named[1], refused)

    def _change(
        self,
        s: Session,
        actor: Actor,
        action: BulkAction,
        target: ColumnElement[bool],
        *,
        why: str,
        now: float,
    ) -> list[JobMark]:
        changed: list[JobMark] = []
        if action is BulkAction.CANCEL:
            # Jobs holding resources (or between states): one by one, with their stop.
            for row in s.scalars(
                select(JobModel)
                .where(target, JobModel.state != JobState.PENDING.value)
                .order_by(JobModel.id)
            ):
                cancel_row(s, row, why, now)
                changed.append(JobMark(row.id, row.name, row.state, row.held))
            done = s.execute(
                update(JobModel)
                .where(target, JobModel.state == JobState.PENDING.value)
                .values(
                    state=JobState.CANCELLED.value,
                    version=JobModel.version + 1,
                    reason=why,
                    end_time=now,
                    pending_reason=None,
                    estimated_start=None,
                )
                .returning(JobModel.id, JobModel.version, JobModel.name, JobModel.held)
                .execution_options(synchronize_session=False)
            ).all()
            if done:
                s.execute(
                    _INSERT_EVENTS,
                    [
                        {
                            "job_id": job_id,
                            "time": now,
                            "source": JobState.PENDING.value,
                            "target": JobState.CANCELLED.value,
                            "version": version,
                            "reason": why,
                        }
                        for job_id, version, _, _ in done
                    ],
                )
            cancelled = JobState.CANCELLED.value
            changed += [JobMark(i, name, cancelled, held) for i, _, name, held in done]
        else:
            held = action is BulkAction.HOLD
            flipped = s.execute(
                update(JobModel)
                .where(target)
                .values(held=held, version=JobModel.version + 1)
                .returning(JobModel.id, JobModel.name)
                .execution_options(synchronize_session=False)
            ).all()
            changed = [JobMark(i, name, JobState.PENDING.value, held) for i, name in flipped]
        if changed:
            name = f"job.{action.value}"
            s.execute(
                _INSERT_AUDITS, [audit.values(actor, name, now, target=c.id) for c in changed]
            )
        changed.sort()
        return changed

    def _named(
        self,
        s: Session,
        sel: Selection,
        matches: ColumnElement[bool],
        changed: set[str],
    ) -> tuple[list[str], list[JobMark]]:
        """Of the ids ``sel`` names: those that match no job, and the named jobs left as they
        were (with their state)."""
        if not sel.ids:
            return [], []
        seen: set[str] = set()
        skipped: list[JobMark] = []
        index = JobModel.spec["array"]["index"].as_integer()
        for job_id, name, state, held, array, task in s.execute(
            select(
                JobModel.id, JobModel.name, JobModel.state, JobModel.held, _array_id(), index
            ).where(matches)
        ):
            seen.add(job_id)
            if array is not None:
                seen |= {array, f"{array}_{task}"}
            if job_id not in changed:
                skipped.append(JobMark(job_id, name, state, held))
        return [i for i in sel.ids if i not in seen], sorted(skipped)


def forbid_other_tenant(principal: Principal, tenant: str | None) -> None:
    """A tenant-scoped caller may not select another tenant's jobs by name."""
    if tenant is not None and not principal.cluster_wide and tenant != principal.tenant:
        raise Forbidden(f"you may change only jobs of your tenant {principal.tenant}")


def parse_states(names: Sequence[str]) -> tuple[JobState, ...]:
    """State names or codes (``PD``, ``running``) -> states; raises ``Invalid``."""
    try:
        return tuple(JobState.parse(n) for n in names)
    except ValueError as exc:
        raise Invalid(str(exc)) from None
