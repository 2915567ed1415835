"""The journal: rows made durable by one append each, taken into the store together later.

A dispatch's lease must be durable, ended, before its client sees the result. Written as its own
SQLite transaction, that row sat between the worker's answer and the client's — the most
expensive place on the dispatch path — once per dispatch. Appended here instead, it is one
``write(2)`` of one line: durable in the sense the store's commits are (WAL with
``synchronous=NORMAL``: it survives the orchestrator being killed, not the machine losing
power), and the rows go into the store a few milliseconds later, many to a transaction.

Each line is one JSON object: the row's key, its spec's retention, its attributes and when it
was made. The file is emptied once every row it holds is in the store. Taking a journal in is
idempotent — a row already in the store is skipped — so a crash between the commit and the
emptying loses nothing and doubles nothing; a line that does not parse (the tail of a write the
machine did not finish) is skipped. Only fresh rows go through here: keys made for them, so a
row in the journal can only be absent from the store or already there, never stale.

The file is the orchestrator's own (mode 0600, in the repo's 0700 ``.swamp/``), but what is read
back from it is still checked as if anyone had written it — a file restored from elsewhere, a
hand edit, a bug: a replay takes in only the rows its caller admits (step leases, whole and well
formed), skips a value the store cannot take, and reads the file as a stream, a batch of rows
to a transaction, so neither a foreign line nor a file of any size can do more than cost a
warning.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sqlite3
import stat
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from swamp.errors import Conflict, StoreError, SwampError
from swamp.store.datastore import (
    WAL_TRUNCATE_BYTES,
    Key,
    Record,
    SpecPolicy,
    wal_size,
)
from swamp.store.records import Operations, SqliteRecords

log = logging.getLogger("swamp.store")
_ENCODER = json.JSONEncoder(separators=(",", ":"))


#: The last moment a version's timestamp can name (9999-12-31, less a second for rounding).
MAX_EPOCH = 253_402_300_798.0
#: A line longer than this is not one the orchestrator wrote (a lease row is a few hundred
#: bytes; its error is capped): it is skipped without being held in memory.
MAX_LINE_BYTES = 1 << 20
#: A journal is taken in this many rows to a transaction (a row admitted is a few KiB at most),
#: so a file of any size is read and taken in with bounded memory.
REPLAY_BATCH_ROWS = 1000


class Unreadable(ValueError):
    """A line that is not an entry: ``reason`` is how it is counted (see :class:`Skipped`)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class Skipped:
    """Lines a replay left out, by reason; said in one warning, never one line each."""

    unreadable: int = 0  # not a whole line we wrote: cut short, not JSON, the wrong shape
    too_long: int = 0  # over MAX_LINE_BYTES
    out_of_range: int = 0  # a value the store cannot take (a timestamp past year 9999)
    foreign: int = 0  # whole, but not a row this journal takes (not a step lease)

    def __bool__(self) -> bool:
        return bool(self.unreadable or self.too_long or self.out_of_range or self.foreign)

    def describe(self) -> str:
        parts = (
            (self.unreadable, "unreadable (cut short, or not an entry)"),
            (self.too_long, f"longer than {MAX_LINE_BYTES} bytes"),
            (self.out_of_range, "with a value the store cannot take"),
            (self.foreign, "not a step lease as the orchestrator journals them"),
        )
        return ", ".join(f"{count} {what}" for count, what in parts if count)


@dataclass(frozen=True)
class Entry:
    """One journaled row: a first version, as :meth:`Datastore.write` would insert it."""

    key: Key
    policy: SpecPolicy
    attributes: dict
    at: float  # epoch seconds: the version's timestamp

    def to_line(self) -> bytes:
        """One line of compact JSON (the store encodes the attributes its own way later, off
        the path the line is written on)."""
        k, p = self.key, self.policy
        body = {
            "key": [k.model_type, k.model_name, k.name],
            "spec": [p.name, p.lifetime, p.garbage_collection],
            "at": self.at,
            "attributes": self.attributes,
        }
        return (_ENCODER.encode(body) + "\n").encode()

    @classmethod
    def from_line(cls, line: bytes) -> Entry | None:
        """The entry a line holds, or ``None`` if it is not one we wrote whole."""
        try:
            return cls.parse(line)
        except Unreadable:
            return None

    @classmethod
    def parse(cls, line: bytes) -> Entry:
        """The entry a line holds, or :class:`Unreadable` saying why not. Whatever the line
        holds, this raises nothing else (a line may nest deeper than the parser goes)."""
        try:
            body = json.loads(line)
            model_type, model_name, name = body["key"]
            spec, lifetime, garbage_collection = body["spec"]
            attributes, at = body["attributes"], body["at"]
        except (ValueError, KeyError, TypeError, UnicodeDecodeError, RecursionError):
            raise Unreadable("unreadable") from None
        if not isinstance(attributes, dict) or not all(isinstance(k, str) for k in attributes):
            raise Unreadable("unreadable")
        if not isinstance(at, (int, float)) or isinstance(at, bool) or not math.isfinite(at):
            raise Unreadable("unreadable")
        if not 0 <= at <= MAX_EPOCH:
            raise Unreadable("out_of_range")
        texts = (model_type, model_name, name, spec, lifetime)
        if not all(isinstance(part, str) and part for part in texts):
            raise Unreadable("unreadable")
        if garbage_collection is not None and (
            not isinstance(garbage_collection, int)
            or isinstance(garbage_collection, bool)
            or garbage_collection < 1
        ):
            raise Unreadable("unreadable")
        try:
            SpecPolicy(spec, lifetime, garbage_collection).lifetime_seconds()
        except SwampError:
            raise Unreadable("unreadable") from None
        return cls(
            Key(model_type, model_name, name),
            SpecPolicy(spec, lifetime, garbage_collection),
            attributes,
            float(at),
        )


def _not_ours(info: os.stat_result) -> str | None:
    """Why a journal file could hold lines someone else wrote, or ``None``: it must be a regular
    file (not followed through a link) of this user that nobody else may write."""
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    if hasattr(os, "geteuid") and info.st_uid != os.geteuid():
        return f"belongs to another user (uid {info.st_uid})"
    if info.st_mode & 0o022:
        return f"may be written by others (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


class Journal:
    """An append-only file of :class:`Entry` lines, next to the database it feeds."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
        try:
            self._fd = os.open(self.path, flags, 0o600)
        except OSError as exc:
            raise StoreError(f"cannot open the journal at {self.path}: {exc.strerror}") from None
        if problem := _not_ours(os.fstat(self._fd)):
            os.close(self._fd)
            raise StoreError(
                f"the journal {self.path} {problem}: what it holds becomes the store's at the "
                f"next start, so it must be this user's alone (chmod 600, or remove it)"
            )

    def __repr__(self) -> str:
        return f"<Journal {self.path}>"

    def append(self, entry: Entry) -> int:
        """Durable once this returns (the kernel has the line); :class:`StoreError` if not.
        Returns the bytes appended."""
        data = entry.to_line()
        try:
            written = os.write(self._fd, data)
            while written < len(data):  # a regular file takes it all, unless the disk is full
                more = os.write(self._fd, data[written:])
                if not more:
                    raise OSError(28, "no space left on device")
                written += more
        except OSError as exc:
            raise StoreError(f"could not append to the journal: {exc.strerror}") from None
        return written

    def entries(self, skipped: Skipped | None = None) -> list[Entry]:
        """Every whole entry in the file, in the order written (all in memory: for a look at a
        small journal; the boot reads it with :meth:`stream`)."""
        return list(self.stream(Skipped() if skipped is None else skipped))

    def stream(self, skipped: Skipped) -> Iterator[Entry]:
        """Every whole entry in the file, in the order written, read as a stream: a line at a
        time, none longer than :data:`MAX_LINE_BYTES` held. The lines that are not entries
        are counted in ``skipped``."""
        try:
            file = open(self.path, "rb")  # noqa: SIM115 - closed below, also when abandoned
        except OSError as exc:
            raise StoreError(f"cannot read the journal at {self.path}: {exc.strerror}") from None
        with file:
            while line := file.readline(MAX_LINE_BYTES + 1):
                if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                    skipped.too_long += 1
                    while (rest := file.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
                        pass  # the rest of it, read and dropped a piece at a time
                    continue
                if not line.strip():
                    continue
                try:
                    yield Entry.parse(line)
                except Unreadable as exc:
                    setattr(skipped, exc.reason, getattr(skipped, exc.reason) + 1)

    def clear(self) -> None:
        """Everything it held is in the store: start again from nothing."""
        try:
            os.ftruncate(self._fd, 0)
        except OSError as exc:
            raise StoreError(f"could not empty the journal: {exc.strerror}") from None

    def close(self) -> None:
        os.close(self._fd)


async def take_in(tx: Operations, entries: list[Entry]) -> list[Record | None]:
    """Insert the rows that are not in the store yet, in the transaction ``tx``. A row already
    there (taken in before a crash emptied the journal) comes back as ``None``."""
    records: list[Record | None] = []
    for entry in entries:
        try:
            records.append(
                await tx.write(
                    entry.key, entry.attributes, policy=entry.policy, fresh=True, at=entry.at
                )
            )
        except Conflict:
            records.append(None)
    return records


async def replay(db: SqliteRecords, journal: Journal, *, admit: Callable[[Entry], bool]) -> int:
    """At boot, before anything reads the store: the rows the last orchestrator journaled go
    in, then the journal is emptied. How many rows were new.

    Only what ``admit`` accepts is taken in (the journal holds step leases: a line of any
    other kind, however well formed, is not the orchestrator's and goes nowhere). The file is
    read as a stream and taken in :data:`REPLAY_BATCH_ROWS` rows to a transaction; a crash
    halfway leaves the file whole, and the next boot skips what is in already. What was left
    out is said in one warning, counted by reason."""
    skipped = Skipped()
    new = 0
    batch: list[Entry] = []

    store = db.store

    async def flush() -> None:
        nonlocal new
        if batch:
            taken = await db.transact(lambda tx: take_in(tx, batch))
            new += sum(1 for record in taken if record is not None)
            batch.clear()
            if wal_size(store.path) > WAL_TRUNCATE_BYTES:  # at boot nothing else checkpoints
                with suppress(sqlite3.Error):  # held by a reader: the checkpointer catches up
                    store.checkpoint()

    for entry in journal.stream(skipped):
        if not admit(entry):
            skipped.foreign += 1
            continue
        batch.append(entry)
        if len(batch) >= REPLAY_BATCH_ROWS:
            await flush()
    await flush()
    if skipped:
        log.warning("the journal %s: skipped %s", journal.path, skipped.describe())
    journal.clear()
    return new
