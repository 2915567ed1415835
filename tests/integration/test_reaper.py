"""The reaper kills what its worker tracked: when the worker goes, or stops beating."""

import os
import signal
import subprocess
import sys

import pytest
import trio

from swamp.worker.reaper import Reaper

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="process groups")


async def _sleeper() -> trio.Process:
    return await trio.lowlevel.open_process(
        ["sleep", "60"], start_new_session=True, stdout=subprocess.DEVNULL
    )


async def _dies(process: trio.Process, within: float) -> bool:
    with trio.move_on_after(within):
        await process.wait()
        return process.returncode == -signal.SIGKILL
    return False


async def test_closing_the_pipe_kills_every_tracked_group():
    reaper = await Reaper.start()
    tracked, untracked = await _sleeper(), await _sleeper()
    reaper.track(tracked.pid)
    reaper.track(untracked.pid)
    reaper.untrack(untracked.pid)
    await reaper.aclose()  # what the worker's death does to the pipe
    assert await _dies(tracked, 5)
    assert untracked.returncode is None
    untracked.kill()
    await untracked.wait()


async def test_silence_kills_the_groups_but_the_reaper_waits_for_more():
    reaper = await Reaper.start()
    reaper.set_silence(3)  # three beats (the least it accepts)
    first = await _sleeper()
    reaper.track(first.pid)
    assert await _dies(first, 8)  # no beats: the worker is frozen
    second = await _sleeper()
    reaper.track(second.pid)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reaper.beat)
        await trio.sleep(5)  # beating: nothing is killed
        assert second.returncode is None
        nursery.cancel_scope.cancel()
    assert reaper.process.returncode is None
    await reaper.aclose()
    assert await _dies(second, 5)


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="found through /proc")
async def test_silence_also_kills_a_command_the_worker_had_not_told_it_about():
    """Frozen between starting a command and saying so (the window is short, but a loaded
    machine can stop a worker right there): the reaper finds the worker's command sessions
    itself, and the command does not outlive the freeze."""
    reaper = await Reaper.start()
    reaper.set_silence(3)
    untold = await _sleeper()  # started, never tracked
    assert await _dies(untold, 8)
    assert reaper.process.returncode is None  # the reaper did not take itself for one
    await reaper.aclose()


async def test_terminal_signals_do_not_stop_the_reaper():
    reaper = await Reaper.start()
    sleeper = await _sleeper()
    reaper.track(sleeper.pid)
    for sig in (signal.SIGINT, signal.SIGTERM):
        os.kill(reaper.process.pid, sig)  # e.g. Ctrl-C in the worker's terminal
    await trio.sleep(0.5)
    assert reaper.process.returncode is None and sleeper.returncode is None
    await reaper.aclose()
    assert await _dies(sleeper, 5)
