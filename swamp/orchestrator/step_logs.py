"""Step logs, live: every line a dispatch prints goes in, batches go to the store.

The dispatch path hands each line to :meth:`StepLogs.append`, which never waits: the line
joins its log's open chunk in memory (a log gets its row with its first line: a dispatch that
prints nothing costs nothing) (``swamp.domain.step_logs`` says when a chunk is sealed)
and the writer is woken. The writer (:meth:`StepLogs.run`, one task) lets lines gather for
:data:`LINGER` seconds, then writes every log's chunks in one transaction — many lines to a
row, many rows to a commit, never a write per line — and wakes the followers. So a worker
streaming a million lines is never slowed by the database, and a reader never slows either:
it reads what is stored, at its own pace (``swamp logs --follow``).

What memory holds is bounded per log by the same cap as the store: when the writer is behind
(the database locked by another process, say), a log's sealed chunks wait here, and past the
cap the oldest of them go — as the store would have dropped them a moment later — and the
line numbers of the next chunk tell every reader how many are missing. Across every log it is
bounded too (``pending_cap``: 128 busy steps never hold 128 caps): past it the oldest sealed
chunks of any log go, the same way. Nothing is dropped silently: the gap is printed where it
is.

Without a running writer (the CLI straight on a repo, where nothing else shares the process)
a batch is written by the caller when it is full (:meth:`capture` awaits it), and the rest when
its log closes (:meth:`opened`).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio

from swamp.domain.step_logs import (
    CHUNK_BYTES,
    CHUNK_LINES,
    DEFAULT_CAP_BYTES,
    LINE_CHARS,
    STREAM_CODES,
    LogOwner,
    line_bytes,
    pending_cap,
)
from swamp.errors import SwampError
from swamp.store.retry import retry_busy
from swamp.store.step_logs import Chunk, LogEnd, LogStart, LogStore

log = logging.getLogger("swamp.logs")
LINGER = 0.2  # seconds lines gather before a batch is written (how far --follow lags)
SETTLE_WAIT = 5.0  # the most a reader waits for the lines of logs already ended to be stored
CLOSE_WAIT = 5.0  # the most a log's last lines may take to be written when it closes
BATCH_BYTES = 4 * 1024 * 1024  # one transaction holds at most about this much text
Emit = Callable[[dict], Awaitable[None]]


@dataclass(eq=False)
class _Log:
    """One open log: its unsealed lines, its sealed chunks waiting for the writer, and the
    number of the next line and byte."""

    id: str
    start: LogStart | None  # until its first line: a dispatch that prints nothing costs no row
    lines: list[str] = field(default_factory=list)
    codes: list[str] = field(default_factory=list)
    size: int = 0  # of the unsealed lines
    first_line: int = 0  # of the unsealed lines, in the whole output
    first_byte: int = 0
    sealed: deque[Chunk] = field(default_factory=deque)
    sealed_bytes: int = 0


class StepLogs:
    def __init__(
        self,
        store: LogStore,
        *,
        cap: int = DEFAULT_CAP_BYTES,
        linger: float = LINGER,
        clock: Callable[[], float] = time.time,
        total_cap: int | None = None,
    ) -> None:
        self.store = store
        self.cap = cap
        self.pending_cap = pending_cap(cap) if total_cap is None else max(total_cap, cap)
        self.linger = linger
        self.clock = clock
        self._open: dict[str, _Log] = {}
        self._dirty: dict[str, _Log] = {}  # logs with lines not yet written (ordered)
        self._started: list[LogStart] = []
        self._ended: list[LogEnd] = []
        # open, or ended and not yet all written: a reader may still see more of it
        self._unsettled: dict[str, str | None] = {}  # log id → its run's id
        self._unsettled_runs: dict[str, int] = {}
        self._wake = trio.Event()
        self._hurry = trio.Event()  # a reader waits for ended logs: write without lingering
        self._written = trio.Event()
        self._ends = 0  # logs with lines that ended, in all
        self._ends_stored = 0  # of them, those whose last lines are in the store
        self.writing = False  # a writer task runs (serve); else the caller writes (the CLI)
        self.pending_bytes = 0  # sealed, not yet written
        # every sealed chunk in the order sealed, to drop the oldest across logs; one already
        # written or dropped is skipped when met (and the queue compacted when mostly such)
        self._sealed_order: deque[tuple[_Log, Chunk]] = deque()
        self._pending_chunks = 0
        self.lines = 0  # taken in, in all
        self.batches = 0
        self.dropped_lines = 0  # dropped here at the cap, before they could be written
        self.lost_batches = 0  # a write the store refused for good (said in serve's log)

    def __repr__(self) -> str:
        return (
            f"<StepLogs open={len(self._open)} lines={self.lines} batches={self.batches} "
            f"pending={self.pending_bytes}B dropped={self.dropped_lines}>"
        )

    def statistics(self) -> dict:
        return {
            "open": len(self._open),
            "lines": self.lines,
            "batches": self.batches,
            "pendingBytes": self.pending_bytes,
            "droppedLines": self.dropped_lines,
            "lostBatches": self.lost_batches,
        }

    # -- the dispatch path: never waits ------------------------------------------------------

    def open(self, log_id: str, owner: LogOwner, *, worker: str | None, attempt: int = 1) -> None:
        if log_id in self._open:
            return
        self._open[log_id] = _Log(log_id, LogStart(log_id, owner, worker, attempt, self.clock()))
        self._unsettled[log_id] = owner.run_id
        if owner.run_id is not None:
            self._unsettled_runs[owner.run_id] = self._unsettled_runs.get(owner.run_id, 0) + 1

    def live(self, log_id: str) -> bool:
        """More of this log may still reach the store (it is open, or not all written)."""
        return log_id in self._unsettled

    def live_run(self, run_id: str) -> bool:
        """A log of this run may still get more (see :meth:`live`)."""
        return run_id in self._unsettled_runs

    def _settle(self, ended: list[LogEnd]) -> None:
        for end in ended:
            run_id = self._unsettled.pop(end.log_id, None)
            if run_id is not None:
                left = self._unsettled_runs.get(run_id, 1) - 1
                if left > 0:
                    self._unsettled_runs[run_id] = left
                else:
                    self._unsettled_runs.pop(run_id, None)

    def append(self, log_id: str, line: str, stream: str | None) -> None:
        entry = self._open.get(log_id)
        if entry is None:
            return
        if entry.start is not None:  # its first line: now it has a row to write
            self._started.append(entry.start)
            entry.start = None
        if len(line) > LINE_CHARS:
            line = line[:LINE_CHARS] + f" … (cut at {LINE_CHARS} characters)"
        size = line_bytes(line)
        entry.lines.append(line)
        entry.codes.append(STREAM_CODES.get(stream or "log", "l"))
        entry.size += size
        self.lines += 1
        if entry.id not in self._dirty:
            self._dirty[entry.id] = entry
        if len(entry.lines) >= CHUNK_LINES or entry.size >= CHUNK_BYTES:
            self._seal(entry)
        self._poke()

    @property
    def batch_due(self) -> bool:
        """Without a writer, a full batch waits for its caller to write it (:meth:`flush`)."""
        return not self.writing and self.pending_bytes >= BATCH_BYTES

    def close(self, log_id: str) -> None:
        entry = self._open.pop(log_id, None)
        if entry is None:
            return
        if entry.start is not None:  # it printed nothing: nothing to keep
            self._settle([LogEnd(log_id, 0.0, 0, 0)])
            return
        self._seal(entry)
        self._dirty[entry.id] = entry
        self._ended.append(LogEnd(log_id, self.clock(), entry.first_line, entry.first_byte))
        self._ends += 1
        self._poke()

    @asynccontextmanager
    async def opened(
        self, log_id: str, owner: LogOwner, *, worker: str | None, attempt: int = 1
    ) -> AsyncIterator[None]:
        """The log open while the block runs; without a writer, written when it ends (within
        :data:`CLOSE_WAIT`, even when the block was cancelled)."""
        self.open(log_id, owner, worker=worker, attempt=attempt)
        try:
            yield
        finally:
            self.close(log_id)
            if not self.writing:
                with trio.move_on_after(CLOSE_WAIT) as scope:
                    scope.shield = True
                    await self.flush()

    def capture(self, log_id: str, emit: Emit) -> Emit:
        """``emit``, keeping the lines of the log events it passes on (a method run in this
        process: its events are dicts, not yet decoded)."""

        async def relay(event: dict) -> None:
            if event.get("kind") == "log" and isinstance(event.get("line"), str):
                stream = event.get("stream")
                self.append(log_id, event["line"], stream if isinstance(stream, str) else None)
                if self.batch_due:
                    await self.flush()
            await emit(event)

        return relay

    def _seal(self, entry: _Log) -> None:
        if not entry.lines:
            return
        chunk = Chunk(
            entry.id,
            entry.first_line,
            entry.first_byte,
            entry.lines,
            "".join(entry.codes),
            entry.size,
        )
        entry.first_line += len(entry.lines)
        entry.first_byte += entry.size
        entry.lines, entry.codes, entry.size = [], [], 0
        entry.sealed.append(chunk)
        entry.sealed_bytes += chunk.size
        self.pending_bytes += chunk.size
        self._pending_chunks += 1
        self._sealed_order.append((entry, chunk))
        while entry.sealed_bytes > self.cap and len(entry.sealed) > 1:  # the writer is behind
            self._drop_oldest(entry)
        while self.pending_bytes > self.pending_cap and self._sealed_order:  # of every log
            oldest, first = self._sealed_order.popleft()
            if oldest.sealed and oldest.sealed[0] is first:
                self._drop_oldest(oldest)
        if len(self._sealed_order) > 2 * self._pending_chunks + 64:
            alive = {id(c) for e in self._dirty.values() for c in e.sealed}
            self._sealed_order = deque((e, c) for e, c in self._sealed_order if id(c) in alive)

    def _drop_oldest(self, entry: _Log) -> None:
        oldest = entry.sealed.popleft()
        entry.sealed_bytes -= oldest.size
        self.pending_bytes -= oldest.size
        self._pending_chunks -= 1
        self.dropped_lines += len(oldest.lines)

    def _poke(self) -> None:
        if not self._wake.is_set():
            self._wake.set()

    # -- the writer ----------------------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Write batches as lines come, until cancelled (``flush`` writes the rest)."""
        self.writing = True
        task_status.started()
        try:
            while True:
                await self._wake.wait()
                with trio.move_on_after(self.linger):  # what comes meanwhile joins this batch
                    await self._hurry.wait()
                self._wake, self._hurry = trio.Event(), trio.Event()
                while self._started or self._ended or self._dirty:
                    if not await self._write_one(self._take()):
                        break  # the store refused it: again at the next wake, not in a loop
                    await trio.lowlevel.checkpoint()  # a big backlog goes a batch at a time
        finally:
            self.writing = False

    def _take(self) -> tuple[list[LogStart], list[Chunk], list[LogEnd]]:
        """One batch: every log opened and ended so far, and chunks up to about
        :data:`BATCH_BYTES` (open chunks sealed: what is written is what a reader sees)."""
        started, self._started = self._started, []
        chunks: list[Chunk] = []
        size = 0
        for log_id, entry in list(self._dirty.items()):
            self._seal(entry)
            while entry.sealed and (not chunks or size + entry.sealed[0].size <= BATCH_BYTES):
                chunk = entry.sealed.popleft()
                entry.sealed_bytes -= chunk.size
                self.pending_bytes -= chunk.size
                self._pending_chunks -= 1
                chunks.append(chunk)
                size += chunk.size
            if entry.sealed:
                break  # the batch is full: the rest goes next
            del self._dirty[log_id]
        ended: list[LogEnd] = []
        if not self._dirty:  # a log ends once every chunk of it is in
            ended, self._ended = self._ended, []
        return started, chunks, ended

    async def _write_one(self, batch: tuple[list[LogStart], list[Chunk], list[LogEnd]]) -> bool:
        """Whether the batch was stored. A lost batch loses its lines (said in the log, and
        by the gap readers see), never its logs' starts and ends: they go again with the
        next batch (their later chunks need the row; an unended row is never collected)."""
        started, chunks, ended = batch
        try:
            await retry_busy(lambda: self.store.write(started, chunks, ended, cap=self.cap))
        except trio.Cancelled:  # (serve stopping while a server had the batch: rolled back)
            self._started[:0] = started  # the logs' starts and ends go with the last flush
            self._ended[:0] = ended
            raise
        except SwampError as exc:  # refused, or the database is away (PostgreSQL down)
            self.lost_batches += 1
            log.warning(
                "could not store %d line(s) of step output: %s",
                sum(len(c.lines) for c in chunks),
                exc.message,
            )
            self._started[:0] = started
            self._ended[:0] = ended
            return False
        self.batches += 1
        self._settle(ended)
        self._ends_stored += len(ended)
        self._written.set()
        self._written = trio.Event()
        return True

    async def flush(self) -> None:
        """Write everything now, in this task (the CLI; and serve's close)."""
        while self._started or self._ended or self._dirty:
            started, chunks, ended = self._take()
            try:
                await self.store.write(started, chunks, ended, cap=self.cap)
            except SwampError as exc:
                self.lost_batches += 1
                log.warning("could not store step output: %s", exc.message)
                self._started[:0] = started  # as in the writer: starts and ends go again
                self._ended[:0] = ended
                return
            self.batches += 1
            self._settle(ended)
            self._ends_stored += len(ended)

    async def caught_up(self) -> None:
        """Return once every log that has ended so far is stored to its last line, or after
        :data:`SETTLE_WAIT` seconds. A reader asks this first, so ``swamp logs`` right after a
        run shows all of it; the dispatch path never waits for the store (a result does not
        wait for a write, nor does each ending dispatch cost a transaction of its own), and
        a locked database never holds a reader long."""
        target = self._ends
        if not self.writing or self._ends_stored >= target:
            return
        with trio.move_on_after(SETTLE_WAIT):
            while self.writing and self._ends_stored < target:
                self._hurry.set()
                self._poke()
                await self._written.wait()

    # -- followers ---------------------------------------------------------------------------

    async def written(self) -> None:
        """Return after the next batch goes in (the caller bounds the wait)."""
        await self._written.wait()
