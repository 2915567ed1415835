"""Ctrl-C in a command: taken as an event, the command's cleanup runs, then "interrupted".

The signal is real (sent to this process); the demo's test presses it on real processes."""

from __future__ import annotations

import os
import signal

import pytest
import trio

from swamp.concurrency import open_unwrapping_nursery, run_interruptibly
from swamp.errors import ChannelClosed, NotFound


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
