"""The store on SQLite and PostgreSQL: schema versions, durability settings, mappings,
optimistic concurrency and uniqueness guarantees the control plane relies on."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import inspect, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm.exc import StaleDataError

from gpupool.control.context import ControlPlane
from gpupool.domain.jobs import IsolationMode, Job, JobSpec, RequeuePolicy
from gpupool.domain.resources import ResourceRequest
from gpupool.domain.states import JobState
from gpupool.domain.transitions import transition
from gpupool.store.mapping import apply_job, job_from_row, job_to_row, spec_from_json, spec_to_json
from gpupool.store.models import Base, JobModel, LeaderModel
from gpupool.store.schema import SchemaMismatch, current_revision, ensure_schema, head_revision


def _job(job_id: str = "j1", user: str = "admin") -> Job:
    spec = JobSpec(name="train", command=("python", "train.py"), resources=ResourceRequest(500))
    return Job(id=job_id, spec=spec, tenant="default", user=user, priority=500)


def test_fresh_store_is_created_at_the_newest_schema(cp: ControlPlane) -> None:
    assert current_revision(cp.engine) == head_revision()
    with cp.tx() as s:
        assert s.get(LeaderModel, 1) is not None


def test_migrations_match_the_models(cp: ControlPlane) -> None:
    with cp.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == [], f"models and migrations differ: add a migration for {diff}"


def test_an_unknown_schema_version_is_refused_with_advice(cp: ControlPlane) -> None:
    with cp.engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'ffff'"))
    with pytest.raises(SchemaMismatch, match="newer than this gpupool knows"):
        ensure_schema(cp.engine)


def test_an_older_schema_is_refused_until_migrate(cp: ControlPlane) -> None:
    # The store as release 0001 left it: no uploads table, no assignments.stop_for, no leader
    # lease expiry, no nodes.agent_id, no memory oversubscription (pools) or spilled bytes
    # (slices), no container engines (nodes) or container settings (pools), no token parents,
    # no nodes.orders_version, no devices.context_reserve_mib, no nodes.features, no notices
    # outbox.
    with cp.engine.begin() as conn:
        conn.execute(text("DROP TABLE notices"))
        conn.execute(text("ALTER TABLE nodes DROP COLUMN features"))
        conn.execute(text("DROP INDEX ix_tokens_parent_id"))
        conn.execute(text("ALTER TABLE tokens DROP COLUMN parent_id"))
        conn.execute(text("DROP TABLE uploads"))
        conn.execute(text("ALTER TABLE assignments DROP COLUMN stop_for"))
        conn.execute(text("ALTER TABLE leader DROP COLUMN expires"))
        conn.execute(text("ALTER TABLE nodes DROP COLUMN agent_id"))
        conn.execute(text("ALTER TABLE pools DROP COLUMN memory_oversubscription"))
        conn.execute(text("ALTER TABLE slices DROP COLUMN spilled_bytes"))
        conn.execute(text("ALTER TABLE nodes DROP COLUMN container_engines"))
        conn.execute(text("ALTER TABLE pools DROP COLUMN container_engine"))
        conn.execute(text("ALTER TABLE pools DROP COLUMN image_registries"))
        conn.execute(text("ALTER TABLE nodes DROP COLUMN orders_version"))
        conn.execute(text("ALTER TABLE devices DROP COLUMN context_reserve_mib"))
        conn.execute(text("UPDATE alembic_version SET version_num = '0001'"))
    with pytest.raises(SchemaMismatch, match="gpupool server --migrate"):
        ensure_schema(cp.engine)
    assert "uploads" not in inspect(cp.engine).get_table_names()  # refused: nothing changed
    assert ensure_schema(cp.engine, allow_migrate=True) == head_revision()
    assert "uploads" in inspect(cp.engine).get_table_names()
    assert "notices" in inspect(cp.engine).get_table_names()
    assert "stop_for" in {c["name"] for c in inspect(cp.engine).get_columns("assignments")}
    assert "expires" in {c["name"] for c in inspect(cp.engine).get_columns("leader")}
    assert "agent_id" in {c["name"] for c in inspect(cp.engine).get_columns("nodes")}
    assert "spilled_bytes" in {c["name"] for c in inspect(cp.engine).get_columns("slices")}
    assert "image_registries" in {c["name"] for c in inspect(cp.engine).get_columns("pools")}
    assert "parent_id" in {c["name"] for c in inspect(cp.engine).get_columns("tokens")}
    assert "orders_version" in {c["name"] for c in inspect(cp.engine).get_columns("nodes")}
    devices = {c["name"] for c in inspect(cp.engine).get_columns("devices")}
    assert "context_reserve_mib" in devices
    assert "features" in {c["name"] for c in inspect(cp.engine).get_columns("nodes")}


def test_tables_without_a_schema_version_are_refused(cp: ControlPlane) -> None:
    with cp.engine.begin() as conn:
        conn.execute(text("DELETE FROM alembic_version"))
    with pytest.raises(SchemaMismatch, match="no gpupool schema version"):
        ensure_schema(cp.engine)


def test_sqlite_runs_in_wal_mode_with_full_sync(cp: ControlPlane) -> None:
    if not cp.sqlite:
        pytest.skip("SQLite only")
    with cp.engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA synchronous")).scalar() == 2  # FULL
        assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 1


_names = st.text(alphabet="abcdefghij-_ .", min_size=1, max_size=20).filter(str.strip)


@settings(max_examples=60, deadline=None)
@given(
    milli=st.sampled_from([0, 1, 250, 500, 999, 1000, 2000, 8000]),
    mem=st.none() | st.integers(0, 81920),
    types=st.lists(st.sampled_from(["A100", "H100-80GB", "T4"]), max_size=3, unique=True),
    replicas=st.integers(1, 8),
    requeue=st.sampled_from(list(RequeuePolicy)),
    isolation=st.sampled_from(list(IsolationMode)),
    limit=st.none() | st.floats(1, 1e6),
    env=st.dictionaries(st.sampled_from(["A", "B", "WANDB_MODE"]), _names, max_size=3),
    script=st.booleans(),
)
def test_spec_json_round_trips_exactly(
    milli: int,
    mem: int | None,
    types: list[str],
    replicas: int,
    requeue: RequeuePolicy,
    isolation: IsolationMode,
    limit: float | None,
    env: dict[str, str],
    script: bool,
) -> None:
    spec = JobSpec(
        name="x",
        command=() if script else ("run", "--flag"),
        script="echo hi | tee log" if script else None,
        env=env,
        resources=ResourceRequest(milli, mem, tuple(types), 2000, 1024),
        replicas=replicas,
        requeue=requeue,
        isolation=isolation,
        time_limit_s=limit,
        preemptible=replicas % 2 == 0,
    )
    assert spec_from_json(spec_to_json(spec)) == spec


def test_job_row_round_trips(cp: ControlPlane) -> None:
    job = _job()
    with cp.tx() as s:
        s.add(job_to_row(job))
    with cp.tx() as s:
        row = s.get(JobModel, "j1")
        assert row is not None
        assert job_from_row(row) == job


def test_a_stale_version_cannot_overwrite_a_newer_one(cp: ControlPlane) -> None:
    """Optimistic concurrency: a writer holding version 1 loses to one that wrote version 2."""
    with cp.tx() as s:
        s.add(job_to_row(_job()))
    stale_session = cp.sessions()
    stale_row = stale_session.get(JobModel, "j1")
    assert stale_row is not None
    stale_session.commit()  # the read transaction ends, as the loop's snapshot does
    with cp.tx() as s:  # someone else moves the job on
        row = s.get(JobModel, "j1")
        assert row is not None
        new, _ = transition(job_from_row(row), JobState.CANCELLED, now=1.0)
        apply_job(row, new)
    new_stale, _ = transition(job_from_row(stale_row), JobState.CONFIGURING, now=2.0)
    apply_job(stale_row, new_stale)
    with pytest.raises(StaleDataError):
        stale_session.commit()
    stale_session.close()
    with cp.tx() as s:
        row = s.get(JobModel, "j1")
        assert row is not None
        assert row.state == "CANCELLED"
        assert row.version == 2


def test_idempotency_keys_are_unique_per_user(cp: ControlPlane) -> None:
    with cp.tx() as s:
        s.add(job_to_row(_job("j1"), idempotency_key="k"))
        s.add(job_to_row(_job("j2", user="someone"), idempotency_key="k"))  # other user: fine
    with pytest.raises(IntegrityError), cp.tx() as s:
        s.add(job_to_row(_job("j3"), idempotency_key="k"))
    with cp.tx() as s:
        ids = sorted(s.scalars(select(JobModel.id)))
    assert ids == ["j1", "j2"]


def test_a_failed_transaction_leaves_nothing_behind(cp: ControlPlane) -> None:
    class Boom(Exception):
        pass

    def write_then_fail() -> None:
        with cp.tx() as s:
            s.add(job_to_row(_job()))
            s.flush()
            raise Boom

    with pytest.raises(Boom):
        write_then_fail()
    with cp.tx() as s:
        assert s.get(JobModel, "j1") is None


def test_bulk_update_is_visible_in_the_next_transaction(cp: ControlPlane) -> None:
    with cp.tx() as s:
        s.add(job_to_row(_job()))
    with cp.tx() as s:
        s.execute(update(JobModel).where(JobModel.id == "j1").values(pending_reason="Priority: x"))
    with cp.tx() as s:
        assert s.scalar(select(JobModel.pending_reason)) == "Priority: x"
