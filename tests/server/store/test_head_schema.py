"""The tests' fast way to a database at head (tests/support/head_schema.py) gives exactly
the schema the migrations give: the same tables, columns, indexes and revision."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, inspect

from gpupool.server.store import Store, database_url
from gpupool.server.store.db import SCHEMA_HEAD, schema_head
from head_schema import at_head, current_revision
from pgserver import fresh_schema


def _shape(url: str) -> dict[str, Any]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            insp = inspect(conn)
            return {
                t: (
                    [(c["name"], str(c["type"]), c["nullable"]) for c in insp.get_columns(t)],
                    sorted((i["name"], tuple(i["column_names"])) for i in insp.get_indexes(t)),
                    insp.get_pk_constraint(t)["constrained_columns"],
                )
                for t in sorted(insp.get_table_names())
            }
    finally:
        engine.dispose()


@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
def test_at_head_is_the_migrations_schema(
    db: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if db == "sqlite":
        migrated, fast = database_url(None, tmp_path / "a"), database_url(None, tmp_path / "b")
    else:
        pg = request.getfixturevalue("pg_url")
        migrated, fast = fresh_schema(pg), fresh_schema(pg)
    store = Store(migrated)
    try:
        store.migrate()
    finally:
        store.close()
    at_head(fast)
    assert current_revision(fast) == current_revision(migrated) == schema_head()
    shape = _shape(fast)
    assert shape == _shape(migrated) and "jobs" in shape
    store = Store(fast)  # and the service finds it current
    try:
        store.migrate()
    finally:
        store.close()
    assert _shape(fast) == shape


def test_schema_head_is_alembics_head() -> None:
    """migrate() trusts SCHEMA_HEAD to tell a current database without loading alembic: a new
    migration in migrations/versions must raise it, or this fails."""
    assert schema_head() == SCHEMA_HEAD
