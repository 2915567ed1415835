"""Real ``swamp serve`` and ``swamp worker connect`` child processes, for the demo and the bench.

Each child's stdout is read as JSON lines; once a child is ready its remaining output must keep
being drained (:meth:`LineReader.drain`, or kept by :meth:`EventLog.follow`), or the child
blocks on a full pipe.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import trio


class LineReader:
    """Lines from a child's pipe, one at a time (the pipe is read in chunks)."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self.stream = stream
        self.buffer = b""

    async def readline(self) -> str | None:
        while b"\n" not in self.buffer:
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode("utf-8", "replace")

    async def drain(self) -> None:
        """Keep reading (and dropping) lines so the child never blocks on a full pipe."""
        while await self.readline() is not None:
            pass

    async def until(self, predicate) -> dict:
        """The next JSON line that satisfies ``predicate``."""
        while True:
            line = await self.readline()
            if line is None:
                raise RuntimeError("the process exited before it was ready")
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if predicate(event):
                return event


class EventLog:
    """A child's JSON lines, kept as they arrive, so a driver can wait for one and read the
    whole sequence afterwards. :meth:`follow` reads the pipe to its end (so the child never
    blocks on it); :meth:`wait_for` wakes on each new line, never on a timer."""

    def __init__(self, reader: LineReader) -> None:
        self.reader = reader
        self.events: list[dict] = []
        self.ended = False
        self._changed = trio.Event()

    def __repr__(self) -> str:
        return f"<EventLog events={len(self.events)} ended={self.ended}>"

    async def follow(self) -> None:
        try:
            while (line := await self.reader.readline()) is not None:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if isinstance(event, dict):
                    self.events.append(event)
                    self._wake()
        finally:
            self.ended = True
            self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def find(self, predicate, *, start: int = 0) -> dict | None:
        return next((e for e in self.events[start:] if predicate(e)), None)

    async def wait_for(self, predicate, *, start: int = 0) -> dict:
        """The first event (from index ``start``) that satisfies ``predicate``; the caller bounds
        the wait. Raises ``RuntimeError`` if the child's output ends without one."""
        while True:
            changed = self._changed
            found = self.find(predicate, start=start)
            if found is not None:
                return found
            if self.ended:
                raise RuntimeError("the process exited without printing the line waited for")
            await changed.wait()


def swamp_argv(*args: str) -> list[str]:
    """How to start another swamp: from the same pyz when this one runs from a pyz (its
    launcher says which, in ``SWAMP_PYZ``), else as ``python -m swamp``; isolated (``-I``) when
    this one is."""
    pyz = os.environ.get("SWAMP_PYZ")
    isolated = ["-I"] if sys.flags.isolated else []  # a child as isolated as its parent
    if pyz and os.path.isfile(pyz):
        return [sys.executable, *isolated, pyz, *args]
    return [sys.executable, *isolated, "-m", "swamp", *args]


# How long a started process is given to say it is ready; a caller wanting less puts its own
# cancel scope around the call.
SERVE_READY_SECONDS = 30
ENROLLED_SECONDS = 60


async def start_serve(
    repo_root: Path,
    *args: str,
    env: dict,
    stderr=subprocess.DEVNULL,
    port: int = 0,
) -> tuple[trio.Process, LineReader, str]:
    """Start ``swamp serve`` (on a free port by default); returns the process, its reader and
    its URL (``trio.TooSlowError`` if it names none within ``SERVE_READY_SECONDS``)."""
    process = await trio.lowlevel.open_process(
        swamp_argv("serve", "--repo-dir", str(repo_root), "--port", str(port), "--json", *args),
        stdout=subprocess.PIPE,
        stderr=stderr,
        env=env,
    )
    reader = LineReader(_piped(process.stdout))
    with trio.fail_after(SERVE_READY_SECONDS):
        url = (await reader.until(lambda e: "url" in e))["url"]
    return process, reader, url


async def start_worker(
    url: str, token: str, *args: str, env: dict, stderr=subprocess.DEVNULL, json: bool = True
) -> tuple[trio.Process, LineReader]:
    """Start ``swamp worker connect`` with the token in its environment (never in argv); with
    ``json=False`` it prints as an operator's worker does (its lifecycle only, as text)."""
    process = await trio.lowlevel.open_process(
        swamp_argv("worker", "connect", url, *(["--json"] if json else []), *args),
        stdout=subprocess.PIPE,
        stderr=stderr,
        env=dict(env, SWAMP_WORKER_TOKEN=token),
    )
    return process, LineReader(_piped(process.stdout))


def _piped(stream: trio.abc.ReceiveStream | None) -> trio.abc.ReceiveStream:
    """A child's output this process opened a pipe for (trio gives ``None`` otherwise)."""
    if stream is None:
        raise ValueError("the child's output is not piped here")
    return stream


async def wait_enrolled(readers: list[LineReader]) -> list[dict]:
    """Each worker's ``enrolled`` event, in order (within ``ENROLLED_SECONDS``)."""
    with trio.fail_after(ENROLLED_SECONDS):
        return [await reader.until(lambda e: e.get("event") == "enrolled") for reader in readers]


async def wait_enrolled_text(readers: list[LineReader]) -> None:
    """Each text-mode worker's ``enrolled as NAME`` line (within ``ENROLLED_SECONDS``)."""
    with trio.fail_after(ENROLLED_SECONDS):
        for reader in readers:
            while True:
                line = await reader.readline()
                if line is None:
                    raise RuntimeError("the worker exited before it enrolled")
                if line.startswith("enrolled as "):
                    break


async def stop_all(processes: list[trio.Process], *, grace: float = 10) -> None:
    """SIGTERM in reverse start order, wait up to ``grace``, then SIGKILL what is left."""
    with trio.CancelScope(shield=True):
        for process in reversed(processes):
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
        with trio.move_on_after(grace):
            for process in processes:
                await process.wait()
        for process in processes:
            if process.returncode is None:
                process.kill()
                await process.wait()
