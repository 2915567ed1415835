"""The worker's side of its reaper (the process itself: :mod:`swamp.worker.reaper_process`).

The worker starts the reaper once, keeps a socket to it for its whole life, beats on it every
second, and — on Linux — has it start every command its methods run, so that the reaper is the
commands' parent and adopts whatever they leave behind. A command's output comes back through
two pipes made here and handed to the reaper with the request; its end, through the socket.
Elsewhere the worker starts its commands itself and names their process groups to the reaper.

Three tasks talk to the reaper (:meth:`Reaper.serve`): one writes (every line, in order, from
an unbounded queue: a line is a few bytes, and the reaper reads at once), one beats, one reads
the answers. They run in a nursery that outlives every dispatch, so a dispatch cancelled as the
worker stops still has its command killed. Should the reaper die under a running worker (an
operator's ``kill -9``, the out-of-memory killer), the commands it had started are killed by
their groups, the dispatches waiting on it fail, and another reaper takes its place.
"""

from __future__ import annotations

import array
import errno
import json
import os
import signal
import socket
import sys
from collections import deque
from collections.abc import Mapping
from pathlib import Path

import trio

from swamp.models.context import Command, Launcher
from swamp.worker.reaper_process import (
    BEAT_INTERVAL,
    FINISH_WITHIN,
    ignore_stop_signals,
    marks_of,
    spawns_commands,
)

# The directory holding `swamp`, for the reaper process's path: found once, at import
SOURCE_ROOT = str(Path(__file__).resolve().parents[2])


class Reaper(Launcher):
    """Starts the reaper process, keeps it informed and starts the worker's commands through
    it (a :class:`~swamp.models.context.Launcher` for every method the worker runs)."""

    def __init__(self, process: trio.Process | None, channel: trio.socket.SocketType | None):
        self.process = process
        self.channel = channel
        self.spawns = process is not None and spawns_commands()
        self.silence: float | None = None
        self.tracked: set[int] = set()
        self._generation = 0  # a new reaper ignores what was meant for the last one
        self._outbox: trio.MemorySendChannel | None = None
        self._pending: deque[_Pending] = deque()  # spawns not yet answered, in order
        self._commands: dict[int, SpawnedCommand] = {}
        self._ready = trio.Event()  # set while there is a reaper to write to
        self._ready.set()
        self._closing = False

    @classmethod
    async def start(cls) -> Reaper:
        if sys.platform == "win32":  # no process groups to kill there
            return cls(None, None)
        return cls(*await _launch())

    def __repr__(self) -> str:
        pid = self.process.pid if self.process is not None else None
        return (
            f"<Reaper pid={pid} spawns={self.spawns} commands={len(self._commands)} "
            f"pending={len(self._pending)} tracked={len(self.tracked)}>"
        )

    # -- the tasks that talk to it --------------------------------------------------------------

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Write, beat and read until cancelled."""
        if self.process is None:
            task_status.started()
            await trio.sleep_forever()
        send, receive = trio.open_memory_channel(float("inf"))
        self._outbox = send
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._write, receive)
            nursery.start_soon(self._beat)
            nursery.start_soon(self._read)
            task_status.started()

    async def _beat(self) -> None:
        while True:
            self._say("beat")
            await trio.sleep(BEAT_INTERVAL)

    async def _write(self, receive: trio.MemoryReceiveChannel) -> None:
        async for generation, data, fds in receive:
            try:
                while self.channel is None:  # a new reaper is starting: this line is for it
                    await self._ready.wait()
                if generation == self._generation and not self._closing:
                    await _send(self.channel, data, fds)
            except (OSError, trio.ClosedResourceError):
                pass  # the reaper is gone: the reader finds out and starts another
            finally:
                for fd in fds:
                    os.close(fd)

    async def _read(self) -> None:
        buffer = b""
        while True:
            channel = self.channel  # None while a new reaper starts: as if this one had gone
            try:
                chunk = b"" if channel is None else await channel.recv(65536)
            except (OSError, trio.ClosedResourceError):
                chunk = b""
            if not chunk:
                if self._closing:
                    return
                buffer = b""
                await self._replace()
                continue
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                self._heard(line.decode("utf-8", "replace"))

    def _heard(self, line: str) -> None:
        verb, _, arg = line.partition(" ")
        if verb == "exited":
            pid, _, code = arg.partition(" ")
            command = self._commands.pop(int(pid), None)
            if command is not None:
                command.exited(int(code))
        elif verb in ("spawned", "failed") and self._pending:
            pending = self._pending.popleft()
            if verb == "failed":
                failure = json.loads(arg)
                pending.fail(OSError(failure.get("errno") or errno.EIO, failure["strerror"]))
            elif pending.abandoned:  # nobody waits for it any more
                self._say(f"kill {json.dumps({'pid': int(arg), 'marks': pending.marks})}")
                pending.release()
            else:
                command = SpawnedCommand(self, int(arg), pending)
                self._commands[command.pid] = command
                pending.done(command)

    async def _replace(self) -> None:
        """The reaper died under a running worker: kill what it had started by their groups
        (their orphans are out of reach now), fail what waits on it, start another."""
        self._generation += 1
        self._ready = trio.Event()
        for command in self._commands.values():
            try:
                os.killpg(command.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            command.exited(-signal.SIGKILL)
        self._commands.clear()
        while self._pending:
            self._pending.popleft().fail(OSError(errno.EPIPE, "the worker's reaper exited"))
        old, self.channel = self.process, None
        if old is not None:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                old.kill()
                await old.wait()
        self.process, self.channel = await _launch()
        self._ready.set()
        if self.silence is not None:
            self.set_silence(self.silence)
        for pgid in self.tracked:
            self._say(f"track {pgid}")

    def _say(self, line: str, fds: tuple[int, ...] = ()) -> None:
        if self._outbox is None or self._closing:
            for fd in fds:
                os.close(fd)
            return
        self._outbox.send_nowait((self._generation, f"{line}\n".encode(), fds))

    # -- what the worker tells it ---------------------------------------------------------------

    def set_silence(self, seconds: float) -> None:
        """How long without a beat means this worker is frozen (3 heartbeats)."""
        self.silence = seconds
        self._say(f"silence {seconds:g}")

    def track(self, pgid: int) -> None:
        self.tracked.add(pgid)
        self._say(f"track {pgid}")

    def untrack(self, pgid: int) -> None:
        self.tracked.discard(pgid)
        self._say(f"untrack {pgid}")

    async def start_command(
        self, argv: list[str], *, env: Mapping[str, str], cwd: str | None
    ) -> Command:
        """A method's command: started by the reaper (Linux); elsewhere here, its group named
        to the reaper until it has exited."""
        if not self.spawns:
            command = await self.start_child(argv, env=env, cwd=cwd)
            if self.process is not None:
                self.track(command.pid)  # its own session: the group id is its pid
                command.on_close = self.untrack
            return command
        if self._outbox is None or self._closing:
            raise OSError(errno.EPIPE, "the worker's reaper is not running")
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        pending = _Pending((out_read, err_read), marks_of(env))
        self._pending.append(pending)
        request = {"argv": list(argv), "env": dict(env), "cwd": cwd}
        self._say(f"spawn {json.dumps(request)}", (out_write, err_write))
        try:
            return await pending.wait()
        except BaseException:
            pending.abandon()
            raise

    async def aclose(self) -> None:
        """A clean stop: the socket closes; the reaper kills what is left and exits."""
        if self.process is None:
            return
        self._closing = True
        with trio.CancelScope(shield=True):
            if self.channel is not None:
                self.channel.close()
            with trio.move_on_after(FINISH_WITHIN + 5):
                await self.process.wait()
            if self.process.returncode is None:
                self.process.kill()


class _Pending:
    """A spawn asked of the reaper and not answered yet (the pipes' read ends wait here)."""

    def __init__(self, fds: tuple[int, int], marks: list[str]) -> None:
        self.fds: tuple[int, ...] = fds
        self.marks = marks
        self.event = trio.Event()
        self.command: SpawnedCommand | None = None
        self.error: OSError | None = None
        self.abandoned = False

    async def wait(self) -> SpawnedCommand:
        await self.event.wait()
        if self.error is not None:
            raise self.error
        assert self.command is not None
        return self.command

    def done(self, command: SpawnedCommand) -> None:
        self.command = command
        self.event.set()

    def fail(self, error: OSError) -> None:
        self.error = error
        self.release()
        self.event.set()

    def abandon(self) -> None:
        """The dispatch stopped waiting; a command already started for it goes. (One not yet
        answered for is killed when the answer comes.)"""
        self.abandoned = True
        if self.command is not None:
            self.command.kill()
            self.command.close()

    def release(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = ()


class SpawnedCommand(Command):
    """A command the reaper started: its output through pipes made here, its end through the
    reaper's socket."""

    def __init__(self, reaper: Reaper, pid: int, pending: _Pending) -> None:
        self.reaper = reaper
        self.pid = pid
        self.marks = pending.marks
        stdout, stderr = pending.fds
        pending.fds = ()  # the streams own them now
        self.stdout: trio.lowlevel.FdStream = trio.lowlevel.FdStream(stdout)
        self.stderr: trio.lowlevel.FdStream = trio.lowlevel.FdStream(stderr)
        self.returncode: int | None = None
        self._exited = trio.Event()

    def exited(self, returncode: int) -> None:
        self.returncode = returncode
        self._exited.set()

    async def wait(self) -> int:
        await self._exited.wait()
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        self.reaper._say(f"kill {json.dumps({'pid': self.pid, 'marks': self.marks})}")

    def pause(self, paused: bool) -> None:
        """Through the reaper, which knows whether the pid is still its child (a reaped pid
        may be anyone's by now)."""
        if self.returncode is None or not paused:  # (the reaper knows what it paused)
            self.reaper._say(f"pause {self.pid} {1 if paused else 0}")

    def close(self) -> None:
        self.stdout.close()
        self.stderr.close()


async def _launch() -> tuple[trio.Process, trio.socket.SocketType]:
    """A reaper process, and the worker's end of its socket."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    program = (
        f"import sys; sys.path.insert(0, {SOURCE_ROOT!r}); "
        "from swamp.worker.reaper_process import main; main()"
    )
    try:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-I", "-c", program],  # -I: nothing from the environment
            stdin=theirs.fileno(),
            env={},  # it needs nothing of the worker's environment, and so holds none of it
            start_new_session=True,  # no terminal's signal reaches it: only the socket's end
            preexec_fn=ignore_stop_signals,  # ignored from its first instruction on
        )
    finally:
        theirs.close()
    return process, trio.socket.from_stdlib_socket(ours)


async def _send(channel: trio.socket.SocketType, data: bytes, fds: tuple[int, ...]) -> None:
    """All of ``data``; the descriptors go with its first byte."""
    sent = 0
    if fds:
        rights = array.array("i", fds).tobytes()
        sent = await channel.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)])
    while sent < len(data):
        sent += await channel.send(data[sent:])
