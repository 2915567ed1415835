"""The reaper: commands die with their worker, even when the worker dies by SIGKILL.

A command runs in a process group of its own (so a timeout or a cancel can kill all of it),
which also means nothing kills it when the worker process itself dies: the orchestrator would
then run the step again beside a still-running first copy. So each worker starts one small
supervisor — this module, run as its own process in its own session — and tells it over a pipe
which process groups it runs:

    track <pgid>      a command started
    untrack <pgid>    it ended and was reaped
    beat              the worker is alive (it writes one every second)
    silence <secs>    how long without a beat means the worker is frozen

When the pipe closes (the worker is gone, however it went) the reaper kills every tracked group
and exits; when the beats stop for ``silence`` seconds (a SIGSTOPped or wedged worker) it kills
them — and, where ``/proc`` tells, every session the worker started, in case it froze between
starting a command and saying so — and waits. The orchestrator re-dispatches a lost worker's
step only after that deadline has passed (it fences), so the two copies never overlap. The
reaper uses nothing but the standard library, and costs one process per worker — never one per
dispatch.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the reaper process itself imports nothing but the standard library
    import trio

DEFAULT_SILENCE = 15.0
BEAT_INTERVAL = 1.0


def _kill(groups: set[int]) -> None:
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    groups.clear()


def sessions_of(parent: int) -> set[int]:
    """The process groups ``parent`` started as sessions of their own (its commands), from
    ``/proc``; empty where there is none. A frozen worker may have started a command and not
    yet told the reaper (it is frozen between the two): this finds that one too."""
    found: set[int] = set()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    me = os.getpid()
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
            ppid, group, session = int(fields[1]), int(fields[2]), int(fields[3])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and session == int(entry) and int(entry) != me:
            found.add(group)
    return found


def main(fd: int = 0) -> None:
    """The reaper process: read commands from ``fd`` until it closes."""
    _ignore_stop_signals()  # only the pipe's end stops it
    silence = DEFAULT_SILENCE
    groups: set[int] = set()
    buffer = b""
    while True:
        ready, _, _ = select.select([fd], [], [], silence)
        if not ready:  # no beat: the worker is frozen or wedged
            worker = os.getppid()
            if worker > 1:
                groups |= sessions_of(worker)
            _kill(groups)
            continue
        chunk = os.read(fd, 4096)
        if not chunk:  # the worker is gone
            _kill(groups)
            return
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            verb, _, arg = line.decode("ascii", "replace").partition(" ")
            try:
                if verb == "track":
                    groups.add(int(arg))
                elif verb == "untrack":
                    groups.discard(int(arg))
                elif verb == "silence":
                    silence = max(3 * BEAT_INTERVAL, float(arg))
            except ValueError:
                continue  # a garbled line from our own worker: ignore it, keep reaping


def _ignore_stop_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


class Reaper:
    """The worker's side: starts the reaper process and keeps it informed."""

    def __init__(self, process: trio.Process | None) -> None:
        self.process = process

    @classmethod
    async def start(cls) -> Reaper:
        import trio

        if sys.platform == "win32":  # no process groups to kill there
            return cls(None)
        root = str(Path(__file__).resolve().parents[2])  # the directory holding `swamp`
        program = (
            f"import sys; sys.path.insert(0, {root!r}); "
            "from swamp.worker.reaper import main; main()"
        )
        process = await trio.lowlevel.open_process(
            [sys.executable, "-c", program],
            stdin=subprocess.PIPE,
            start_new_session=True,  # no terminal signal reaches it: only the pipe's end
            preexec_fn=_ignore_stop_signals,  # ignored from its first instruction on
        )
        return cls(process)

    def _say(self, line: str) -> None:
        if self.process is None or self.process.stdin is None:
            return
        try:  # a line is tiny and the reaper reads at once: no need to wait on the pipe
            os.write(self.process.stdin.fileno(), f"{line}\n".encode())
        except OSError:
            pass  # the reaper is gone (or the pipe is full): nothing more to say

    def track(self, pgid: int) -> None:
        self._say(f"track {pgid}")

    def untrack(self, pgid: int) -> None:
        self._say(f"untrack {pgid}")

    def set_silence(self, seconds: float) -> None:
        self._say(f"silence {seconds:g}")

    async def beat(self, *, task_status=None) -> None:
        import trio

        if task_status is not None:
            task_status.started()
        while True:
            self._say("beat")
            await trio.sleep(BEAT_INTERVAL)

    async def aclose(self) -> None:
        """A clean stop: the pipe closes, the reaper kills what is left and exits."""
        import trio

        if self.process is None:
            return
        with trio.CancelScope(shield=True):
            if self.process.stdin is not None:
                await self.process.stdin.aclose()
            with trio.move_on_after(5):
                await self.process.wait()
            if self.process.returncode is None:
                self.process.kill()


if __name__ == "__main__":
    main()
