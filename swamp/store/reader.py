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
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import trio

from swamp.concurrency import open_unwrapping_nursery
from swamp.domain.query import Predicate
from swamp.domain.read_scope import ReadScope
from swamp.errors import Busy, QueryTimeout, StoreError
from swamp.store.datastore import Record, select

THREADS = 2  # for every worker's queries together
ADMIN_THREADS = 1  # an operator's query never waits behind the workers'
WORKER_BUDGET = 5.0  # a running method's queryData
ADMIN_BUDGET = 60.0  # an operator's data query through the server


class Reader:
    """Read-only connections to one database, used from threads one query at a time.

    Fair between peers: one peer (a dispatch's worker) has at most one query running or
    waiting for a thread — its others wait behind it, not in front of everyone else's — and
    operators' queries have a thread of their own. A query that waits for a thread for longer
    than its budget is refused (``busy``) rather than queued without end."""

    def __init__(
        self, path: Path, *, threads: int = THREADS, admin_threads: int = ADMIN_THREADS
    ) -> None:
        self.path = Path(path)
        self._limiter = trio.CapacityLimiter(threads)
        self._admin = trio.CapacityLimiter(admin_threads)
        self._peers: dict[object, trio.Lock] = {}  # one query at a time per peer
        self._idle: list[sqlite3.Connection] = []  # at most all threads' worth are ever made
        self.queries = 0
        self.timed_out = 0
        self.turned_away = 0

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
        peer: object = None,
        newest_first: bool = False,
    ) -> list[Record]:
        """The store's query, in a thread; the budget counts from when it starts running.
        ``peer`` (a worker) has one query at a time; ``None`` is an operator's. Cancelling the
        caller stops the thread's query at once."""
        if peer is None:
            return await self._run(
                predicate, budget, all_versions, limit, scope, newest_first, self._admin
            )
        lock = self._peers.get(peer)
        if lock is None:
            lock = self._peers[peer] = trio.Lock()
        try:
            if not await _acquire_within(lock, budget):
                raise self._busy()
            try:
                return await self._run(
                    predicate, budget, all_versions, limit, scope, newest_first, self._limiter
                )
            finally:
                lock.release()
        finally:
            if not lock.locked() and not lock.statistics().tasks_waiting:
                self._peers.pop(peer, None)

    def _busy(self) -> Busy:
        self.turned_away += 1
        return Busy(
            "queries are waiting for the orchestrator's query threads; ask again shortly "
            "(or ask for less)"
        )

    async def _run(
        self,
        predicate: Predicate,
        budget: float,
        all_versions: bool,
        limit: int | None,
        scope: ReadScope | None,
        newest_first: bool,
        threads: trio.CapacityLimiter,
    ) -> list[Record]:

        stop = threading.Event()  # set when the caller is cancelled: the thread ends at once

        def run() -> list[Record]:
            with self._connection() as db:
                return select(
                    db,
                    predicate,
                    all_versions=all_versions,
                    limit=limit,
                    scope=scope,
                    budget=budget,
                    stop=stop,
                    newest_first=newest_first,
                )

        self.queries += 1
        if not await _acquire_within(threads, budget):  # a thread: waited for, bounded
            raise self._busy()
        try:
            # a cancelled caller (its socket gone, a shutdown) stops the thread's query, and
            # waits only for that: the thread and its connection are never left behind
            async with open_unwrapping_nursery() as nursery:
                nursery.start_soon(_stop_when_cancelled, stop)
                try:
                    return await trio.to_thread.run_sync(run)
                except QueryTimeout:
                    if stop.is_set():  # stopped because the caller was cancelled: say that
                        await trio.lowlevel.checkpoint()
                    raise
                finally:
                    nursery.cancel_scope.cancel()
        except QueryTimeout:
            self.timed_out += 1
            raise
        except sqlite3.Error as exc:
            raise StoreError(f"querying the datastore: {exc}") from None
        finally:
            threads.release()

    @contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        try:  # threads take connections at once: asking first and then popping could race
            db = self._idle.pop()
        except IndexError:
            db = self._open()
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


async def _stop_when_cancelled(stop: threading.Event) -> None:
    try:
        await trio.sleep_forever()
    finally:
        stop.set()


async def _acquire_within(lock: trio.Lock | trio.CapacityLimiter, seconds: float) -> bool:
    """Take ``lock`` now, or within ``seconds``; whether it was taken."""
    try:
        lock.acquire_nowait()
        return True
    except trio.WouldBlock:
        pass
    with trio.move_on_after(seconds):
        await lock.acquire()
        return True
    return False
