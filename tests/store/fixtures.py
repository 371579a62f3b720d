"""Database fixtures shared by the store, control and API tests.

``db_url`` is parametrised over SQLite (a file per test) and PostgreSQL. PostgreSQL is
``$GPUPOOL_TEST_PG`` (default ``postgresql+psycopg://postgres@127.0.0.1:5432/postgres``); the
session creates a fresh database ``gpupool_test_<random>``, creates the schema once, empties
the tables before each test and drops the database at the end. Without a reachable server the
PostgreSQL cases skip with the reason, except under ``CI=true``, where they fail.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Connection, create_engine, func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from gpupool.control.bootstrap import bootstrap
from gpupool.control.context import ControlPlane
from gpupool.control.machinery.clock import ManualClock
from gpupool.control.settings import ServerSettings
from gpupool.store.db import make_engine
from gpupool.store.models import Base, DeviceModel, SliceModel
from gpupool.store.schema import ensure_schema, head_revision

PG_ADMIN_URL = os.environ.get(
    "GPUPOOL_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
START = 1_800_000_000.0  # a fixed "now" for manual clocks (2027-01-15)


def _pg_unavailable(reason: str) -> None:
    message = f"PostgreSQL not reachable at {PG_ADMIN_URL} ({reason}); set GPUPOOL_TEST_PG"
    if IN_CI:
        pytest.fail(f"{message}: PostgreSQL tests are mandatory in CI", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """URL of a fresh PostgreSQL database for this test session (dropped at the end)."""
    try:
        admin = create_engine(
            PG_ADMIN_URL, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3}
        )
        with admin.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:  # any connection failure means "no server"
        _pg_unavailable(type(exc).__name__)
    name = f"gpupool_test_{secrets.token_hex(4)}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    engine = make_engine(url)
    ensure_schema(engine)
    engine.dispose()
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _empty_pg(url: str) -> None:
    engine = create_engine(url)
    names = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))
        # A test may have changed the recorded version on purpose: put it back.
        conn.execute(text("DELETE FROM alembic_version"))
        conn.execute(text("INSERT INTO alembic_version VALUES (:v)"), {"v": head_revision()})
    engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database URL with an empty gpupool schema, on SQLite and on PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'gpupool.db'}"
    url: str = request.getfixturevalue("pg_database")
    _empty_pg(url)
    return url


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


@pytest.fixture
def cp(db_url: str, tmp_path: Path, clock: ManualClock) -> Iterator[ControlPlane]:
    """A prepared, bootstrapped control plane (no loop thread) with a manual clock."""
    settings = ServerSettings(home=tmp_path / "home", database_url=db_url, schedule=False)
    plane = ControlPlane(settings, clock=clock)
    plane.prepare()
    bootstrap(plane)
    try:
        yield plane
    finally:
        plane.close()


def device_load(db: Connection | Session) -> list[tuple[str, int, int, int]]:
    """Each device holding active slices: ``(uuid, memory MiB, milli held, MiB held)``, for
    the tests that check no device is ever over capacity."""
    rows = db.execute(
        select(
            DeviceModel.uuid,
            DeviceModel.memory_mib,
            func.sum(SliceModel.milli),
            func.sum(SliceModel.memory_mib),
        )
        .join(SliceModel, SliceModel.device_uuid == DeviceModel.uuid)
        .where(SliceModel.active.is_(True))
        .group_by(DeviceModel.uuid, DeviceModel.memory_mib)
    ).all()
    return [(str(u), int(m), int(milli), int(mem)) for u, m, milli, mem in rows]
