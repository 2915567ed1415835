"""A book's awaited calls made from a plain (synchronous) test: each runs to its end in a
``trio.run`` of its own. The books are awaited through ``swamp.store.records``; a test of
what they store, on SQLite, need not be a trio test for that."""

from __future__ import annotations

import functools
import inspect
from typing import Any

import trio


class Synced:
    """``target`` with every coroutine method called to its end, the rest as they are."""

    def __init__(self, target: Any) -> None:
        object.__setattr__(self, "target", target)

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.target, name)
        if inspect.iscoroutinefunction(attribute):
            return lambda *args, **kwargs: trio.run(functools.partial(attribute, *args, **kwargs))
        return attribute

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.target, name, value)
