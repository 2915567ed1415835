"""Step logs in PostgreSQL: the same two tables as SQLite's (``swamp.store.step_logs``), for
several orchestrators.

A chunk's id is a reader's cursor (``swamp logs --follow`` asks for the chunks after the last
it saw), so ids must grow in the order chunks become visible — the order of commits. A
sequence alone does not give that: two batches in flight take their ids in one order and may
commit in the other, and a reader between the two commits would step past the first batch's
chunks for good. So each batch's transaction first takes one advisory lock, held until it
commits: batches commit one at a time, in the order they took their ids. (Batches are a few
a second per orchestrator; writing them one at a time costs nothing a reader would notice.)

Everything else is SQLite's store, statement for statement: a log's row comes with its first
line, a chunk of no log is never written, each log is cut to the cap in the batch that grows
it, and collection forgets logs with their chunks, a few keys to a transaction.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from swamp.domain.step_logs import overflow
from swamp.store import pg
from swamp.store.step_logs import (
    CHUNK_COLUMNS,
    INFO_COLUMNS,
    PAGE_CHUNKS,
    Chunk,
    LogEnd,
    LogInfo,
    LogStart,
    StoredChunk,
    added,
    log_info,
    page_of,
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS step_log (
    log_id        TEXT COLLATE "C" PRIMARY KEY,
    opened        BIGSERIAL,
    run_id        TEXT COLLATE "C",
    workflow      TEXT,
    job           TEXT,
    step          TEXT,
    model_type    TEXT NOT NULL,
    model_name    TEXT NOT NULL,
    method        TEXT NOT NULL,
    worker        TEXT,
    attempt       INTEGER NOT NULL,
    started_epoch DOUBLE PRECISION NOT NULL,
    ended_epoch   DOUBLE PRECISION,
    lines         BIGINT NOT NULL DEFAULT 0,
    bytes         BIGINT NOT NULL DEFAULT 0,
    kept_bytes    BIGINT NOT NULL DEFAULT 0,
    dropped_lines BIGINT NOT NULL DEFAULT 0,
    dropped_bytes BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS step_log_run_step ON step_log (run_id, job, step)
    WHERE run_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS step_log_owner ON step_log (model_type, model_name)
    WHERE run_id IS NULL;
CREATE SEQUENCE IF NOT EXISTS step_log_chunk_id;
CREATE TABLE IF NOT EXISTS step_log_chunk (
    id          BIGINT PRIMARY KEY,
    log_id      TEXT COLLATE "C" NOT NULL,
    first_line  BIGINT  NOT NULL,
    first_byte  BIGINT  NOT NULL,
    line_count  INTEGER NOT NULL,
    byte_count  INTEGER NOT NULL,
    streams     TEXT    NOT NULL,
    body        TEXT    NOT NULL
);
CREATE INDEX IF NOT EXISTS step_log_chunk_log ON step_log_chunk (log_id, id)
"""
_WRITE_LOCK = 0x534C4F47  # 'SLOG': batches commit one at a time, in the order of their ids
ROWS_PER_STATEMENT = 500  # rows of a multi-row INSERT (parameters stay far below 65,535)
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode


def _marks(count: int, start: int = 1) -> str:
    return ",".join(f"${n}" for n in range(start, start + count))


class PgLogStore:
    """:class:`~swamp.store.step_logs.LogStore` on a PostgreSQL pool (the record store's)."""

    def __init__(self, pool: pg.Pool, *, orchestrator: str | None = None) -> None:
        self.pool = pool
        # the orchestrator writing (its logs name it: whoever reconciles it when it dies
        # ends those it left open); None for a writer of no orchestrator
        self.orchestrator = orchestrator

    def __repr__(self) -> str:
        return f"<PgLogStore {self.pool!r}>"

    @classmethod
    async def open(cls, pool: pg.Pool, *, orchestrator: str | None = None) -> PgLogStore:
        """The store on ``pool``, its tables made if they are not there yet (and a table an
        earlier version made given the column that names each log's writer)."""
        await pg.make_schema(pool, _SCHEMA)
        await pg.add_column(  # (a table an earlier version made: each log's writer)
            pool,
            "step_log",
            "orchestrator",
            'ALTER TABLE step_log ADD COLUMN orchestrator TEXT COLLATE "C"',
            "CREATE INDEX step_log_open ON step_log (orchestrator) WHERE ended_epoch IS NULL",
        )
        return cls(pool, orchestrator=orchestrator)

    # -- writes ------------------------------------------------------------------------------

    async def write(
        self,
        started: Sequence[LogStart],
        chunks: Sequence[Chunk],
        ended: Sequence[LogEnd],
        *,
        cap: int,
    ) -> None:
        """One batch, one transaction (after the batches before it: see the module)."""
        async with self.pool.connection() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", (_WRITE_LOCK,))
            for at in range(0, len(started), ROWS_PER_STATEMENT):
                rows = started[at : at + ROWS_PER_STATEMENT]
                params: list = []
                for s in rows:
                    params += [s.log_id, s.owner.run_id, s.owner.workflow, s.owner.job]
                    params += [s.owner.step, s.owner.model_type, s.owner.model_name]
                    params += [s.owner.method, s.worker, s.attempt, float(s.started_epoch)]
                    params.append(self.orchestrator)
                values = ",".join(f"({_marks(12, 12 * n + 1)})" for n in range(len(rows)))
                await conn.execute(
                    "INSERT INTO step_log (log_id, run_id, workflow, job, step, model_type, "
                    "model_name, method, worker, attempt, started_epoch, orchestrator) "
                    f"VALUES {values} ON CONFLICT (log_id) DO NOTHING",
                    params,
                )
            if chunks:
                ids = await conn.execute(
                    "SELECT nextval('step_log_chunk_id') FROM generate_series(1, $1)",
                    (len(chunks),),
                )
                numbered = list(zip(sorted(r[0] for r in ids.rows), chunks, strict=True))
                for at in range(0, len(numbered), ROWS_PER_STATEMENT):
                    rows_ = numbered[at : at + ROWS_PER_STATEMENT]
                    params = []
                    for chunk_id, c in rows_:
                        params += [chunk_id, c.log_id, c.first_line, c.first_byte]
                        params += [len(c.lines), c.size, c.streams, _ENCODE(list(c.lines))]
                    values = ",".join(f"({_marks(8, 8 * n + 1)})" for n in range(len(rows_)))
                    # only for a log that has its row (see SqliteLogStore.write)
                    await conn.execute(
                        "INSERT INTO step_log_chunk (id, log_id, first_line, first_byte, "
                        "line_count, byte_count, streams, body) SELECT v.* FROM (VALUES "
                        f"{values}) AS v(id, log_id, first_line, first_byte, line_count, "
                        "byte_count, streams, body) WHERE EXISTS (SELECT 1 FROM step_log s "
                        "WHERE s.log_id = v.log_id)",
                        params,
                    )
            for log_id, (size, lines, size_upto) in added(chunks).items():
                await conn.execute(
                    "UPDATE step_log SET kept_bytes = kept_bytes + $1, "
                    "lines = GREATEST(lines, $2), bytes = GREATEST(bytes, $3) WHERE log_id = $4",
                    (size, lines, size_upto, log_id),
                )
                await self._cap(conn, log_id, cap)
            for e in ended:
                await conn.execute(
                    "UPDATE step_log SET ended_epoch = $1, lines = GREATEST(lines, $2), "
                    "bytes = GREATEST(bytes, $3) WHERE log_id = $4",
                    (float(e.ended_epoch), e.lines, e.bytes, e.log_id),
                )

    async def _cap(self, conn: pg.Connection, log_id: str, cap: int) -> None:
        """As SQLite's: the oldest chunks go until the log fits ``cap``; the log says where
        what is kept starts."""
        kept = await conn.execute("SELECT kept_bytes FROM step_log WHERE log_id = $1", (log_id,))
        if kept.rows and kept.rows[0][0] > cap:
            rows = (
                await conn.execute(
                    "SELECT id, byte_count FROM step_log_chunk WHERE log_id = $1 ORDER BY id",
                    (log_id,),
                )
            ).rows
            drop = overflow([size for _, size in rows], cap)
            if drop:
                await conn.execute(
                    "DELETE FROM step_log_chunk WHERE log_id = $1 AND id <= $2",
                    (log_id, rows[drop - 1][0]),
                )
                await conn.execute(
                    "UPDATE step_log SET kept_bytes = $1 WHERE log_id = $2",
                    (sum(size for _, size in rows[drop:]), log_id),
                )
        first = await conn.execute(
            "SELECT first_line, first_byte FROM step_log_chunk WHERE log_id = $1 "
            "ORDER BY id LIMIT 1",
            (log_id,),
        )
        if first.rows:
            await conn.execute(
                "UPDATE step_log SET dropped_lines = $1, dropped_bytes = $2 WHERE log_id = $3",
                (first.rows[0][0], first.rows[0][1], log_id),
            )

    async def end_open(self, now: float) -> int:
        """Boot, alone on the database: the logs no orchestrator writes any more ended."""
        async with self.pool.connection() as conn:
            done = await conn.execute(
                "UPDATE step_log SET ended_epoch = $1 WHERE ended_epoch IS NULL", (float(now),)
            )
        return done.rowcount

    async def end_left(self, now: float, orchestrator: str | None) -> int:
        """The logs ``orchestrator`` left open ended: one that died, whose lines stopped
        coming (``None``: those of a writer that named none, an earlier version's)."""
        async with self.pool.connection() as conn:
            done = await conn.execute(
                "UPDATE step_log SET ended_epoch = $1 WHERE ended_epoch IS NULL AND "
                + ("orchestrator IS NULL" if orchestrator is None else "orchestrator = $2"),
                (float(now),) if orchestrator is None else (float(now), orchestrator),
            )
        return done.rowcount

    # -- reads -------------------------------------------------------------------------------

    async def _query(self, sql: str, params: Sequence[object] = ()) -> list[tuple]:
        async with self.pool.connection() as conn:
            return (await conn.execute(sql, params)).rows

    async def _infos(self, where: str, params: Sequence[object]) -> list[LogInfo]:
        return [
            log_info(r)
            for r in await self._query(f"SELECT {INFO_COLUMNS} FROM step_log {where}", params)
        ]

    async def logs_of_run(self, run_id: str) -> list[LogInfo]:
        return await self._infos("WHERE run_id = $1 ORDER BY opened", (run_id,))

    async def logs_with_prefix(self, prefix: str) -> list[LogInfo]:
        return await self._infos(
            "WHERE log_id >= $1 AND log_id < $2 ORDER BY opened LIMIT 10", (prefix, prefix + "g")
        )

    async def logs_by_id(self, log_ids: Sequence[str]) -> list[LogInfo]:
        if not log_ids:
            return []
        return await self._infos(
            f"WHERE log_id IN ({_marks(len(log_ids))}) ORDER BY opened", tuple(log_ids)
        )

    async def logs_of_step(self, run_id: str, step: str) -> list[LogInfo]:
        job, _, name = step.partition(".")
        return await self._infos(
            "WHERE run_id = $1 AND (step = $2 OR (job = $3 AND step = $4)) ORDER BY opened",
            (run_id, step, job, name),
        )

    async def run_workflow(self, run_id: str) -> str | None:
        rows = await self._query(
            "SELECT workflow FROM step_log WHERE run_id = $1 LIMIT 1", (run_id,)
        )
        return rows[0][0] if rows else None

    async def run_counts(self, run_id: str) -> tuple[int, int]:
        [row] = await self._query(
            "SELECT COUNT(*), COUNT(*) FILTER (WHERE ended_epoch IS NULL) FROM step_log "
            "WHERE run_id = $1",
            (run_id,),
        )
        return int(row[0]), int(row[1])

    async def chunks(
        self, log_ids: Sequence[str], *, after: int, limit_bytes: int
    ) -> tuple[list[StoredChunk], bool]:
        if not log_ids:
            return [], False
        return await self._chunks(
            f"log_id IN ({_marks(len(log_ids))})", tuple(log_ids), after, limit_bytes
        )

    async def chunks_of_run(
        self, run_id: str, *, after: int, limit_bytes: int
    ) -> tuple[list[StoredChunk], bool]:
        return await self._chunks(
            "log_id IN (SELECT log_id FROM step_log WHERE run_id = $1)",
            (run_id,),
            after,
            limit_bytes,
        )

    async def _chunks(
        self, where: str, params: tuple, after: int, limit_bytes: int
    ) -> tuple[list[StoredChunk], bool]:
        """The page's ids first (the index alone), then those rows, up to about
        ``limit_bytes`` of text (at least one chunk)."""
        n = len(params)
        ids = [
            row[0]
            for row in await self._query(
                f"SELECT id FROM step_log_chunk WHERE {where} AND id > ${n + 1} "
                f"ORDER BY id LIMIT ${n + 2}",
                (*params, after, PAGE_CHUNKS + 1),
            )
        ]
        more = len(ids) > PAGE_CHUNKS
        ids = ids[:PAGE_CHUNKS]
        if not ids:
            return [], False
        rows = await self._query(
            f"SELECT {CHUNK_COLUMNS} FROM step_log_chunk WHERE id IN ({_marks(len(ids))}) "
            "ORDER BY id",
            ids,
        )
        return page_of(rows, limit_bytes=limit_bytes, more=more)

    # -- collection --------------------------------------------------------------------------

    async def runs(self) -> list[tuple[str, str]]:
        rows = await self._query(
            "SELECT DISTINCT run_id, workflow FROM step_log WHERE run_id IS NOT NULL"
        )
        return [(r[0], r[1]) for r in rows]

    async def others(self) -> list[tuple[str, str, str, float]]:
        rows = await self._query(
            "SELECT model_type, model_name, log_id, ended_epoch "
            "FROM step_log WHERE run_id IS NULL AND ended_epoch IS NOT NULL"
        )
        return [(r[0], r[1], r[2], r[3]) for r in rows]

    async def forget_orphans(self, *, limit: int = 100) -> int:
        async with self.pool.connection() as conn, conn.transaction():
            ids = (
                await conn.execute(
                    "SELECT DISTINCT log_id FROM step_log_chunk c WHERE NOT EXISTS "
                    "(SELECT 1 FROM step_log s WHERE s.log_id = c.log_id) LIMIT $1",
                    (limit,),
                )
            ).rows
            removed = 0
            for (log_id,) in ids:
                done = await conn.execute("DELETE FROM step_log_chunk WHERE log_id = $1", (log_id,))
                removed += done.rowcount
            return removed

    async def forget_runs(self, run_ids: Iterable[str]) -> int:
        return await self._forget("run_id = $1", [(r,) for r in run_ids])

    async def forget_logs(self, log_ids: Iterable[str]) -> int:
        return await self._forget("log_id = $1", [(i,) for i in log_ids])

    async def forget_instances(self, instances: Iterable[tuple[str, str]]) -> int:
        return await self._forget(
            "model_type = $1 AND model_name = $2 AND run_id IS NULL", list(instances)
        )

    async def _forget(self, where: str, keys: list[tuple], *, batch: int = 100) -> int:
        removed = 0
        for at in range(0, len(keys), batch):
            async with self.pool.connection() as conn, conn.transaction():
                for key in keys[at : at + batch]:
                    ids = (
                        await conn.execute(f"SELECT log_id FROM step_log WHERE {where}", key)
                    ).rows
                    for (log_id,) in ids:
                        await conn.execute(
                            "DELETE FROM step_log_chunk WHERE log_id = $1", (log_id,)
                        )
                        await conn.execute("DELETE FROM step_log WHERE log_id = $1", (log_id,))
                    removed += len(ids)
        return removed
