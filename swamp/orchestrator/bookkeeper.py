"""The bookkeeper: everything the orchestrator writes behind, and when each is on disk.

Three kinds of record change where nothing may wait on the disk — a dispatch's reply, a
socket's close callback, the moment a step is assigned — so they are handed to the bookkeeper,
and one task (:meth:`Bookkeeper.run`) writes them. This module is the one answer to "when is X
durable":

**A step lease** (``swamp/step-lease``, one row per dispatch; :meth:`open_lease` …
:meth:`end_lease`):

- A dispatch that ends within :data:`LEASE_WRITE_DELAY` — most do — makes its row durable
  once, already ended, *before its result goes anywhere*: one append to the journal
  (``swamp.store.journal``; it survives the process being killed, as the store's commits do).
  The task takes journaled rows into the store within :data:`JOURNAL_DELAY`, or at once when
  :data:`JOURNAL_BATCH` wait, many to a transaction. Without a journal, when the journal
  fails, or with :data:`MAX_JOURNALED` rows waiting, the row is inserted at the end instead
  (still before the result goes anywhere).
- A dispatch still running after :data:`LEASE_WRITE_DELAY` has its row inserted by the task,
  active (several due together in one transaction); its end is then a transition of that row,
  durable before the result goes anywhere.
- A dispatch that writes data has its row durable, marked write-bearing, *before its first
  write is persisted* (:meth:`mark_writes`); one whose worker says it had an effect is marked
  in the row still to be written, or in the stored one by the task before any other write
  (:meth:`mark_effects`).
- At shutdown (:meth:`flush`) the journaled rows go in and rows not written yet go in as
  they are (active), for the next boot to expire. At boot the journal is replayed before
  anything reads the leases (``swamp.store.journal.replay``).
- What a crash can lose: the row of a dispatch younger than the delay, whose result nobody
  has seen (the next boot finds nothing to expire, and the step's client saw no result).

**A worker status version** (``swamp/worker``) and **a queue episode**
(``swamp/pending-dispatch``): :meth:`put` queues the write (it never waits); the task writes
them one at a time in the order they happened, each its own transaction, retried while another
process holds the database. Durable some milliseconds later; :meth:`settled` waits for every
write queued so far, of one :class:`Stream` (enrollment, before a reconnecting worker's new
record, waits for the status versions only) or of all (the shutdown, for the last
``disconnected`` versions, within 5 s). Nothing is coalesced: every change is a version. Each
stream is bounded on its own (:data:`LIMITS`): past it, the oldest queued write *of that
stream* is dropped with a warning — a flood of queue episodes never pushes out a worker's
status — these records are history; the live state is in memory and the next boot reconciles
what the disk says. A crash loses what was still queued, and the boot's
reconciliation (workers disconnected, waiting episodes orphaned) settles it.

The storage is behind two small seams: :class:`LeaseRows` (today ``LeaseBook`` over SQLite)
and the write callables handed to :meth:`put`; the journal is optional. A PostgreSQL store
implements the same ones.
"""

from __future__ import annotations

import enum
import logging
import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from swamp.domain.leases import LeaseState
from swamp.domain.queue import MAX_WAITING
from swamp.errors import SwampError
from swamp.store.datastore import Record
from swamp.store.journal import Entry, Journal
from swamp.store.retry import retry_busy

log = logging.getLogger("swamp.records")
LEASE_WRITE_DELAY = 0.05  # a running dispatch's lease row is in the store by then
LEASE_RETRY_CAP = 5.0  # the longest wait between attempts while the store refuses writes
JOURNAL_BATCH = 4  # journaled rows taken into the store together, right after a reply
JOURNAL_DELAY = 0.05  # fewer than that are taken in by then
MAX_JOURNALED = 1024  # rows journaled and not in the store yet; beyond, a row is inserted at once


class Stream(enum.Enum):
    """The ordered writes, each bounded and settled on its own."""

    WORKERS = "worker records"  # status versions
    QUEUE = "queue episodes"


# writes of one stream queued behind; beyond, the oldest of that stream is dropped
LIMITS = {Stream.WORKERS: 250_000, Stream.QUEUE: 4 * MAX_WAITING}


@dataclass(frozen=True)
class _Write:
    order: int
    what: str
    write: Callable[[], Any]
    then: Callable[[Any], None] | None


def _settled() -> trio.Event:
    event = trio.Event()
    event.set()
    return event


class LeaseRows(Protocol):
    """What the bookkeeper needs of the store for lease rows (``LeaseBook`` is one)."""

    def opened(
        self,
        *,
        lease_id: str,
        worker: str,
        model_type: str,
        model_name: str,
        method: str,
        step_id: str | None = None,
    ) -> dict: ...

    async def insert(self, attrs: dict) -> Record: ...

    async def insert_many(
        self, many: list[dict], *, journaled: Iterable[Entry] = ()
    ) -> list[Record | None]: ...

    def journaled(self, attrs: dict) -> Entry: ...

    def ended(self, attrs: dict, state: LeaseState, *, error: str | None = None) -> dict: ...

    def write_bearing(self, attrs: dict) -> dict: ...

    async def mark_writes(
        self, lease_id: str, *, current: Record | None = None
    ) -> Record | None: ...

    async def end(
        self,
        lease_id: str,
        state: LeaseState,
        *,
        error: str | None = None,
        current: Record | None = None,
        has_writes: bool = False,
    ) -> Record | None: ...


@dataclass(eq=False, slots=True)
class Lease:
    """One dispatch's lease as the bookkeeper keeps it: its attributes until its row is
    written, then the latest version this process wrote."""

    id: str
    opened: dict | None  # the row's attributes, while it is not written yet
    opened_at: float  # trio time
    record: Record | None = None
    has_writes: bool = False  # the dispatch had an effect
    writes_stored: bool = False  # the row in the store says so
    batched: trio.Event | None = None  # set when the transaction that has its row ends


@dataclass(frozen=True)
class BookkeeperStatistics:
    pending: int  # ordered writes queued (status versions, queue episodes)
    written: int  # ordered writes done
    failed: int  # ordered writes the store refused (said, and given up)
    dropped: int  # ordered writes dropped past the bound
    leases_unwritten: int  # running dispatches whose row is not written yet
    leases_journaled: int  # ended rows in the journal, not in the store yet
    leases_written: int  # lease rows that went in through the task's transactions
    batches: int  # those transactions
    journal_bytes: int  # the journal's size (emptied when its rows are in)


class Bookkeeper:
    def __init__(
        self,
        leases: LeaseRows,
        journal: Journal | None = None,
        *,
        limits: dict[Stream, int] | None = None,
    ) -> None:
        self.leases = leases
        self.journal = journal
        self.limits = dict(LIMITS if limits is None else limits)
        # ordered writes of each stream: (order, what, write, then), oldest first
        self._queues: dict[Stream, deque[_Write]] = {s: deque() for s in Stream}
        self._order = 0  # across streams: the task writes the oldest head first
        self._idle = {s: _settled() for s in Stream}
        # leases whose row is not written yet, oldest first
        self._unwritten: dict[str, Lease] = {}
        self._batch: list[Lease] = []  # leases whose rows are in the transaction in flight
        # leases whose effect the stored row does not say yet (see mark_effects)
        self._effects: dict[str, Lease] = {}
        self._effects_idle = _settled()  # set while no effect waits to be marked
        # ended rows in the journal and not in the store yet, with when each was journaled
        self._journaled: list[tuple[Entry, float]] = []
        self._journal_failed = False  # said once, until an append works again
        self._journal_bytes = 0
        # the task sleeps until this (trio time; infinite when nothing waits), and wakes early
        # on the event: a write queued, a lease opened while idle, a row due sooner
        self._until = math.inf
        self._wakes: trio.Event | None = None
        self._pause = 0.0  # after a failed lease write: waits longer each time, said once
        self._not_before = -math.inf  # no lease write before this (trio time)
        self.written = 0  # ordered writes done
        self.failed = 0
        self.dropped = 0
        self.batches = 0  # lease transactions (inserts and journal take-ins)
        self.leases_written = 0  # lease rows that went in through a batch

    def __repr__(self) -> str:
        return (
            f"<Bookkeeper pending={self._pending()} unwritten={len(self._unwritten)} "
            f"journaled={len(self._journaled)} written={self.written}>"
        )

    def statistics(self) -> BookkeeperStatistics:
        """What waits and what was written (as trio's objects describe themselves)."""
        return BookkeeperStatistics(
            pending=self._pending(),
            written=self.written,
            failed=self.failed,
            dropped=self.dropped,
            leases_unwritten=len(self._unwritten),
            leases_journaled=len(self._journaled),
            leases_written=self.leases_written,
            batches=self.batches,
            journal_bytes=self._journal_bytes,
        )

    # -- ordered writes: worker status versions, queue episodes --------------------------------

    def put(
        self,
        stream: Stream,
        what: str,
        write: Callable[[], Any],
        then: Callable[[Any], None] | None = None,
    ) -> None:
        """Queue ``write`` (a synchronous store call; never waits here); ``then`` gets its
        result once written."""
        queue = self._queues[stream]
        if len(queue) >= self.limits[stream]:
            dropped = queue.popleft()
            self.dropped += 1
            log.warning("%s: too many writes behind; dropped %s", stream.value, dropped.what)
        self._order += 1
        queue.append(_Write(self._order, what, write, then))
        if self._idle[stream].is_set():
            self._idle[stream] = trio.Event()
        self._wake()

    async def settled(self, stream: Stream | None = None) -> None:
        """Wait until every write of ``stream`` (``None``: of every stream) queued so far is
        written (or given up on)."""
        for s in Stream if stream is None else (stream,):
            await self._idle[s].wait()

    def _pending(self) -> int:
        return sum(len(queue) for queue in self._queues.values())

    def _oldest(self) -> Stream | None:
        """The stream whose next write was queued first (the order things happened in)."""
        heads = [(queue[0].order, s) for s, queue in self._queues.items() if queue]
        return min(heads, key=lambda head: head[0])[1] if heads else None

    async def _write_next(self, stream: Stream) -> None:
        queue = self._queues[stream]
        entry = queue.popleft()
        try:
            result = await retry_busy(entry.write)
        except SwampError as exc:
            self.failed += 1
            log.warning("could not record %s: %s", entry.what, exc)
            return
        else:
            self.written += 1
            if entry.then is not None:
                entry.then(result)
        finally:
            if not queue:  # written, and nothing of this stream queued meanwhile
                self._idle[stream].set()

    # -- lease rows ----------------------------------------------------------------------------

    def open_lease(
        self,
        lease_id: str,
        *,
        worker: str,
        model_type: str,
        model_name: str,
        method: str,
        step_id: str | None = None,
    ) -> Lease:
        """A lease that starts now; nothing is written yet (its row is due in
        :data:`LEASE_WRITE_DELAY`)."""
        lease = Lease(
            lease_id,
            self.leases.opened(
                lease_id=lease_id,
                worker=worker,
                model_type=model_type,
                model_name=model_name,
                method=method,
                step_id=step_id,
            ),
            trio.current_time(),
        )
        self._unwritten[lease_id] = lease
        if self._until == math.inf:
            self._wake()
        return lease

    def adopted_lease(self, record: Record) -> Lease:
        """A lease whose row is stored already: a run carried here by its worker, whose lease
        the burial of its old holder moved to this orchestrator (``swamp.domain.carrying``)."""
        has_writes = bool(record.attributes.get("hasWrites"))
        return Lease(
            record.name.removeprefix("lease-"),
            None,
            trio.current_time(),
            record=record,
            has_writes=has_writes,
            writes_stored=has_writes,
        )

    async def end_lease(self, lease: Lease, state: LeaseState, error: str | None) -> bool:
        """End the lease durably (retried while the database is locked); a lease that cannot be
        ended is expired by the next boot's reconciliation, so the step's outcome stands. Says
        whether this ended it: not, when the store could not be written, or when the row had
        ended or moved to another orchestrator already (a shared database: this one was taken
        for dead meanwhile, and what becomes of the step is no longer its to say)."""
        await _out_of_batch(lease)
        if lease.has_writes and lease.opened is not None:
            lease.opened = self.leases.write_bearing(lease.opened)
        if self._journal_end(lease, state, error):
            return True
        try:
            if await self._insert(
                lease, lambda opened: self.leases.ended(opened, state, error=error)
            ):
                return True
            ended = await retry_busy(
                lambda: self.leases.end(
                    lease.id,
                    state,
                    error=error,
                    current=lease.record,
                    has_writes=lease.has_writes,
                )
            )
        except SwampError as exc:
            log.warning("could not end lease %s as %s: %s", lease.id, state.value, exc)
            return False
        if ended is None:
            log.warning("lease %s had ended, or is no longer this one's", lease.id)
            return False
        lease.record = ended
        return True

    async def mark_writes(self, lease: Lease) -> None:
        """Durably mark the lease write-bearing *before* the first write is persisted."""
        lease.has_writes = True
        await _out_of_batch(lease)
        if not lease.writes_stored:
            if not await self._insert(lease, self.leases.write_bearing):
                lease.record = await retry_busy(
                    lambda: self.leases.mark_writes(lease.id, current=lease.record)
                )
            lease.writes_stored = True

    def mark_effects(self, lease: Lease) -> None:
        """The dispatch had an effect: its lease says so — in the row still to be written, or
        in the stored one by the task, before any other write (never waits: the worker's
        events are being read); one that cannot be made is made with the lease's end."""
        lease.has_writes = True
        if lease.writes_stored:
            return
        if lease.id in self._unwritten and lease.opened is not None:
            lease.opened = self.leases.write_bearing(lease.opened)
            return
        self._effects[lease.id] = lease
        if self._effects_idle.is_set():
            self._effects_idle = trio.Event()
        self._wake()

    async def effects_settled(self) -> None:
        """Wait until every effect said so far is marked in its stored row (or given up)."""
        await self._effects_idle.wait()

    async def _mark_effects(self) -> None:
        """The stored rows of the dispatches that had an effect say so."""
        while self._effects:
            lease = self._effects.pop(next(iter(self._effects)))
            await _out_of_batch(lease)
            if lease.writes_stored or lease.id in self._unwritten:
                continue  # said already; or its row, still to be written, says it (end_lease)
            try:
                lease.record = await self.leases.mark_writes(lease.id, current=lease.record)
            except SwampError as exc:
                log.info("lease %s: its effect is recorded with its end (%s)", lease.id, exc)
                continue
            lease.writes_stored = True
        self._effects_idle.set()

    def _journal_end(self, lease: Lease, state: LeaseState, error: str | None) -> bool:
        """A lease whose row is not written yet ends with one append to the journal, if there is
        one and it takes it; the task puts the row in the store. Says whether it did."""
        if (
            self.journal is None
            or lease.id not in self._unwritten
            or lease.opened is None
            or len(self._journaled) >= MAX_JOURNALED
        ):
            return False
        entry = self.leases.journaled(self.leases.ended(lease.opened, state, error=error))
        try:
            self._journal_bytes += self.journal.append(entry)
        except SwampError as exc:
            if not self._journal_failed:
                log.warning("%s: lease rows go straight to the store meanwhile", exc)
                self._journal_failed = True
            return False
        if self._journal_failed:
            log.info("the journal takes lease rows again")
            self._journal_failed = False
        del self._unwritten[lease.id]
        lease.opened = None
        now = trio.current_time()
        self._journaled.append((entry, now))
        if len(self._journaled) >= JOURNAL_BATCH or self._until > now + JOURNAL_DELAY:
            self._wake()
        return True

    async def _insert(self, lease: Lease, change: Callable[[dict], dict]) -> bool:
        """If the lease's row is not written yet, write it now as ``change`` makes it, and say
        so. Should that fail, the row goes back to be written behind, as it was opened. While
        it is in flight the lease is marked ``batched``, as in a batch: another write or the end
        of the same dispatch waits for it (two writes of one dispatch may come at once)."""
        if self._unwritten.pop(lease.id, None) is None or lease.opened is None:
            return False
        opened = lease.opened
        lease.batched = in_flight = trio.Event()
        try:
            lease.record = await retry_busy(lambda: self.leases.insert(change(opened)))
        except BaseException:
            self._unwritten[lease.id] = lease
            raise
        finally:
            lease.batched = None
            in_flight.set()
        lease.opened = None
        return True

    def _leases_due(self) -> float | None:
        """When the next lease write is due (trio time), or ``None`` when nothing waits."""
        due = None
        if self._unwritten:
            due = next(iter(self._unwritten.values())).opened_at + LEASE_WRITE_DELAY
        if len(self._journaled) >= JOURNAL_BATCH:
            due = -math.inf  # now: this task runs once the step that filled it has replied
        elif self._journaled:
            journaled = self._journaled[0][1] + JOURNAL_DELAY
            due = journaled if due is None else min(due, journaled)
        if due is not None and self._pause:  # the store refused: not before the pause ends
            due = max(due, self._not_before)
        return due

    async def _write_leases(self) -> None:
        try:
            await retry_busy(self._write_due_leases)
        except SwampError as exc:
            if not self._pause:
                log.warning("could not write the leases of dispatches: %s", exc)
            self._pause = min(LEASE_RETRY_CAP, max(LEASE_WRITE_DELAY, self._pause * 2))
            self._not_before = trio.current_time() + self._pause  # they stay due meanwhile
            return
        self._not_before = -math.inf
        if self._pause:
            log.info("the leases of dispatches are written again")
            self._pause = 0.0

    async def _write_due_leases(self) -> None:
        """The rows due now, in one transaction."""
        now = trio.current_time()
        due = []
        for lease in self._unwritten.values():
            if lease.opened_at + LEASE_WRITE_DELAY > now:
                break
            due.append(lease)
        await self._insert_with_journaled(due)

    async def _insert_with_journaled(self, leases: list[Lease]) -> None:
        """The rows of ``leases``, as opened, and every journaled row (all of them: the journal
        is emptied after the commit, so none may stay behind in it), in one transaction.

        While it is in flight the leases are out of ``_unwritten``, marked ``batched``: a
        dispatch that ends or writes meanwhile waits for the commit, then changes the stored
        row (on SQLite nothing runs meanwhile: the transaction never waits). A transaction
        that fails puts them back in front, as they were."""
        journaled = [entry for entry, _ in self._journaled]
        leases = [lease for lease in leases if lease.opened is not None]
        if not leases and not journaled:
            return
        for lease in leases:
            del self._unwritten[lease.id]
            lease.batched = trio.Event()
        self._batch = leases
        try:
            records = await self.leases.insert_many(
                [lease.opened for lease in leases if lease.opened is not None],
                journaled=journaled,
            )
        except BaseException:
            self._unwritten = {lease.id: lease for lease in leases} | self._unwritten
            raise
        else:
            for lease, record in zip(leases, records, strict=True):
                lease.record, lease.opened = record, None
        finally:
            self._batch = []
            for lease in leases:
                if lease.batched is not None:
                    lease.batched.set()
                    lease.batched = None
        self.batches += 1
        self.leases_written += len(records) + len(journaled)
        if journaled:
            del self._journaled[: len(journaled)]
        if journaled and self.journal is not None and not self._journaled:
            try:  # (rows journaled while it was in flight keep the file until the next)
                self.journal.clear()
                self._journal_bytes = 0
            except SwampError as exc:  # its rows are in: the next boot skips them
                log.warning("%s", exc)

    # -- the one task --------------------------------------------------------------------------

    def _wake(self) -> None:
        if self._wakes is not None:
            self._wakes.set()
            self._wakes = None

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Write what is due: lease rows first (they are on the dispatch path), then the
        ordered writes one at a time. Sleeps until the next lease row is due, or until
        something is queued: no timer per dispatch, nothing done when idle."""
        task_status.started()
        while True:
            due = self._leases_due()
            if due is not None and trio.current_time() >= due:
                await self._write_leases()
                continue
            if self._effects:
                await self._mark_effects()
                continue
            stream = self._oldest()
            if stream is not None:
                await self._write_next(stream)
                continue
            self._wakes = wakes = trio.Event()
            self._until = math.inf if due is None else due
            with trio.move_on_at(self._until):
                await wakes.wait()
            self._until = -math.inf  # awake: nothing needs to wake it

    async def flush(self) -> None:
        """At shutdown: the journaled rows go in, and the rows not written yet go in as they are
        (active), so the next boot finds and expires them, as it does any lease a stopped
        orchestrator left running."""
        for lease in list(self._batch):  # a batch in flight ends first (PostgreSQL)
            await _out_of_batch(lease)
        try:
            await self._insert_with_journaled(list(self._unwritten.values()))
            await self._mark_effects()  # the effects said, not in a stored row yet
        except SwampError as exc:
            log.warning("could not write the leases of dispatches: %s", exc)
        self._unwritten.clear()


async def _out_of_batch(lease: Lease) -> None:
    """Wait while the lease's row is in a transaction in flight (it ends written, or back to
    be written behind)."""
    while lease.batched is not None:
        await lease.batched.wait()
