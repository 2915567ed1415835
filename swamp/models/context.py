"""Method contexts: the shared process helper and the local (in-orchestrator) context."""

from __future__ import annotations

import abc
import os
import signal
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import trio

from swamp.concurrency import open_unwrapping_nursery
from swamp.domain.names import check_data_name
from swamp.domain.query import parse as parse_predicate
from swamp.errors import SwampError, UserError
from swamp.models.framework import ModelType, ProcessResult
from swamp.protocol.messages import LogLine, LogStream
from swamp.store.datastore import Key, Record
from swamp.store.records import Operations, Records


class Command(abc.ABC):
    """A command a method started: its output, its end, and how to stop all of it."""

    pid: int
    stdout: trio.abc.ReceiveStream
    stderr: trio.abc.ReceiveStream
    returncode: int | None

    @abc.abstractmethod
    async def wait(self) -> int:
        """Its exit status once it has exited (negative: the signal that killed it)."""

    @abc.abstractmethod
    def kill(self) -> None:
        """Kill it and what it started, as far as its launcher can tell."""

    @abc.abstractmethod
    def close(self) -> None:
        """It has exited and its output has been read: let go of it."""

    @abc.abstractmethod
    def pause(self, paused: bool) -> None:
        """Stop its group where it stands (``SIGSTOP``), or let it go on (``SIGCONT``): a run
        carried between orchestrators has no effect until one adopts it. Not on Windows."""


class ChildCommand(Command):
    """A command started as a child of this process."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.pid = process.pid
        if process.stdout is None or process.stderr is None:
            raise ValueError("a command's output must be piped to be read")
        self.stdout = process.stdout
        self.stderr = process.stderr
        self.on_close: Callable[[int], None] | None = None

    @property
    def returncode(self) -> int | None:  # type: ignore[override]
        return self.process.returncode

    async def wait(self) -> int:
        return await self.process.wait()

    def kill(self) -> None:
        if self.process.returncode is not None:
            return  # reaped: its group id may be anyone's by now
        try:
            if sys.platform != "win32":
                os.killpg(self.process.pid, signal.SIGKILL)
            else:
                self.process.kill()
        except (ProcessLookupError, PermissionError):
            pass

    def pause(self, paused: bool) -> None:
        if not hasattr(os, "killpg") or (paused and self.process.returncode is not None):
            return  # reaped: its group id may be anyone's by now (not while it has members:
            # what was paused is let go on)
        try:
            os.killpg(self.process.pid, signal.SIGSTOP if paused else signal.SIGCONT)
        except (ProcessLookupError, PermissionError):
            pass

    def close(self) -> None:
        if self.on_close is not None:
            self.on_close(self.pid)


class Launcher:
    """Starts the commands a method runs, each in a session of its own so that a timeout or a
    cancel kills all of it: this one as children of this process. On a worker its reaper
    starts them instead (:mod:`swamp.worker.reaper`), so that they die with the worker."""

    async def start_command(
        self, argv: list[str], *, env: Mapping[str, str], cwd: str | None
    ) -> Command:
        return await self.start_child(argv, env=env, cwd=cwd)

    async def start_child(
        self, argv: list[str], *, env: Mapping[str, str], cwd: str | None
    ) -> ChildCommand:
        """The command as a child of this process (in a session of its own)."""
        process = await trio.lowlevel.open_process(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
            start_new_session=sys.platform != "win32",
        )
        return ChildCommand(process)


class ContextBase(abc.ABC):
    """Everything but the data access: identity, environment, logging, subprocesses."""

    def __init__(
        self,
        *,
        model_type: ModelType,
        model_name: str,
        method: str,
        dispatch_id: str | None,
        env: Mapping[str, str] | Callable[[], Mapping[str, str]],
        cwd: str | None = None,
        launcher: Launcher | None = None,
        probe_seams: Callable[[], Sequence[Any]] = tuple,
    ) -> None:
        self.model = model_type
        self.model_type = model_type.type
        self.model_name = model_name
        self.method = method
        self.dispatch_id = dispatch_id
        self._env: dict[str, str] | None = None
        self._make_env = env if callable(env) else lambda: env
        self.cwd = cwd
        self.outputs: list[dict] = []
        self.commands: set[Command] = set()  # running now (a carried run pauses them)
        self.launcher: Launcher = launcher if launcher is not None else Launcher()
        # the fleet probe's seams, as the process that built this context knows them (its
        # plugins): asked only when the probe runs, so the models need not know the plugins
        self.probe_seams = probe_seams

    @property
    def env(self) -> dict[str, str]:
        """The environment a command runs with (the shipped one over the local one), worked out
        when first asked for: most methods never run a command, and a copy of a whole process
        environment per dispatch was a measurable part of a no-op's cost on a worker."""
        if self._env is None:
            self._env = dict(self._make_env())
        return self._env

    async def may_start(self) -> None:
        """Before a command starts: a worker's run carried between orchestrators starts none
        until one adopts it."""
        return None

    def command_started(self, command: Command) -> None:
        """It runs (a worker's run carried since it was asked for pauses it at once)."""
        self.commands.add(command)

    async def report_effects(self) -> None:
        """The method has had an effect outside the data plane (a command ran). Where it matters
        — on a worker — the orchestrator then never runs the step again if the worker is lost."""
        return None

    @abc.abstractmethod
    async def log(self, line: str, *, stream: LogStream = "log") -> None:
        """Each context streams logs its own way (to the client, or as events over the socket)."""

    def _check_write(self, spec: str, name: str) -> None:
        self.model.resource(spec)
        check_data_name(name)

    async def run_process(
        self,
        argv: Sequence[str] | str,
        *,
        cwd: str | None = None,
        # the plugin API's own limit, and its end is a result (timed_out), not a cancellation
        timeout: float | None = None,  # noqa: ASYNC109
        tail: int = 20,
    ) -> ProcessResult:
        """Run a subprocess with the shipped environment, streaming its lines as log events.

        A string is run through the platform shell. On timeout or cancellation the command is
        killed with everything it started (its launcher says how far that reaches), so
        ``sh -c 'sleep 100'`` does not leave a sleeper behind.
        """
        if isinstance(argv, str):
            argv = ["cmd", "/c", argv] if sys.platform == "win32" else ["/bin/sh", "-c", argv]
        tails: dict[str, deque[str]] = {"stdout": deque(maxlen=tail), "stderr": deque(maxlen=tail)}
        await self.may_start()
        try:
            command = await self.launcher.start_command(
                list(argv), env=self.env, cwd=cwd or self.cwd
            )
        except OSError as exc:
            raise UserError(f"cannot start {argv[0]!r}: {exc.strerror or exc}") from exc
        self.command_started(command)
        timed_out = ended = False
        try:
            with trio.move_on_after(timeout if timeout else float("inf")) as scope:
                async with open_unwrapping_nursery() as nursery:
                    nursery.start_soon(self._pump, command.stdout, "stdout", tails["stdout"])
                    nursery.start_soon(self._pump, command.stderr, "stderr", tails["stderr"])
                await command.wait()
                ended = True
            timed_out = scope.cancelled_caught
        finally:
            self.commands.discard(command)
            if not ended:  # timed out, cancelled or failed: it goes, and what it started
                command.kill()
                with trio.CancelScope(shield=True):
                    with trio.move_on_after(5):
                        await command.wait()
            if command.returncode is not None:
                command.close()
                with trio.CancelScope(shield=True), trio.move_on_after(1):
                    try:
                        await self.report_effects()  # it ran: never again after a lost worker
                    except SwampError:
                        pass  # the connection is gone: the orchestrator decides without it
        return ProcessResult(
            exit_code=command.returncode if command.returncode is not None else -9,
            stdout_tail=list(tails["stdout"]),
            stderr_tail=list(tails["stderr"]),
            timed_out=timed_out,
        )

    async def _pump(
        self, stream: trio.abc.ReceiveStream, name: LogStream, tail: deque[str]
    ) -> None:
        buffer = b""
        while True:
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for raw in lines:
                line = raw.decode("utf-8", "replace").rstrip("\r")
                tail.append(line)
                await self.log(line, stream=name)
        if buffer:
            line = buffer.decode("utf-8", "replace")
            tail.append(line)
            await self.log(line, stream=name)


class LocalContext(ContextBase):
    """The context of a method run in the orchestrator's (or the CLI's) own process."""

    def __init__(self, *, db: Records, emit, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.db = db
        self.emit = emit

    async def log(self, line: str, *, stream: LogStream = "log") -> None:
        await self.emit(LogLine(line=line, stream=stream).to_json())

    async def query_data(self, predicate: str) -> list[dict]:
        parsed = parse_predicate(predicate)
        return [r.to_json() for r in await self.db.query(parsed)]

    async def write_resource(self, spec: str, name: str, value: Any) -> dict:
        self._check_write(spec, name)
        record = await write_value(
            self.db,
            Key(self.model_type, self.model_name, name),
            self.model.resource(spec).policy,
            value,
        )
        handle = {"spec": spec, "name": name, "version": record.version}
        self.outputs.append(handle)
        return handle

    async def read_resource(self, name: str) -> Any:
        check_data_name(name)
        record = await self.db.latest(Key(self.model_type, self.model_name, name))
        return read_value(record)


async def write_value(db: Operations, key: Key, policy, value: Any) -> Record:
    if isinstance(value, (bytes, bytearray)):
        return await db.write(key, {}, policy=policy, content=bytes(value))
    if not isinstance(value, dict):
        raise UserError("a resource value must be an object (dict) or bytes")
    return await db.write(key, value, policy=policy)


def read_value(record: Record | None) -> Any:
    if record is None:
        return None
    return record.content if record.content is not None else record.attributes
