"""Taking over the steps of an orchestrator that died (a shared database).

The orchestrator that reconciles a dead one (under its liveness lock,
``swamp.orchestrator.peers``) makes the dead one's open step records its own
(``PgSteps.take_over``: one taker wins) and settles each beside everything else:

1. It gathers what is left of the step: the answer of an orchestrator that ran it for the dead
   one (each living peer is asked, ``peer.step.wait``, and answers once its run of the step
   ended — a peer that cannot be asked is asked again until it answers or is gone), else the
   step's latest lease.
2. :func:`swamp.domain.takeover.decide` says what becomes of it.
3. It records the outcome, or — after the fence, so that a copy still running behind a
   partition has been stopped — runs the step again as its own, from its recorded request
   (the environment's values read here: the same ``--ship-env`` is expected everywhere).

A client of the dead orchestrator reads the outcome through any orchestrator
(``model.method.follow``), whoever writes it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from swamp.bookkeeping.leases import LeaseBook
from swamp.domain.episodes import Move
from swamp.domain.takeover import decide
from swamp.errors import MalformedFrame, SwampError
from swamp.orchestrator.dispatch import DispatchService, RunRequest, decode_request
from swamp.orchestrator.peers import Peers, answer_ending
from swamp.orchestrator.step_records import StepRecords
from swamp.protocol.messages import DispatchResult, RunResult
from swamp.protocol.rpc import no_events
from swamp.store.records import Records

if TYPE_CHECKING:  # (PostgreSQL's driver is there only where a shared database is served)
    from swamp.store.pg_steps import PgSteps, StepRow

log = logging.getLogger("swamp.peers")
ASK_AGAIN = 2.0  # seconds before asking again a peer that could not be asked
CLOCK_SKEW = 60.0  # seconds: a step's leases are looked for from this long before it opened


class Takeovers:
    """The steps this orchestrator took over, settling. Made before anything is served (the
    boot buries the dead first); the steps taken then are settled once :meth:`serve` runs."""

    def __init__(self, table: PgSteps, me: str) -> None:
        self.table = table
        self.me = me
        self.settling: dict[str, str] = {}  # step id → the orchestrator it was taken from
        self.taken = 0
        self._waiting: list[tuple[str, StepRow]] = []  # taken before serve started
        self._nursery: trio.Nursery | None = None
        # what settling uses (given to serve)
        self.records: StepRecords | None = None
        self.dispatch: DispatchService | None = None
        self.peers: Peers | None = None
        self.db: Records | None = None
        self.fence = 0.0  # seconds before a step that may still run somewhere runs here

    def __repr__(self) -> str:
        return f"<Takeovers settling={len(self.settling)} taken={self.taken}>"

    async def serve(
        self,
        records: StepRecords,
        dispatch: DispatchService,
        peers: Peers,
        db: Records,
        *,
        fence: float,
        task_status=trio.TASK_STATUS_IGNORED,
    ) -> None:
        self.records, self.dispatch, self.peers, self.db = records, dispatch, peers, db
        self.fence = fence
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            waiting, self._waiting = self._waiting, []
            for dead, row in waiting:
                nursery.start_soon(self._settle, dead, row)
            task_status.started()
            await trio.sleep_forever()

    async def take(self, dead: str) -> int:
        """Make ``dead``'s open steps ours and settle each (beside the caller); how many."""
        rows = await self.table.take_over(dead, self.me)
        for row in rows:
            self.settling[row.id] = dead
            if self._nursery is None:
                self._waiting.append((dead, row))
            else:
                self._nursery.start_soon(self._settle, dead, row)
        self.taken += len(rows)
        if rows:
            log.info(
                "took over %d step(s) of orchestrator %s: their clients may follow them "
                "through any orchestrator",
                len(rows),
                dead[:12],
            )
        return len(rows)

    async def _settle(self, dead: str, row: StepRow) -> None:
        try:
            await self._settle_one(dead, row)
        except Exception:  # never the end of the others: the step fails saying so
            log.exception("settling step %s taken from %s failed", row.id[:12], dead[:12])
            await self._fail(row.id, "internal", "settling it after its orchestrator died failed")
        finally:
            self.settling.pop(row.id, None)

    async def _settle_one(self, dead: str, row: StepRow) -> None:
        assert self.db is not None
        try:
            request = decode_request(row.request or {}, row.id)
        except MalformedFrame as exc:
            await self._fail(
                row.id,
                "outcome_lost",
                f"its orchestrator died and its request was not recorded ({exc.message}): "
                "it cannot be run again",
            )
            return
        answer = await self._answer_of_others(dead, row.id)
        end = result = lease = None
        if answer is not None:
            end, result = answer_ending(answer, "?")
        else:
            lease = (
                await LeaseBook(self.db).latest_of_steps(
                    {row.id}, since_epoch=row.opened_epoch - CLOCK_SKEW
                )
            ).get(row.id)
        model_type = request.model.type
        then = decide(
            end,
            lease,
            model=request.model.name,
            method=f"{model_type}.{request.method}",
            retry=request.model.retry,
        )
        log.info(
            "step %s of orchestrator %s (%s.%s): %s%s",
            row.id[:12],
            dead[:12],
            model_type,
            request.method,
            then.move.value,
            f" ({then.reason})" if then.reason else "",
        )
        if then.move is Move.FINISH:
            await self._finish(row.id, request, result, end.worker if end else None)
        elif then.move is Move.FAIL:
            await self._fail(row.id, then.code, then.reason)
        else:
            await trio.sleep(self.fence)  # a copy still running behind a partition stops first
            request.attempts = 1 if lease is not None or end is not None else 0
            await self._run_again(request)

    async def _answer_of_others(self, dead: str, step_id: str) -> dict | None:
        """The answer of the orchestrator that ran ``step_id`` for ``dead`` (``None``: none
        did, as far as every living one says). Every living one is asked at once; each that
        cannot be asked is asked again until it answers or is gone."""
        assert self.peers is not None
        answers: list[dict] = []

        async def here() -> None:  # (it may have been claimed by this one)
            assert self.peers is not None
            said = await self.peers.outliving.wait_step(dead, step_id)
            if said.get("state") == "ended":
                answers.append(said["answer"])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(here)
            for row in await self.peers.table.orchestrators():
                if row.id in (self.me, dead) or "takeover" not in row.features:
                    continue
                nursery.start_soon(self._ask_until_answered, row.id, dead, step_id, answers)
        return answers[0] if answers else None

    async def _ask_until_answered(
        self, peer: str, dead: str, step_id: str, answers: list[dict]
    ) -> None:
        assert self.peers is not None
        while True:
            try:
                answer = await self.peers.ask_step(peer, dead, step_id)
            except SwampError as exc:
                try:
                    gone = await self.peers.table.get(peer) is None
                except SwampError:
                    gone = False
                if gone:
                    return  # (its own reconciliation settles what it ran)
                log.info("could not ask %s about step %s: %s", peer[:12], step_id[:12], exc)
                await trio.sleep(ASK_AGAIN)
                continue
            if answer is not None:
                answers.append(answer)
            return

    async def _finish(
        self, step_id: str, request: RunRequest, result: dict | None, worker: str | None
    ) -> None:
        assert self.dispatch is not None and self.records is not None
        try:
            ran = DispatchResult.decode(result or {}, where="a claimer's answer")
        except MalformedFrame as exc:
            await self._fail(step_id, "dispatch_failed", exc.message)
            return
        model_type = self.dispatch.registry.runnable(request.model.type)
        reply = self.dispatch.result_of(request, model_type, ran, worker, None, None)
        await self.records.ended(step_id, {"reply": reply.to_json()})

    async def _fail(self, step_id: str, code: str, reason: str) -> None:
        assert self.records is not None
        await self.records.ended(step_id, {"error": {"code": code, "message": reason}})

    async def _run_again(self, request: RunRequest) -> RunResult | None:
        """Run it here as our own (its outcome is recorded as any placed step's)."""
        assert request.step_id is not None and self.dispatch is not None
        try:
            return await self.dispatch.run(request, no_events)
        except SwampError as exc:  # recorded by the run — or refused before it: recorded here
            await self._fail(request.step_id, exc.code, exc.message)  # (the first one stands)
            return None
