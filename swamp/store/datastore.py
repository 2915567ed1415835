"""Versioned, immutable data in one SQLite file.

A record is ``(model type, model name, data name, version)`` → JSON attributes + optional bytes.
``latest`` is the highest version. Writes insert the next version; only where a spec keeps a
single version (``garbage_collection = 1``) does a compare-and-swap replace the row in place.

Transitions are compare-and-swap on ``latest``. :meth:`Datastore.transition` reads the latest
version, asks a pure ``decide`` function for the next attributes, and inserts ``version + 1``
inside ``BEGIN IMMEDIATE`` after checking that ``latest`` has not moved. ``BEGIN IMMEDIATE``
takes SQLite's write lock, which serializes writers across *processes*, so two processes can never
both win the same transition; the loser re-reads and decides again. The unique index on the key is
the second line of defence.

Each spec declares ``garbage_collection`` (versions kept per data name, enforced at write time)
and ``lifetime`` (``infinite``, ``ephemeral`` = one hour, or a duration such as ``7d``); lapsed
rows are removed by :meth:`Datastore.collect_garbage`, which the orchestrator runs periodically.

The orchestrator opens the store with auto-checkpoint off and checkpoints from a thread
(:meth:`checkpoint`), which keeps WAL checkpoint stalls off the event loop. Short-lived CLI
processes keep SQLite's default auto-checkpoint.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from swamp.domain.durations import parse_duration
from swamp.domain.names import is_adhoc_instance
from swamp.domain.query import Predicate
from swamp.domain.read_scope import ReadScope
from swamp.errors import Conflict, QueryTimeout, StoreBroken, StoreBusy, StoreError

# The content comes last, after every column a query reads, and its size is a column of its own:
# a row's metadata is then read without touching its content (SQLite keeps what does not fit
# in the row's page on a chain of overflow pages, which it must walk to reach a column after it).
_TABLE = """
CREATE TABLE IF NOT EXISTS {table} (
    model_type  TEXT    NOT NULL,
    model_name  TEXT    NOT NULL,
    name        TEXT    NOT NULL,
    version     INTEGER NOT NULL,
    spec        TEXT    NOT NULL,
    attributes  TEXT    NOT NULL,
    created_at  TEXT    NOT NULL,
    created_epoch REAL  NOT NULL,
    expires_epoch REAL,
    size        INTEGER NOT NULL,
    content     BLOB,
    PRIMARY KEY (model_type, model_name, name, version)
) WITHOUT ROWID
"""
# Workflow run headers (``swamp.models.builtin.WORKFLOW_RUN``), which the web pages list newest
# first: an index of their own, by when each was written, kept for their rows alone (a partial
# index: other writes pay nothing for it). A query uses it when it names the type as this
# literal, which ``select`` does for a ``newest_first`` query of the type.
NEWEST_INDEXED = "swamp/workflow-run"
_INDEXES = f"""
CREATE INDEX IF NOT EXISTS data_expiry ON data (expires_epoch) WHERE expires_epoch IS NOT NULL;
CREATE INDEX IF NOT EXISTS data_newest_runs ON data (created_epoch)
    WHERE model_type = '{NEWEST_INDEXED}';
"""
_SCHEMA = _TABLE.format(table="data") + ";" + _INDEXES
_COLUMN_ORDER = [
    "model_type",
    "model_name",
    "name",
    "version",
    "spec",
    "attributes",
    "created_at",
    "created_epoch",
    "expires_epoch",
    "size",
    "content",
]

EPHEMERAL_SECONDS = 3600
# A WAL larger than this after a checkpoint is truncated (see Datastore.checkpoint); the
# orchestrator's own connection also cuts the file it reuses back to it.
WAL_TRUNCATE_BYTES = 16 * 1024 * 1024
# How long a truncating checkpoint waits for another process's writer or readers to let go.
TRUNCATE_WAIT_MS = 500
# A row is the latest version of its item (a correlated subquery on the primary key).
_IS_LATEST = (
    "version = (SELECT MAX(version) FROM data m WHERE m.model_type=d.model_type "
    "AND m.model_name=d.model_name AND m.name=d.name)"
)


def _file_identity(path: Path) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


MAX_CAS_RETRIES = 64


_CANONICAL = json.JSONEncoder(separators=(",", ":"), sort_keys=True)  # built once, not per write
_second: list = [None, ""]  # the last whole second formatted, and its text


def iso(epoch: float) -> str:
    """``2026-11-30T12:00:00.123Z``: UTC, milliseconds (as ``datetime`` rounds and truncates).
    A dispatch stamps four of these; the whole second is formatted once per second."""
    fraction, whole = math.modf(epoch)
    micros = round(fraction * 1_000_000)
    if micros >= 1_000_000:
        whole, micros = whole + 1, micros - 1_000_000
    elif micros < 0:
        whole, micros = whole - 1, micros + 1_000_000
    second = int(whole)
    if _second[0] != second:
        text = datetime.fromtimestamp(second, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
        _second[0], _second[1] = second, text
        return f"{text}.{micros // 1000:03d}Z"
    return f"{_second[1]}.{micros // 1000:03d}Z"


def parse_iso(text: object) -> float | None:
    """The epoch of a timestamp :func:`iso` wrote, or ``None`` when it is not one."""
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True)
class Key:
    model_type: str
    model_name: str
    name: str


@dataclass(frozen=True)
class SpecPolicy:
    """What a resource spec declares about its data's retention."""

    name: str
    lifetime: str = "infinite"
    garbage_collection: int | None = None

    def lifetime_seconds(self) -> float | None:
        if self.lifetime == "infinite":
            return None
        if self.lifetime == "ephemeral":
            return EPHEMERAL_SECONDS
        return parse_duration(self.lifetime, what="lifetime")


@dataclass(frozen=True)
class Record:
    model_type: str
    model_name: str
    name: str
    version: int
    spec: str
    attributes: dict
    content: bytes | None
    created_at: str
    content_size: int | None = None  # when the content itself was not loaded (queries)

    @property
    def key(self) -> Key:
        return Key(self.model_type, self.model_name, self.name)

    def to_json(self, *, with_attributes: bool = True) -> dict:
        out = {
            "modelType": self.model_type,
            "modelName": self.model_name,
            "name": self.name,
            "version": self.version,
            "spec": self.spec,
            "createdAt": self.created_at,
            "size": len(self.content) if self.content is not None else (self.content_size or 0),
        }
        if with_attributes:
            out["attributes"] = self.attributes
        return out


_COLUMNS = "model_type, model_name, name, version, spec, attributes, content, created_at"


def _row(row: tuple) -> Record:
    return Record(row[0], row[1], row[2], row[3], row[4], json.loads(row[5]), row[6], row[7])


# What queries read: everything but the content, whose size is enough for a match or a listing.
_META_COLUMNS = "model_type, model_name, name, version, spec, attributes, NULL, created_at, size"


def _meta_row(row: tuple) -> Record:
    return Record(row[0], row[1], row[2], row[3], row[4], json.loads(row[5]), None, row[7], row[8])


def _migrate(db: sqlite3.Connection) -> bool:
    """A database written before the content moved last: rebuilt once, in one transaction
    (another process that finds it done leaves it). Whether this rebuilt it."""
    columns = [row[1] for row in db.execute("PRAGMA table_info(data)")]
    if columns == _COLUMN_ORDER:
        return False
    db.execute("BEGIN IMMEDIATE")
    try:
        columns = [row[1] for row in db.execute("PRAGMA table_info(data)")]
        if columns == _COLUMN_ORDER:
            db.execute("ROLLBACK")
            return False
        db.execute("DROP TABLE IF EXISTS data_rebuilt")
        db.execute(_TABLE.format(table="data_rebuilt"))
        db.execute(
            "INSERT INTO data_rebuilt SELECT model_type, model_name, name, version, spec, "
            "attributes, created_at, created_epoch, expires_epoch, "
            "COALESCE(LENGTH(CAST(content AS BLOB)), 0), content FROM data"
        )
        db.execute("DROP TABLE data")
        db.execute("ALTER TABLE data_rebuilt RENAME TO data")
        for statement in filter(str.strip, _INDEXES.split(";")):
            db.execute(statement)
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    return True


def database_files(path: Path) -> list[Path]:
    """The files SQLite writes for the database at ``path``: itself, its write-ahead log and
    the log's shared-memory index."""
    return [path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")]


def unwritable(path: Path) -> list[Path]:
    """Those of the database's files that exist and this process may not write: a mode that
    forbids it (root may write regardless, and so it is not refused), an immutable flag
    (``chattr +i``), a read-only mount. An open connection goes on writing into such a file
    as if nothing had changed — or into the log only, which can then never be copied back —
    so it is asked of the file itself."""
    effective = os.access in os.supports_effective_ids
    return [
        file
        for file in database_files(path)
        if not os.access(file, os.W_OK, effective_ids=effective) and file.exists()
    ]


def read_only(files: list[Path]) -> str:
    names = ", ".join(str(file) for file in files)
    return f"the database is read-only: {names} cannot be written"


def _translate(exc: sqlite3.Error, what: str, *, store: Datastore | None = None) -> StoreError:
    """sqlite3's errors, in the project's words. With the ``store`` that met it: a write refused
    while its writes are paused is busy (retried); a refused write into a file made read-only
    (SQLite calls one into an immutable file "disk I/O") names the file."""
    text = str(exc)
    lowered = text.lower()
    if "locked" in lowered or "busy" in lowered:
        return StoreBusy(f"{what}: the database is locked by another process")
    readonly = "readonly" in lowered or "read-only" in lowered
    if store is not None and readonly and store.paused:
        return StoreBusy(f"{what}: {store.paused}")
    if (
        store is not None
        and (readonly or "disk i/o" in lowered)
        and (files := unwritable(store.path))
    ):
        return StoreBroken(f"{what}: {read_only(files)} ({text})")
    if readonly:
        return StoreBroken(f"{what}: the database is read-only ({text})")
    if "malformed" in lowered or "not a database" in lowered or "disk i/o" in lowered:
        return StoreBroken(f"{what}: the database file is damaged ({text})")
    if "no such table" in lowered:
        return StoreBroken(f"{what}: the database file was replaced ({text})")
    return StoreError(f"{what}: {text}")


def _scope_sql(scope: ReadScope) -> tuple[str, list]:
    """``scope`` as a WHERE clause: excluded types out, then any allowed item or type pattern."""
    allowed, params = [], []
    for model_type, model_name in sorted(scope.items):
        allowed.append("(model_type = ? AND model_name = ?)")
        params += [model_type, model_name]
    for pattern in scope.type_patterns:  # the pattern alphabet has no GLOB specials but '*'
        allowed.append("model_type GLOB ?")
        params.append(pattern)
    excluded = sorted(scope.excluded_types)
    clause = (
        f"model_type NOT IN ({','.join('?' * len(excluded))}) AND ({' OR '.join(allowed) or '0'})"
    )
    return clause, excluded + params


def select(
    db: sqlite3.Connection,
    predicate: Predicate,
    *,
    all_versions: bool = False,
    limit: int | None = None,
    scope: ReadScope | None = None,
    budget: float | None = None,
    stop: threading.Event | None = None,
    newest_first: bool = False,
) -> list[Record]:
    """:meth:`Datastore.query` on a connection: any of the store's, or a reader's (from
    another thread, which ``stop`` can end early). ``newest_first`` orders by when each was
    written, the latest first (SQLite sorts; with ``limit`` only that many are decoded)."""
    clauses, params = [], []
    source = "data d"
    if scope is not None:
        clause, scope_params = _scope_sql(scope)
        clauses.append(clause)
        params.extend(scope_params)
    for field, column in (
        ("modelType", "model_type"),
        ("modelName", "model_name"),
        ("name", "name"),
        ("spec", "spec"),
    ):
        if field in predicate.equalities:
            if (
                newest_first
                and field == "modelType"
                and predicate.equalities[field] == (NEWEST_INDEXED)
            ):  # as the partial index says it, and SQLite told to walk it, newest first
                clauses.append(f"model_type = '{NEWEST_INDEXED}'")
                source = "data d INDEXED BY data_newest_runs"
                continue
            clauses.append(f"{column} = ?")
            params.append(predicate.equalities[field])
    where = " AND ".join(clauses) or "1=1"
    if not all_versions:
        where += f" AND {_IS_LATEST}"
    deadline = None if budget is None else time.monotonic() + budget

    def late() -> bool:
        if deadline is not None and time.monotonic() > deadline:
            return True
        return stop is not None and stop.is_set()

    if deadline is not None:  # SQLite asks every few thousand steps: stop when it is late
        db.set_progress_handler(late, 4096)
    # Rows stream from a cursor, without their content: memory holds the matches only, and
    # the scan stops at ``limit``.
    out: list[Record] = []
    try:
        cursor = db.execute(
            f"SELECT {_META_COLUMNS} FROM {source} WHERE {where} "
            + (
                "ORDER BY created_epoch DESC"
                if newest_first
                else "ORDER BY model_type, model_name, name, version"
            ),
            params,
        )
        try:
            for row in cursor:
                if deadline is not None and late():  # a row's attributes may be large
                    raise QueryTimeout(_too_slow(budget))
                record = _meta_row(row)
                if predicate.matches(record.to_json()):
                    out.append(record)
                    if limit is not None and len(out) >= limit:
                        break
        finally:
            cursor.close()
    except sqlite3.OperationalError as exc:
        if deadline is not None and "interrupt" in str(exc).lower():
            raise QueryTimeout(_too_slow(budget)) from None
        raise
    finally:
        if deadline is not None:
            db.set_progress_handler(None, 0)
    return out


def adhoc_runs(db: sqlite3.Connection, *, excluded: Iterable[str]) -> list[tuple[str, str, float]]:
    """Every ad-hoc run's instance (``run-`` and 16 hex digits) of a type not ``excluded``
    (bookkeeping types, whose instance names are tokens', workers' and workflows' names, never
    ad-hoc runs), with its type and the epoch of its last write. A scan of the whole table:
    run it on a connection of its own, off the event loop."""
    skip = sorted(excluded)
    rows = db.execute(
        "SELECT model_type, model_name, MAX(created_epoch) FROM data "
        f"WHERE model_name GLOB 'run-????????????????' "
        f"AND model_type NOT IN ({','.join('?' * len(skip))}) "
        "GROUP BY model_type, model_name",
        skip,
    ).fetchall()
    return [(t, n, e) for t, n, e in rows if is_adhoc_instance(n)]


def _too_slow(budget: float | None) -> str:
    return (
        f"the query did not finish within its {budget:g}s budget: narrow the predicate (an "
        "exact modelType, modelName or name is looked up by index) or ask for fewer records"
    )


class Datastore:
    """One connection to the repo's database.

    The orchestrator's connection never waits for a lock (``busy_timeout`` 0): a write that
    meets another process's lock raises :class:`StoreBusy` at once, and the async caller
    retries without blocking the event loop (``swamp.store.retry``). The CLI's connections wait
    up to 10 s, as a short-lived process may. Once a write finds the database read-only,
    damaged or replaced, the store is *broken*: every later write is refused with the reason,
    so nothing is acknowledged that was not kept.
    """

    def __init__(self, path: Path | str, *, orchestrator: bool = False, clock=time.time) -> None:
        self.path = Path(path)
        self.clock = clock
        self.writes = 0
        self.on_write: Callable[[], None] | None = None
        self.broken: str | None = None
        self.paused: str | None = None  # why writes are refused as busy for a moment
        wait = 0 if orchestrator else 10
        try:
            self.db = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=wait
            )
            self.db.execute(f"PRAGMA busy_timeout={wait * 1000}")
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            if orchestrator:
                self.db.execute("PRAGMA wal_autocheckpoint=0")
            self.db.executescript(_SCHEMA)
            self.migrated = _migrate(self.db)
            self._identity = _file_identity(self.path)
        except sqlite3.Error as exc:
            raise _translate(exc, f"cannot open the datastore at {self.path}") from None

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def _sql(self, what: str, *, writing: bool = False) -> Iterator[None]:
        if writing and self.broken:
            raise StoreBroken(self.broken)
        try:
            yield
        except sqlite3.IntegrityError:
            raise
        except sqlite3.Error as exc:
            error = _translate(exc, what, store=self)
            if isinstance(error, StoreBroken):
                self.broken = error.message
            raise error from None

    def sql(self, what: str, *, writing: bool = False):
        """SQL of a table of its own on this connection (the step logs), with the store's
        errors: translated, a broken store refusing writes."""
        return self._sql(what, writing=writing)

    def check_file(self) -> str | None:
        """Is the file we write still the repo's database, and may it still be written? A file
        deleted or replaced under a running server takes its writes into nowhere; one made
        read-only (its mode, ``chattr +i``, a read-only mount — the database, its ``-wal`` or
        its ``-shm``) still takes them through the open connection, or into the log alone,
        and the next start cannot open it. This notices either, and breaks the store."""
        if self.broken is None and _file_identity(self.path) != self._identity:
            self.broken = (
                f"the database file {self.path} was deleted or replaced while serving; nothing "
                "is written until swamp serve is restarted"
            )
        if self.broken is None and (files := unwritable(self.path)):
            self.broken = (
                f"{read_only(files)} (made read-only while serving); nothing is written until "
                "it is writable again and swamp serve is restarted"
            )
        return self.broken

    def replaced(self) -> str | None:
        """Why reads of the file at our path would not be of our database (it was deleted or
        replaced), or ``None``. A read-only database is still ours to read."""
        if _file_identity(self.path) != self._identity:
            return self.check_file() or "the database file was deleted or replaced while serving"
        return None

    def probe_writable(self) -> None:
        """Take the write lock and let it go at once: a read-only database is found at start
        (any of its files, by name)."""
        if files := unwritable(self.path):
            raise StoreBroken(f"the database cannot be written: {read_only(files)}")
        with self._sql("the database cannot be written", writing=True):
            self.db.execute("BEGIN IMMEDIATE")
            try:  # a write that changes nothing, rolled back: SQLite checks it can write
                self.db.execute("UPDATE data SET version = version WHERE 0")
            finally:
                self.db.execute("ROLLBACK")

    # -- reads -------------------------------------------------------------------------------

    def latest(self, key: Key) -> Record | None:
        with self._sql("reading the datastore"):
            row = self.db.execute(
                f"SELECT {_COLUMNS} FROM data WHERE model_type=? AND model_name=? AND name=? "
                "ORDER BY version DESC LIMIT 1",
                (key.model_type, key.model_name, key.name),
            ).fetchone()
        return _row(row) if row else None

    def versions(self, key: Key) -> list[int]:
        with self._sql("reading the datastore"):
            rows = self.db.execute(
                "SELECT version FROM data WHERE model_type=? AND model_name=? AND name=? "
                "ORDER BY version",
                (key.model_type, key.model_name, key.name),
            ).fetchall()
        return [r[0] for r in rows]

    def latest_of_type(self, model_type: str, *, model_name: str | None = None) -> list[Record]:
        """The latest version of every data item of a model type (optionally one instance)."""
        where = "model_type = ?"
        params: list = [model_type]
        if model_name is not None:
            where += " AND model_name = ?"
            params.append(model_name)
        return self._latest(where, params)

    def model_names(self, model_type: str) -> list[str]:
        """The instances of a model type that have data (read from the primary key's index,
        no record decoded)."""
        with self._sql("reading the datastore"):
            rows = self.db.execute(
                "SELECT DISTINCT model_name FROM data WHERE model_type = ? ORDER BY model_name",
                (model_type,),
            ).fetchall()
        return [row[0] for row in rows]

    def latest_with_prefix(self, model_type: str, model_name: str, prefix: str) -> list[Record]:
        """The latest version of each item of one instance whose name starts with ``prefix``:
        a range of the primary key, so its cost follows the matches, not the instance's size."""
        if not prefix:
            raise ValueError("an empty prefix would read the whole instance")
        upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        return self._latest(
            "model_type = ? AND model_name = ? AND name >= ? AND name < ?",
            [model_type, model_name, prefix, upper],
        )

    def latest_in_range(
        self, model_type: str, model_name: str, low: str, high: str, *, limit: int
    ) -> list[Record]:
        """The latest version of the first ``limit`` items of one instance whose names are at
        least ``low`` and below ``high`` (a range of the primary key: a page of a run's steps
        costs the page, not the run)."""
        with self._sql("reading the datastore"):
            rows = self.db.execute(
                f"SELECT {_COLUMNS} FROM data d WHERE model_type = ? AND model_name = ? "
                f"AND name >= ? AND name < ? AND {_IS_LATEST} ORDER BY name LIMIT ?",
                (model_type, model_name, low, high, limit),
            ).fetchall()
        return [_row(r) for r in rows]

    def _latest(self, where: str, params: list) -> list[Record]:
        with self._sql("reading the datastore"):
            rows = self.db.execute(
                f"SELECT {_COLUMNS} FROM data d WHERE {where} AND {_IS_LATEST} "
                "ORDER BY model_type, model_name, name",
                params,
            ).fetchall()
        return [_row(r) for r in rows]

    def query(
        self,
        predicate: Predicate,
        *,
        all_versions: bool = False,
        limit: int | None = None,
        scope: ReadScope | None = None,
        budget: float | None = None,
        newest_first: bool = False,
    ) -> list[Record]:
        """Records matching a predicate; the latest version of each item unless ``all_versions``.

        With a ``scope`` only the records it allows are considered at all (in SQL, before the
        predicate sees anything). With a ``budget`` (seconds) a query still running after that
        long stops with :class:`QueryTimeout`. The orchestrator runs queries from peers off its
        event loop (``swamp.store.reader``); this one runs where it is called.
        """
        with self._sql("querying the datastore"):
            return select(
                self.db,
                predicate,
                all_versions=all_versions,
                limit=limit,
                scope=scope,
                budget=budget,
                newest_first=newest_first,
            )

    def data_version(self) -> int:
        """Changes when *another* connection commits: how serve notices CLI writes."""
        with self._sql("reading the datastore"):
            return self.db.execute("PRAGMA data_version").fetchall()[0][0]

    # -- writes ------------------------------------------------------------------------------

    def write(
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
        """Insert the next version. With ``expected_version`` (0 = must not exist) it is a
        compare-and-swap: ``Conflict`` if ``latest`` is not that version any more. ``fresh``:
        the key holds an id made for it just now, so no version can exist — version 1 is one
        plain INSERT, without looking (a clash would still be refused by the key). ``at``: when
        the version was made, if not now (a row taken in from the journal)."""
        now = self.clock() if at is None else at
        created_at = iso(now)
        lifetime = policy.lifetime_seconds()
        encoded = _CANONICAL.encode(attributes)
        item = (key.model_type, key.model_name, key.name)
        row = (  # the table's columns after the key, in order
            policy.name,
            encoded,
            created_at,
            now,
            None if lifetime is None else now + lifetime,
            0 if content is None else len(content),
            content,
        )
        # One statement, so one atomic write transaction: SQLite takes the write lock before it
        # evaluates MAX(version), which makes the check and the insert indivisible across
        # processes without a BEGIN/COMMIT round trip.
        if self.broken:
            raise StoreBroken(self.broken)
        replaced = expected_version or 0  # the version an in-place write replaces
        in_place = replaced > 0 and policy.garbage_collection == 1
        try:
            if in_place:
                # One version is kept: the next replaces it in place, a compare-and-swap in
                # one UPDATE (no insert and trim: one row, one write).
                inserted = self.db.execute(
                    "UPDATE data SET version=?, spec=?, attributes=?, created_at=?, "
                    "created_epoch=?, expires_epoch=?, size=?, content=? WHERE model_type=? "
                    "AND model_name=? AND name=? AND version=? RETURNING version",
                    (replaced + 1, *row, *item, replaced),
                ).fetchall()
            elif fresh:
                self.db.execute("INSERT INTO data VALUES (?,?,?,1,?,?,?,?,?,?,?)", (*item, *row))
                inserted = [(1,)]
            elif expected_version is None:
                inserted = self.db.execute(
                    "INSERT INTO data SELECT ?,?,?,COALESCE(MAX(version),0)+1,?,?,?,?,?,?,? "
                    "FROM data WHERE model_type=? AND model_name=? AND name=? RETURNING version",
                    (*item, *row, *item),
                ).fetchall()
            else:
                inserted = self.db.execute(
                    "INSERT INTO data SELECT ?,?,?,?,?,?,?,?,?,?,? WHERE (SELECT COALESCE("
                    "MAX(version),0) FROM data WHERE model_type=? AND model_name=? AND name=?)=? "
                    "RETURNING version",
                    (*item, expected_version + 1, *row, *item, expected_version),
                ).fetchall()
        except sqlite3.IntegrityError:
            inserted = []
        except sqlite3.Error as exc:
            error = _translate(exc, "the datastore refused a write", store=self)
            if isinstance(error, StoreBroken):
                self.broken = error.message
            raise error from None
        if not inserted:
            raise Conflict(
                f"{key.model_type}/{key.model_name}/{key.name} moved past version "
                f"{expected_version}"
            )
        version = inserted[0][0]
        if (
            not in_place  # replaced in place: there is no older version to trim
            and policy.garbage_collection is not None
            and version > policy.garbage_collection
        ):
            with suppress(StoreError), self._sql("trimming old versions", writing=True):
                self.db.execute(  # the write stands; old versions go now or at the next one
                    "DELETE FROM data WHERE model_type=? AND model_name=? AND name=? "
                    "AND version<=?",
                    (*item, version - policy.garbage_collection),
                )
        self.writes += 1
        if self.on_write is not None:
            self.on_write()
        return Record(
            key.model_type,
            key.model_name,
            key.name,
            version,
            policy.name,
            attributes,
            content,
            created_at,
        )

    def transition(
        self,
        key: Key,
        decide: Callable[[Record | None], dict | None],
        *,
        policy: SpecPolicy,
        current: Record | None = None,
    ) -> tuple[Record | None, bool]:
        """Read latest, decide, compare-and-swap; retry the decision if another writer won.

        ``decide`` is pure: it returns the next attributes, ``None`` for "no write", or raises to
        refuse (nothing is written). Returns ``(latest record, wrote)``.

        A caller that knows the latest record (because it wrote it) passes it as ``current`` to
        skip the first read; if it was stale, the compare-and-swap fails and the loop re-reads.
        """
        for attempt in range(MAX_CAS_RETRIES):
            if attempt or current is None:
                current = self.latest(key)
            attributes = decide(current)
            if attributes is None:
                return current, False
            try:
                record = self.write(
                    key,
                    attributes,
                    policy=policy,
                    expected_version=current.version if current else 0,
                )
            except Conflict:
                continue
            return record, True
        raise StoreError(f"gave up on {key} after {MAX_CAS_RETRIES} concurrent updates")

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Several reads and writes as one: ``BEGIN IMMEDIATE`` takes the write lock first, so
        what is read inside cannot change before the writes land (across processes too), and
        all of it commits or none. Not re-entrant."""
        if self.broken:
            raise StoreBroken(self.broken)
        with self._sql("starting a write transaction", writing=True):
            self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
            with self._sql("committing a write transaction", writing=True):
                self.db.execute("COMMIT")
        except BaseException:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise

    def delete_items(self, keys: Iterable[Key]) -> int:
        """Remove every version of the given data items (bookkeeping GC); inside a
        :meth:`transaction` it joins it."""
        if self.db.in_transaction:
            return self._delete(keys)
        with self.transaction():
            return self._delete(keys)

    def _delete(self, keys: Iterable[Key]) -> int:
        count = 0
        with self._sql("deleting from the datastore", writing=True):
            for key in keys:
                count += self.db.execute(
                    "DELETE FROM data WHERE model_type=? AND model_name=? AND name=?",
                    (key.model_type, key.model_name, key.name),
                ).rowcount
        return count

    def delete_with_prefix(
        self, model_type: str, model_name: str, prefix: str, *, batch: int = 1000
    ) -> int:
        """Remove every item of one instance whose name starts with ``prefix`` (a range of the
        primary key), ``batch`` rows a transaction: a run's steps go with their run without
        one long write."""
        if not prefix:
            raise ValueError("an empty prefix would delete the whole instance")
        upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        removed = 0
        while True:
            with self._sql("deleting from the datastore", writing=True):
                cur = self.db.execute(
                    "DELETE FROM data WHERE (model_type, model_name, name, version) IN ("
                    "SELECT model_type, model_name, name, version FROM data WHERE "
                    "model_type = ? AND model_name = ? AND name >= ? AND name < ? LIMIT ?)",
                    (model_type, model_name, prefix, upper, batch),
                )
            removed += cur.rowcount
            if cur.rowcount < batch:
                return removed

    def delete_instance(self, model_type: str, model_name: str) -> int:
        """Remove every item of one model instance; call it inside a :meth:`transaction`."""
        with self._sql("deleting from the datastore", writing=True):
            return self.db.execute(
                "DELETE FROM data WHERE model_type=? AND model_name=?", (model_type, model_name)
            ).rowcount

    def collect_garbage(self, *, batch: int = 500) -> int:
        """Delete rows whose lifetime has lapsed, in small batches (never one big transaction)."""
        now = self.clock()
        removed = 0
        while True:
            with self._sql("collecting garbage", writing=True):
                cur = self.db.execute(
                    "DELETE FROM data WHERE (model_type, model_name, name, version) IN ("
                    "SELECT model_type, model_name, name, version FROM data "
                    "WHERE expires_epoch IS NOT NULL AND expires_epoch < ? LIMIT ?)",
                    (now, batch),
                )
            removed += cur.rowcount
            if cur.rowcount < batch:
                return removed

    def checkpoint(self, *, truncate_over: int | None = WAL_TRUNCATE_BYTES) -> int:
        """Checkpoint the WAL on a connection of its own: safe to call from a worker thread.
        Returns the log's size afterwards (0 when there is none).

        A log no larger than ``truncate_over`` bytes (or any, with ``None``) gets a passive
        checkpoint: it copies what it can and waits for nobody. A larger one — writes kept
        landing while checkpoints ran, so it never started over — is truncated: that takes
        the writer's lock, copies the rest, waits for readers to leave the log and cuts it to
        nothing, waiting at most :data:`TRUNCATE_WAIT_MS` for another process's writer or
        readers. Call that with this connection's writes paused (:meth:`writes_paused`), or
        it races each of them for the lock. A reader that holds an old snapshot for longer (a
        backup, ``sqlite3`` left in a transaction) keeps the log from being truncated: the
        size returned says so. A broken store is left alone (connecting to a deleted file's
        path would create a new, empty one)."""
        if self.broken or self.check_file():
            return 0
        db = sqlite3.connect(
            f"{self.path.resolve().as_uri()}?mode=rw", uri=True, isolation_level=None, timeout=10.0
        )
        try:
            if truncate_over is not None and wal_size(self.path) > truncate_over:
                db.execute(f"PRAGMA busy_timeout={TRUNCATE_WAIT_MS}")
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            else:
                db.execute("PRAGMA wal_checkpoint(PASSIVE)")
        finally:
            db.close()
        return wal_size(self.path)

    @contextmanager
    def writes_paused(self, reason: str) -> Iterator[None]:
        """Meanwhile this connection refuses to write (``PRAGMA query_only``), and a write is
        :class:`StoreBusy` — retried by the orchestrator in trio like any busy write. What a
        truncating checkpoint in another thread needs: the orchestrator writes back to back in
        a burst, and the lock would otherwise go to the next write, every time."""
        with self._sql("pausing writes"):
            self.db.execute("PRAGMA query_only=1")
        self.paused = reason
        try:
            yield
        finally:
            self.paused = None
            with self._sql("resuming writes"):
                self.db.execute("PRAGMA query_only=0")

    def limit_wal(self, size: int = WAL_TRUNCATE_BYTES) -> None:
        """Keep the log this connection reuses to ``size`` bytes: when it starts the log over
        after a checkpoint (without truncating it), it cuts the file back to that."""
        with self._sql("setting the WAL's size limit"):
            self.db.execute(f"PRAGMA journal_size_limit={int(size)}")


def wal_size(path: Path) -> int:
    """The size of the write-ahead log of the database at ``path`` (0 when there is none)."""
    try:
        return os.stat(database_files(path)[1]).st_size
    except OSError:
        return 0
