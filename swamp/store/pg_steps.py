"""The placed steps of a shared database, so a step outlives the orchestrator it was sent to.

``swamp_step``: one row per step placed on a worker through an orchestrator on PostgreSQL —
its request as sent (the *names* of its environment, never the values), the orchestrator that
answers for it (its *owner*: the one it was sent to, until that one dies and another takes it
over), and once it ended, its outcome (the reply its client got, or the error). The owner
writes both, in batches (``swamp.orchestrator.step_records``); any orchestrator reads them, so
a client whose orchestrator died asks another for its step (``model.method.follow``).

A follower marks the row ``followed``; only the end of a followed row notifies
(:data:`CHANNEL`), so the steps nobody follows — nearly all of them — cost no ``NOTIFY``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from swamp.store import pg

_SCHEMA = """
CREATE TABLE IF NOT EXISTS swamp_step (
    id            TEXT COLLATE "C" PRIMARY KEY,
    owner         TEXT COLLATE "C" NOT NULL,
    request       TEXT,
    outcome       TEXT,
    followed      BOOLEAN NOT NULL DEFAULT FALSE,
    opened_epoch  DOUBLE PRECISION NOT NULL,
    ended_epoch   DOUBLE PRECISION
);
CREATE INDEX IF NOT EXISTS swamp_step_open ON swamp_step (owner) WHERE outcome IS NULL;
CREATE INDEX IF NOT EXISTS swamp_step_ended ON swamp_step (ended_epoch)
    WHERE ended_epoch IS NOT NULL
"""
CHANNEL = "swamp_step_ended"  # a followed step ended (the payload: its id)
_ENCODE = json.JSONEncoder(separators=(",", ":"), sort_keys=True).encode
_COLUMNS = "id, owner, request, outcome, opened_epoch"


@dataclass(frozen=True)
class StepRow:
    id: str
    owner: str
    request: dict | None  # None: its outcome was written before its request (a batch apart)
    outcome: dict | None  # None: it has not ended
    opened_epoch: float


def _json(text: str | None) -> dict | None:
    if text is None:
        return None
    value = json.loads(text)
    return value if isinstance(value, dict) else {}


def _row(row: tuple) -> StepRow:
    return StepRow(str(row[0]), str(row[1]), _json(row[2]), _json(row[3]), float(row[4]))


class PgSteps:
    def __init__(self, pool: pg.Pool) -> None:
        self.pool = pool

    def __repr__(self) -> str:
        return f"<PgSteps {self.pool!r}>"

    @classmethod
    async def open(cls, pool: pg.Pool) -> PgSteps:
        await pg.make_schema(pool, _SCHEMA)
        return cls(pool)

    async def write(
        self,
        owner: str,
        opened: list[tuple[str, dict, float]],
        ended: list[tuple[str, dict, float]],
    ) -> None:
        """Requests (id, request, when) and outcomes (id, outcome, when) in one transaction.
        A request never replaces anything; the first outcome stands; a followed step that
        ends notifies."""
        async with self.pool.connection() as conn, conn.transaction():
            for step_id, request, at in opened:
                await conn.execute(
                    "INSERT INTO swamp_step (id, owner, request, opened_epoch) "
                    "VALUES ($1, $2, $3, $4) ON CONFLICT (id) DO UPDATE SET request = "
                    "EXCLUDED.request WHERE swamp_step.request IS NULL",
                    (step_id, owner, _ENCODE(request), at),
                )
            for step_id, outcome, at in ended:
                await conn.execute(
                    "WITH ended AS (INSERT INTO swamp_step (id, owner, outcome, opened_epoch, "
                    "ended_epoch) VALUES ($1, $2, $3, $4, $4) ON CONFLICT (id) DO UPDATE SET "
                    "outcome = EXCLUDED.outcome, ended_epoch = EXCLUDED.ended_epoch "
                    "WHERE swamp_step.outcome IS NULL RETURNING followed) "
                    "SELECT pg_notify($5, $1) FROM ended WHERE followed",
                    (step_id, owner, _ENCODE(outcome), at, CHANNEL),
                )

    async def get(self, step_id: str) -> StepRow | None:
        async with self.pool.connection() as conn:
            result = await conn.execute(
                f"SELECT {_COLUMNS} FROM swamp_step WHERE id = $1", (step_id,)
            )
        return next((_row(r) for r in result.rows), None)

    async def follow(self, step_id: str) -> StepRow | None:
        """The step, marked followed (its end will notify) unless it ended already."""
        async with self.pool.connection() as conn:
            result = await conn.execute(
                "WITH marked AS (UPDATE swamp_step SET followed = TRUE WHERE id = $1 AND "
                f"outcome IS NULL RETURNING {_COLUMNS}) SELECT * FROM marked UNION ALL "
                f"SELECT {_COLUMNS} FROM swamp_step WHERE id = $1 AND outcome IS NOT NULL",
                (step_id,),
            )
        return next((_row(r) for r in result.rows), None)

    async def take_over(self, dead: str, me: str) -> list[StepRow]:
        """The steps ``dead`` answered for and had not ended, now ``me``'s (one taker wins:
        whoever reconciles the dead one, under its liveness lock)."""
        async with self.pool.connection() as conn:
            result = await conn.execute(
                f"UPDATE swamp_step SET owner = $2 WHERE owner = $1 AND outcome IS NULL "
                f"RETURNING {_COLUMNS}",
                (dead, me),
            )
        rows = [_row(r) for r in result.rows]
        rows.sort(key=lambda row: row.opened_epoch)
        return rows

    async def collect(self, before_epoch: float) -> int:
        """Delete the steps that ended before ``before_epoch`` (their outcome was read long
        ago, or never will be)."""
        async with self.pool.connection() as conn:
            result = await conn.execute(
                "DELETE FROM swamp_step WHERE ended_epoch < $1", (before_epoch,)
            )
        return result.rowcount
