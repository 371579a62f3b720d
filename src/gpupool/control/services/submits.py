"""Storing submits: a batch of prepared submits (:class:`PendingSubmit`) written in one
transaction by :func:`insert_submits`.

A submit is *prepared* first (:meth:`JobService.prepare
<gpupool.control.services.jobs.JobService.prepare>`: what needs no store: permission, the
spec, the tenant), then written here with what needs the store, each item by itself: its
idempotency key (a key the user already used returns that job, as does the same key again in
the batch), its tenant, pool and priority class, the jobs its dependency names, what no node of
its pool could hold and its tenant's quota (:mod:`gpupool.control.services.envelope`). The
batch's new jobs, their events and audit rows go in as three multi-row INSERTs. Group commit
(:mod:`gpupool.control.machinery.batching`) and job arrays
(:mod:`gpupool.control.services.arrays`) hand their batches to
:meth:`JobService.write_submits <gpupool.control.services.jobs.JobService.write_submits>`,
which calls this.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import insert, select

from gpupool.control.context import ControlPlane
from gpupool.control.errors import Invalid
from gpupool.control.machinery.dependencies import unknown_targets
from gpupool.control.services import audit
from gpupool.control.services.auth import Actor
from gpupool.control.services.envelope import envelopes, quota_refusal
from gpupool.domain.arrays import ArrayTask
from gpupool.domain.jobs import Job, JobSpec
from gpupool.domain.states import JobState
from gpupool.store.mapping import job_from_row, job_values
from gpupool.store.models import AuditModel, Base, JobEventModel, JobModel, QuotaModel

# Core INSERTs on the tables (not the ORM classes): SQLAlchemy caches their compiled form, and
# executing them with a list of rows is one executemany (multi-row VALUES where the driver can).
_INSERT_JOBS = insert(Base.metadata.tables[JobModel.__tablename__])
_INSERT_EVENTS = insert(Base.metadata.tables[JobEventModel.__tablename__])
_INSERT_AUDITS = insert(Base.metadata.tables[AuditModel.__tablename__])


def new_job_id() -> str:
    return secrets.token_hex(6)


@dataclass(frozen=True)
class PendingSubmit:
    """A submit that passed the checks needing no store, waiting to be written."""

    actor: Actor
    spec: JobSpec
    tenant: str
    key: str | None  # the idempotency key
    workdir_upload: str | None = None
    held: bool = False  # submitted held: it waits until released
    array: ArrayTask | None = None  # a task of a job array
    queue_anyway: bool = False  # store it even if no node of its pool could hold it
    begin: float | None = None  # not eligible before this time (sbatch --begin), epoch seconds


#: What storing one submit came to: the job and whether it was created now, or the error.
SubmitOutcome = tuple[Job, bool] | BaseException


def insert_submits(cp: ControlPlane, items: Sequence[PendingSubmit]) -> list[SubmitOutcome]:
    """Write ``items`` in one transaction; one outcome per item, in order (see the module
    docstring). A unique-key clash (the same key committed meanwhile by another process)
    raises :class:`~sqlalchemy.exc.IntegrityError` for the caller to retry item by item."""
    now = cp.now()
    outcomes: list[SubmitOutcome | None] = [None] * len(items)
    jobs: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    audits: list[dict[str, Any]] = []
    with cp.tx() as s:
        # Idempotency: the jobs these keys already made (one query for the batch; the
        # user + key index answers it), and keys repeated within the batch.
        known: dict[tuple[str, str], Job] = {}
        quotas: dict[tuple[str, str], QuotaModel | None] = {}  # read once per batch
        keyed = [(i.actor.principal.user, i.key) for i in items if i.key is not None]
        if keyed:
            users = sorted({u for u, _ in keyed})
            keys = sorted({k for _, k in keyed})
            for row in s.scalars(
                select(JobModel).where(JobModel.user.in_(users), JobModel.idempotency_key.in_(keys))
            ):
                if row.idempotency_key is not None:
                    known[(row.user, row.idempotency_key)] = job_from_row(row)
        for n, item in enumerate(items):
            user = item.actor.principal.user
            mark = (user, item.key) if item.key is not None else None
            if mark is not None and mark in known:
                outcomes[n] = (known[mark], False)
                continue
            spec = item.spec
            copy, has_tenant, has_pool, priority = cp.catalog.get(
                s, item.tenant, spec.pool, spec.priority_class
            )
            if not has_tenant:
                outcomes[n] = Invalid(
                    f"tenant {item.tenant!r} does not exist: ask an admin to create it"
                )
                continue
            if not has_pool:
                outcomes[n] = Invalid(
                    f"pool {spec.pool!r} does not exist: use one of `gpupool pools`"
                )
                continue
            if priority is None:
                names = ", ".join(sorted(copy.priorities, key=copy.priorities.__getitem__))
                outcomes[n] = Invalid(
                    f"priority class {spec.priority_class!r} does not exist: use one of {names}"
                )
                continue
            if spec.dependency is not None:
                scope = None if item.actor.principal.cluster_wide else item.tenant
                unknown = unknown_targets(s, spec.dependency, scope)
                if unknown:
                    outcomes[n] = Invalid(
                        f"dependency {spec.dependency.text()!r} names {', '.join(unknown)}, "
                        "which is not a job or job array you can see: give ids from "
                        "gpupool queue or gpupool history"
                    )
                    continue
            room = envelopes(cp).get(s, spec.pool)
            refusal = room.image_refusal(spec)  # containers: the allowlist, always
            if refusal is not None or not item.queue_anyway:
                refusal = (
                    refusal or room.refusal(spec) or quota_refusal(s, item.tenant, spec, quotas)
                )
                if refusal is not None:
                    outcomes[n] = Invalid(refusal)
                    continue
            job = Job(
                id=new_job_id(),
                spec=spec,
                tenant=item.tenant,
                user=user,
                priority=priority,
                submit_time=now,
                eligible_time=now if item.begin is None else max(now, item.begin),
                held=item.held,
                array=item.array,
            )
            values = job_values(job, idempotency_key=item.key)
            if item.workdir_upload is not None:
                values["spec"] = {**values["spec"], "workdir_upload": item.workdir_upload}
            jobs.append(values)
            events.append(
                {
                    "job_id": job.id,
                    "time": now,
                    "source": JobState.PENDING.value,
                    "target": JobState.PENDING.value,
                    "version": job.version,
                    "reason": "submitted held" if item.held else "submitted",
                }
            )
            audits.append(audit.values(item.actor, "job.submit", now, target=job.id))
            outcomes[n] = (job, True)
            if mark is not None:
                known[mark] = job  # the same key again in this batch: this job
        # Core multi-row INSERTs (no ORM bookkeeping), jobs first since their events
        # refer to them.
        if jobs:
            s.execute(_INSERT_JOBS, jobs)
            s.execute(_INSERT_EVENTS, events)
            s.execute(_INSERT_AUDITS, audits)
    return [o for o in outcomes if o is not None]
