"""Alembic environment: runs migrations on the engine the caller passes in ``attributes``."""

from __future__ import annotations

from alembic import context

from gpupool.store.models import Base

engine = context.config.attributes["engine"]
with engine.begin() as connection:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=engine.dialect.name == "sqlite",
    )
    context.run_migrations()
