"""Where a running orchestrator keeps its records: opened once by ``serve``, closed at its end.

Two kinds, one shape (:class:`Storage`): the books and the step logs go through their seams
(``db``: ``swamp.store.records``; ``logs``: ``swamp.store.step_logs``) whichever it is.

- **The repo's SQLite file** (the default): the store itself is kept too (``store``), for what
  only a file has — its health checks, the reader thread, WAL checkpoints, the journal of lease
  rows, the watch for other processes' commits.
- **PostgreSQL** (``serve --database``): a pool shared by the record store and the step logs;
  no file, no journal (a lease row's durability point is the database's commit).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from swamp.domain.database import check_database_url
from swamp.errors import UserError
from swamp.repo import Repo
from swamp.store.datastore import Datastore
from swamp.store.journal import Journal
from swamp.store.records import Records, SqliteRecords
from swamp.store.step_logs import LogStore, SqliteLogs, SqliteLogStore

log = logging.getLogger("swamp.serve")


@dataclass
class Storage:
    db: Records
    logs: LogStore
    where: str  # for the operator: the file, or the database's URL without its password
    store: Datastore | None = None  # SQLite's own (None on PostgreSQL)
    journal: Journal | None = None

    @property
    def shared(self) -> bool:
        """Records in a database other orchestrators may share (not a file of this repo)."""
        return self.store is None

    async def aclose(self) -> None:
        if self.journal is not None:
            self.journal.close()
        await self.db.aclose()


def open_sqlite(repo: Repo) -> Storage:
    store = repo.open_store(orchestrator=True)
    store.probe_writable()  # a read-only database is found now, not at the first enrollment
    store.limit_wal()  # the log this connection reuses is kept small (swamp.store.checkpoints)
    return Storage(
        db=SqliteRecords(store),
        logs=SqliteLogs(SqliteLogStore(store)),
        where=str(store.path),
        store=store,
        journal=Journal(repo.journal_path),
    )


async def open_postgres(url: str) -> Storage:
    """The record store and the step logs on one pool, their tables made if need be."""
    where = check_database_url(url)
    try:
        from swamp.store.pg_step_logs import PgLogStore
        from swamp.store.pg_store import PgStore
    except ImportError:
        raise UserError(
            "serve --database needs PostgreSQL's driver, which this install lacks: "
            "pip install 'swamp[postgres]' (the one-file swamp.pyz is for workers)"
        ) from None
    db = await PgStore.open(url)
    try:
        logs = await PgLogStore.open(db.pool)
    except BaseException:
        await db.aclose()
        raise
    return Storage(db=db, logs=logs, where=where)
