"""What a dispatched method may read through ``query_data``: the data of the model it runs.

A model instance may declare more in ``models/*.toml``::

    reads = ["build-cache", "@command/shell", "@test/*"]

``build-cache`` is another instance (by name); ``@command/shell`` is every instance of a type;
``@test/*`` every type under ``test/``. Infrastructure records — tokens, workers, leases — are
never in scope, whatever is declared. The scope is applied *inside* the query (as SQL), so a
predicate over data out of scope simply matches nothing: a refusal after matching would tell
the method what exists, one yes/no at a time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from swamp.errors import UserError

# Model types whose data a dispatched method can never read: credentials and the pool.
INFRASTRUCTURE_TYPES = frozenset(
    {
        "swamp/enrollment-token",
        "swamp/token-binding",
        "swamp/server-token",
        "swamp/worker",
        "swamp/worker-holding",
        "swamp/step-lease",
        "swamp/pending-dispatch",
    }
)
_TYPE_PATTERN = re.compile(r"[a-z0-9*][a-z0-9_*-]*(/[a-z0-9*][a-z0-9_*-]*)*")
_INSTANCE = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")


@dataclass(frozen=True)
class ReadEntry:
    """One ``reads`` entry: an instance name, or (``@…``) a model-type pattern."""

    instance: str | None = None
    type_pattern: str | None = None


def parse_reads(entries: Iterable[object], *, source: str) -> tuple[ReadEntry, ...]:
    out = []
    for entry in entries:
        if isinstance(entry, str) and entry.startswith("@") and _TYPE_PATTERN.fullmatch(entry[1:]):
            out.append(ReadEntry(type_pattern=entry[1:]))
        elif isinstance(entry, str) and _INSTANCE.fullmatch(entry):
            out.append(ReadEntry(instance=entry))
        else:
            raise UserError(
                f"invalid reads entry {entry!r} in {source}: a model instance name "
                "(build-cache), or @ and a model type, '*' matching any part "
                "(@command/shell, @test/*)"
            )
    return tuple(out)


@dataclass(frozen=True)
class ReadScope:
    """Resolved: exact ``(model type, model name)`` items, plus type patterns (``*`` = any)."""

    items: frozenset[tuple[str, str]]
    type_patterns: tuple[str, ...] = ()
    excluded_types: frozenset[str] = INFRASTRUCTURE_TYPES

    @classmethod
    def of(
        cls,
        model_type: str,
        model_name: str,
        *,
        also: Iterable[tuple[str, str]] = (),
        type_patterns: Iterable[str] = (),
    ) -> ReadScope:
        return cls(frozenset({(model_type, model_name), *also}), tuple(type_patterns))

    def allows(self, model_type: str, model_name: str) -> bool:
        """The same rule in Python (the store applies it as SQL)."""
        if model_type in self.excluded_types:
            return False
        if (model_type, model_name) in self.items:
            return True
        return any(
            re.fullmatch(re.escape(p).replace(r"\*", ".*"), model_type) for p in self.type_patterns
        )


#: Every model's data and never infrastructure: what a workflow's expressions may read
#: (``data.query``, ``data.latest``): their values are rendered into steps that go to workers.
ALL_DATA = ReadScope(frozenset(), ("*",))
