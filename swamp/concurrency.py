"""Structured-concurrency helpers shared by the orchestrator, the worker and the client."""

from __future__ import annotations

import contextlib
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
    error, exit 1, instead of "interrupted" and 130). Here a handler of our own is installed
    before trio starts (so trio installs none): it only asks for the cancel. A second Ctrl-C
    during the cleanup changes nothing; one after ``fn`` returned leaves its result alone;
    the signal receivers of ``serve`` and ``worker connect`` take it over while they are open
    and hand it back. A SIGINT that is ignored (a background job) or handled by someone else
    stays so, and off the main thread (no signals there) this is plain ``trio.run``.
    """
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        return trio.run(fn, *args)
    interrupted = False
    running: list[tuple[trio.lowlevel.TrioToken, trio.CancelScope]] = []

    def on_interrupt(signum: int, frame: object) -> None:
        nonlocal interrupted
        interrupted = True
        for token, scope in running:  # (none yet: the scope is cancelled as it opens)
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(scope.cancel)

    async def body() -> T:
        with trio.CancelScope() as scope:
            running.append((trio.lowlevel.current_trio_token(), scope))
            if interrupted:
                scope.cancel()
            return await fn(*args)
        raise KeyboardInterrupt  # the scope caught its cancel: Ctrl-C

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        return trio.run(body)
    except BaseException:
        if interrupted:  # Ctrl-C wins over whatever it broke on its way out
            raise KeyboardInterrupt from None
        raise
    finally:
        signal.signal(signal.SIGINT, previous)
