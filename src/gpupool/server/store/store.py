"""The store: one Database and a repository per aggregate over it (store.jobs,
store.services, store.events, store.nodes, store.auth, store.history, store.settings)."""

from __future__ import annotations

import copy
import dataclasses

from gpupool.server.store.auth import Auth
from gpupool.server.store.base import Repository
from gpupool.server.store.db import Database
from gpupool.server.store.events import Events
from gpupool.server.store.history import History
from gpupool.server.store.jobs import Jobs
from gpupool.server.store.nodes import Nodes
from gpupool.server.store.retry import Retry
from gpupool.server.store.services import Services
from gpupool.server.store.settings import Settings


class Store:
    """Jobs, services, events, nodes, tokens, history and settings in one database; every
    public method of a repository is one transaction (gpupool.server.store.base)."""

    def __init__(self, url: str) -> None:
        self.db = Database(url)
        self.jobs = Jobs(self.db)
        self.services = Services(self.db)
        self.events = Events(self.db)
        self.nodes = Nodes(self.db)
        self.auth = Auth(self.db)
        self.history = History(self.db)
        self.settings = Settings(self.db)

    @property
    def url(self) -> str:
        return self.db.url

    def retrying(self, retry: Retry) -> Store:
        """This store (its database, pool and repositories) with every public call retried
        by `retry`: the scheduler loop's."""
        view = copy.copy(self)
        view.db = self.db.with_retry(retry)
        for name, value in vars(self).items():
            if isinstance(value, Repository):  # each one, its class (a test's double) kept
                setattr(view, name, dataclasses.replace(value, db=view.db))
        return view

    def migrate(self) -> None:
        """Bring the schema to the newest revision (Database.migrate)."""
        self.db.migrate()

    def table_names(self) -> set[str]:
        """The tables the database holds (whatever their schema)."""
        return self.db.table_names()

    def close(self) -> None:
        """Close every pooled connection (at shutdown; the Store must not be used after)."""
        self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
