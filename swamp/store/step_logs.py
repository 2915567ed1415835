"""Step logs on disk: every line a dispatch printed, in chunks, beside the data it belongs to.

:class:`LogStore` is the seam, awaited (a PostgreSQL store implements the same few methods:
``swamp.store.pg_step_logs``); :class:`SqliteLogStore` keeps two tables of its own in the repo's
database, on the store's connection (its calls do not wait; :class:`SqliteLogs` puts it behind
the seam): ``step_log``, one row per log (a dispatch: its owner, worker, times and how much it
printed), and ``step_log_chunk``, the lines, many to a row (``swamp.domain.step_logs``). A
chunk's id only grows (``AUTOINCREMENT``: never reused after a delete), so it is a reader's
cursor. Writes come in batches from the orchestrator's writer (``swamp.orchestrator.step_logs``),
one transaction each; the per-log cap is applied in the same transaction.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from swamp.domain.step_logs import LogOwner, overflow
from swamp.store.datastore import Datastore, iso

_SCHEMA = """
CREATE TABLE IF NOT EXISTS step_log (
    log_id        TEXT PRIMARY KEY,
    run_id        TEXT,
    workflow      TEXT,
    job           TEXT,
    step          TEXT,
    model_type    TEXT NOT NULL,
    model_name    TEXT NOT NULL,
    method        TEXT NOT NULL,
    worker        TEXT,
    attempt       INTEGER NOT NULL,
    started_epoch REAL NOT NULL,
    ended_epoch   REAL,
    lines         INTEGER NOT NULL DEFAULT 0,
    bytes         INTEGER NOT NULL DEFAULT 0,
    kept_bytes    INTEGER NOT NULL DEFAULT 0,
    dropped_lines INTEGER NOT NULL DEFAULT 0,
    dropped_bytes INTEGER NOT NULL DEFAULT 0
);
DROP INDEX IF EXISTS step_log_run;
CREATE INDEX IF NOT EXISTS step_log_run_step ON step_log (run_id, job, step)
    WHERE run_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS step_log_owner ON step_log (model_type, model_name)
    WHERE run_id IS NULL;
CREATE TABLE IF NOT EXISTS step_log_chunk (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    log_id      TEXT    NOT NULL,
    first_line  INTEGER NOT NULL,
    first_byte  INTEGER NOT NULL,
    line_count  INTEGER NOT NULL,
    byte_count  INTEGER NOT NULL,
    streams     TEXT    NOT NULL,
    body        TEXT    NOT NULL
);
CREATE INDEX IF NOT EXISTS step_log_chunk_log ON step_log_chunk (log_id, id);
"""
# what a log's row and a chunk's are read as, on either backend (log_info, page_of)
INFO_COLUMNS = (
    "log_id, run_id, workflow, job, step, model_type, model_name, method, worker, attempt, "
    "started_epoch, ended_epoch, lines, bytes, dropped_lines, dropped_bytes"
)
CHUNK_COLUMNS = "id, log_id, first_line, first_byte, streams, body, byte_count"
PAGE_CHUNKS = 1000  # chunks in a page at most (a page's frame stays small whatever their size)
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode


@dataclass(frozen=True)
class LogStart:
    """A log opened: a dispatch began (its attempt, on its worker)."""

    log_id: str
    owner: LogOwner
    worker: str | None
    attempt: int
    started_epoch: float


@dataclass(frozen=True)
class Chunk:
    """Lines of one log, in order: ``first_line`` and ``first_byte`` place them in its whole
    output; ``streams`` has one character per line (``swamp.domain.step_logs``)."""

    log_id: str
    first_line: int
    first_byte: int
    lines: Sequence[str]
    streams: str
    size: int


@dataclass(frozen=True)
class LogEnd:
    log_id: str
    ended_epoch: float
    lines: int  # every line it printed (kept or not)
    bytes: int


@dataclass(frozen=True)
class StoredChunk:
    id: int
    log_id: str
    first_line: int
    first_byte: int
    streams: str
    size: int
    lines: list[str]


@dataclass(frozen=True)
class LogInfo:
    log_id: str
    owner: LogOwner
    worker: str | None
    attempt: int
    started_at: str
    ended_at: str | None
    lines: int
    bytes: int
    dropped_lines: int
    dropped_bytes: int


class LogStore(Protocol):
    """What the step logs need of a database, awaited (a server is a round trip away)."""

    async def write(
        self,
        started: Sequence[LogStart],
        chunks: Sequence[Chunk],
        ended: Sequence[LogEnd],
        *,
        cap: int,
    ) -> None: ...

    async def logs_of_run(self, run_id: str) -> list[LogInfo]: ...

    async def logs_with_prefix(self, prefix: str) -> list[LogInfo]: ...

    async def logs_by_id(self, log_ids: Sequence[str]) -> list[LogInfo]: ...

    async def logs_of_step(self, run_id: str, step: str) -> list[LogInfo]: ...

    async def run_workflow(self, run_id: str) -> str | None: ...

    async def run_counts(self, run_id: str) -> tuple[int, int]: ...

    async def chunks(
        self, log_ids: Sequence[str], *, after: int, limit_bytes: int
    ) -> tuple[list[StoredChunk], bool]: ...

    async def chunks_of_run(
        self, run_id: str, *, after: int, limit_bytes: int
    ) -> tuple[list[StoredChunk], bool]: ...

    async def runs(self) -> list[tuple[str, str]]: ...

    async def others(self) -> list[tuple[str, str, str, float]]: ...

    async def forget_runs(self, run_ids: Iterable[str]) -> int: ...

    async def forget_logs(self, log_ids: Iterable[str]) -> int: ...

    async def forget_orphans(self, *, limit: int = 100) -> int: ...

    async def forget_instances(self, instances: Iterable[tuple[str, str]]) -> int: ...

    async def end_open(self, now: float) -> int: ...


class SqliteLogStore:
    def __init__(self, store: Datastore) -> None:
        self.store = store
        self.db = store.db
        with store.sql("creating the step-log tables", writing=True):
            self.db.executescript(_SCHEMA)

    def __repr__(self) -> str:
        return f"<SqliteLogStore {self.store.path}>"

    # -- writes ------------------------------------------------------------------------------

    def write(
        self,
        started: Sequence[LogStart],
        chunks: Sequence[Chunk],
        ended: Sequence[LogEnd],
        *,
        cap: int,
    ) -> None:
        """One batch, one transaction: logs opened, chunks added (each log then cut to
        ``cap``), logs ended."""
        with self.store.transaction(), self.store.sql("writing step logs", writing=True):
            db = self.db
            db.executemany(
                "INSERT OR IGNORE INTO step_log (log_id, run_id, workflow, job, step, "
                "model_type, model_name, method, worker, attempt, started_epoch) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                [
                    (
                        s.log_id,
                        s.owner.run_id,
                        s.owner.workflow,
                        s.owner.job,
                        s.owner.step,
                        s.owner.model_type,
                        s.owner.model_name,
                        s.owner.method,
                        s.worker,
                        s.attempt,
                        s.started_epoch,
                    )
                    for s in started
                ],
            )
            db.executemany(
                # only for a log that has its row: a chunk of no log (its row forgotten, or
                # its start lost with a batch) could never be read nor collected
                "INSERT INTO step_log_chunk (log_id, first_line, first_byte, line_count, "
                "byte_count, streams, body) SELECT ?,?,?,?,?,?,? "
                "WHERE EXISTS (SELECT 1 FROM step_log WHERE log_id = ?)",
                [
                    (
                        c.log_id,
                        c.first_line,
                        c.first_byte,
                        len(c.lines),
                        c.size,
                        c.streams,
                        _ENCODE(list(c.lines)),
                        c.log_id,
                    )
                    for c in chunks
                ],
            )
            for log_id, (size, lines, size_upto) in added(chunks).items():
                db.execute(
                    "UPDATE step_log SET kept_bytes = kept_bytes + ?, lines = MAX(lines, ?), "
                    "bytes = MAX(bytes, ?) WHERE log_id = ?",
                    (size, lines, size_upto, log_id),
                )
                self._cap(log_id, cap)
            db.executemany(
                "UPDATE step_log SET ended_epoch = ?, lines = MAX(lines, ?), "
                "bytes = MAX(bytes, ?) WHERE log_id = ?",
                [(e.ended_epoch, e.lines, e.bytes, e.log_id) for e in ended],
            )

    def _cap(self, log_id: str, cap: int) -> None:
        """The oldest chunks of ``log_id`` go until it fits in ``cap``; the log says where
        what is kept starts (what was dropped, in memory or here)."""
        db = self.db
        row = db.execute("SELECT kept_bytes FROM step_log WHERE log_id = ?", (log_id,)).fetchone()
        if row is not None and row[0] > cap:
            rows = db.execute(
                "SELECT id, byte_count FROM step_log_chunk WHERE log_id = ? ORDER BY id",
                (log_id,),
            ).fetchall()
            drop = overflow([size for _, size in rows], cap)
            if drop:
                db.execute(
                    "DELETE FROM step_log_chunk WHERE log_id = ? AND id <= ?",
                    (log_id, rows[drop - 1][0]),
                )
                db.execute(
                    "UPDATE step_log SET kept_bytes = ? WHERE log_id = ?",
                    (sum(size for _, size in rows[drop:]), log_id),
                )
        first = db.execute(
            "SELECT first_line, first_byte FROM step_log_chunk WHERE log_id = ? "
            "ORDER BY id LIMIT 1",
            (log_id,),
        ).fetchone()
        if first is not None:
            db.execute(
                "UPDATE step_log SET dropped_lines = ?, dropped_bytes = ? WHERE log_id = ?",
                (first[0], first[1], log_id),
            )

    def end_open(self, now: float) -> int:
        """Boot: the logs a previous orchestrator left open ended with it."""
        with self.store.transaction(), self.store.sql("ending step logs", writing=True):
            return self.db.execute(
                "UPDATE step_log SET ended_epoch = ? WHERE ended_epoch IS NULL", (now,)
            ).rowcount

    # -- reads -------------------------------------------------------------------------------

    def logs_of_run(self, run_id: str) -> list[LogInfo]:
        """A run's logs, in the order they were opened."""
        return self._infos("WHERE run_id = ? ORDER BY rowid", (run_id,))

    def logs_with_prefix(self, prefix: str) -> list[LogInfo]:
        """The logs whose id starts with ``prefix`` (hex digits only: no LIKE specials)."""
        return self._infos(
            "WHERE log_id >= ? AND log_id < ? ORDER BY rowid LIMIT 10", (prefix, prefix + "g")
        )

    def logs_by_id(self, log_ids: Sequence[str]) -> list[LogInfo]:
        """The logs of ``log_ids`` (a page's: a few hundred at most), in the order opened."""
        if not log_ids:
            return []
        marks = ",".join("?" * len(log_ids))
        return self._infos(f"WHERE log_id IN ({marks}) ORDER BY rowid", tuple(log_ids))

    def logs_of_step(self, run_id: str, step: str) -> list[LogInfo]:
        """The logs of a run's step named ``STEP`` or ``JOB.STEP`` (by the index, not the
        run's other steps)."""
        job, _, name = step.partition(".")
        return self._infos(
            "WHERE run_id = ? AND (step = ? OR (job = ? AND step = ?)) ORDER BY rowid",
            (run_id, step, job, name),
        )

    def run_workflow(self, run_id: str) -> str | None:
        """The workflow of a run that has logs (one row read)."""
        with self.store.sql("reading step logs"):
            row = self.db.execute(
                "SELECT workflow FROM step_log WHERE run_id = ? LIMIT 1", (run_id,)
            ).fetchone()
        return row[0] if row is not None else None

    def run_counts(self, run_id: str) -> tuple[int, int]:
        """(logs, logs still open) of a run."""
        with self.store.sql("reading step logs"):
            row = self.db.execute(
                "SELECT COUNT(*), COALESCE(SUM(ended_epoch IS NULL), 0) FROM step_log "
                "WHERE run_id = ?",
                (run_id,),
            ).fetchone()
        return int(row[0]), int(row[1])

    def _infos(self, where: str, params: tuple) -> list[LogInfo]:
        with self.store.sql("reading step logs"):
            rows = self.db.execute(
                f"SELECT {INFO_COLUMNS} FROM step_log {where}", params
            ).fetchall()
        return [log_info(r) for r in rows]

    def chunks(
        self, log_ids: Sequence[str], *, after: int, limit_bytes: int
    ) -> tuple[list[StoredChunk], bool]:
        """The chunks of ``log_ids`` after chunk ``after``, oldest first, up to about
        ``limit_bytes`` of text (at least one chunk), and whether more are stored."""
        if not log_ids:
            return [], False
        marks = ",".join("?" * len(log_ids))
        return self._chunks(f"log_id IN ({marks})", (*log_ids,), after, limit_bytes)

    def chunks_of_run(
        self, run_id: str, *, after: int, limit_bytes: int
    ) -> tuple[list[StoredChunk], bool]:
        """The chunks of every log of a run after chunk ``after``, as :meth:`chunks`: the
        whole run is read with one cursor (chunk ids only grow)."""
        return self._chunks(
            "log_id IN (SELECT log_id FROM step_log WHERE run_id = ?)",
            (run_id,),
            after,
            limit_bytes,
        )

    def _chunks(
        self, where: str, params: tuple, after: int, limit_bytes: int
    ) -> tuple[list[StoredChunk], bool]:
        """The page's chunk ids first, from the index alone (a run's chunks sorted by id
        cost their ids, never their text), then those rows."""
        with self.store.sql("reading step logs"):
            ids = [
                row[0]
                for row in self.db.execute(
                    f"SELECT id FROM step_log_chunk WHERE {where} AND id > ? ORDER BY id LIMIT ?",
                    (*params, after, PAGE_CHUNKS + 1),
                )
            ]
            more = len(ids) > PAGE_CHUNKS
            ids = ids[:PAGE_CHUNKS]
            if not ids:
                return [], False
            cursor = self.db.execute(
                f"SELECT {CHUNK_COLUMNS} FROM step_log_chunk WHERE id IN "
                f"({','.join('?' * len(ids))}) ORDER BY id",
                ids,
            )
            try:
                return page_of(cursor, limit_bytes=limit_bytes, more=more)
            finally:
                cursor.close()

    # -- collection --------------------------------------------------------------------------

    def runs(self) -> list[tuple[str, str]]:
        """(run id, workflow) of every workflow run that has logs."""
        with self.store.sql("reading step logs"):
            return self.db.execute(
                "SELECT DISTINCT run_id, workflow FROM step_log WHERE run_id IS NOT NULL"
            ).fetchall()

    def others(self) -> list[tuple[str, str, str, float]]:
        """(model type, model name, log id, end epoch) of every ended log of no workflow run
        (one still being written is never collected: its later chunks would have no row)."""
        with self.store.sql("reading step logs"):
            return self.db.execute(
                "SELECT model_type, model_name, log_id, ended_epoch "
                "FROM step_log WHERE run_id IS NULL AND ended_epoch IS NOT NULL"
            ).fetchall()

    def forget_orphans(self, *, limit: int = 100) -> int:
        """Chunks of no log (an earlier version wrote a forgotten log's later chunks), up to
        ``limit`` logs' worth a call."""
        with self.store.transaction(), self.store.sql("forgetting step logs", writing=True):
            ids = [
                row[0]
                for row in self.db.execute(
                    "SELECT DISTINCT log_id FROM step_log_chunk WHERE log_id NOT IN "
                    "(SELECT log_id FROM step_log) LIMIT ?",
                    (limit,),
                ).fetchall()
            ]
            return sum(
                self.db.execute("DELETE FROM step_log_chunk WHERE log_id = ?", (i,)).rowcount
                for i in ids
            )

    def forget_runs(self, run_ids: Iterable[str]) -> int:
        return self._forget("run_id = ?", [(r,) for r in run_ids])

    def forget_logs(self, log_ids: Iterable[str]) -> int:
        return self._forget("log_id = ?", [(i,) for i in log_ids])

    def forget_instances(self, instances: Iterable[tuple[str, str]]) -> int:
        return self._forget("model_type = ? AND model_name = ? AND run_id IS NULL", instances)

    def _forget(self, where: str, keys: Iterable[tuple], *, batch: int = 100) -> int:
        """Logs matching ``where`` for each key, with their chunks, a few keys to a
        transaction (a log of 32 MiB is a few hundred rows)."""
        keys = list(keys)
        removed = 0
        for at in range(0, len(keys), batch):
            with self.store.transaction(), self.store.sql("forgetting step logs", writing=True):
                for key in keys[at : at + batch]:
                    ids = [
                        row[0]
                        for row in self.db.execute(
                            f"SELECT log_id FROM step_log WHERE {where}", key
                        ).fetchall()
                    ]
                    for log_id in ids:
                        self.db.execute("DELETE FROM step_log_chunk WHERE log_id = ?", (log_id,))
                        self.db.execute("DELETE FROM step_log WHERE log_id = ?", (log_id,))
                    removed += len(ids)
        return removed


class SqliteLogs:
    """:class:`SqliteLogStore` behind the :class:`LogStore` seam: each call is the store's
    own (nothing waits), awaited."""

    def __init__(self, tables: SqliteLogStore) -> None:
        self.tables = tables

    def __repr__(self) -> str:
        return f"<SqliteLogs {self.tables!r}>"

    async def write(
        self,
        started: Sequence[LogStart],
        chunks: Sequence[Chunk],
        ended: Sequence[LogEnd],
        *,
        cap: int,
    ) -> None:
        self.tables.write(started, chunks, ended, cap=cap)

    async def logs_of_run(self, run_id: str) -> list[LogInfo]:
        return self.tables.logs_of_run(run_id)

    async def logs_with_prefix(self, prefix: str) -> list[LogInfo]:
        return self.tables.logs_with_prefix(prefix)

    async def logs_by_id(self, log_ids: Sequence[str]) -> list[LogInfo]:
        return self.tables.logs_by_id(log_ids)

    async def logs_of_step(self, run_id: str, step: str) -> list[LogInfo]:
        return self.tables.logs_of_step(run_id, step)

    async def run_workflow(self, run_id: str) -> str | None:
        return self.tables.run_workflow(run_id)

    async def run_counts(self, run_id: str) -> tuple[int, int]:
        return self.tables.run_counts(run_id)

    async def chunks(
        self, log_ids: Sequence[str], *, after: int, limit_bytes: int
    ) -> tuple[list[StoredChunk], bool]:
        return self.tables.chunks(log_ids, after=after, limit_bytes=limit_bytes)

    async def chunks_of_run(
        self, run_id: str, *, after: int, limit_bytes: int
    ) -> tuple[list[StoredChunk], bool]:
        return self.tables.chunks_of_run(run_id, after=after, limit_bytes=limit_bytes)

    async def runs(self) -> list[tuple[str, str]]:
        return self.tables.runs()

    async def others(self) -> list[tuple[str, str, str, float]]:
        return self.tables.others()

    async def forget_runs(self, run_ids: Iterable[str]) -> int:
        return self.tables.forget_runs(run_ids)

    async def forget_logs(self, log_ids: Iterable[str]) -> int:
        return self.tables.forget_logs(log_ids)

    async def forget_orphans(self, *, limit: int = 100) -> int:
        return self.tables.forget_orphans(limit=limit)

    async def forget_instances(self, instances: Iterable[tuple[str, str]]) -> int:
        return self.tables.forget_instances(instances)

    async def end_open(self, now: float) -> int:
        return self.tables.end_open(now)


def log_info(r: Sequence) -> LogInfo:
    """A log's row, read as :data:`INFO_COLUMNS`."""
    return LogInfo(
        log_id=r[0],
        owner=LogOwner(
            model_type=r[5],
            model_name=r[6],
            method=r[7],
            run_id=r[1],
            workflow=r[2],
            job=r[3],
            step=r[4],
        ),
        worker=r[8],
        attempt=r[9],
        started_at=iso(r[10]),
        ended_at=iso(r[11]) if r[11] is not None else None,
        lines=r[12],
        bytes=r[13],
        dropped_lines=r[14],
        dropped_bytes=r[15],
    )


def page_of(
    rows: Iterable[Sequence], *, limit_bytes: int, more: bool
) -> tuple[list[StoredChunk], bool]:
    """Chunk rows (read as :data:`CHUNK_COLUMNS`, oldest first) up to about ``limit_bytes`` of
    text, at least one; and whether more are stored (``more``: past the rows read)."""
    out: list[StoredChunk] = []
    size = 0
    for row in rows:
        if out and size + row[6] > limit_bytes:
            return out, True
        out.append(StoredChunk(row[0], row[1], row[2], row[3], row[4], row[6], chunk_lines(row[5])))
        size += row[6]
    return out, more


def added(chunks: Sequence[Chunk]) -> dict[str, tuple[int, int, int]]:
    """What a batch adds to each log: (bytes, lines up to, bytes up to)."""
    totals: dict[str, tuple[int, int, int]] = {}
    for c in chunks:
        size, lines, upto = totals.get(c.log_id, (0, 0, 0))
        totals[c.log_id] = (
            size + c.size,
            max(lines, c.first_line + len(c.lines)),
            max(upto, c.first_byte + c.size),
        )
    return totals


def chunk_lines(body: str) -> list[str]:
    """The lines a chunk's body holds (JSON text); a damaged body reads as one line saying so."""
    try:
        lines = json.loads(body)
    except (ValueError, RecursionError):
        return ["(a damaged chunk of this log could not be read)"]
    if not isinstance(lines, list):
        return ["(a damaged chunk of this log could not be read)"]
    return [line if isinstance(line, str) else str(line) for line in lines]


__all__ = [
    "Chunk",
    "LogEnd",
    "LogInfo",
    "LogStart",
    "LogStore",
    "SqliteLogStore",
    "SqliteLogs",
    "StoredChunk",
]
