"""Jobs: submit (idempotent), read, list, cancel, hold, release, requeue.

Visibility: a tenant-scoped role sees only its tenant's jobs; any other job answers 404, the
same as a job that does not exist, so ids of other teams' jobs leak nothing.

**Idempotency key**: a client may send a key with a submit (the ``Idempotency-Key`` header or
the request's ``idempotency_key``). A second submit by the same user with the same key returns
the job created by the first, whatever happened in between (timeouts, server restarts). Keys
are unique per user and kept for the life of the job.

A submit is checked here (:meth:`JobService.prepare`) and stored by
:mod:`gpupool.control.services.submits`; what a read answers (:class:`JobDetail`,
:class:`JobPage`) is defined in :mod:`gpupool.control.services.jobviews`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpupool.control.bootstrap import DEFAULT_TENANT
from gpupool.control.context import ControlPlane
from gpupool.control.errors import Conflict, Forbidden, Invalid, NotFound
from gpupool.control.machinery.batching import GroupCommit
from gpupool.control.machinery.jobstate import move
from gpupool.control.notify import check_submit
from gpupool.control.services import audit
from gpupool.control.services.auth import Actor, Principal, require, tenant_visible
from gpupool.control.services.bulk import cancel_row
from gpupool.control.services.envelope import envelopes, quota_refusal
from gpupool.control.services.jobedit import updated_spec
from gpupool.control.services.jobviews import JobDetail, JobFilter, JobPage, load_details
from gpupool.control.services.submits import PendingSubmit, SubmitOutcome, insert_submits
from gpupool.control.services.uploads import UploadService
from gpupool.domain.errors import SpecError
from gpupool.domain.jobs import Job, JobSpec
from gpupool.domain.jobspec import build_spec
from gpupool.domain.states import JobState
from gpupool.domain.transitions import JobEvent
from gpupool.domain.users import Permission
from gpupool.store.mapping import apply_job, event_from_row, job_from_row
from gpupool.store.models import JobEventModel, JobModel

MAX_PAGE = 1000


def _not_found(job_id: str) -> NotFound:
    return NotFound(f"job {job_id!r} not found: list your jobs with `gpupool queue`")


class JobService:
    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self._batcher: GroupCommit[PendingSubmit, tuple[Job, bool]] | None = None

    # ------------------------------------------------------------------ submit
    def submit(
        self,
        actor: Actor,
        data: Mapping[str, Any],
        idempotency_key: str | None = None,
        *,
        workdir_upload: str | None = None,
        held: bool = False,
        queue_anyway: bool = False,
        begin: float | None = None,
    ) -> tuple[Job, bool]:
        """Validate and store a job; returns it and whether it was created now.

        ``workdir_upload`` names an upload of the job's tenant (see
        :mod:`gpupool.control.services.uploads`); it is kept in the job's stored spec and sent to
        the agent, which unpacks it and runs the job there. ``held``: the job is stored held and
        waits until released (an idempotent retry returns the first job as it is).
        ``queue_anyway``: store it even when no node of its pool could hold it (see
        :mod:`gpupool.control.services.envelope`); otherwise such a job is refused.
        ``begin``: it is not eligible before then (epoch seconds; sbatch --begin)."""
        pending = replace(
            self.prepare(actor, data, idempotency_key),
            held=held,
            queue_anyway=queue_anyway,
            begin=begin,
        )
        if workdir_upload is not None:
            UploadService(self.cp).check_for_job(actor.principal, workdir_upload, pending.tenant)
            pending = replace(pending, workdir_upload=workdir_upload)
        outcome = self.write_submits([pending])[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def submit_async(
        self,
        actor: Actor,
        data: Mapping[str, Any],
        idempotency_key: str | None = None,
        *,
        held: bool = False,
        queue_anyway: bool = False,
        begin: float | None = None,
    ) -> tuple[Job, bool]:
        """:meth:`submit` (without an upload) through group commit: concurrent submits share
        one transaction; this returns after the commit. Call it from an event loop."""
        pending = self.prepare(actor, data, idempotency_key)
        if held or queue_anyway or begin is not None:
            pending = replace(pending, held=held, queue_anyway=queue_anyway, begin=begin)
        if self._batcher is None:
            self._batcher = GroupCommit(
                self.write_submits,
                max_items=self.cp.settings.submit_batch,
                writers=self.cp.settings.submit_writers,
                name="submits",
            )
        return await self._batcher.submit(pending)

    def close(self) -> None:
        """Stop the group-commit writer (after the submits already queued)."""
        if self._batcher is not None:
            self._batcher.close()

    def prepare(
        self, actor: Actor, data: Mapping[str, Any], idempotency_key: str | None
    ) -> PendingSubmit:
        """Checks that need no store: permission, the spec, the tenant it may go to."""
        require(actor.principal, Permission.JOB_SUBMIT)
        try:
            spec = build_spec(data, source="request")
        except SpecError as exc:
            raise Invalid("; ".join(str(p) for p in exc.problems)) from None
        unsendable = check_submit(spec, self.cp.settings)  # --mail-type with nowhere to go
        if unsendable is not None:
            raise Invalid(unsendable)
        return PendingSubmit(actor, spec, self._tenant_for(actor.principal, spec), idempotency_key)

    def _tenant_for(self, principal: Principal, spec: JobSpec) -> str:
        if spec.tenant is None:
            return principal.tenant or DEFAULT_TENANT
        if principal.cluster_wide or spec.tenant == principal.tenant:
            return spec.tenant
        raise Forbidden(
            f"you may submit jobs only to your tenant {principal.tenant}: remove "
            f"'tenant: {spec.tenant}' or ask an admin"
        )

    def _by_key(self, user: str, key: str) -> Job | None:
        with self.cp.read() as s:
            row = s.scalar(
                select(JobModel).where(JobModel.user == user, JobModel.idempotency_key == key)
            )
            return job_from_row(row) if row is not None else None

    def write_submits(self, items: Sequence[PendingSubmit]) -> list[SubmitOutcome]:
        """Store prepared submits in one transaction; one outcome per item, in order.

        A bad item (unknown pool, ...) gets its error and does not stop the others. If the
        transaction fails on a unique key (a submit with the same idempotency key committed
        meanwhile by another process), each item is retried on its own, and an item whose
        key now exists returns that job."""
        try:
            outcomes = insert_submits(self.cp, items)
        except IntegrityError as exc:
            if len(items) > 1:
                return [self.write_submits([item])[0] for item in items]
            item = items[0]
            if item.key is not None:
                existing = self._by_key(item.actor.principal.user, item.key)
                if existing is not None:
                    return [(existing, False)]
            return [exc]
        except Exception as exc:  # each caller gets the error (503, 500, ...)
            return [exc] * len(items)
        self.cp.poke()
        return outcomes

    # ------------------------------------------------------------------ read
    def _load(self, s: Session, principal: Principal, job_id: str) -> JobModel:
        require(principal, Permission.JOB_READ, Permission.JOB_READ_ANY)
        row = s.get(JobModel, job_id)
        if row is None or not tenant_visible(principal, row.tenant):
            raise _not_found(job_id)
        return row

    def get(self, principal: Principal, job_id: str) -> JobDetail:
        with self.cp.read() as s:
            row = self._load(s, principal, job_id)
            return load_details(s, [row])[0]

    def list_jobs(
        self, principal: Principal, flt: JobFilter, limit: int = 100, cursor: str | None = None
    ) -> JobPage:
        """Jobs newest first. ``cursor`` is the ``next_cursor`` of the previous page."""
        require(principal, Permission.JOB_READ, Permission.JOB_READ_ANY)
        limit = max(1, min(limit, MAX_PAGE))
        query: Select[Any] = select(JobModel)
        if not principal.cluster_wide:
            query = query.where(JobModel.tenant == principal.tenant)
        if flt.tenant is not None:
            query = query.where(JobModel.tenant == flt.tenant)
        if flt.user is not None:
            query = query.where(JobModel.user == flt.user)
        if flt.pool is not None:
            query = query.where(JobModel.pool == flt.pool)
        if flt.name is not None:
            query = query.where(JobModel.name == flt.name)
        if flt.array_id is not None:
            query = query.where(JobModel.spec["array"]["array_id"].as_string() == flt.array_id)
        if flt.states:
            query = query.where(JobModel.state.in_([st.value for st in flt.states]))
        if cursor is not None:
            try:
                t_text, last_id = cursor.split("_", 1)
                t = float(t_text)
            except ValueError:
                raise Invalid(
                    "cursor is not valid: pass the next_cursor of the last page"
                ) from None
            query = query.where(
                (JobModel.submit_time < t) | ((JobModel.submit_time == t) & (JobModel.id < last_id))
            )
        query = query.order_by(JobModel.submit_time.desc(), JobModel.id.desc()).limit(limit + 1)
        with self.cp.read() as s:
            rows = list(s.scalars(query))
            more = len(rows) > limit
            rows = rows[:limit]
            details = load_details(s, rows)
        next_cursor = f"{rows[-1].submit_time!r}_{rows[-1].id}" if more and rows else None
        return JobPage([d.job for d in details], next_cursor, details)

    def events(self, principal: Principal, job_id: str) -> list[JobEvent]:
        with self.cp.read() as s:
            self._load(s, principal, job_id)
            rows = s.scalars(
                select(JobEventModel)
                .where(JobEventModel.job_id == job_id)
                .order_by(JobEventModel.id)
            )
            return [event_from_row(r) for r in rows]

    # ------------------------------------------------------------------ change
    def _load_for_change(self, s: Session, principal: Principal, job_id: str) -> JobModel:
        row = self._load(s, principal, job_id)
        if principal.can(Permission.JOB_CANCEL_ANY):
            return row
        if principal.can(Permission.JOB_CANCEL_TENANT) and row.tenant == principal.tenant:
            return row
        if principal.can(Permission.JOB_CANCEL_OWN) and row.user == principal.user:
            return row
        raise Forbidden(
            f"role {principal.role.value} may not change job {job_id} of user {row.user}: "
            "members change their own jobs, tenant admins their tenant's"
        )

    def cancel(self, actor: Actor, job_id: str, reason: str | None = None) -> Job:
        now = self.cp.now()
        why = reason or f"cancelled by {actor.principal.user}"
        with self.cp.tx() as s:
            row = self._load_for_change(s, actor.principal, job_id)
            state = JobState(row.state)
            if state.is_terminal:
                raise Conflict(f"job {job_id} already ended ({state.value}): nothing to cancel")
            cancel_row(s, row, why, now)
            audit.record(s, actor, "job.cancel", now, target=job_id)
            job = job_from_row(row)
        self.cp.poke()
        return job

    def set_held(self, actor: Actor, job_id: str, held: bool) -> Job:
        now = self.cp.now()
        with self.cp.tx() as s:
            row = self._load_for_change(s, actor.principal, job_id)
            if held and JobState(row.state) is not JobState.PENDING:
                raise Conflict(f"job {job_id} is {row.state}: only pending jobs can be held")
            job = job_from_row(row).with_changes(held=held)
            row.held = held
            audit.record(s, actor, "job.hold" if held else "job.release", now, target=job_id)
        self.cp.poke()
        return job

    def update(self, actor: Actor, job_id: str, changes: Mapping[str, Any]) -> Job:
        """Change a pending job (see :mod:`gpupool.control.services.jobedit`), audited."""
        now = self.cp.now()
        with self.cp.tx() as s:
            row = self._load_for_change(s, actor.principal, job_id)
            if JobState(row.state) is not JobState.PENDING:
                resize = (
                    f"; to change a running job's GPU slice in place (isolation shim): gpupool "
                    f"resize {job_id} -g GPUS --gpu-mem SIZE"
                    if "resources" in changes and JobState(row.state) is JobState.RUNNING
                    else ""
                )
                raise Conflict(
                    f"job {job_id} is {row.state}: only pending jobs can be updated; "
                    f"cancel it and submit it again{resize}"
                )
            job = job_from_row(row)
            spec = updated_spec(job.spec, changes)
            if spec.resources != job.spec.resources:  # checked as a submit is checked
                refusal = envelopes(self.cp).get(s, spec.pool).refusal(spec) or quota_refusal(
                    s, row.tenant, spec, {}
                )
                if refusal is not None:
                    raise Invalid(refusal)
            priority = job.priority
            if spec.priority_class != job.spec.priority_class:
                wanted = spec.priority_class
                copy, _, _, found = self.cp.catalog.get(s, row.tenant, row.pool, wanted)
                if found is None:
                    names = ", ".join(sorted(copy.priorities, key=copy.priorities.__getitem__))
                    raise Invalid(
                        f"priority class {spec.priority_class!r} does not exist: use one of {names}"
                    )
                priority = found
            # A new version: a start the scheduler decided from the old spec (between its
            # snapshot and its commit) is refused at commit, and the next cycle sees this one.
            job = dataclasses.replace(
                job.with_changes(spec=spec, priority=priority), version=job.version + 1
            )
            apply_job(row, job)
            audit.record(s, actor, "job.update", now, target=job_id)
        self.cp.poke()
        return job

    def requeue(self, actor: Actor, job_id: str) -> Job:
        """Put an ended job (failed, preempted, node failure, boot failure) back in the queue."""
        now = self.cp.now()
        with self.cp.tx() as s:
            row = self._load_for_change(s, actor.principal, job_id)
            state = JobState(row.state)
            if state not in (
                JobState.FAILED,
                JobState.PREEMPTED,
                JobState.NODE_FAIL,
                JobState.BOOT_FAIL,
            ):
                raise Conflict(
                    f"job {job_id} is {state.value}: only failed, preempted, node-failed or "
                    "boot-failed jobs can be requeued; cancel a running job and resubmit"
                )
            move(s, row, JobState.REQUEUED, now, reason=f"requeued by {actor.principal.user}")
            move(s, row, JobState.PENDING, now, reason="waiting again")
            audit.record(s, actor, "job.requeue", now, target=job_id)
            job = job_from_row(row)
        self.cp.poke()
        return job
