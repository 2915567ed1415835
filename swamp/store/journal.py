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
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

from swamp.errors import Conflict, StoreError, SwampError
from swamp.store.datastore import Datastore, Key, Record, SpecPolicy

log = logging.getLogger("swamp.store")
_ENCODER = json.JSONEncoder(separators=(",", ":"))


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
            body = json.loads(line)
            model_type, model_name, name = body["key"]
            spec, lifetime, garbage_collection = body["spec"]
            attributes, at = body["attributes"], body["at"]
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            return None
        if not isinstance(attributes, dict) or not all(isinstance(k, str) for k in attributes):
            return None
        if not isinstance(at, (int, float)) or isinstance(at, bool) or not math.isfinite(at):
            return None
        texts = (model_type, model_name, name, spec, lifetime)
        if not all(isinstance(part, str) and part for part in texts):
            return None
        if garbage_collection is not None and (
            not isinstance(garbage_collection, int)
            or isinstance(garbage_collection, bool)
            or garbage_collection < 1
        ):
            return None
        try:
            SpecPolicy(spec, lifetime, garbage_collection).lifetime_seconds()
        except SwampError:
            return None
        return cls(
            Key(model_type, model_name, name),
            SpecPolicy(spec, lifetime, garbage_collection),
            attributes,
            float(at),
        )


class Journal:
    """An append-only file of :class:`Entry` lines, next to the database it feeds."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StoreError(f"cannot open the journal at {self.path}: {exc.strerror}") from None

    def __repr__(self) -> str:
        return f"<Journal {self.path}>"

    def append(self, entry: Entry) -> None:
        """Durable once this returns (the kernel has the line); :class:`StoreError` if not."""
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

    def entries(self) -> list[Entry]:
        """Every whole entry in the file, in the order written."""
        with open(self.path, "rb") as file:
            lines = file.read().split(b"\n")
        entries = [entry for line in lines if line and (entry := Entry.from_line(line))]
        skipped = sum(1 for line in lines if line) - len(entries)
        if skipped:
            log.warning("skipped %d unreadable line(s) in the journal %s", skipped, self.path)
        return entries

    def clear(self) -> None:
        """Everything it held is in the store: start again from nothing."""
        try:
            os.ftruncate(self._fd, 0)
        except OSError as exc:
            raise StoreError(f"could not empty the journal: {exc.strerror}") from None

    def close(self) -> None:
        os.close(self._fd)


def take_in(store: Datastore, entries: list[Entry]) -> list[Record | None]:
    """Insert the rows that are not in the store yet; call inside a transaction. A row already
    there (taken in before a crash emptied the journal) comes back as ``None``."""
    records: list[Record | None] = []
    for entry in entries:
        try:
            records.append(
                store.write(
                    entry.key, entry.attributes, policy=entry.policy, fresh=True, at=entry.at
                )
            )
        except Conflict:
            records.append(None)
    return records


def replay(store: Datastore, journal: Journal) -> int:
    """At boot, before anything reads the store: what the last orchestrator journaled goes in,
    in one transaction, then the journal is emptied. How many rows were new."""
    entries = journal.entries()
    if entries:
        with store.transaction():
            taken = take_in(store, entries)
    else:
        taken = []
    journal.clear()
    return sum(1 for record in taken if record is not None)
