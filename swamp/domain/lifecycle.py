"""Lifecycles as explicit transition tables.

Token states, worker statuses and lease states each declare, in one place, which transitions are
legal. An illegal transition raises and changes nothing; the tests walk every pair.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import Enum

from swamp.errors import IllegalTransition


class Lifecycle:
    def __init__(self, name: str, table: Mapping[Enum, Iterable[Enum]]) -> None:
        self.name = name
        self.table = {state: frozenset(targets) for state, targets in table.items()}

    def allows(self, current: Enum, target: Enum) -> bool:
        return target in self.table.get(current, frozenset())

    def check(self, current: Enum, target: Enum) -> None:
        if not self.allows(current, target):
            raise IllegalTransition(
                f"{self.name} cannot go from {current.value!r} to {target.value!r}"
            )

    def terminal(self, state: Enum) -> bool:
        return not self.table.get(state)
