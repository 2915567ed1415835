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

import functools
import logging
import sqlite3
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from swamp.domain.database import check_database_url
from swamp.errors import UserError
from swamp.models.builtin import INTERNAL_TYPES
from swamp.repo import Repo
from swamp.store.datastore import Datastore, adhoc_runs
from swamp.store.journal import Journal

if TYPE_CHECKING:
    from swamp.store.pg_peers import PgPeers
    from swamp.store.pg_steps import PgSteps
from swamp.store.records import Records, SqliteRecords
from swamp.store.step_logs import LogStore, SqliteLogs, SqliteLogStore

log = logging.getLogger("swamp.serve")


AdhocRuns = Callable[[], Awaitable[list[tuple[str, str, float]]]]


@dataclass
class Storage:
    db: Records
    logs: LogStore
    where: str  # for the operator: the file, or the database's URL without its password
    # every ad-hoc run's (type, instance, last write): a scan of the whole table, never on the
    # event loop (SQLite's on a thread of its own, PostgreSQL's on the server)
    adhoc_runs: AdhocRuns
    store: Datastore | None = None  # SQLite's own (None on PostgreSQL)
    journal: Journal | None = None
    # PostgreSQL's: the orchestrators serving it and the shared queue (swamp.store.pg_peers)
    peers: PgPeers | None = None
    steps: PgSteps | None = None  # PostgreSQL's: the placed steps (swamp.store.pg_steps)

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
    path = store.path

    async def adhoc_runs() -> list[tuple[str, str, float]]:
        return await trio.to_thread.run_sync(scan_adhoc_runs, path)

    return Storage(
        db=SqliteRecords(store),
        logs=SqliteLogs(SqliteLogStore(store)),
        where=str(store.path),
        adhoc_runs=adhoc_runs,
        store=store,
        journal=Journal(repo.journal_path),
    )


async def open_postgres(url: str, *, orchestrator: str | None = None) -> Storage:
    """The record store and the step logs on one pool, their tables made if need be
    (``orchestrator``: the id of the one opening it, which its step logs name)."""
    where = check_database_url(url)
    try:
        from swamp.store.pg_peers import PgPeers
        from swamp.store.pg_step_logs import PgLogStore
        from swamp.store.pg_steps import PgSteps
        from swamp.store.pg_store import PgStore
    except ImportError:
        raise UserError(
            "serve --database needs PostgreSQL's driver, which this install lacks: "
            "pip install 'swamp[postgres]' (the one-file swamp.pyz is for workers)"
        ) from None
    db = await PgStore.open(url)
    try:
        logs = await PgLogStore.open(db.pool, orchestrator=orchestrator)
        peers = await PgPeers.open(db.pool)
        steps = await PgSteps.open(db.pool)
    except BaseException:
        await db.aclose()
        raise
    return Storage(
        db=db,
        logs=logs,
        where=where,
        adhoc_runs=functools.partial(db.adhoc_runs, excluded=INTERNAL_TYPES),
        peers=peers,
        steps=steps,
    )


def scan_adhoc_runs(path: Path) -> list[tuple[str, str, float]]:
    """Every ad-hoc run in the SQLite database at ``path``, read on a connection of its own
    (from a thread: it reads the whole table)."""
    db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=10)
    try:
        return adhoc_runs(db, excluded=INTERNAL_TYPES)
    finally:
        db.close()
