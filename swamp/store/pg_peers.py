"""The orchestrators serving one PostgreSQL, and the steps waiting for any of them.

Two small tables beside the records (``swamp.orchestrator.peers`` uses them):

- ``swamp_orchestrator``: one row per orchestrator that serves the database — its id (new at
  each start), the URL its peers reach it at, the SHA-256 of its peer credential (never the
  secret) and its CA pin when it made its own. A row goes only after whoever took its owner's
  liveness lock has reconciled what it left: a row whose lock is free names an orchestrator
  that died, and a record that names an orchestrator with no row was left by one already gone.
- ``swamp_shared_queue``: a step that no worker of its orchestrator (its *origin*) could take
  waits here too. Another orchestrator with a matching free worker *claims* it by
  compare-and-swap (``claimed_by`` from NULL), the origin *takes* the claim (``taken``) and
  sends the step to the claimer, which runs it on its own socket and deletes the row; a step
  whose origin gave up on it is deleted by its origin, claimed or not.
- ``swamp_shared_outcome``: how a step run for another orchestrator ended, written by the
  claimer only when its link to the origin broke before it could answer (the relay is the
  normal way; this is what makes a broken relay lose nothing). The origin takes it (deletes
  it) once; an origin's rows go with it.

Every statement is one round trip and its own transaction; nothing here holds a lock.
"""

from __future__ import annotations

import json

from swamp.domain.peers import PeerRow, SharedStep
from swamp.store import pg

_SCHEMA = """
CREATE TABLE IF NOT EXISTS swamp_orchestrator (
    id              TEXT COLLATE "C" PRIMARY KEY,
    url             TEXT NOT NULL,
    credential_hash TEXT NOT NULL,
    ca_pem          TEXT,
    started_epoch   DOUBLE PRECISION NOT NULL
);
CREATE TABLE IF NOT EXISTS swamp_shared_queue (
    queue_id     TEXT COLLATE "C" PRIMARY KEY,
    origin       TEXT COLLATE "C" NOT NULL,
    placement    TEXT NOT NULL,
    priority     INTEGER NOT NULL,
    submitter    TEXT NOT NULL,
    queued_epoch DOUBLE PRECISION NOT NULL,
    claimed_by   TEXT COLLATE "C",
    worker       TEXT,
    dispatch_id  TEXT,
    taken        BOOLEAN NOT NULL DEFAULT FALSE
);
CREATE INDEX IF NOT EXISTS swamp_shared_queue_origin ON swamp_shared_queue (origin);
CREATE INDEX IF NOT EXISTS swamp_shared_queue_claimer ON swamp_shared_queue (claimed_by)
    WHERE claimed_by IS NOT NULL;
CREATE TABLE IF NOT EXISTS swamp_shared_outcome (
    send_id       TEXT COLLATE "C" PRIMARY KEY,
    origin        TEXT COLLATE "C" NOT NULL,
    claimer       TEXT COLLATE "C" NOT NULL,
    reply         TEXT NOT NULL,
    written_epoch DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS swamp_shared_outcome_origin ON swamp_shared_outcome (origin)
"""
_ENCODE = json.JSONEncoder(separators=(",", ":"), sort_keys=True).encode
MAX_PAYLOAD = 7000  # bytes of a NOTIFY's payload (the server refuses 8000 and more)


_STEP_COLUMNS = (
    "queue_id, origin, placement, priority, submitter, queued_epoch, claimed_by, worker, "
    "dispatch_id, taken"
)


def _step(row: tuple) -> SharedStep:
    placement = json.loads(row[2])
    return SharedStep(
        row[0],
        row[1],
        placement if isinstance(placement, dict) else {},
        int(row[3]),
        row[4],
        float(row[5]),
        row[6],
        row[7],
        row[8],
        bool(row[9]),
    )


_PEER_COLUMNS = "id, url, credential_hash, ca_pem, started_epoch, features, heartbeat"


def _peer(row: tuple) -> PeerRow:
    features = frozenset((row[5] or "").split())
    return PeerRow(row[0], row[1], row[2], row[3], float(row[4]), features, float(row[6] or 0))


class PgPeers:
    """The two tables on a pool (the record store's)."""

    def __init__(self, pool: pg.Pool) -> None:
        self.pool = pool

    def __repr__(self) -> str:
        return f"<PgPeers {self.pool!r}>"

    @classmethod
    async def open(cls, pool: pg.Pool) -> PgPeers:
        await pg.make_schema(pool, _SCHEMA)
        await pg.add_column(  # (a registry an earlier version made: what each can do)
            pool,
            "swamp_orchestrator",
            "features",
            "ALTER TABLE swamp_orchestrator ADD COLUMN features TEXT",
        )
        await pg.add_column(  # (…and the longest heartbeat each told a worker)
            pool,
            "swamp_orchestrator",
            "heartbeat",
            "ALTER TABLE swamp_orchestrator ADD COLUMN heartbeat DOUBLE PRECISION",
        )
        return cls(pool)

    async def _execute(self, sql: str, params: tuple = ()) -> pg.Result:
        async with self.pool.connection() as conn:
            return await conn.execute(sql, params)

    # -- the orchestrators -------------------------------------------------------------------

    async def register(self, row: PeerRow) -> None:
        await self._execute(
            "INSERT INTO swamp_orchestrator (id, url, credential_hash, ca_pem, started_epoch, "
            "features, heartbeat) VALUES ($1, $2, $3, $4, $5, $6, $7)",
            (row.id, row.url, row.credential_hash, row.ca_pem, row.started_epoch,
             " ".join(sorted(row.features)), row.heartbeat),
        )  # fmt: skip

    async def told(self, orchestrator: str, heartbeat: float) -> None:
        """``orchestrator`` tells its workers ``heartbeat`` now (the registry keeps the
        longest)."""
        await self._execute(
            "UPDATE swamp_orchestrator SET heartbeat = GREATEST(COALESCE(heartbeat, 0), $2) "
            "WHERE id = $1",
            (orchestrator, heartbeat),
        )

    async def orchestrators(self) -> list[PeerRow]:
        result = await self._execute(
            f"SELECT {_PEER_COLUMNS} FROM swamp_orchestrator ORDER BY started_epoch, id"
        )
        return [_peer(r) for r in result.rows]

    async def get(self, orchestrator: str) -> PeerRow | None:
        result = await self._execute(
            f"SELECT {_PEER_COLUMNS} FROM swamp_orchestrator WHERE id = $1",
            (orchestrator,),
        )
        return next((_peer(r) for r in result.rows), None)

    async def forget(self, orchestrator: str) -> None:
        """``orchestrator`` is gone and what it left is reconciled: its row, the steps it was
        waiting for go; the steps it claimed and never took may be claimed again."""
        async with self.pool.connection() as conn, conn.transaction():
            await conn.execute("DELETE FROM swamp_shared_queue WHERE origin = $1", (orchestrator,))
            await conn.execute(
                "UPDATE swamp_shared_queue SET claimed_by = NULL, worker = NULL, "
                "dispatch_id = NULL WHERE claimed_by = $1 AND NOT taken",
                (orchestrator,),
            )
            await conn.execute(
                "DELETE FROM swamp_shared_queue WHERE claimed_by = $1 AND taken", (orchestrator,)
            )
            await conn.execute(
                "DELETE FROM swamp_shared_outcome WHERE origin = $1", (orchestrator,)
            )
            await conn.execute("DELETE FROM swamp_orchestrator WHERE id = $1", (orchestrator,))

    # -- outcomes a broken relay could not carry ------------------------------------------------

    async def write_outcome(
        self, send_id: str, origin: str, claimer: str, reply: dict, *, wake: str, at: float
    ) -> bool:
        """Keep how ``send_id`` ended for ``origin`` and tell it (on ``wake``, its own
        channel), in one round trip; nothing if ``origin`` is gone (nobody would take it).
        Whether it was kept."""
        result = await self._execute(
            "WITH kept AS (INSERT INTO swamp_shared_outcome (send_id, origin, claimer, "
            "reply, written_epoch) SELECT $1, $2, $3, $4, $5 WHERE EXISTS (SELECT 1 FROM "
            "swamp_orchestrator WHERE id = $2) ON CONFLICT (send_id) DO NOTHING "
            "RETURNING 1) SELECT pg_notify($6, $7) FROM kept",
            (send_id, origin, claimer, _ENCODE(reply), at, wake,
             _ENCODE({"outcome": send_id})),
        )  # fmt: skip
        return bool(result.rows)

    async def take_outcome(self, send_id: str, origin: str) -> dict | None:
        """The outcome kept for ``origin``'s ``send_id``, deleted as it is read (once)."""
        result = await self._execute(
            "DELETE FROM swamp_shared_outcome WHERE send_id = $1 AND origin = $2 RETURNING reply",
            (send_id, origin),
        )
        if not result.rows:
            return None
        reply = json.loads(result.rows[0][0])
        return reply if isinstance(reply, dict) else {}

    async def collect_outcomes(self, before_epoch: float) -> int:
        """Delete the outcomes kept before ``before_epoch``: one its origin takes is taken
        within seconds; an older one was never going to be (its answer had arrived after
        all, or its origin stopped waiting)."""
        result = await self._execute(
            "DELETE FROM swamp_shared_outcome WHERE written_epoch < $1", (before_epoch,)
        )
        return result.rowcount

    async def kept_answers(self, origin: str) -> list[dict]:
        """Every answer kept for ``origin`` (read before it is forgotten: whoever takes its
        steps over decides with them)."""
        result = await self._execute(
            "SELECT reply FROM swamp_shared_outcome WHERE origin = $1", (origin,)
        )
        answers = [json.loads(row[0]) for row in result.rows]
        return [a for a in answers if isinstance(a, dict)]

    async def drop_outcome(self, send_id: str, origin: str) -> None:
        """``origin`` no longer waits for it (its caller left)."""
        await self._execute(
            "DELETE FROM swamp_shared_outcome WHERE send_id = $1 AND origin = $2",
            (send_id, origin),
        )

    # -- the shared queue --------------------------------------------------------------------

    async def publish(
        self,
        step: SharedStep,
        *,
        wake: str = "swamp_orchestrators",
        holder: tuple[str, str, str] | None = None,
        holder_prefix: str = "",
    ) -> None:
        """Insert it and tell the orchestrators listening on ``wake``, in one round trip: the
        notification carries the step as :func:`published` reads it, so a claimer need not
        read the table first. ``holder``: the key of the record of the one worker that may
        take it (a targeted step) — the notification goes only to the orchestrator that
        record names (its channel, ``holder_prefix`` and its id), none if it is the origin
        itself; to ``wake`` when the worker is held by none."""
        said = _ENCODE(
            {
                "step": step.queue_id,
                "origin": step.origin,
                "placement": step.placement,
                "priority": step.priority,
                "queued": step.queued_epoch,
            }
        )
        if len(said.encode()) > MAX_PAYLOAD:  # (a placement of many long labels) a plain
            said = step.origin  # wake-up: the others read it from the table
        row = (
            step.queue_id,
            step.origin,
            _ENCODE(step.placement),
            step.priority,
            step.submitter,
            step.queued_epoch,
            wake,
            said,
        )
        added = (
            "WITH added AS (INSERT INTO swamp_shared_queue (queue_id, origin, placement, "
            "priority, submitter, queued_epoch) VALUES ($1, $2, $3, $4, $5, $6) "
            "ON CONFLICT (queue_id) DO NOTHING RETURNING 1)"
        )
        if holder is None:
            await self._execute(f"{added} SELECT pg_notify($7, $8) FROM added", row)
            return
        # the worker's record as last written (its primary key's order): who holds it
        await self._execute(
            f"{added}, record AS (SELECT attributes::jsonb AS a FROM data WHERE "
            "model_type = $9 AND model_name = $10 AND name = $11 ORDER BY version DESC "
            "LIMIT 1), held AS (SELECT a->>'orchestrator' AS id FROM record WHERE "
            "a->>'status' <> 'disconnected'), told AS (SELECT CASE "
            "WHEN (SELECT id FROM held) = $2 THEN NULL "
            "WHEN (SELECT id FROM held) <> '' THEN $12 || left((SELECT id FROM held), 32) "
            "ELSE $7 END AS channel) "
            "SELECT pg_notify(channel, $8) FROM added, told WHERE channel IS NOT NULL",
            (*row, *holder, holder_prefix),
        )

    async def withdraw(self, queue_id: str) -> None:
        """The origin no longer waits for it (it ran here, timed out, or its caller left)."""
        await self._execute("DELETE FROM swamp_shared_queue WHERE queue_id = $1", (queue_id,))

    async def withdraw_unclaimed(self, queue_id: str) -> bool:
        """Withdraw it if nobody claimed it yet; ``False``: another orchestrator has."""
        result = await self._execute(
            "DELETE FROM swamp_shared_queue WHERE queue_id = $1 AND claimed_by IS NULL",
            (queue_id,),
        )
        if result.rowcount:
            return True
        return not (
            await self._execute("SELECT 1 FROM swamp_shared_queue WHERE queue_id = $1", (queue_id,))
        ).rows

    async def claimable(
        self, me: str, *, after: SharedStep | None = None, limit: int = 500
    ) -> list[SharedStep]:
        """Others' steps nobody claimed yet, highest priority first, then oldest: a page of
        ``limit``, the one ``after`` a step of the page before (by the same order)."""
        if after is None:
            result = await self._execute(
                f"SELECT {_STEP_COLUMNS} FROM swamp_shared_queue WHERE claimed_by IS NULL "
                "AND origin <> $1 ORDER BY priority DESC, queued_epoch, queue_id LIMIT $2",
                (me, limit),
            )
        else:
            result = await self._execute(
                f"SELECT {_STEP_COLUMNS} FROM swamp_shared_queue WHERE claimed_by IS NULL "
                "AND origin <> $1 AND (-priority, queued_epoch, queue_id) > ($3, $4, $5) "
                "ORDER BY priority DESC, queued_epoch, queue_id LIMIT $2",
                (me, limit, -after.priority, after.queued_epoch, after.queue_id),
            )
        return [_step(r) for r in result.rows]

    async def claim(
        self, queue_id: str, me: str, worker: str, dispatch_id: str, *, wake: str | None = None
    ) -> bool:
        """Claim it for ``worker``'s slot reserved as ``dispatch_id``: ``False`` if another
        orchestrator was first (or its origin withdrew it). Claimed, every orchestrator
        listening on ``wake`` is woken in the same round trip."""
        if wake is None:
            result = await self._execute(
                "UPDATE swamp_shared_queue SET claimed_by = $2, worker = $3, dispatch_id = $4 "
                "WHERE queue_id = $1 AND claimed_by IS NULL",
                (queue_id, me, worker, dispatch_id),
            )
            return result.rowcount == 1
        result = await self._execute(
            "WITH claimed AS (UPDATE swamp_shared_queue SET claimed_by = $2, worker = $3, "
            "dispatch_id = $4 WHERE queue_id = $1 AND claimed_by IS NULL RETURNING origin) "
            "SELECT pg_notify($5 || left(claimed.origin, 32), $6) FROM claimed",
            (
                queue_id,
                me,
                worker,
                dispatch_id,
                wake,
                _ENCODE(
                    {"step": queue_id, "claimer": me, "worker": worker, "dispatch": dispatch_id}
                ),
            ),
        )
        return bool(result.rows)

    async def take_claims(self, origin: str) -> list[SharedStep]:
        """The origin's steps another orchestrator claimed, taken (each once) in one round
        trip: the origin sends each to its claimer, or withdraws it."""
        result = await self._execute(
            "UPDATE swamp_shared_queue SET taken = TRUE WHERE origin = $1 "
            f"AND claimed_by IS NOT NULL AND NOT taken RETURNING {_STEP_COLUMNS}",
            (origin,),
        )
        return [_step(r) for r in result.rows]

    async def claimed_for(self, origin: str) -> list[SharedStep]:
        """The origin's steps another orchestrator claimed and the origin has not taken."""
        result = await self._execute(
            f"SELECT {_STEP_COLUMNS} FROM swamp_shared_queue WHERE origin = $1 "
            "AND claimed_by IS NOT NULL AND NOT taken",
            (origin,),
        )
        return [_step(r) for r in result.rows]

    async def take(self, queue_id: str, claimer: str) -> bool:
        """The origin sends the step to its claimer: ``False`` if the claim went meanwhile."""
        result = await self._execute(
            "UPDATE swamp_shared_queue SET taken = TRUE WHERE queue_id = $1 AND claimed_by = $2",
            (queue_id, claimer),
        )
        return result.rowcount == 1

    async def mark_taken(self, queue_ids: list[str], origin: str) -> None:
        """The origin took these claims (heard of in their notifications): not offered to it
        again, and a dead claimer's are deleted rather than offered to others."""
        await self._execute(
            "UPDATE swamp_shared_queue SET taken = TRUE WHERE queue_id IN "
            "(SELECT jsonb_array_elements_text($1::jsonb)) AND origin = $2 "
            "AND claimed_by IS NOT NULL",
            (_ENCODE(queue_ids), origin),
        )

    async def claims_of(self, me: str) -> dict[str, bool]:
        """The steps ``me`` claimed that are still here: queue id → taken by their origin."""
        result = await self._execute(
            "SELECT queue_id, taken FROM swamp_shared_queue WHERE claimed_by = $1", (me,)
        )
        return {r[0]: bool(r[1]) for r in result.rows}

    async def done(self, queue_id: str, claimer: str) -> None:
        """The claimer has the step (or gives its claim up): the row goes."""
        await self._execute(
            "DELETE FROM swamp_shared_queue WHERE queue_id = $1 AND claimed_by = $2",
            (queue_id, claimer),
        )
