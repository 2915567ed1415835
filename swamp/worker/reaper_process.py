"""The reaper process: a worker's commands, and everything they start, die with the worker.

A command runs in a session of its own (so a timeout or a cancel can kill all of it), which
also means nothing kills it when the worker process itself dies: the orchestrator would then
run the step again beside a still-running first copy. So each worker starts one small
supervisor — this module, run as its own process in its own session, importing nothing but the
standard library — and keeps a socket to it. When the socket closes (the worker is gone,
however it went: ``kill -9`` included) the reaper kills what the worker ran and exits; when the
worker falls silent for ``silence`` seconds (SIGSTOP, a wedged process) it kills them and waits.
The orchestrator re-dispatches a lost worker's step only after that deadline has passed (it
fences), so two copies never overlap. One process per worker — never one per dispatch.

**On Linux the reaper starts the commands itself** and is a *child subreaper*
(``prctl(PR_SET_CHILD_SUBREAPER)``). A command that daemonizes (``setsid -f``, a double fork)
leaves its own process tree, and the orphan is re-parented to the nearest subreaper above it —
the reaper. So every process a command started, however it detached, stays a descendant of the
reaper until it exits, and the reaper finds it by walking ``/proc`` down from itself. That is
why the reaper, not the worker, is the commands' parent: a subreaper collects the orphans
*below* it, and the orphans of a worker killed by ``kill -9`` go to whatever is *above* it.

A tree is killed without a race: every process in it is stopped (a stopped process cannot
fork), the tree is walked again until nothing new appears, then all of it is killed. For one
command (its dispatch timed out or was cancelled) the tree is the command's, plus every orphan
the reaper adopted that carries the command's ``SWAMP_STEP_ID`` and ``SWAMP_ATTEMPT`` (it left
the tree before the kill); a daemon that both left and cleared its environment lives until its
worker stops. What a command leaves running when it exits normally runs on, as before, until it
ends or its worker stops.

The worker says, one line each (a ``spawn``'s two pipes ride along as ``SCM_RIGHTS``)::

    spawn {"argv", "env", "cwd"}    start a command; answered, in order, ``spawned <pid>`` or
                                    ``failed {"errno", "strerror"}``
    kill {"pid", "marks"}           the command's tree, and the orphans carrying ``marks``
    pause <pid> 1|0                 stop the command's group where it stands, or let it go
                                    on (a run carried between orchestrators)
    beat                            the worker is alive (it writes one every second)
    silence <secs>                  how long without a word means the worker is frozen
    track <pgid> / untrack <pgid>   elsewhere than Linux the worker starts its commands and
                                    names their process groups, which the reaper kills (a
                                    command that leaves its group escapes, as it always did)

and the reaper answers ``exited <pid> <returncode>`` for every command it started.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

DEFAULT_SILENCE = 15.0
BEAT_INTERVAL = 1.0
FINISH_WITHIN = 10.0  # how long a reaper whose worker is gone waits for what it killed
MARKS = ("SWAMP_STEP_ID", "SWAMP_ATTEMPT")  # what a command's orphans inherit from it
PR_SET_CHILD_SUBREAPER = 36


def spawns_commands() -> bool:
    """Whether the reaper starts the commands (Linux: it can adopt their orphans)."""
    return sys.platform.startswith("linux")


def marks_of(env: Mapping[str, str]) -> list[str]:
    """The ``NAME=value`` entries of a command's environment its orphans are known by."""
    return [f"{name}={env[name]}" for name in MARKS if name in env]


def children_by_parent() -> dict[int, list[int]]:
    """Every live process's children, from ``/proc`` (zombies left out: they cannot fork);
    empty where there is no ``/proc``."""
    found: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != b"Z":
            found.setdefault(int(fields[1]), []).append(int(entry))
    return found


def descendants(roots: Iterable[int], children: dict[int, list[int]]) -> set[int]:
    found: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def carries(pid: int, marks: list[str]) -> bool:
    """Whether ``pid``'s environment holds every one of ``marks``."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            entries = set(f.read().split(b"\0"))
    except OSError:
        return False
    return all(mark.encode() in entries for mark in marks)


def stop_and_kill(members: Callable[[], set[int]]) -> None:
    """Kill every process ``members()`` names, and what they fork meanwhile: stop them, ask
    again until nothing new appears, then kill them all."""
    held: set[int] = set()
    for _ in range(1000):
        new = members() - held
        if not new:
            break
        for pid in new:
            _signal(pid, signal.SIGSTOP)
        held |= new
    for pid in held:
        _signal(pid, signal.SIGKILL)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_groups(groups: Iterable[int]) -> None:
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def become_subreaper() -> bool:
    """Orphans below this process come to it, not to init (Linux ≥ 3.4)."""
    if not spawns_commands():
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class Supervisor:
    """The reaper's state: what it started, what it was told, what it has yet to say."""

    def __init__(self, channel: socket.socket) -> None:
        self.channel = channel
        self.me = os.getpid()
        self.silence = DEFAULT_SILENCE
        self.groups: set[int] = set()  # tracked process groups (the worker starts commands)
        self.started: dict[int, subprocess.Popen] = {}  # the commands it started, until reaped
        self.paused: set[int] = set()  # process groups paused here (a carried run's)
        self.fds: deque[int] = deque()  # pipes received, two per spawn, in order
        self.out = bytearray()  # what the worker has yet to read
        self.gone = False  # the worker's end has closed

    def say(self, line: str) -> None:
        if not self.gone:
            self.out += f"{line}\n".encode()

    def flush(self) -> None:
        """Send what the socket takes now; never wait on a worker that does not read."""
        try:
            sent = self.channel.send(self.out, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError:  # the worker is gone: nobody reads
            self.out.clear()
            return
        del self.out[:sent]

    def handle(self, line: bytes) -> None:
        verb, _, arg = line.decode("utf-8", "replace").partition(" ")
        if verb == "spawn":
            self.spawn(arg)
            return
        try:
            if verb == "kill":
                order = json.loads(arg)
                self.kill_command(int(order["pid"]), [str(m) for m in order.get("marks") or ()])
            elif verb == "pause":
                pid, paused = arg.split()
                self.pause(int(pid), paused == "1")
            elif verb == "track":
                self.groups.add(int(arg))
            elif verb == "untrack":
                self.groups.discard(int(arg))
            elif verb == "silence":
                self.silence = max(3 * BEAT_INTERVAL, float(arg))
        except (ValueError, KeyError, TypeError, AttributeError):
            pass  # a garbled line from our own worker: ignore it, keep reaping

    def spawn(self, text: str) -> None:
        """Start a command with the next two pipes received; answer either way, exactly once
        (the worker pairs answers with its requests in order)."""
        if len(self.fds) < 2:
            self.fail(0, "no pipes came with it")
            return
        stdout, stderr = self.fds.popleft(), self.fds.popleft()
        try:
            request: dict[str, Any] = json.loads(text)
            process = subprocess.Popen(
                [str(a) for a in request["argv"]],
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                env={str(k): str(v) for k, v in request["env"].items()},
                cwd=request.get("cwd"),
                start_new_session=True,  # its group can be killed; no terminal's signal
            )
        except OSError as exc:
            self.fail(exc.errno or 0, exc.strerror or str(exc))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            self.fail(0, str(exc))
        else:
            self.started[process.pid] = process
            self.say(f"spawned {process.pid}")
        finally:
            os.close(stdout)
            os.close(stderr)

    def fail(self, number: int, reason: str) -> None:
        self.say(f"failed {json.dumps({'errno': number, 'strerror': reason})}")

    def reap(self) -> bool:
        """Collect every child that has exited, telling the worker of its commands; whether
        any child is left."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            if pid == 0:
                return True
            process = self.started.pop(pid, None)
            if process is not None:
                process.returncode = os.waitstatus_to_exitcode(status)  # Popen forgets it
                self.say(f"exited {pid} {process.returncode}")

    def pause(self, pid: int, paused: bool) -> None:
        """Stop a command's group where it stands (only while its leader is ours, not reaped:
        a reaped pid may be anyone's), or let a group paused here go on — also once its
        leader has been reaped (a group id is not reused while the group has members)."""
        if paused and pid not in self.started:
            return
        if not paused and pid not in self.paused:
            return
        try:
            os.killpg(pid, signal.SIGSTOP if paused else signal.SIGCONT)
        except (ProcessLookupError, PermissionError):
            pass
        if paused:
            self.paused.add(pid)
        else:
            self.paused.discard(pid)

    def kill_command(self, pid: int, marks: list[str]) -> None:
        def members() -> set[int]:
            children = children_by_parent()
            # its own tree while it is ours (a reaped pid may be anyone's by now) ...
            roots = {pid} if pid in self.started else set()
            if marks:  # ... and the orphans it left, which came to us
                roots |= {
                    child
                    for child in children.get(self.me, ())
                    if child not in self.started and carries(child, marks)
                }
            return roots | descendants(roots, children)

        stop_and_kill(members)
        if pid in self.started:
            _kill_groups([pid])

    def kill_everything(self) -> None:
        """The worker is gone or frozen: everything below the reaper, and the tracked groups."""
        _kill_groups(self.groups)
        self.groups.clear()
        stop_and_kill(lambda: descendants([self.me], children_by_parent()))
        _kill_groups(list(self.started))


def main(fd: int = 0) -> None:
    """The reaper process: serve the worker on the socket ``fd`` until it closes."""
    # SIGINT and SIGTERM were ignored from its first instruction on (the worker's
    # ``preexec_fn``). A handler that does nothing keeps ignoring them and, unlike SIG_IGN,
    # is not inherited by the commands it starts.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _ignore)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, _ignore)  # a child exited: the select below wakes
    channel = socket.socket(fileno=fd)
    supervisor = Supervisor(channel)
    if spawns_commands():
        become_subreaper()  # if refused, it still kills its commands' trees and groups
    buffer = b""
    heard = time.monotonic()
    while True:
        wait = max(0.0, heard + supervisor.silence - time.monotonic())
        writing = [channel] if supervisor.out else []
        watched: list[socket.socket | int] = [channel, wake_read]
        readable, _, _ = select.select(watched, writing, [], wait)
        if wake_read in readable:
            os.read(wake_read, 4096)
        if channel in readable:
            try:
                chunk, fds, _, _ = socket.recv_fds(channel, 65536, 16)
            except OSError:
                chunk, fds = b"", []
            supervisor.fds.extend(fds)
            if not chunk:  # the worker is gone, however it went
                supervisor.gone = True
                _finish(supervisor, wake_read)
                return
            heard = time.monotonic()
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                supervisor.handle(line)
        elif time.monotonic() >= heard + supervisor.silence:
            supervisor.kill_everything()  # no word from the worker: frozen or wedged
            heard = time.monotonic()
        supervisor.reap()
        if supervisor.out:
            supervisor.flush()


def _finish(supervisor: Supervisor, wake_read: int) -> None:
    """Kill everything and collect it, for at most ``FINISH_WITHIN`` seconds (a process the
    reaper may not signal would keep it waiting for ever)."""
    while supervisor.fds:
        os.close(supervisor.fds.popleft())
    deadline = time.monotonic() + FINISH_WITHIN
    while True:
        supervisor.kill_everything()
        if not supervisor.reap() or time.monotonic() > deadline:
            return
        if select.select([wake_read], [], [], 0.5)[0]:  # woken by SIGCHLD
            os.read(wake_read, 4096)


def _ignore(*_: object) -> None:
    pass


def ignore_stop_signals() -> None:
    """The reaper's first instructions (a ``preexec_fn``): only its socket's end stops it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


if __name__ == "__main__":
    main()
