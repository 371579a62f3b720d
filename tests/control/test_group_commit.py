"""Group commit and the submit hot path's caches: batches, per-item outcomes, idempotency
inside a batch, the principal cache's invalidation and the catalog's reloads."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import pytest
from sqlalchemy import func, select

from gpupool.control.context import ControlPlane
from gpupool.control.errors import Invalid, Unauthorized
from gpupool.control.machinery.batching import GroupCommit
from gpupool.control.machinery.clock import ManualClock
from gpupool.control.services.auth import PrincipalCache, authenticate
from gpupool.control.services.jobs import JobService
from gpupool.control.services.pools import PoolService
from gpupool.control.services.tenants import TenantService
from gpupool.control.services.users import UserService
from gpupool.domain.jobs import Job
from gpupool.domain.pools import Pool
from gpupool.domain.tenants import Tenant
from gpupool.domain.users import Role
from gpupool.store.models import AuditModel, JobEventModel, JobModel
from tests.control.builders import ADMIN, actor

SPEC = {"name": "j", "command": ["true"], "resources": {"gpus": "0.5"}}


def _count(cp: ControlPlane, model: type) -> int:
    with cp.read() as s:
        return int(s.scalar(select(func.count()).select_from(model)) or 0)


# ---------------------------------------------------------------- GroupCommit


def test_items_queued_while_a_batch_is_written_go_in_the_next_batch_together() -> None:
    started, release = threading.Event(), threading.Event()
    batches: list[list[int]] = []

    def write(items: Sequence[int]) -> list[int | BaseException]:
        if not batches:
            started.set()
            release.wait(10)  # hold the first batch until the others are queued
        batches.append(list(items))
        return [i * 10 for i in items]

    commit: GroupCommit[int, int] = GroupCommit(write, max_items=64)

    async def main() -> list[int]:
        first = asyncio.ensure_future(commit.submit(0))
        while not started.is_set():  # the writer holds item 0
            await asyncio.sleep(0.001)
        rest = [asyncio.ensure_future(commit.submit(i)) for i in range(1, 6)]
        await asyncio.sleep(0)  # each of them queues its item
        release.set()
        return await asyncio.gather(first, *rest)

    try:
        assert asyncio.run(main()) == [0, 10, 20, 30, 40, 50]
    finally:
        commit.close()
    assert batches == [[0], [1, 2, 3, 4, 5]]


def test_each_caller_gets_its_own_outcome_and_a_failed_write_reaches_everyone() -> None:
    def write(items: Sequence[int]) -> list[int | BaseException]:
        if 99 in items:
            raise RuntimeError("disk on fire")
        return [ValueError(f"bad {i}") if i < 0 else i for i in items]

    commit: GroupCommit[int, int] = GroupCommit(write)

    async def one(i: int) -> object:
        try:
            return await commit.submit(i)
        except Exception as exc:
            return exc

    async def main() -> list[object]:
        return [await one(1), await one(-1), await one(99)]

    try:
        ok, bad, broken = asyncio.run(main())
    finally:
        commit.close()
    assert ok == 1
    assert isinstance(bad, ValueError)
    assert isinstance(broken, RuntimeError)


# ---------------------------------------------------------------- write_submits


def test_a_batch_keeps_idempotency_exact_and_isolates_a_bad_submit(cp: ControlPlane) -> None:
    jobs = JobService(cp)
    earlier, _ = jobs.submit(ADMIN, SPEC, "k0")
    items = [
        jobs.prepare(ADMIN, SPEC, "k1"),
        jobs.prepare(ADMIN, SPEC, "k1"),  # the same key twice in one batch
        jobs.prepare(ADMIN, {**SPEC, "pool": "nope"}, None),
        jobs.prepare(ADMIN, SPEC, "k0"),  # a key of an earlier batch
        jobs.prepare(ADMIN, SPEC, None),
    ]
    outcomes = jobs.write_submits(items)
    first, again, bad, old, plain = outcomes
    assert isinstance(first, tuple)
    assert isinstance(again, tuple)
    assert isinstance(old, tuple)
    assert isinstance(plain, tuple)
    assert first[1] is True
    assert again == (first[0], False)
    assert isinstance(bad, Invalid)
    assert "pool 'nope' does not exist" in bad.message
    assert old[0].id == earlier.id
    assert old[1] is False
    assert plain[1] is True
    # three jobs in all (earlier, k1, plain), each with its event and its audit row
    assert _count(cp, JobModel) == 3
    assert _count(cp, JobEventModel) == 3
    with cp.read() as s:
        actions = list(s.scalars(select(AuditModel.action)))
    assert actions.count("job.submit") == 3


def test_concurrent_async_submits_with_one_key_make_one_job(cp: ControlPlane) -> None:
    jobs = JobService(cp)

    async def main() -> list[tuple[str, bool]]:
        got = await asyncio.gather(*(jobs.submit_async(ADMIN, SPEC, "same") for _ in range(20)))
        return [(job.id, created) for job, created in got]

    try:
        results = asyncio.run(main())
    finally:
        jobs.close()
    assert len({job_id for job_id, _ in results}) == 1
    assert sum(created for _, created in results) == 1
    assert _count(cp, JobModel) == 1


# ---------------------------------------------------------------- catalog


def test_the_catalog_finds_new_names_and_forgets_deleted_ones_at_once(cp: ControlPlane) -> None:
    jobs = JobService(cp)
    jobs.submit(ADMIN, SPEC)  # loads the catalog copy
    TenantService(cp).put(ADMIN, Tenant("green", 1.0))
    PoolService(cp).put(ADMIN, Pool("fresh"))
    job, _ = jobs.submit(ADMIN, {**SPEC, "tenant": "green", "pool": "fresh"})
    assert (job.tenant, job.spec.pool) == ("green", "fresh")
    PoolService(cp).put(ADMIN, Pool("gone"))
    jobs.submit(ADMIN, SPEC)  # copy knows "gone"
    PoolService(cp).delete(ADMIN, "gone")
    with pytest.raises(Invalid, match="pool 'gone' does not exist"):
        jobs.submit(ADMIN, {**SPEC, "pool": "gone"})


def test_a_name_the_copy_lacks_is_reloaded_from_the_store(cp: ControlPlane) -> None:
    jobs = JobService(cp)
    jobs.submit(ADMIN, SPEC)
    # another server created the pool: this process's services did not see it
    other = ControlPlane(cp.settings, clock=cp.clock, engine=cp.engine)
    PoolService(other).put(ADMIN, Pool("elsewhere"))
    job, _ = jobs.submit(ADMIN, {**SPEC, "pool": "elsewhere"})
    assert job.spec.pool == "elsewhere"


# ---------------------------------------------------------------- principal cache


def test_a_cached_principal_is_dropped_when_its_token_is_revoked(cp: ControlPlane) -> None:
    users = UserService(cp)
    issued = users.create_token(ADMIN, None, "t", None)
    with cp.read() as s:
        who = authenticate(s, issued.secret, cp.now(), cp.principals)
    assert cp.principals.get(issued.secret, cp.now()) == who
    users.revoke_token(ADMIN, issued.id)
    assert cp.principals.get(issued.secret, cp.now()) is None
    with cp.read() as s, pytest.raises(Unauthorized, match="revoked"):
        authenticate(s, issued.secret, cp.now(), cp.principals)


def test_a_deleted_users_cached_tokens_stop_working(cp: ControlPlane) -> None:
    users = UserService(cp)
    users.create(ADMIN, "bob", Role.ADMIN, None)
    issued = users.create_token(actor("admin"), "bob", "t", None)
    with cp.read() as s:
        authenticate(s, issued.secret, cp.now(), cp.principals)
    users.delete(ADMIN, "bob")
    with cp.read() as s, pytest.raises(Unauthorized):
        authenticate(s, issued.secret, cp.now(), cp.principals)


def test_the_cache_checks_expiry_and_does_not_keep_answers_older_than_a_clear() -> None:
    cache = PrincipalCache(ttl_s=60)
    clock = ManualClock(1000.0)
    who = ADMIN.principal
    cache.put("gp_a", who, expires_at=1010.0, generation=cache.generation)
    assert cache.get("gp_a", clock.now()) == who
    clock.advance(10)
    assert cache.get("gp_a", clock.now()) is None  # the token itself expired
    started = cache.generation  # a lookup starts, then a revocation clears the cache
    cache.clear()
    cache.put("gp_b", who, expires_at=None, generation=started)
    assert cache.get("gp_b", clock.now()) is None


def test_a_key_committed_by_another_server_during_the_batch_returns_that_job(
    cp: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    if cp.sqlite:
        pytest.skip("SQLite writers queue on the write lock: the key query cannot go stale")
    other = ControlPlane(cp.settings, clock=cp.clock)  # another server on the same store
    theirs: list[Job] = []
    real_get = cp.catalog.get

    def get_after_a_race(*args: Any) -> Any:
        if not theirs:  # after this batch read the keys, the other server commits key "k"
            theirs.append(JobService(other).submit(ADMIN, SPEC, "k")[0])
        return real_get(*args)

    monkeypatch.setattr(cp.catalog, "get", get_after_a_race)
    jobs = JobService(cp)
    try:
        outcomes = jobs.write_submits(
            [jobs.prepare(ADMIN, SPEC, "k"), jobs.prepare(ADMIN, SPEC, None)]
        )
    finally:
        other.close()
    race, plain = outcomes
    assert race == (theirs[0], False)
    assert isinstance(plain, tuple)
    assert plain[1] is True
    assert _count(cp, JobModel) == 2
