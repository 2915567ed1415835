"""Queries off the event loop: what a peer asks to read never holds up anyone else.

A query scans rows and runs the predicate over each in Python; over a large instance that is
seconds of work, and on the orchestrator's event loop those seconds stalled every socket (admin
calls waited, an innocent worker was dropped for missed heartbeats). Here each query runs in a
thread, on a read-only connection of its own, and stops when its time budget is spent
(:class:`~swamp.errors.QueryTimeout`). At most :data:`THREADS` run at once; more wait their
turn, first come first served, so a worker that floods queries slows its own answers, not the
loop. Reads see the last commit (WAL): they never wait for, or block, a writer.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import trio

from swamp.domain.query import Predicate
from swamp.domain.read_scope import ReadScope
from swamp.errors import QueryTimeout, StoreError
from swamp.store.datastore import Record, select

THREADS = 2
WORKER_BUDGET = 5.0  # a running method's queryData
ADMIN_BUDGET = 60.0  # an operator's data query through the server


class Reader:
    """Read-only connections to one database, used from threads one query at a time."""

    def __init__(self, path: Path, *, threads: int = THREADS) -> None:
        self.path = Path(path)
        self._limiter = trio.CapacityLimiter(threads)
        self._idle: list[sqlite3.Connection] = []  # at most ``threads`` are ever made
        self.queries = 0
        self.timed_out = 0

    def __repr__(self) -> str:
        return (
            f"<Reader running={self._limiter.borrowed_tokens} "
            f"waiting={self._limiter.statistics().tasks_waiting} timed_out={self.timed_out}>"
        )

    async def query(
        self,
        predicate: Predicate,
        *,
        budget: float,
        all_versions: bool = False,
        limit: int | None = None,
        scope: ReadScope | None = None,
    ) -> list[Record]:
        """The store's query, in a thread; the budget counts from when it starts running.
        Cancelling the caller leaves the thread to finish within its budget."""

        def run() -> list[Record]:
            with self._connection() as db:
                return select(
                    db,
                    predicate,
                    all_versions=all_versions,
                    limit=limit,
                    scope=scope,
                    budget=budget,
                )

        self.queries += 1
        try:
            return await trio.to_thread.run_sync(run, limiter=self._limiter)
        except QueryTimeout:
            self.timed_out += 1
            raise
        except sqlite3.Error as exc:
            raise StoreError(f"querying the datastore: {exc}") from None

    @contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        db = self._idle.pop() if self._idle else self._open()
        try:
            yield db
        finally:
            self._idle.append(db)

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(
            f"{self.path.resolve().as_uri()}?mode=ro",
            uri=True,
            isolation_level=None,
            check_same_thread=False,
            timeout=5,
        )
        db.execute("PRAGMA query_only = 1")
        return db

    def close(self) -> None:
        for db in self._idle:
            db.close()
        self._idle.clear()
