"""The store's files and the home are the owner's alone (store/db.py): a job running as another
account must not read the SQLite file (uploads, job environments) or the admin token."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from sqlalchemy import text

from gpupool.domain.errors import GpupoolError
from gpupool.store.db import make_engine, secure_home


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_sqlite_store_and_its_wal_files_are_private(tmp_path: Path) -> None:
    db = tmp_path / "home" / "gpupool.db"
    engine = make_engine(f"sqlite:///{db}")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE t (x INTEGER)"))
        conn.execute(text("INSERT INTO t VALUES (1)"))
    for path in (db, db.with_name("gpupool.db-wal"), db.with_name("gpupool.db-shm")):
        assert _mode(path) == 0o600, path
    engine.dispose()


def test_a_store_left_readable_by_an_older_gpupool_is_made_private(tmp_path: Path) -> None:
    db = tmp_path / "gpupool.db"
    for path in (db, db.with_name("gpupool.db-wal"), db.with_name("gpupool.db-shm")):
        path.touch()
        path.chmod(0o644)
    make_engine(f"sqlite:///{db}").dispose()
    for path in (db, db.with_name("gpupool.db-wal"), db.with_name("gpupool.db-shm")):
        assert _mode(path) == 0o600, path


def test_the_home_is_private_and_only_gpupools_files_in_it_are_touched(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    home.chmod(0o755)
    for name in ("admin-token", "agent-token", "server-url", "notes.txt"):
        (home / name).write_text("x")
        (home / name).chmod(0o644)
    (home / "agent").mkdir(mode=0o755)
    secure_home(home)
    assert _mode(home) == 0o700
    assert _mode(home / "logs") == 0o700
    assert _mode(home / "agent") == 0o700
    for name in ("admin-token", "agent-token", "server-url"):
        assert _mode(home / name) == 0o600, name
    assert _mode(home / "notes.txt") == 0o644  # not gpupool's: left alone
    secure_home(home, others_may_pass=True)  # gpupool up --run-as: jobs pass to home/agent
    assert (_mode(home), _mode(home / "agent"), _mode(home / "logs")) == (0o711, 0o711, 0o700)


def test_a_shared_world_writable_home_is_refused_with_what_to_do(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    with pytest.raises(GpupoolError, match=r"writable by everyone .*choose a folder of its own"):
        secure_home(shared)
    assert _mode(shared) == 0o1777  # nothing changed
