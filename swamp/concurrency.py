"""Structured-concurrency helpers shared by the orchestrator, the worker and the client."""

from __future__ import annotations

import signal
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import trio

from swamp.compat import BaseExceptionGroup

T = TypeVar("T")


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


def run_interruptibly(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``trio.run(fn, *args)`` with Ctrl-C taken as an event: ``fn`` is cancelled, its cleanup
    runs, and ``KeyboardInterrupt`` is raised once ``trio.run`` has returned.

    Trio's own delivery raises ``KeyboardInterrupt`` in whatever unprotected code runs when the
    signal lands; landing inside a nursery's bookkeeping it once broke trio itself (an internal
    error, exit 1, instead of "interrupted" and 130). A second Ctrl-C during the cleanup waits
    in the receiver. Off the main thread (no signals there) it is plain ``trio.run``.
    """
    if threading.current_thread() is not threading.main_thread():
        return trio.run(fn, *args)
    interrupted = False

    async def body() -> T:
        nonlocal interrupted
        scope = trio.CancelScope()

        async def watch(interrupts: AsyncIterator[int]) -> None:
            nonlocal interrupted
            async for _ in interrupts:
                interrupted = True
                scope.cancel()

        with trio.open_signal_receiver(signal.SIGINT) as interrupts:
            async with open_unwrapping_nursery() as nursery:
                nursery.start_soon(watch, interrupts)
                try:
                    with scope:
                        return await fn(*args)
                finally:
                    nursery.cancel_scope.cancel()
        raise KeyboardInterrupt  # the scope caught its cancel: Ctrl-C

    try:
        return trio.run(body)
    except BaseException:
        if interrupted:  # Ctrl-C wins over whatever it broke on its way out
            raise KeyboardInterrupt from None
        raise
