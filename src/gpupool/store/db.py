"""Opening the store: where it lives, and the engine settings that make it durable.

- **home**: ``$GPUPOOL_HOME``, default ``~/.local/share/gpupool``; the SQLite file, the admin
  token and the job logs live there.
- **database URL**: ``$GPUPOOL_DATABASE_URL`` (``postgresql+psycopg://user@host/db``) or, when
  unset, ``sqlite:///$GPUPOOL_HOME/gpupool.db``.

SQLite runs in WAL mode with ``synchronous=FULL`` (a commit the API acknowledged survives a
power cut), foreign keys on, and a busy timeout so concurrent writers queue instead of failing.
PostgreSQL connections are checked before use (``pool_pre_ping``), so the server recovers on
its own after the database comes back. A session that sits in an open transaction for
``IDLE_IN_TRANSACTION_S`` without sending anything (its process frozen by SIGSTOP or a pause
mid-commit) is ended by PostgreSQL, so the row locks it held are freed; the frozen server's
commit then fails when it wakes. (A standby does not wait that long for the leader row: it
ends a frozen leader's session itself once the lease has lapsed, control/machinery/leader.py.)

**File modes.** The store holds uploads, job environments and token hashes, and the home holds
the admin token: neither may be readable by a job running under another account. The SQLite
file is created ``0600`` before SQLite opens it (SQLite gives its ``-wal`` and ``-shm`` files the
database's mode), and a file left by an older gpupool is put back to ``0600`` with them at every
start. :func:`secure_home` makes the home ``0700`` (``0711`` where the local agent's jobs, run as
another account, must pass through it to their folders) and everything already in it private.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from gpupool.domain.errors import GpupoolError

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


#: The mode of every file holding a secret or the store: the owner's alone.
PRIVATE_FILE = 0o600
#: The home's mode, and what it is when others (jobs of the local agent) may pass through it.
PRIVATE_HOME = 0o700
PASS_ONLY_HOME = 0o711
#: Folders under the home that jobs pass through to reach their own folders (see agent/runas.py).
AGENT_FOLDER = "agent"


def secure_sqlite_file(path: Path) -> None:
    """Create the SQLite file ``0600`` if it is missing, and make it and its ``-wal``/``-shm``
    files ``0600`` if they exist (stores from older versions were ``0644``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, PRIVATE_FILE)
    os.close(fd)
    for file in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        if file.exists():
            file.chmod(PRIVATE_FILE)


#: What gpupool keeps in its home, made private by :func:`secure_home` (nothing else there is
#: touched). ``server-url`` holds no secret; it is private too, as only this account's clients
#: read it.
HOME_FILES = (
    "admin-token",
    "admin-token.tmp",
    "agent-token",
    "gpupool.db",
    "gpupool.db-wal",
    "gpupool.db-shm",
    "leader.lock",
    "server-url",
)
HOME_FOLDERS = ("logs",)


def secure_home(home: Path, *, others_may_pass: bool = False) -> None:
    """Make the gpupool home private: the folder ``0700`` (``0711`` with ``others_may_pass``,
    for the local agent's jobs run as another account), gpupool's files in it ``0600`` and its
    ``logs`` folder ``0700`` (made now, so it is never created open). The local agent's folder
    ``agent`` is left to the agent (see ``agent/runas.py``), except that others may not list it.
    A shared, world-writable folder (``/tmp``) is refused: it cannot be made private."""
    home.mkdir(parents=True, exist_ok=True, mode=PRIVATE_HOME)
    if home.stat().st_mode & stat.S_IWOTH:
        raise GpupoolError(
            f"the gpupool home {home} is writable by everyone (a shared folder): choose a "
            "folder of its own, e.g. --home ~/.local/share/gpupool"
        )
    home.chmod(PASS_ONLY_HOME if others_may_pass else PRIVATE_HOME)
    for name in HOME_FOLDERS:
        (home / name).mkdir(exist_ok=True, mode=PRIVATE_HOME)
        (home / name).chmod(PRIVATE_HOME)
    for name in HOME_FILES:
        path = home / name
        if path.is_file() and not path.is_symlink():
            path.chmod(PRIVATE_FILE)
    agent = home / AGENT_FOLDER
    if agent.is_dir() and not agent.is_symlink():
        agent.chmod(PASS_ONLY_HOME if others_may_pass else PRIVATE_HOME)


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


#: Seconds a PostgreSQL session may stay idle inside a transaction before the server ends it
#: (far above any pause between a gpupool transaction's statements).
IDLE_IN_TRANSACTION_S = 60.0


def make_engine(
    url: str,
    *,
    pool_size: int = 10,
    idle_in_transaction_s: float = IDLE_IN_TRANSACTION_S,
    application_name: str = "gpupool",
) -> Engine:
    """An engine for ``url`` with gpupool's durability and recovery settings."""
    if is_sqlite(url):
        path = url.split("///", 1)[-1].split("?", 1)[0]
        if path and path != ":memory:" and not path.startswith("file:"):
            secure_sqlite_file(Path(path))
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
        connect_args={
            "connect_timeout": 3,
            # named in pg_stat_activity (an operator, or a standby ending a frozen leader's
            # session: control/machinery/leader.py, sees whose it is)
            "application_name": application_name,
            "options": "-c idle_in_transaction_session_timeout="
            f"{max(1, int(idle_in_transaction_s * 1000))}",
        },
    )


def session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions that keep loaded values after commit (services return plain values)."""
    return sessionmaker(engine, expire_on_commit=False)
