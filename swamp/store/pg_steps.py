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
    waiting       BOOLEAN NOT NULL DEFAULT FALSE,
    opened_epoch  DOUBLE PRECISION NOT NULL,
    ended_epoch   DOUBLE PRECISION
);
CREATE INDEX IF NOT EXISTS swamp_step_open ON swamp_step (owner) WHERE outcome IS NULL;
CREATE INDEX IF NOT EXISTS swamp_step_ended ON swamp_step (ended_epoch)
    WHERE ended_epoch IS NOT NULL
"""
CHANNEL = "swamp_step_ended"  # a followed step ended (the payload: its id)
_COLUMNS = "id, owner, request, outcome, opened_epoch, waiting"
ROWS_PER_STATEMENT = 500  # (three parameters a row: far below the protocol's 65,535)


def _chunks(rows: list) -> list[list]:
    return [rows[i : i + ROWS_PER_STATEMENT] for i in range(0, len(rows), ROWS_PER_STATEMENT)]


def _first_of_each(rows: list[tuple[str, str, float]]) -> list[tuple[str, str, float]]:
    """Each step once (its first row): one statement may not change a row twice."""
    seen: set[str] = set()
    kept = []
    for row in rows:
        if row[0] not in seen:
            seen.add(row[0])
            kept.append(row)
    return kept


def _values(count: int, width: int, *, first: int, owner: bool = True) -> str:
    """``($2, $1, $3, $4), …`` for ``count`` rows of ``width`` parameters from ``$first``
    (with ``owner``, ``$1`` after each row's first: the owner shared by every row)."""
    rows = []
    for n in range(count):
        marks = [f"${first + n * width + k}" for k in range(width)]
        if owner:
            marks.insert(1, "$1")
        rows.append(f"({', '.join(marks)})")
    return ", ".join(rows)


@dataclass(frozen=True)
class StepRow:
    id: str
    owner: str
    request: dict | None  # None: its outcome was written before its request (a batch apart)
    outcome: dict | None  # None: it has not ended
    opened_epoch: float
    # it waits for a worker (set as it starts waiting, cleared before it is dispatched):
    # with no lease, the one thing that says it was not sent anywhere
    waiting: bool = False


def _json(text: str | None) -> dict | None:
    if text is None:
        return None
    value = json.loads(text)
    return value if isinstance(value, dict) else {}


def _row(row: tuple) -> StepRow:
    return StepRow(
        str(row[0]), str(row[1]), _json(row[2]), _json(row[3]), float(row[4]), bool(row[5])
    )


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
        opened: list[tuple[str, str, float]],
        ended: list[tuple[str, str, float]],
        waits: list[tuple[str, bool]] = (),  # type: ignore[assignment]
    ) -> None:
        """Requests (id, encoded request, when), waits (id, waiting) and outcomes (id,
        encoded outcome, when), a statement per kind (:data:`ROWS_PER_STATEMENT` rows at most). A
        request never replaces anything; the first outcome stands, and only the step's owner
        writes it (one taken for dead and back cannot overwrite its taker's); a followed step
        that ends notifies."""
        opened, ended = _first_of_each(opened), _first_of_each(ended)  # (one row once)
        # each statement its own transaction: a batch cut short is written again whole, and
        # every statement is an upsert that a second writing changes nothing by (no BEGIN
        # and COMMIT round trips on a path every placed step takes)
        async with self.pool.connection() as conn:
            for rows in _chunks(opened):
                await conn.execute(
                    "INSERT INTO swamp_step (id, owner, request, opened_epoch) VALUES "
                    + _values(len(rows), 3, first=2)
                    + " ON CONFLICT (id) DO UPDATE SET request = EXCLUDED.request "
                    "WHERE swamp_step.request IS NULL",
                    (owner, *(v for row in rows for v in row)),
                )
            last = {step_id: waiting for step_id, waiting in waits}  # (each one's last)
            for rows in _chunks(list(last.items())):
                pairs = (f"(${2 * n + 1}, ${2 * n + 2}::boolean)" for n in range(len(rows)))
                marks = ", ".join(pairs)
                await conn.execute(
                    f"UPDATE swamp_step SET waiting = v.w FROM (VALUES {marks}) AS v (id, w) "
                    "WHERE swamp_step.id = v.id AND swamp_step.outcome IS NULL",
                    tuple(v for step_id, w in rows for v in (step_id, "t" if w else "f")),
                )
            for rows in _chunks(ended):
                await conn.execute(
                    "WITH ended AS (INSERT INTO swamp_step (id, owner, outcome, opened_epoch, "
                    "ended_epoch) SELECT v.id, $2, v.outcome, v.at, v.at FROM (VALUES "
                    + _values(len(rows), 3, first=3, owner=False)
                    + ") AS v (id, outcome, at) ON CONFLICT (id) DO UPDATE SET "
                    "outcome = EXCLUDED.outcome, ended_epoch = EXCLUDED.ended_epoch "
                    "WHERE swamp_step.outcome IS NULL AND swamp_step.owner = EXCLUDED.owner "
                    "RETURNING id, followed) "
                    "SELECT pg_notify($1, id) FROM ended WHERE followed",
                    (CHANNEL, owner, *(v for row in rows for v in row)),
                )

    async def get(self, step_id: str) -> StepRow | None:
        async with self.pool.connection() as conn:
            result = await conn.execute(
                f"SELECT {_COLUMNS} FROM swamp_step WHERE id = $1", (step_id,)
            )
        return next((_row(r) for r in result.rows), None)

    async def follow(self, step_id: str) -> StepRow | None:
        """The step, marked followed first unless it ended (its end will notify). Two
        statements: the read's snapshot is taken after the mark committed, so an end written
        since is either read here or sees the mark and notifies."""
        async with self.pool.connection() as conn:
            await conn.execute(
                "UPDATE swamp_step SET followed = TRUE WHERE id = $1 AND outcome IS NULL "
                "AND NOT followed",
                (step_id,),
            )
            result = await conn.execute(
                f"SELECT {_COLUMNS} FROM swamp_step WHERE id = $1", (step_id,)
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

    async def open_owners(self, before_epoch: float) -> list[str]:
        """Who answers for the steps opened before ``before_epoch`` that have not ended."""
        async with self.pool.connection() as conn:
            result = await conn.execute(
                "SELECT DISTINCT owner FROM swamp_step WHERE outcome IS NULL AND opened_epoch < $1",
                (before_epoch,),
            )
        return [str(row[0]) for row in result.rows]

    async def open_of(self, owner: str, before_epoch: float) -> list[StepRow]:
        """``owner``'s steps opened before ``before_epoch`` that have not ended."""
        async with self.pool.connection() as conn:
            result = await conn.execute(
                f"SELECT {_COLUMNS} FROM swamp_step WHERE owner = $1 AND outcome IS NULL "
                "AND opened_epoch < $2 ORDER BY opened_epoch",
                (owner, before_epoch),
            )
        return [_row(r) for r in result.rows]

    async def collect(self, before_epoch: float) -> int:
        """Delete the steps that ended before ``before_epoch`` (their outcome was read long
        ago, or never will be)."""
        async with self.pool.connection() as conn:
            result = await conn.execute(
                "DELETE FROM swamp_step WHERE ended_epoch < $1", (before_epoch,)
            )
        return result.rowcount
