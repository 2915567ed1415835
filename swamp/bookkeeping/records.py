"""Reading stored bookkeeping that may be damaged: one bad record is skipped, never fatal.

Records are data, and data can be edited by hand, written by an older version or half-restored
from a backup. Every reader of tokens, workers and leases goes through :func:`decoded`, so a
record it cannot understand costs one warning naming it — not the worker list, the token list
or the orchestrator's boot.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from swamp.domain.text import printable
from swamp.store.datastore import Record
from swamp.store.records import Records

log = logging.getLogger("swamp.records")
T = TypeVar("T")


def decoded(records: Iterable[Record], decode: Callable[[Record], T]) -> Iterator[T]:
    for record in records:
        try:
            yield decode(record)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            log.warning(
                "skipping the malformed %s record %s/%s v%d (%s: %s)",
                record.model_type,
                printable(record.model_name),
                printable(record.name),
                record.version,
                type(exc).__name__,
                printable(exc),
            )


async def collect_ended(
    db: Records, model_type: str, instance: str, *, open_state: str, cutoff: str
) -> int:
    """Delete the items of ``model_type``/``instance`` that have ended (their ``state`` is not
    ``open_state``) before ``cutoff`` (an ISO time): leases, queue episodes. The store stays
    bounded; what is still open is never touched."""
    stale = [
        r.key
        for r in await db.latest_of_type(model_type, model_name=instance)
        if r.attributes.get("state") != open_state and r.attributes.get("endedAt", "") < cutoff
    ]
    return await db.delete_items(stale) if stale else 0


def has_fields(*names: str) -> Callable[[Record], dict]:
    """A decoder that insists on string fields ``names`` and returns the attributes."""

    def decode(record: Record) -> dict:
        attrs = record.attributes
        if not isinstance(attrs, dict):
            raise TypeError("the attributes are not an object")
        for name in names:
            if not isinstance(attrs.get(name), str):
                raise KeyError(name)
        return attrs

    return decode


#: Which records a reconciliation takes as left by an orchestrator that is gone: on a
#: database of its own, every record (the last one died before this one started); on one
#: several share, those naming a dead orchestrator (``swamp.orchestrator.peers``).
Orphaned = Callable[[dict], bool]
RESTART = "orchestrator restart"


def everything(attrs: dict) -> bool:
    return True
