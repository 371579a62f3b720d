from tests.store.fixtures import clock, cp, db_url, pg_database

__all__ = ["clock", "cp", "db_url", "pg_database"]
