"""Ctrl-C in a command: taken as an event, the command's cleanup runs, then "interrupted".

The signal is real (sent to this process); the demo's test presses it on real processes."""

from __future__ import annotations

import os
import signal

import pytest
import trio

from swamp.concurrency import open_unwrapping_nursery, run_interruptibly
from swamp.errors import ChannelClosed, NotFound


@pytest.fixture(autouse=True)
def ctrl_c_as_at_a_terminal():
    """Ctrl-C as an interactive shell leaves it (a suite started as a background job of a
    script inherits it ignored, and these tests would wait for ever)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def _press_ctrl_c() -> None:
    os.kill(os.getpid(), signal.SIGINT)


def test_a_command_that_ends_returns_its_value():
    async def answer(a: int, b: int) -> int:
        await trio.lowlevel.checkpoint()
        return a + b

    assert run_interruptibly(answer, 2, 3) == 5


def test_ctrl_c_cancels_the_command_runs_its_cleanup_and_raises_keyboard_interrupt():
    cleaned: list[str] = []

    async def command() -> None:
        try:
            async with open_unwrapping_nursery() as nursery:
                nursery.start_soon(trio.sleep_forever)
                _press_ctrl_c()
                await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                _press_ctrl_c()  # a second Ctrl-C during the cleanup waits; the cleanup ends
                await trio.sleep(0.01)
                cleaned.append("stopped the children")

    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        run_interruptibly(command)
    assert cleaned == ["stopped the children"]
    assert signal.getsignal(signal.SIGINT) == before  # given back


def test_ctrl_c_wins_over_an_error_it_caused_on_the_way_out():
    async def command() -> None:
        try:
            _press_ctrl_c()
            await trio.sleep_forever()
        finally:
            raise ChannelClosed("the connection closed")

    with pytest.raises(KeyboardInterrupt):
        run_interruptibly(command)


def test_an_error_without_ctrl_c_is_the_error():
    async def command() -> None:
        await trio.lowlevel.checkpoint()
        raise NotFound("no such model")

    with pytest.raises(NotFound, match="no such model"):
        run_interruptibly(command)


def test_ctrl_c_just_as_the_command_ends_leaves_its_result_alone():
    async def command() -> int:
        await trio.lowlevel.checkpoint()
        _press_ctrl_c()  # handled at once; no checkpoint follows in the command
        return 7

    assert run_interruptibly(command) == 7


def test_a_signal_receiver_inside_the_command_takes_ctrl_c_while_it_is_open():
    """As ``serve`` and ``worker connect`` do: their receiver hears it, nothing is
    cancelled; closed, it hands Ctrl-C back."""

    async def command() -> str:
        with trio.open_signal_receiver(signal.SIGINT) as signals:
            _press_ctrl_c()
            async for signum in signals:
                assert signum == signal.SIGINT
                break
        await trio.sleep(0.01)
        return "drained"

    assert run_interruptibly(command) == "drained"


def test_an_ignored_ctrl_c_stays_ignored():
    """A command started with SIGINT ignored (a background job of a script) is not made
    interruptible."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:

        async def command() -> str:
            _press_ctrl_c()
            await trio.sleep(0.01)
            return "done"

        assert run_interruptibly(command) == "done"
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
