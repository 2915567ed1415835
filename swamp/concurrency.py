"""Structured-concurrency helpers shared by the orchestrator, the worker and the client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from swamp.compat import BaseExceptionGroup


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


@asynccontextmanager
async def open_unwrapping_nursery() -> AsyncIterator[trio.Nursery]:
    """A nursery whose single failure surfaces as itself, not wrapped in an exception group.

    Trio wraps whatever a nursery body or child raises in a group; callers here catch typed
    errors (``ChannelClosed``, ``Rejected``...), so one error is unwrapped. Several distinct
    errors stay grouped: they are a genuine multiple failure.
    """
    try:
        async with trio.open_nursery() as nursery:
            yield nursery
    except BaseExceptionGroup as group:
        leaves = _leaves(group)
        interrupt = next((e for e in leaves if isinstance(e, KeyboardInterrupt)), None)
        if interrupt is not None:  # Ctrl-C wins over whatever it broke on its way
            raise interrupt from None
        real = [e for e in leaves if not isinstance(e, trio.Cancelled)]
        if len(real) == 1:
            raise real[0] from None
        if not real and leaves:
            raise leaves[0] from None
        raise
