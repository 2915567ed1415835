"""The enrollment token leaves the worker's environment block and command line.

Whatever a worker runs runs as its user, and a process can read the environment block and the
command line of any process of its user: ``/proc/<pid>/environ`` and ``/proc/<pid>/cmdline``
(``ps eww`` elsewhere). Those show what the process was *started* with — deleting the variable
from ``os.environ`` changes nothing there. So a worker given its token in
``SWAMP_WORKER_TOKEN`` or ``--token`` starts itself again, in the same process (``exec``: the
same pid, so a service manager and ``kill`` see no change), with neither, and the token in a
pipe whose read end is the only thing it inherits: ``--token-fd N``. It reads the pipe once
and closes it. ``--token-file`` needs none of this: only the path is in the environment.

This costs one more interpreter start before the worker connects (the command line's own
imports, ≈ 0.1 s). It is done where ``exec`` keeps the process — everywhere but Windows, where
the token stays where it was given.
"""

from __future__ import annotations

import os
import sys

from swamp.errors import UserError

TOKEN_FD = "--token-fd"
TOKEN_VARIABLE = "SWAMP_WORKER_TOKEN"


def supported() -> bool:
    return sys.platform != "win32" and hasattr(sys, "orig_argv")


def command_line(orig_argv: list[str], argv: list[str], fd: int) -> list[str]:
    """How this process was started (``orig_argv``: the interpreter, its options, the script,
    module or pyz), with the arguments of ``swamp`` (``argv[1:]``) minus every ``--token`` and
    with ``--token-fd FD`` after ``connect``."""
    args = argv[1:]
    if args and orig_argv[len(orig_argv) - len(args) :] == args:
        prefix = orig_argv[: len(orig_argv) - len(args)]
    else:  # something rewrote sys.argv: start swamp the way its children are started
        pyz = os.environ.get("SWAMP_PYZ")
        isolated = ["-I"] if sys.flags.isolated else []
        runs = [pyz] if pyz and os.path.isfile(pyz) else ["-m", "swamp"]
        prefix = [sys.executable, *isolated, *runs]
    kept: list[str] = []
    skip = False
    options_end = False
    for arg in args:
        if skip:
            skip = False
        elif options_end:
            kept.append(arg)
        elif arg == "--":
            options_end = True
            kept.append(arg)
        elif arg == "--token":
            skip = True  # and its value
        elif not arg.startswith("--token="):
            kept.append(arg)
    at = kept.index("connect") + 1 if "connect" in kept else len(kept)
    return [*prefix, *kept[:at], TOKEN_FD, str(fd), *kept[at:]]


def exec_without_token(token: str) -> None:
    """Start this process again without the token in its environment or command line; the
    token goes through a pipe (``--token-fd``). Returns only if it cannot."""
    read, write = os.pipe()
    os.write(write, token.encode())  # a few dozen bytes: the pipe holds them all
    os.close(write)
    os.set_inheritable(read, True)
    argv = command_line(list(sys.orig_argv), list(sys.argv), read)
    env = {k: v for k, v in os.environ.items() if k != TOKEN_VARIABLE}
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    try:
        os.execve(sys.executable, argv, env)
    except OSError as exc:
        os.close(read)
        raise UserError(f"cannot start the worker without its token in view: {exc}") from None


def read_token_fd(fd: int) -> str:
    """The token from the pipe ``exec_without_token`` made (or any file descriptor the caller
    opened): read to its end, then closed, so nothing the worker starts inherits it."""
    chunks = []
    try:
        while chunk := os.read(fd, 4096):
            chunks.append(chunk)
    except OSError as exc:
        raise UserError(
            f"cannot read the token from file descriptor {fd}: {exc.strerror}"
        ) from None
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
    text = b"".join(chunks).decode("utf-8", "replace").removesuffix("\n").strip()
    if not text:
        raise UserError(f"no token in file descriptor {fd}")
    return text
