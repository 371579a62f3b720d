"""Persistence: SQLAlchemy tables, mappings to domain objects, Alembic migrations."""
