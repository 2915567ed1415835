"""Runs carried here by a worker whose orchestrator went away (the carrier's side).

A worker that lost its socket without a word from its orchestrator carries what it runs
(``swamp.worker.runs``) and lists it when it enrolls here. For each, :meth:`Adoptions.listed`
marks the lease *carried by* this orchestrator — only a dead holder's own step, and only the
worker's own lease (``swamp.domain.carrying``) — and the worker is told to wait, the run's
slot held. From then on the run is known as running its step (``Outliving.answer_later``), and
a task of its own waits for the old holder's burial (here or by a peer, ``Peers.until_gone``),
at most as long as the worker carries the run:

- the burial moved the lease here and is over (the holder's row gone): the run is adopted
  (``Episodes.adopt``: ``worker.adopt``) and heard to its end as any episode; its answer goes
  to whoever took the step over (``peer.step.wait``), which waits for it;
- else the worker is told to stop it (``worker.abandon``), the mark is taken off, and a lease
  moved here anyway ends as a lost worker's — tried again while the database is away.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import trio

from swamp.bookkeeping.leases import LeaseBook
from swamp.bookkeeping.leases import key as lease_key
from swamp.domain.carrying import STOP, WAIT, adopted, carry_seconds
from swamp.domain.leases import LeaseState
from swamp.errors import SwampError
from swamp.ids import ordered_id
from swamp.orchestrator.dispatch import DispatchService, decode_request
from swamp.orchestrator.episode import Episode, Episodes, Step, Work
from swamp.orchestrator.peers import Peers, encode_ending
from swamp.orchestrator.pool import Member
from swamp.orchestrator.queue import DispatchQueue
from swamp.protocol.messages import AbandonRequest, CarriedRun
from swamp.store.datastore import Record, parse_iso
from swamp.store.records import Records

if TYPE_CHECKING:  # (PostgreSQL's driver is there only where a shared database is served)
    from swamp.store.pg_steps import PgSteps

log = logging.getLogger("swamp.peers")
MARGIN = 2.0  # seconds before the worker's own deadline the wait for the burial gives up
GIVE_UP_RETRY, GIVE_UP_MAX = 2.0, 30.0  # seconds between attempts while the database is away
NOT_ADOPTED = "its worker carried it to another orchestrator, which could not take it over"


@dataclass(frozen=True)
class _Carried:
    """A run a worker carries here, marked, waiting for its old holder's burial."""

    holder: str
    step_id: str
    work: Work


class Adoptions:
    """The runs carried here, waiting for their old holder's burial or adopted."""

    def __init__(
        self,
        db: Records,
        steps: PgSteps,
        peers: Peers,
        episodes: Episodes,
        queue: DispatchQueue,
        dispatch: DispatchService,
    ) -> None:
        self.db = db
        self.steps = steps
        self.peers = peers
        self.me = peers.me
        self.episodes = episodes
        self.queue = queue
        self.dispatch = dispatch
        self.leases = LeaseBook(db, owner=peers.me)
        self.adopted = 0  # runs adopted since start
        self.waiting: dict[str, _Carried] = {}  # by dispatch id, until settled
        self.giving_up: set[str] = set()  # not adopted, being let go of
        self._nursery: trio.Nursery | None = None

    def __repr__(self) -> str:
        return f"<Adoptions waiting={len(self.waiting)} adopted={self.adopted}>"

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    async def listed(self, member: Member, carried: list[CarriedRun]) -> dict[str, str]:
        """At enrollment, before the member joins: what becomes of each run it carries
        (:data:`WAIT`: marked here, its slot held, and settled from now on — whether the
        enrollment goes any further or not; one not named is stopped). At most as many as it
        has slots are looked at."""
        said: dict[str, str] = {}
        for run in carried[: member.capacity]:
            if run.dispatch_id in said or run.dispatch_id in self.waiting:
                continue  # (listed twice, or by a connection of the worker's still settling)
            if run.dispatch_id in self.giving_up:
                said[run.dispatch_id] = STOP
                continue
            if len(member.active) >= member.capacity or self._nursery is None:
                continue
            marked = await self._mark(member, run)
            if marked is None:
                said[run.dispatch_id] = STOP
                continue
            said[run.dispatch_id] = WAIT
            member.active.add(run.dispatch_id)  # (before it joins: the pool counts it)
            self.waiting[run.dispatch_id] = marked
            # no longer than the worker may carry it (it says, and its old holder told it)
            seconds = min(run.seconds, carry_seconds(self.peers.told_by(marked.holder)))
            self._nursery.start_soon(self._settle, member, run.dispatch_id, seconds)
        return said

    async def _mark(self, member: Member, run: CarriedRun) -> _Carried | None:
        """Mark the lease carried by us; what adopting it takes, or ``None`` if it may not be
        (not a dead holder's own step, not this worker's, or its request unreadable here)."""
        dispatch_id = run.dispatch_id
        try:
            record = await self.db.latest(lease_key(dispatch_id))
            lease = record.attributes if record is not None else None
            step_id = lease.get("stepId") if lease is not None else None
            if not isinstance(step_id, str):
                return None
            row = await self.steps.get(step_id)
            if row is None or row.outcome is not None or row.request is None:
                return None
            work = self.dispatch.adopted_work(decode_request(row.request, step_id))
            marked = await self.leases.mark_carried(
                dispatch_id,
                carrier=self.me,
                worker=member.name,
                owner=row.owner,
                effects=run.effects,
            )
        except (SwampError, ValueError) as exc:
            log.warning("dispatch %s carried here cannot be taken over: %s", dispatch_id[:12], exc)
            return None
        if marked is None:
            return None
        holder = str(marked["orchestrator"])
        log.info(
            "worker %s carries dispatch %s of orchestrator %s here: waiting for its burial",
            member.name,
            dispatch_id[:12],
            holder[:12],
        )
        return _Carried(holder, step_id, work)

    async def _settle(self, member: Member, dispatch_id: str, seconds: float) -> None:
        """Wait for the old holder's burial (at most ``seconds`` less a margin), then adopt
        the run if the burial moved its lease here. Known as running its step meanwhile
        (``Outliving.answer_later``): whoever took the step over waits for its answer."""
        carried = self.waiting[dispatch_id]
        heard = False  # the adopted run was heard to its end (its lease ended with it)

        async def settle() -> dict | None:
            nonlocal heard
            with trio.move_on_after(max(0.0, seconds - MARGIN)):
                await self.peers.until_gone(carried.holder)
            record = await self._still_ours(dispatch_id, member, carried.holder)
            if record is None:
                log.info(
                    "dispatch %s carried by worker %s was not taken over: its old holder "
                    "lives, or ended it first",
                    dispatch_id[:12],
                    member.name,
                )
                return None
            answer = await self._adopt(member, record, carried)
            heard = True
            return answer

        try:
            await self.peers.outliving.answer_later(
                carried.holder, f"carried:{dispatch_id}", carried.step_id, settle
            )
        except Exception:  # never the end of the others: the run is let go below
            log.exception("adopting dispatch %s failed", dispatch_id[:12])
        finally:
            self.waiting.pop(dispatch_id, None)
            self.queue.release(member, dispatch_id)
            if not heard and self._nursery is not None:
                try:
                    self._nursery.start_soon(self._give_up, member, dispatch_id)
                except RuntimeError:  # this one stops: its own burial expires the lease
                    pass

    async def _still_ours(self, dispatch_id: str, member: Member, holder: str) -> Record | None:
        """The lease, if the burial of ``holder`` moved it here and is over (its row gone
        from the registry: a burial cut off part-way leaves a holder that may still be
        alive); else ``None`` (what is left of it is :meth:`_give_up`'s)."""
        record = await self.db.latest(lease_key(dispatch_id))
        if record is None or not adopted(record.attributes, carrier=self.me, worker=member.name):
            return None
        if await self.peers.table.get(holder) is not None:
            return None
        return record

    async def _give_up(self, member: Member, dispatch_id: str) -> None:
        """Not adopted: the worker stops the run, our mark goes, and a lease the burial moved
        here anyway ends as a lost worker's (whoever took the step over decides by it) —
        tried again until it is done, or this orchestrator stops."""
        channel = member.channel
        if channel is not None and not channel.closed:
            try:
                await channel.call(
                    "worker.abandon", AbandonRequest(dispatch_id).to_json(), timeout=10
                )
            except SwampError:
                pass  # its own deadline stops it
        self.giving_up.add(dispatch_id)  # (listed again meanwhile: stopped)
        pause, said = GIVE_UP_RETRY, False
        try:
            while True:
                try:
                    record = await self.leases.unmark_carried(dispatch_id, carrier=self.me)
                    if record is None or not adopted(
                        record.attributes, carrier=self.me, worker=member.name
                    ):
                        return
                    await self.leases.end(dispatch_id, LeaseState.EXPIRED, error=NOT_ADOPTED)
                    return
                except SwampError as exc:
                    if not said:
                        log.warning(
                            "dispatch %s carried here, not adopted: %s", dispatch_id[:12], exc
                        )
                        said = True
                await trio.sleep(pause)
                pause = min(pause * 2, GIVE_UP_MAX)
        finally:
            self.giving_up.discard(dispatch_id)

    async def _adopt(self, member: Member, record: Record, carried: _Carried) -> dict:
        lease_id = record.name.removeprefix("lease-")
        work = carried.work
        opened = parse_iso(record.attributes.get("createdAt"))
        if work.timeout is not None and opened is not None:  # (counted from its start)
            work = replace(work, timeout=max(0.0, work.timeout - (time.time() - opened)))
        self.adopted += 1
        log.info(
            "adopted dispatch %s (step %s) of orchestrator %s on worker %s: it runs on",
            lease_id[:12],
            carried.step_id[:12],
            carried.holder[:12],
            member.name,
        )
        episode = await self.episodes.adopt(
            member, record, work, Step(carried.step_id), log_id=ordered_id()
        )
        if not episode.lease_ended and self._nursery is not None:  # (the database away)
            self._nursery.start_soon(self._end_until_done, episode, lease_id)
        return encode_ending(episode.end, episode.result, lease_id)

    async def _end_until_done(self, episode: Episode, lease_id: str) -> None:
        """An adopted run's lease whose end could not be written: again until it is (or it
        is no longer active), so whoever took the step over does not wait on it."""
        pause = GIVE_UP_RETRY
        while not await self.episodes.end_again(episode):
            try:
                record = await self.db.latest(lease_key(lease_id))
                if record is None or record.attributes.get("state") != LeaseState.ACTIVE.value:
                    return
            except SwampError:
                pass
            await trio.sleep(pause)
            pause = min(pause * 2, GIVE_UP_MAX)
