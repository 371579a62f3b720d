"""Opening the store: where it lives, and the engine settings that make it durable.

- **home**: ``$GPUPOOL_HOME``, default ``~/.local/share/gpupool``; the SQLite file, the admin
  token and the job logs live there.
- **database URL**: ``$GPUPOOL_DATABASE_URL`` (``postgresql+psycopg://user@host/db``) or, when
  unset, ``sqlite:///$GPUPOOL_HOME/gpupool.db``.

SQLite runs in WAL mode with ``synchronous=FULL`` (a commit the API acknowledged survives a
power cut), foreign keys on, and a busy timeout so concurrent writers queue instead of failing.
PostgreSQL connections are checked before use (``pool_pre_ping``), so the server recovers on
its own after the database comes back.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

DEFAULT_HOME = Path("~/.local/share/gpupool")


def resolve_home(home: str | os.PathLike[str] | None = None) -> Path:
    """The gpupool home folder: ``home``, else ``$GPUPOOL_HOME``, else the default."""
    raw = home if home is not None else os.environ.get("GPUPOOL_HOME")
    return Path(raw).expanduser() if raw else DEFAULT_HOME.expanduser()


def resolve_url(home: Path, url: str | None = None) -> str:
    """The database URL: ``url``, else ``$GPUPOOL_DATABASE_URL``, else SQLite under ``home``."""
    chosen = url or os.environ.get("GPUPOOL_DATABASE_URL")
    if chosen:
        return chosen
    return f"sqlite:///{home / 'gpupool.db'}"


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # The sqlite3 driver opens transactions lazily; let SQLAlchemy's BEGIN drive them instead.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


#: Execution option marking a read-only transaction (SQLite then begins it DEFERRED).
READ_ONLY = "gpupool_read_only"


def _sqlite_begin(conn: Any) -> None:
    # IMMEDIATE takes the write lock at BEGIN, so read-then-write transactions never deadlock;
    # read-only transactions begin DEFERRED and run beside the writer (WAL readers never block).
    if conn.get_execution_options().get(READ_ONLY):
        conn.exec_driver_sql("BEGIN")
    else:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def make_engine(url: str, *, pool_size: int = 10) -> Engine:
    """An engine for ``url`` with gpupool's durability and recovery settings."""
    if is_sqlite(url):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            pool_size=pool_size,
            max_overflow=pool_size,
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    return create_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size * 2,
        pool_pre_ping=True,
        pool_timeout=5,
        connect_args={"connect_timeout": 3},
    )


def session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions that keep loaded values after commit (services return plain values)."""
    return sessionmaker(engine, expire_on_commit=False)
