"""Schema versions: create a fresh store, refuse an unknown one, migrate on request.

The store's version is Alembic's revision in the ``alembic_version`` table. At start:

- an empty database is created at the newest revision;
- a database at the newest revision is used as it is;
- an older known revision is refused until the operator migrates it (``gpupool server
  --migrate``), because a migration should be a decision, not a side effect of a restart;
- a revision this gpupool does not know (written by a newer release) is refused.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect

from gpupool.domain.errors import GpupoolError

MIGRATIONS = Path(__file__).with_name("migrations")


class SchemaMismatch(GpupoolError):
    """The store's schema is not the one this gpupool runs on; the message says what to do."""


def alembic_config(engine: Engine) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["engine"] = engine
    return cfg


def head_revision() -> str:
    head = ScriptDirectory(str(MIGRATIONS)).get_current_head()
    if head is None:  # pragma: no cover - the package ships migrations
        raise SchemaMismatch("gpupool was installed without its migrations: reinstall it")
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def _known(revision: str) -> bool:
    script = ScriptDirectory(str(MIGRATIONS))
    return any(rev.revision == revision for rev in script.walk_revisions())


def migrate(engine: Engine) -> str:
    """Upgrade the store to the newest schema; returns the revision reached."""
    command.upgrade(alembic_config(engine), "head")
    return head_revision()


def ensure_schema(engine: Engine, *, allow_migrate: bool = False) -> str:
    """Make sure the store is at this gpupool's schema, or raise :class:`SchemaMismatch`."""
    head = head_revision()
    current = current_revision(engine)
    if current == head:
        return head
    if current is None:
        tables = set(inspect(engine).get_table_names())
        if tables:
            raise SchemaMismatch(
                f"the database has tables ({', '.join(sorted(tables)[:5])}...) but no gpupool "
                "schema version: point GPUPOOL_DATABASE_URL at an empty database or a gpupool store"
            )
        return migrate(engine)
    if not _known(current):
        raise SchemaMismatch(
            f"the store's schema version {current} is newer than this gpupool knows (newest "
            f"{head}): upgrade gpupool, or restore a backup made for this version"
        )
    if allow_migrate:
        return migrate(engine)
    raise SchemaMismatch(
        f"the store's schema version {current} is older than this gpupool's ({head}): back up "
        "the database, then run `gpupool server --migrate` once to upgrade it"
    )
