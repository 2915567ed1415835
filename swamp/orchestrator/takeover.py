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
import time
from typing import TYPE_CHECKING

import trio

from swamp.bookkeeping.leases import LeaseBook
from swamp.bookkeeping.leases import key as lease_key
from swamp.domain.episodes import Move, Next
from swamp.domain.takeover import answer_for, decide, still_running
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
SWEEP_EVERY = 60.0  # seconds between sweeps for open steps nobody settles
SWEEP_AGE = 60.0  # seconds a step is open before a sweep may take it
STILL_RUNNING_MAX = 3600.0  # seconds a step whose lease stays active elsewhere is waited for
UNREAD = object()  # a step's latest lease, not read yet
CLOCK_SKEW = 60.0  # seconds: a step's leases are looked for from this long before it opened


class Takeovers:
    """The steps this orchestrator took over, settling. Made before anything is served (the
    boot buries the dead first); the steps taken then are settled once :meth:`serve` runs."""

    def __init__(self, table: PgSteps, me: str, db: Records) -> None:
        self.table = table
        self.me = me
        self.db = db
        self.settling: dict[str, str] = {}  # step id → the orchestrator it was taken from
        self.taken = 0
        # taken before serve started: (dead, row, kept answers, latest lease)
        self._waiting: list[tuple[str, StepRow, list[dict], object]] = []
        self._nursery: trio.Nursery | None = None
        # what settling uses (given to serve)
        self.records: StepRecords | None = None
        self.dispatch: DispatchService | None = None
        self.peers: Peers | None = None
        self.fence = 0.0  # seconds before a step that may still run somewhere runs here
        self.fences: dict[str, float] = {}  # …longer, for a dead one whose workers were told so

    def __repr__(self) -> str:
        return f"<Takeovers settling={len(self.settling)} taken={self.taken}>"

    async def serve(
        self,
        records: StepRecords,
        dispatch: DispatchService,
        peers: Peers,
        *,
        fence: float,
        task_status=trio.TASK_STATUS_IGNORED,
    ) -> None:
        self.records, self.dispatch, self.peers = records, dispatch, peers
        self.fence = fence
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            waiting, self._waiting = self._waiting, []
            for settle in waiting:
                nursery.start_soon(self._settle, *settle)
            nursery.start_soon(self._sweep_now_and_then)
            task_status.started()
            await trio.sleep_forever()

    async def take(self, dead: str, kept: list[dict] | None = None, *, fence: float = 0.0) -> int:
        """Make ``dead``'s open steps ours and settle each (beside the caller); how many.
        ``kept``: the answers claimers kept in the database for it (read before it is
        forgotten, which deletes them); ``fence``: how long its steps wait before they run
        again, if longer than ours (its workers were told a longer heartbeat)."""
        if fence > self.fence:
            self.fences[dead] = fence
            while len(self.fences) > MAX_FENCES:
                del self.fences[next(iter(self.fences))]
        rows = await self.table.take_over(dead, self.me)
        rows = [row for row in rows if row.id not in self.settling]
        for row in rows:  # (before any await: a sweep meanwhile must not settle them too)
            self.settling[row.id] = dead
        try:
            leases: dict[str, dict] | None = await self._latest_leases(rows)
        except SwampError as exc:  # each reads its own, again and again, as it settles
            log.warning("the leases of %s's steps are read as each settles: %s", dead[:12], exc)
            leases = None
        for row in rows:
            lease = UNREAD if leases is None else leases.get(row.id)
            settle = (dead, row, list(kept or ()), lease)
            if self._nursery is None:
                self._waiting.append(settle)
            else:
                self._nursery.start_soon(self._settle, *settle)
        self.taken += len(rows)
        if rows:
            log.info(
                "took over %d step(s) of orchestrator %s: their clients may follow them "
                "through any orchestrator",
                len(rows),
                dead[:12],
            )
        return len(rows)

    async def _latest_leases(self, rows: list[StepRow]) -> dict[str, dict]:
        """The latest lease of each of ``rows``' steps, in one scan (from the oldest)."""
        if not rows:
            return {}
        since = min(row.opened_epoch for row in rows) - CLOCK_SKEW
        return await LeaseBook(self.db).latest_of_steps({row.id for row in rows}, since_epoch=since)

    async def _lease_again(self, lease: dict | None) -> object:
        """``lease`` as it is stored now (:data:`UNREAD` if it cannot be read: a scan then)."""
        lease_id = (lease or {}).get("leaseId")
        if not isinstance(lease_id, str):
            return UNREAD
        try:
            record = await self.db.latest(lease_key(lease_id))
        except SwampError:
            return UNREAD
        return record.attributes if record is not None else UNREAD

    async def sweep(self) -> int:
        """Take over the open steps nobody settles: those of an owner that is gone from the
        registry (reconciled by an orchestrator of an earlier version, or written late by
        one taken for dead), and our own that neither run nor settle here (taken in a
        statement whose answer was lost). Only steps older than :data:`SWEEP_AGE`: a new
        orchestrator records steps a moment before it is registered."""
        assert self.peers is not None and self.records is not None
        before = time.time() - SWEEP_AGE
        serving = {row.id for row in await self.peers.table.orchestrators()}
        taken = 0
        for owner in await self.table.open_owners(before):
            if owner not in serving:
                taken += await self.take(owner)
        mine = [
            row
            for row in await self.table.open_of(self.me, before)
            if row.id not in self.settling and not self.records.runs(row.id)
        ]
        for row in mine:  # (before any await)
            self.settling[row.id] = self.me
        for row in mine:
            assert self._nursery is not None
            self._nursery.start_soon(self._settle, self.me, row, [], UNREAD)
        return taken + len(mine)

    async def _sweep_now_and_then(self) -> None:
        while True:
            await trio.sleep(SWEEP_EVERY)
            try:
                await self.sweep()
            except SwampError as exc:
                log.warning("the sweep of steps nobody settles was skipped: %s", exc)

    async def _settle(self, dead: str, row: StepRow, kept: list[dict], lease: object) -> None:
        try:
            await self._settle_one(dead, row, kept, lease)
        except Exception:  # never the end of the others: the step fails saying so
            log.exception("settling step %s taken from %s failed", row.id[:12], dead[:12])
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await self._fail(
                    row.id, "internal", "settling it after its orchestrator died failed"
                )
        finally:
            self.settling.pop(row.id, None)

    async def _settle_one(self, dead: str, row: StepRow, kept: list[dict], read: object) -> None:
        """``read``: its latest lease as read when it was taken (:data:`UNREAD`: not yet)."""
        assert self.peers is not None
        waited = 0.0
        while True:
            try:
                answers = await self._answers_of_others(row.id)
                if read is UNREAD or answers:  # (an answer's lease may be newer than read)
                    read = (await self._latest_leases([row])).get(row.id)
                lease = read if isinstance(read, dict) else None
                if lease is not None:  # (kept answers are the dead one's, of every step:
                    answers += kept  # one speaks for this step only by its lease's dispatch)
                peers = await self.peers.table.orchestrators()
            except SwampError as exc:  # the database (or a peer) is away: nothing is decided
                log.warning("step %s waits to be settled: %s", row.id[:12], exc)
                await trio.sleep(ASK_AGAIN)
                continue
            answer = answer_for(lease, [(_dispatch_of(a), a) for a in answers])
            serving = {r.id for r in peers} - ({dead} - {self.me})
            if answer is None and still_running(lease, serving) and waited < STILL_RUNNING_MAX:
                # (at one of an earlier version, not asked): its lease ends when it does
                await trio.sleep(ASK_AGAIN)
                waited += ASK_AGAIN
                read = await self._lease_again(lease)  # (that one row, not a scan)
                continue
            earlier = any("takeover" not in r.features for r in peers)
            break
        end = result = None
        if answer is not None:
            end, result = answer_ending(answer, str((lease or {}).get("workerName") or "?"))
        try:
            request = decode_request(row.request or {}, row.id)
        except MalformedFrame as exc:
            request = None
            unreadable = exc.message
        name = request.model.name if request else "?"
        method = f"{request.model.type}.{request.method}" if request else "?"
        then = decide(
            end,
            lease,
            model=name,
            method=method,
            retry=request.model.retry if request else "never",
            waiting=row.waiting,
        )
        if (
            then.move is not Move.FAIL
            and end is None
            and (earlier or still_running(lease, serving))
        ):
            # an orchestrator of an earlier version serves the database (its leases name no
            # step: whether it ran this one cannot be told), or a lease never ended
            then = Next(
                Move.FAIL,
                "outcome_lost",
                "its orchestrator died, and whether it ran elsewhere cannot be told (an "
                "orchestrator of an earlier version serves the database, or its lease there "
                "never ended): it is not run again",
            )
        log.info(
            "step %s of orchestrator %s (%s): %s%s",
            row.id[:12],
            dead[:12],
            method,
            then.move.value,
            f" ({then.reason})" if then.reason else "",
        )
        if then.move is Move.FAIL:
            await self._fail(row.id, then.code, then.reason)
        elif request is None:
            await self._fail(
                row.id,
                "outcome_lost",
                f"its orchestrator died and its request was not recorded ({unreadable}): "
                "its outcome is not known",
            )
        elif then.move is Move.FINISH:
            await self._finish(row.id, request, result, end.worker if end else None)
        else:
            # a copy still running behind a partition stops first (or carried by its worker
            # to any orchestrator, which may have told it a longer heartbeat)
            fence = self.fences.get(dead, self.fence)
            await trio.sleep(max(fence, self.peers.longest_fence(self.fence)))
            now = await self.table.get(row.id)
            if now is None or now.outcome is not None or now.owner != self.me:
                return  # it ended meanwhile (or is another's): nothing to run
            request.attempts = 1 if lease is not None or end is not None else 0
            assert self.records is not None
            await self.records.adopt(row.id)  # (its record marked as ours say: not waiting)
            await self._run_again(request)

    async def _answers_of_others(self, step_id: str) -> list[dict]:
        """The answers of the orchestrators that ran an episode of ``step_id`` for another
        (each living one is asked at once, and answers when its run ends; each that cannot
        be asked is asked again until it answers or is gone)."""
        assert self.peers is not None
        answers: list[dict] = []

        async def here() -> None:  # (it may have been claimed by this one)
            assert self.peers is not None
            said = await self.peers.outliving.wait_step(step_id)
            if said.get("state") == "ended":
                answers.append(said["answer"])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(here)
            for row in await self.peers.table.orchestrators():
                if row.id == self.me or "takeover" not in row.features:
                    continue
                nursery.start_soon(self._ask_until_answered, row.id, step_id, answers)
        return answers

    async def _ask_until_answered(self, peer: str, step_id: str, answers: list[dict]) -> None:
        assert self.peers is not None
        while True:
            try:
                answer = await self.peers.ask_step(peer, step_id)
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
        reply = self.dispatch.result_of(request, request.model.type, ran, worker, None, None)
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


MAX_FENCES = 1024  # dead orchestrators whose longer fence is remembered (the oldest go)


def _dispatch_of(answer: dict) -> str | None:
    """The dispatch an answer is about (``None``: refused before anything ran)."""
    reply = answer.get("reply")
    dispatch = reply.get("dispatchId") if isinstance(reply, dict) else None
    return dispatch if isinstance(dispatch, str) and dispatch else None
