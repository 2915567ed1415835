"""The record store behind one async seam, so that a backend may be a server.

:class:`~swamp.store.datastore.Datastore` is SQLite on the orchestrator's own disk: a write
costs microseconds, so its methods are plain calls, made on the event loop. A record store on
PostgreSQL (:mod:`swamp.store.pg_store`) is a round trip away: every operation waits on a
socket, so every operation is awaited. :class:`Records` is what both give — the same records,
the same versions, the same compare-and-swap — and the contract tests
(``tests/unit/test_store_contract.py``) hold both to it.

A transaction is a body run with a handle: ``await records.transact(body)`` calls ``body(tx)``
with the operations bound to one transaction (on PostgreSQL, one connection of the pool), so a
task never joins another's transaction by accident. It is serializable — what it reads cannot
change before its writes land, on both backends — and all of it commits or none. On
PostgreSQL a transaction that would break that is refused and the body run again on a fresh
snapshot, so a body only reads and writes through its handle (nothing it does elsewhere may
happen twice). The store's own operations are refused inside the task's own transaction (they
would wait on it), and a handle is no good once its transaction has ended.

:class:`SqliteRecords` puts the SQLite store behind the seam: each operation is the store's own
call (nothing waits), and a lock keeps a task's transaction to itself: the operations of other
tasks through the seam wait until it ends. The ``Datastore`` it wraps must be reached through it
alone: a direct call while a transaction is open would join it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol, TypeVar

import trio

from swamp.domain.query import Predicate
from swamp.domain.read_scope import ReadScope
from swamp.store.datastore import Datastore, Key, Record, SpecPolicy

T = TypeVar("T")


class Operations(Protocol):
    """Reads and writes of records, in a transaction or each on its own."""

    async def latest(self, key: Key, *, hold: bool = False) -> Record | None:
        """The latest version; with ``hold`` (in a transaction), kept as read until the
        transaction ends: a write to it waits, or the transaction is refused."""
        ...

    async def versions(self, key: Key) -> list[int]: ...

    async def write(
        self,
        key: Key,
        attributes: dict,
        *,
        policy: SpecPolicy,
        content: bytes | None = None,
        expected_version: int | None = None,
        fresh: bool = False,
        at: float | None = None,
    ) -> Record: ...

    async def latest_of_type(
        self, model_type: str, *, model_name: str | None = None
    ) -> list[Record]: ...

    async def model_names(self, model_type: str) -> list[str]: ...

    async def latest_with_prefix(
        self, model_type: str, model_name: str, prefix: str
    ) -> list[Record]: ...

    async def latest_in_range(
        self, model_type: str, model_name: str, low: str, high: str, *, limit: int
    ) -> list[Record]: ...

    async def delete_items(self, keys: Iterable[Key]) -> int: ...

    async def delete_instance(self, model_type: str, model_name: str) -> int: ...


class Records(Operations, Protocol):
    """The whole store: the operations, transactions, and what runs outside any."""

    async def transact(
        self, body: Callable[[Operations], Awaitable[T]], *, queue_on: str | None = None
    ) -> T:
        """``body`` on one transaction; those that name the same ``queue_on`` run one after
        another (a hot record many write at once: each would otherwise be refused and run
        again, on a server, until it ran out of attempts)."""
        ...

    async def transition(
        self,
        key: Key,
        decide: Callable[[Record | None], dict | None],
        *,
        policy: SpecPolicy,
        current: Record | None = None,
    ) -> tuple[Record | None, bool]: ...

    async def query(
        self,
        predicate: Predicate,
        *,
        all_versions: bool = False,
        limit: int | None = None,
        scope: ReadScope | None = None,
        budget: float | None = None,
        newest_first: bool = False,
    ) -> list[Record]: ...

    async def delete_with_prefix(
        self, model_type: str, model_name: str, prefix: str, *, batch: int = 1000
    ) -> int: ...

    async def collect_garbage(self, *, batch: int = 500) -> int: ...

    async def aclose(self) -> None: ...


class _SqliteOperations:
    """The SQLite store's calls, awaited (they never wait on the store). Outside a
    transaction each first waits its ``turn``: while another task's transaction is open."""

    def __init__(self, store: Datastore, turn: Callable[[], Awaitable[None]] | None) -> None:
        self.store = store
        self._wait = turn or _now
        self.ended = False  # a transaction's handle, after it ended

    async def _turn(self) -> None:
        if self.ended:
            raise RuntimeError("this transaction has ended: its handle is no longer good")
        await self._wait()

    async def latest(self, key: Key, *, hold: bool = False) -> Record | None:
        await self._turn()  # SQLite: a transaction holds the write lock already
        return self.store.latest(key)

    async def versions(self, key: Key) -> list[int]:
        await self._turn()
        return self.store.versions(key)

    async def write(
        self,
        key: Key,
        attributes: dict,
        *,
        policy: SpecPolicy,
        content: bytes | None = None,
        expected_version: int | None = None,
        fresh: bool = False,
        at: float | None = None,
    ) -> Record:
        await self._turn()
        return self.store.write(
            key,
            attributes,
            policy=policy,
            content=content,
            expected_version=expected_version,
            fresh=fresh,
            at=at,
        )

    async def latest_of_type(
        self, model_type: str, *, model_name: str | None = None
    ) -> list[Record]:
        await self._turn()
        return self.store.latest_of_type(model_type, model_name=model_name)

    async def model_names(self, model_type: str) -> list[str]:
        await self._turn()
        return self.store.model_names(model_type)

    async def latest_with_prefix(
        self, model_type: str, model_name: str, prefix: str
    ) -> list[Record]:
        await self._turn()
        return self.store.latest_with_prefix(model_type, model_name, prefix)

    async def latest_in_range(
        self, model_type: str, model_name: str, low: str, high: str, *, limit: int
    ) -> list[Record]:
        await self._turn()
        return self.store.latest_in_range(model_type, model_name, low, high, limit=limit)

    async def delete_items(self, keys: Iterable[Key]) -> int:
        await self._turn()
        return self.store.delete_items(keys)

    async def delete_instance(self, model_type: str, model_name: str) -> int:
        await self._turn()
        return self.store.delete_instance(model_type, model_name)


async def _now() -> None:
    """Inside the transaction: its own turn."""


class SqliteRecords(_SqliteOperations):
    """:class:`Records` over one SQLite :class:`Datastore` (the default backend)."""

    def __init__(self, store: Datastore) -> None:
        super().__init__(store, self._wait_turn)
        self._lock = trio.Lock()  # a task's transaction is its own

    def __repr__(self) -> str:
        return f"<SqliteRecords {self.store.path}>"

    async def _wait_turn(self) -> None:
        if self._lock.locked():  # a transaction holds the connection
            if self._lock.statistics().owner is trio.lowlevel.current_task():
                raise RuntimeError(
                    "the store was used inside this task's own transaction: use the "
                    "transaction's handle"
                )
            async with self._lock:  # another task's: wait until it ends
                pass

    async def transact(
        self, body: Callable[[Operations], Awaitable[T]], *, queue_on: str | None = None
    ) -> T:
        """``body`` on one transaction (``BEGIN IMMEDIATE``: serializable, as it takes the
        write lock first — every transaction queues on it, whatever ``queue_on`` says; never
        refused, so run once). Like every call here it does not yield
        unless it must (another task's transaction is open, or the body yields): a body of
        store calls runs from start to commit with nothing else run between."""
        try:
            self._lock.acquire_nowait()
        except trio.WouldBlock:
            await self._lock.acquire()
        try:
            handle = _SqliteOperations(self.store, None)
            try:
                with self.store.transaction():
                    return await body(handle)
            finally:
                handle.ended = True
        finally:
            self._lock.release()

    async def transition(
        self,
        key: Key,
        decide: Callable[[Record | None], dict | None],
        *,
        policy: SpecPolicy,
        current: Record | None = None,
    ) -> tuple[Record | None, bool]:
        await self._turn()
        return self.store.transition(key, decide, policy=policy, current=current)

    async def query(
        self,
        predicate: Predicate,
        *,
        all_versions: bool = False,
        limit: int | None = None,
        scope: ReadScope | None = None,
        budget: float | None = None,
        newest_first: bool = False,
    ) -> list[Record]:
        await self._turn()
        return self.store.query(
            predicate,
            all_versions=all_versions,
            limit=limit,
            scope=scope,
            budget=budget,
            newest_first=newest_first,
        )

    async def delete_with_prefix(
        self, model_type: str, model_name: str, prefix: str, *, batch: int = 1000
    ) -> int:
        await self._turn()
        return self.store.delete_with_prefix(model_type, model_name, prefix, batch=batch)

    async def collect_garbage(self, *, batch: int = 500) -> int:
        await self._turn()
        return self.store.collect_garbage(batch=batch)

    async def aclose(self) -> None:
        self.store.close()
