"""Versioned records in PostgreSQL: the record store of several orchestrators.

The same table as SQLite's (``swamp.store.datastore``: a row per version of an item, its
attributes as canonical JSON text, its content last) and the same writes, statement for
statement: a compare-and-swap is one ``INSERT … SELECT … WHERE (the latest version) = expected``
whose racers meet on the primary key (``ON CONFLICT DO NOTHING``: the loser gets no row, a
:class:`Conflict`), or one ``UPDATE … WHERE version = expected`` where a spec keeps a single
version. Both hold under READ COMMITTED, PostgreSQL's default: no lock is taken to decide.

The key's columns sort by their bytes (``COLLATE "C"``), as SQLite's do, whatever the
database's locale: a range of names and the order of a listing are the same on both.

Every operation is awaited on a connection of a :class:`~swamp.store.pg.Pool` (the event loop
never blocks on the database). A transaction (:meth:`PgStore.transact`) is SERIALIZABLE, as
SQLite's ``BEGIN IMMEDIATE`` makes one: what it reads cannot change before its writes land,
or PostgreSQL refuses it (``serialization_failure``, ``deadlock_detected``) and the body is run
again on a fresh snapshot, up to :data:`TX_ATTEMPTS` times — so a body does nothing but read
and write through its handle. Inside one, a compare-and-swap that fails is a savepoint rolled
back, not the transaction: the body sees :class:`Conflict` and goes on. A query reads pages
by the key (each page starts after the last row of the one before: a row that exists all
along is read once, whatever is written meanwhile) and stops at its ``limit``; past its
``budget`` it is cancelled on the server.
"""

from __future__ import annotations

import contextvars
import json
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from contextlib import suppress
from typing import TypeVar

import trio

from swamp.domain.names import is_adhoc_instance
from swamp.domain.query import Predicate
from swamp.domain.read_scope import ReadScope
from swamp.errors import Conflict, QueryTimeout, SqlError, StoreError, SwampError
from swamp.store import pg
from swamp.store.datastore import (
    _CANONICAL,
    MAX_CAS_RETRIES,
    NEWEST_INDEXED,
    Key,
    Record,
    SpecPolicy,
    iso,
)

_SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS data (
    model_type  TEXT COLLATE "C" NOT NULL,
    model_name  TEXT COLLATE "C" NOT NULL,
    name        TEXT COLLATE "C" NOT NULL,
    version     BIGINT NOT NULL,
    spec        TEXT NOT NULL,
    attributes  TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    created_epoch DOUBLE PRECISION NOT NULL,
    expires_epoch DOUBLE PRECISION,
    size        BIGINT NOT NULL,
    content     BYTEA,
    PRIMARY KEY (model_type, model_name, name, version)
);
CREATE INDEX IF NOT EXISTS data_expiry ON data (expires_epoch) WHERE expires_epoch IS NOT NULL;
CREATE INDEX IF NOT EXISTS data_newest_runs ON data (created_epoch)
    WHERE model_type = '"""
    + NEWEST_INDEXED
    + """';
"""
)
_COLUMNS = "model_type, model_name, name, version, spec, attributes, content, created_at"
_META_COLUMNS = "model_type, model_name, name, version, spec, attributes, NULL, created_at, size"
_IS_LATEST = (
    "version = (SELECT MAX(version) FROM data m WHERE m.model_type=d.model_type "
    "AND m.model_name=d.model_name AND m.name=d.name)"
)
QUERY_PAGE = 1000  # rows read at a time by a query that filters in Python
POOL_SIZE = 4
TX_ATTEMPTS = 16  # a serializable transaction run again after a conflict, at most
_RETRIED = frozenset({pg.SERIALIZATION_FAILURE, pg.DEADLOCK_DETECTED})
# the task runs a transaction: the store's own operations would wait on its locks (another
# connection), so they are refused — the transaction's handle is the way
_IN_TRANSACTION: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "swamp_pg_in_transaction", default=False
)
T = TypeVar("T")


def _lock_key(name: str) -> int:
    from swamp.store.pg_locks import lock_key

    return lock_key(name)


async def _unlock(conn: pg.Connection, name: str) -> None:
    """Let a queue's lock go, whatever happened to the transaction; a connection that cannot
    (cut off, or slow past the grace) is closed, and its session's locks go with it — never
    back in the pool holding one."""
    if conn.closed:
        return
    done = False
    with (
        trio.CancelScope(shield=True),
        trio.move_on_after(pg.CANCEL_GRACE),
        suppress(SwampError),
    ):
        await conn.execute("SELECT pg_advisory_unlock($1)", (_lock_key(name),))
        done = True
    if not done:
        conn.close()


def _row(row: tuple) -> Record:
    return Record(row[0], row[1], row[2], row[3], row[4], json.loads(row[5]), row[6], row[7])


def _meta_row(row: tuple) -> Record:
    return Record(row[0], row[1], row[2], row[3], row[4], json.loads(row[5]), None, row[7], row[8])


def _upper(prefix: str) -> str:
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


class _Sql:
    """Numbered parameters ($1, $2 …) as a statement is put together."""

    def __init__(self) -> None:
        self.params: list = []

    def __call__(self, value: object) -> str:
        self.params.append(value)
        return f"${len(self.params)}"


def _scope_sql(scope: ReadScope, p: _Sql) -> str:
    allowed = [
        f"(model_type = {p(model_type)} AND model_name = {p(model_name)})"
        for model_type, model_name in sorted(scope.items)
    ]
    for pattern in scope.type_patterns:  # '*' is the only wildcard: LIKE's own are escaped
        escaped = pattern.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        allowed.append(f"model_type LIKE {p(escaped.replace('*', '%'))}")
    excluded = [p(t) for t in sorted(scope.excluded_types)]
    not_in = f"model_type NOT IN ({', '.join(excluded)})" if excluded else "TRUE"
    return f"{not_in} AND ({' OR '.join(allowed) or 'FALSE'})"


class _Operations:
    """The reads and writes of records, each a statement on ``run``'s connection (in a
    transaction: ``in_transaction``, and the handle is good until it ends)."""

    def __init__(self, run: Callable, clock: Callable[[], float], *, in_transaction: bool) -> None:
        self._execute = run
        self.clock = clock
        self.in_transaction = in_transaction
        self.ended = False

    async def _run(self, sql: str, params: tuple = ()):
        if self.ended:
            raise RuntimeError("this transaction has ended: its handle is no longer good")
        return await self._execute(sql, params)

    async def latest(self, key: Key, *, hold: bool = False) -> Record | None:
        """With ``hold``, in a transaction: ``FOR SHARE`` — a write to the row waits until the
        transaction ends, and a row written since its snapshot makes PostgreSQL refuse it (it
        runs again). Serializable checking alone does not see a writer outside a transaction
        (a compare-and-swap is one): a fenced write needs the row held."""
        lock = " FOR SHARE" if hold and self.in_transaction else ""
        result = await self._run(
            f"SELECT {_COLUMNS} FROM data WHERE model_type=$1 AND model_name=$2 AND name=$3 "
            f"ORDER BY version DESC LIMIT 1{lock}",
            (key.model_type, key.model_name, key.name),
        )
        return _row(result.rows[0]) if result.rows else None

    async def versions(self, key: Key) -> list[int]:
        result = await self._run(
            "SELECT version FROM data WHERE model_type=$1 AND model_name=$2 AND name=$3 "
            "ORDER BY version",
            (key.model_type, key.model_name, key.name),
        )
        return [r[0] for r in result.rows]

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
        """As :meth:`Datastore.write`: the next version; with ``expected_version`` (0: must not
        exist) a compare-and-swap."""
        now = self.clock() if at is None else at
        created_at = iso(now)
        lifetime = policy.lifetime_seconds()
        item = (key.model_type, key.model_name, key.name)
        row = (
            policy.name,
            _CANONICAL.encode(attributes),
            created_at,
            now,
            None if lifetime is None else now + lifetime,
            0 if content is None else len(content),
            content,
        )
        replaced = expected_version or 0
        in_place = replaced > 0 and policy.garbage_collection == 1
        if in_place:
            result = await self._replace(item, row, replaced)
        elif fresh:
            result = await self._run(
                "INSERT INTO data VALUES ($1,$2,$3,1,$4,$5,$6,$7,$8,$9,$10) "
                "ON CONFLICT DO NOTHING RETURNING version",
                (*item, *row),
            )
        elif expected_version is None:
            # the next version, whatever it is: a racer that takes the same one first makes
            # this one try again with the version after it
            for _ in range(MAX_CAS_RETRIES):
                result = await self._run(
                    "INSERT INTO data SELECT $1,$2,$3,COALESCE(MAX(version),0)+1,$4,$5,$6,$7,$8,"
                    "$9,$10 FROM data WHERE model_type=$1 AND model_name=$2 AND name=$3 "
                    "ON CONFLICT DO NOTHING RETURNING version",
                    (*item, *row),
                )
                if result.rows:
                    break
            else:
                raise StoreError(f"gave up on {key} after {MAX_CAS_RETRIES} concurrent writes")
        else:
            result = await self._run(
                "INSERT INTO data SELECT $1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11 WHERE (SELECT "
                "COALESCE(MAX(version),0) FROM data WHERE model_type=$1 AND model_name=$2 AND "
                "name=$3)=$12 ON CONFLICT DO NOTHING RETURNING version",
                (*item, expected_version + 1, *row, expected_version),
            )
        if not result.rows:
            raise Conflict(
                f"{key.model_type}/{key.model_name}/{key.name} moved past version "
                f"{expected_version}"
            )
        version = result.rows[0][0]
        if (
            not in_place
            and policy.garbage_collection is not None
            and version > policy.garbage_collection
        ):
            await self._trim(item, version - policy.garbage_collection)
        return Record(*item, version, policy.name, attributes, content, created_at)

    async def _replace(self, item: tuple, row: tuple, replaced: int):
        """One version kept: the next replaces it in place, one UPDATE where it is still the
        one replaced. A version after it written meanwhile (a plain write not yet trimmed)
        makes the UPDATE clash on the key: a :class:`Conflict`, as on SQLite — and inside a
        transaction a savepoint rolled back, so the transaction goes on."""
        statement = (
            "UPDATE data SET version=$1, spec=$2, attributes=$3, created_at=$4, "
            "created_epoch=$5, expires_epoch=$6, size=$7, content=$8 WHERE model_type=$9 "
            "AND model_name=$10 AND name=$11 AND version=$12 RETURNING version"
        )
        params = (replaced + 1, *row, *item, replaced)
        if self.in_transaction:
            await self._run("SAVEPOINT swamp_replace")
        try:
            result = await self._run(statement, params)
        except SqlError as exc:
            if exc.sqlstate != pg.UNIQUE_VIOLATION:
                raise
            if self.in_transaction:
                await self._run("ROLLBACK TO SAVEPOINT swamp_replace")
            raise Conflict(f"{'/'.join(item)} moved past version {replaced}") from None
        if self.in_transaction:
            await self._run("RELEASE SAVEPOINT swamp_replace")
        return result

    async def _trim(self, item: tuple, through: int) -> None:
        """Old versions past the spec's count go. Outside a transaction the write has landed
        already: a trim that fails leaves them for the next write (as on SQLite), it does
        not fail the write."""
        statement = (
            "DELETE FROM data WHERE model_type=$1 AND model_name=$2 AND name=$3 AND version<=$4"
        )
        if self.in_transaction:
            await self._run(statement, (*item, through))
            return
        with suppress(SwampError):  # a refused statement, a lost connection, a full pool
            await self._run(statement, (*item, through))

    async def _latest(self, where: str, params: tuple) -> list[Record]:
        result = await self._run(
            f"SELECT {_COLUMNS} FROM data d WHERE {where} AND {_IS_LATEST} "
            "ORDER BY model_type, model_name, name",
            params,
        )
        return [_row(r) for r in result.rows]

    async def latest_of_type(
        self, model_type: str, *, model_name: str | None = None
    ) -> list[Record]:
        if model_name is None:
            return await self._latest("model_type = $1", (model_type,))
        return await self._latest("model_type = $1 AND model_name = $2", (model_type, model_name))

    async def model_names(self, model_type: str) -> list[str]:
        result = await self._run(
            "SELECT DISTINCT model_name FROM data WHERE model_type = $1 ORDER BY model_name",
            (model_type,),
        )
        return [r[0] for r in result.rows]

    async def latest_with_prefix(
        self, model_type: str, model_name: str, prefix: str
    ) -> list[Record]:
        if not prefix:
            raise ValueError("an empty prefix would read the whole instance")
        return await self._latest(
            "model_type = $1 AND model_name = $2 AND name >= $3 AND name < $4",
            (model_type, model_name, prefix, _upper(prefix)),
        )

    async def latest_in_range(
        self, model_type: str, model_name: str, low: str, high: str, *, limit: int
    ) -> list[Record]:
        result = await self._run(
            f"SELECT {_COLUMNS} FROM data d WHERE model_type = $1 AND model_name = $2 AND "
            f"name >= $3 AND name < $4 AND {_IS_LATEST} ORDER BY name LIMIT $5",
            (model_type, model_name, low, high, limit),
        )
        return [_row(r) for r in result.rows]

    async def delete_items(self, keys: Iterable[Key]) -> int:
        """Every version of the given items; all or none (outside a transaction, in one of its
        own)."""
        count = 0
        for key in keys:
            result = await self._run(
                "DELETE FROM data WHERE model_type=$1 AND model_name=$2 AND name=$3",
                (key.model_type, key.model_name, key.name),
            )
            count += result.rowcount
        return count

    async def delete_instance(self, model_type: str, model_name: str) -> int:
        result = await self._run(
            "DELETE FROM data WHERE model_type=$1 AND model_name=$2", (model_type, model_name)
        )
        return result.rowcount


class PgStore(_Operations):
    """:class:`~swamp.store.records.Records` on a PostgreSQL database."""

    def __init__(self, pool: pg.Pool, *, clock: Callable[[], float] = time.time) -> None:
        super().__init__(self._on_any, clock, in_transaction=False)
        self.pool = pool
        self.retried = 0  # transactions run again after a serialization failure or deadlock

    def __repr__(self) -> str:
        return f"<PgStore {self.pool!r}>"

    @classmethod
    async def open(
        cls, url: str, *, size: int = POOL_SIZE, clock: Callable[[], float] = time.time
    ) -> PgStore:
        """A store on the database ``url``, its table made if it is not there yet."""
        pool = pg.Pool(url, size=size)
        store = cls(pool, clock=clock)
        try:
            await pg.make_schema(pool, _SCHEMA)
        except BaseException:
            await pool.aclose()
            raise
        return store

    async def aclose(self) -> None:
        await self.pool.aclose()

    async def _on_any(self, sql: str, params: tuple = ()):
        if _IN_TRANSACTION.get():
            raise RuntimeError(
                "the store was used inside this task's own transaction: use the "
                "transaction's handle (it would wait on the transaction's own locks)"
            )
        async with self.pool.connection() as conn:
            return await conn.execute(sql, params)

    async def transact(
        self, body: Callable[[_Operations], Awaitable[T]], *, queue_on: str | None = None
    ) -> T:
        """Run ``body`` with a handle on one SERIALIZABLE transaction: all of it commits or
        none; run again (a fresh transaction, a fresh snapshot) when PostgreSQL refuses it as
        a serialization failure or a deadlock, up to :data:`TX_ATTEMPTS` times.

        ``queue_on``: transactions naming the same queue run one after another, whichever
        process runs them — a session advisory lock taken *before* the transaction begins, so
        its snapshot already sees the one before (taken inside, the snapshot would be older
        than the lock, and the write refused all the same)."""
        for attempt in range(TX_ATTEMPTS):
            token = _IN_TRANSACTION.set(True)
            try:
                async with self.pool.connection() as conn:
                    handle = _Operations(conn.execute, self.clock, in_transaction=True)
                    try:
                        if queue_on is not None:  # (let go below whatever happens: cancelled
                            # as the server grants it, the connection still holds it)
                            await conn.execute(
                                "SELECT pg_advisory_lock($1)", (_lock_key(queue_on),)
                            )
                        async with conn.transaction():
                            await conn.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
                            return await body(handle)
                    finally:
                        handle.ended = True
                        if queue_on is not None:
                            await _unlock(conn, queue_on)
            except SqlError as exc:
                if exc.sqlstate not in _RETRIED or attempt == TX_ATTEMPTS - 1:
                    raise
                self.retried += 1
            finally:
                _IN_TRANSACTION.reset(token)
            await trio.sleep(random.uniform(0, 0.002 * (attempt + 1)))  # racers part ways
        raise AssertionError("unreachable")

    async def delete_items(self, keys: Iterable[Key]) -> int:
        listed = list(keys)  # read before anything is deleted: an iterator that fails, fails

        async def delete(tx: _Operations) -> int:
            return await tx.delete_items(listed)

        return await self.transact(delete)

    async def transition(
        self,
        key: Key,
        decide: Callable[[Record | None], dict | None],
        *,
        policy: SpecPolicy,
        current: Record | None = None,
    ) -> tuple[Record | None, bool]:
        """As :meth:`Datastore.transition`: read, decide, compare-and-swap; decide again if
        another writer won."""
        for attempt in range(MAX_CAS_RETRIES):
            if attempt or current is None:
                current = await self.latest(key)
            attributes = decide(current)
            if attributes is None:
                return current, False
            try:
                record = await self.write(
                    key,
                    attributes,
                    policy=policy,
                    expected_version=current.version if current else 0,
                )
            except Conflict:
                continue
            return record, True
        raise StoreError(f"gave up on {key} after {MAX_CAS_RETRIES} concurrent updates")

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
        """As :func:`~swamp.store.datastore.select`: the rows SQL can narrow (scope, equalities),
        then the predicate over each in Python, read a page at a time until ``limit``."""
        p = _Sql()
        clauses = []
        if scope is not None:
            clauses.append(_scope_sql(scope, p))
        for field, column in (
            ("modelType", "model_type"),
            ("modelName", "model_name"),
            ("name", "name"),
            ("spec", "spec"),
        ):
            if field in predicate.equalities:
                value = predicate.equalities[field]
                if newest_first and field == "modelType" and value == NEWEST_INDEXED:
                    clauses.append(f"model_type = '{NEWEST_INDEXED}'")  # as its index says
                    continue
                clauses.append(f"{column} = {p(value)}")
        where = " AND ".join(clauses) or "TRUE"
        if not all_versions:
            where += f" AND {_IS_LATEST}"
        if newest_first:
            order = "created_epoch DESC, model_type DESC, model_name DESC, name DESC, version DESC"
            after = "(created_epoch, model_type, model_name, name, version) < "
        else:
            order = "model_type, model_name, name, version"
            after = "(model_type, model_name, name, version) > "
        out: list[Record] = []
        last: tuple | None = None  # the key of the last row read: the next page starts after it
        with trio.move_on_after(budget if budget is not None else float("inf")) as timer:
            while True:
                page_params = _Sql()
                page_params.params = list(p.params)
                page_where = where
                if last is not None:
                    page_where += f" AND {after}({', '.join(page_params(v) for v in last)})"
                page = await self._on_any(
                    f"SELECT {_META_COLUMNS}, created_epoch FROM data d WHERE {page_where} "
                    f"ORDER BY {order} LIMIT {QUERY_PAGE}",
                    tuple(page_params.params),
                )
                for row in page.rows:
                    record = _meta_row(row)
                    if predicate.matches(record.to_json()):
                        out.append(record)
                        if limit is not None and len(out) >= limit:
                            return out
                if len(page.rows) < QUERY_PAGE:
                    return out
                tail = page.rows[-1]
                last = (tail[0], tail[1], tail[2], tail[3])
                if newest_first:
                    last = (tail[9], *last)
        assert timer.cancelled_caught
        raise QueryTimeout(
            f"the query ran past its budget of {budget:g}s: narrow it (modelType, modelName "
            "or name ==)"
        )

    async def delete_with_prefix(
        self, model_type: str, model_name: str, prefix: str, *, batch: int = 1000
    ) -> int:
        if not prefix:
            raise ValueError("an empty prefix would delete the whole instance")
        removed = 0
        while True:
            result = await self._on_any(
                "DELETE FROM data WHERE (model_type, model_name, name, version) IN ("
                "SELECT model_type, model_name, name, version FROM data WHERE "
                "model_type = $1 AND model_name = $2 AND name >= $3 AND name < $4 LIMIT $5)",
                (model_type, model_name, prefix, _upper(prefix), batch),
            )
            removed += result.rowcount
            if result.rowcount < batch:
                return removed

    async def adhoc_runs(self, *, excluded: Iterable[str]) -> list[tuple[str, str, float]]:
        """As SQLite's :func:`~swamp.store.datastore.adhoc_runs`: every ad-hoc run's instance of a
        type not ``excluded``, with its type and the epoch of its last write (a scan of the
        table, on the server: nothing here waits but the answer)."""
        skip = sorted(excluded)
        marks = ",".join(f"${n}" for n in range(1, len(skip) + 1)) or "NULL"
        result = await self._on_any(
            "SELECT model_type, model_name, MAX(created_epoch) FROM data "
            f"WHERE model_name LIKE 'run-' || repeat('_', 16) AND model_type NOT IN ({marks}) "
            "GROUP BY model_type, model_name",
            tuple(skip),
        )
        return [(t, n, e) for t, n, e in result.rows if is_adhoc_instance(n)]

    async def collect_garbage(self, *, batch: int = 500) -> int:
        now = self.clock()
        removed = 0
        while True:
            result = await self._on_any(
                "DELETE FROM data WHERE (model_type, model_name, name, version) IN ("
                "SELECT model_type, model_name, name, version FROM data "
                "WHERE expires_epoch IS NOT NULL AND expires_epoch < $1 LIMIT $2)",
                (now, batch),
            )
            removed += result.rowcount
            if result.rowcount < batch:
                return removed
