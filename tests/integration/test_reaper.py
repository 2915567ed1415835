"""The reaper, driven as the worker drives it: what it kills, when, and what it leaves alone.

Each command here daemonizes the way real ones do — ``setsid -f`` forks, and the child leaves
both the command's process group and its tree (its parent exits) — and writes its daemon's pid
to a file. The detector is whether that pid is still a live process; the control shows it fires
on the same daemon when only its process group is killed, which is all the reaper used to do.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path

import pytest
import trio

from swamp.worker.reaper import Reaper

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="adopting orphans: Linux"),
    pytest.mark.skipif(shutil.which("setsid") is None, reason="needs setsid"),
]
ENV = {"PATH": os.defpath, "SWAMP_STEP_ID": "0" * 32, "SWAMP_ATTEMPT": "1"}
DEADLINE = 30  # generous: a busy machine is slow, never wrong


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


async def gone(pid: int) -> bool:
    """Whether ``pid`` is gone within the deadline (it is killed at once; this only waits for
    the kernel to say so)."""
    with trio.move_on_after(DEADLINE):
        # not our child: the kernel sends no event when it goes, /proc only says it has
        while alive(pid):  # noqa: ASYNC110
            await trio.sleep(0.05)
        return True
    return False


def daemonizing(directory: Path, name: str, *, then: str = "exec sleep 600") -> str:
    """A command that starts a daemon (its pid in ``name``), then ``then``."""
    pidfile = directory / name
    return (
        f"setsid -f sh -c 'echo $$ > {pidfile}.tmp && mv {pidfile}.tmp {pidfile}; "
        f"exec sleep 600' < /dev/null > /dev/null 2>&1; {then}"
    )


async def pid_in(path: Path) -> int:
    with trio.fail_after(DEADLINE):
        # written by a process that is not ours (a daemon): no event reaches us
        while not await trio.Path(path).exists():  # noqa: ASYNC110
            await trio.sleep(0.05)
    return int(await trio.Path(path).read_text())


async def test_the_control_a_daemon_outlives_a_kill_of_its_group(tmp_path):
    """Without the reaper's adoption: killing the command's group, as the reaper used to,
    leaves the daemon running."""
    command = await trio.lowlevel.open_process(
        ["/bin/sh", "-c", daemonizing(tmp_path, "daemon")], start_new_session=True, env=ENV
    )
    daemon = await pid_in(tmp_path / "daemon")
    try:
        os.killpg(command.pid, signal.SIGKILL)
        await command.wait()
        assert alive(daemon)  # the detector fires
    finally:
        os.kill(daemon, signal.SIGKILL)


async def test_closing_the_socket_kills_every_command_and_everything_it_started(tmp_path):
    reaper = await Reaper.start()
    async with trio.open_nursery() as nursery:
        await nursery.start(reaper.serve)
        command = await reaper.start_command(
            ["/bin/sh", "-c", daemonizing(tmp_path, "daemon")], env=ENV, cwd=None
        )
        daemon = await pid_in(tmp_path / "daemon")
        ended = await reaper.start_command(
            ["/bin/sh", "-c", daemonizing(tmp_path, "left", then="exit 0")], env=ENV, cwd=None
        )
        assert await ended.wait() == 0
        left = await pid_in(tmp_path / "left")  # what a command left running when it ended
        assert alive(left)  # ... runs on, until its worker stops
        nursery.cancel_scope.cancel()
    await reaper.aclose()  # what the worker's death does to the socket
    assert await gone(command.pid) and await gone(daemon) and await gone(left)
    assert reaper.process.returncode == 0


async def test_killing_a_command_kills_its_tree_and_its_orphans_not_others(tmp_path):
    reaper = await Reaper.start()
    async with trio.open_nursery() as nursery:
        await nursery.start(reaper.serve)
        victim = await reaper.start_command(
            ["/bin/sh", "-c", daemonizing(tmp_path, "victim")], env=ENV, cwd=None
        )
        other_env = {**ENV, "SWAMP_STEP_ID": "1" * 32}
        bystander = await reaper.start_command(
            ["/bin/sh", "-c", daemonizing(tmp_path, "bystander")], env=other_env, cwd=None
        )
        orphan, other_orphan = (
            await pid_in(tmp_path / "victim"),
            await pid_in(tmp_path / "bystander"),
        )
        victim.kill()  # its dispatch timed out, or was cancelled
        assert await victim.wait() == -signal.SIGKILL
        assert await gone(orphan)
        assert bystander.returncode is None and alive(other_orphan)
        nursery.cancel_scope.cancel()
    await reaper.aclose()
    assert await gone(other_orphan)


async def test_silence_kills_everything_but_the_reaper_waits_for_more(tmp_path):
    reaper = await Reaper.start()
    async with trio.open_nursery() as nursery:
        await nursery.start(reaper.serve)
        reaper.set_silence(3)  # three beats (the least it accepts)
        command = await reaper.start_command(  # answered after the silence line was read
            ["/bin/sh", "-c", daemonizing(tmp_path, "daemon")], env=ENV, cwd=None
        )
        daemon = await pid_in(tmp_path / "daemon")
        nursery.cancel_scope.cancel()  # no beat from here on: to the reaper, a frozen worker
    assert await gone(command.pid) and await gone(daemon)
    assert reaper.process.returncode is None  # it waits for the worker to come back
    await reaper.aclose()
    assert reaper.process.returncode == 0


async def test_terminal_signals_do_not_stop_the_reaper_and_commands_get_default_dispositions():
    reaper = await Reaper.start()
    async with trio.open_nursery() as nursery:
        await nursery.start(reaper.serve)
        for sig in (signal.SIGINT, signal.SIGTERM):
            os.kill(reaper.process.pid, sig)  # e.g. Ctrl-C in the worker's terminal
        command = await reaper.start_command(
            ["/bin/sh", "-c", "grep SigIgn /proc/self/status"], env=ENV, cwd=None
        )
        output = (await command.stdout.receive_some(4096)).decode()
        assert await command.wait() == 0
        ignored = int(output.split()[1], 16)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):  # not the reaper's
            assert not ignored & (1 << (sig - 1)), output
        assert reaper.process.returncode is None
        nursery.cancel_scope.cancel()
    await reaper.aclose()


async def test_a_reaper_killed_under_its_worker_is_replaced(tmp_path):
    reaper = await Reaper.start()
    async with trio.open_nursery() as nursery:
        await nursery.start(reaper.serve)
        running = await reaper.start_command(["sleep", "600"], env=ENV, cwd=None)
        first = reaper.process
        first.kill()  # an operator's kill -9, the out-of-memory killer
        assert await running.wait() == -signal.SIGKILL  # killed by its group
        assert await gone(running.pid)
        command = await reaper.start_command(["/bin/sh", "-c", "exit 7"], env=ENV, cwd=None)
        assert await command.wait() == 7
        assert reaper.process is not first
        nursery.cancel_scope.cancel()
    await reaper.aclose()
    assert reaper.process.returncode == 0


async def test_a_command_that_cannot_start_says_why(tmp_path):
    reaper = await Reaper.start()
    async with trio.open_nursery() as nursery:
        await nursery.start(reaper.serve)
        with pytest.raises(FileNotFoundError):
            await reaper.start_command(["/nonexistent/program"], env=ENV, cwd=None)
        with pytest.raises(OSError, match="No such file"):
            await reaper.start_command(["true"], env=ENV, cwd=str(tmp_path / "missing"))
        command = await reaper.start_command(["true"], env=ENV, cwd=str(tmp_path))
        assert await command.wait() == 0  # and it carries on
        nursery.cancel_scope.cancel()
    await reaper.aclose()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


async def _until_state(pid: int, wanted) -> str:
    """``pid``'s state once ``wanted(state)`` holds (the reaper acts on its own line)."""
    with trio.fail_after(DEADLINE):
        while not wanted(state := _state(pid)):  # noqa: ASYNC110 (another process's state)
            await trio.sleep(0.02)
    return state


async def test_a_carried_runs_command_is_paused_and_let_go_on_with_its_whole_group(tmp_path):
    """A run carried between orchestrators: its command's group is stopped where it stands,
    then let go on — the group's other members too, after its leader has exited (a group id
    is not reused while it has members); a killed paused command dies."""
    reaper = await Reaper.start()
    async with trio.open_nursery() as nursery:
        await nursery.start(reaper.serve)
        child = tmp_path / "child"
        command = await reaper.start_command(
            ["/bin/sh", "-c", f"sleep 600 & echo $! > {child}; wait"], env=ENV, cwd=None
        )
        member = await pid_in(child)
        command.pause(True)
        assert await _until_state(command.pid, lambda s: s == "T") == "T"
        assert await _until_state(member, lambda s: s == "T") == "T"
        command.pause(False)
        assert await _until_state(member, lambda s: s != "T") in ("S", "R")
        # the leader exits while its group is paused: letting go still reaches the member
        command.pause(True)
        await _until_state(member, lambda s: s == "T")
        os.kill(command.pid, signal.SIGKILL)
        assert await command.wait() == -signal.SIGKILL
        command.pause(False)
        assert await _until_state(member, lambda s: s != "T") in ("S", "R")
        os.kill(member, signal.SIGKILL)
        nursery.cancel_scope.cancel()
    await reaper.aclose()
