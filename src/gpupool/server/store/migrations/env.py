"""Alembic environment for gpupool's schema.

Store.migrate() hands over an open connection (config.attributes["connection"]) inside its own
transaction; the alembic CLI, used only to write new revisions, gets a URL from
`-x url=...`, sqlalchemy.url or GPUPOOL_DATABASE_URL instead.
"""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine
from sqlalchemy.engine import Connection

from gpupool.server.store.tables import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    # render_as_batch: SQLite cannot ALTER most things, so autogenerate writes table copies
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=True,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def _cli_url() -> str:
    url = (
        context.get_x_argument(as_dictionary=True).get("url")
        or config.get_main_option("sqlalchemy.url")
        or os.environ.get("GPUPOOL_DATABASE_URL")
    )
    if not url:
        raise SystemExit("give a database: alembic -x url=sqlite:///path/gpupool.db ...")
    return url


handed_over = config.attributes.get("connection")
if handed_over is not None:
    _run(handed_over)
elif context.is_offline_mode():
    context.configure(url=_cli_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    engine = create_engine(_cli_url())
    try:
        with engine.begin() as conn:
            _run(conn)
    finally:
        engine.dispose()
