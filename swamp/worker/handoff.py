"""The enrollment token leaves the worker's environment block and command line.

Whatever a worker runs runs as its user, and a process can read the environment block and the
command line of any process of its user: ``/proc/<pid>/environ`` and ``/proc/<pid>/cmdline``
(``ps eww`` elsewhere). Those show the memory the process was *started* with — deleting the
variable from ``os.environ`` changes nothing there. So a worker given its token in
``SWAMP_WORKER_TOKEN`` or ``--token``, or through a source that read it from a variable
(``env:NAME``), hides it before it connects; a token from a file or a secret store needs
nothing, only its reference is in view (:func:`exposed` tells which; :func:`blank` erases the
reference where that is cheap):

- **On Linux, in place.** ``/proc/self/stat`` gives where the kernel reads both from (the
  initial command line and environment, on the main thread's stack); every copy of the token
  there is overwritten with ``*`` — as ``setproctitle`` rewrites a title — and the variable is
  unset. Reading both back proves it. This costs microseconds: start-up stays as it was.
- **Elsewhere, and on Linux should that proof fail,** the worker starts itself again in the same
  process (``exec``: the same pid, so a service manager and ``kill`` see no change) with neither,
  the token in a pipe whose read end is all it inherits (``--token-fd N``, read once and
  closed). That costs a second start of the command line (≈ 0.15–0.3 s).

Not on Windows, where ``exec`` does not keep the process: the token stays where it was given.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Collection
from pathlib import Path

from swamp.domain.token_sources import is_reference
from swamp.errors import UserError

TOKEN_FD = "--token-fd"
TOKEN_VARIABLE = "SWAMP_WORKER_TOKEN"


def supported() -> bool:
    return sys.platform != "win32" and hasattr(sys, "orig_argv")


def exposed(token: str, given: str | None) -> tuple[set[str], set[str]]:
    """What this process shows of its token: the texts to erase and the variables to unset,
    both empty when nothing secret is in view. ``given`` is ``--token`` (or the variable):
    a token given as it is is in view, and so is the variable it beat; a reference
    (``exec:…``) is not a secret, but a token a source read from a variable (``env:NAME``),
    or that also sits on the command line, is."""
    secrets: set[str] = set()
    variables: set[str] = set()
    for text in (given, os.environ.get(TOKEN_VARIABLE)):
        if text and not is_reference(text.strip()):  # a token given as it is
            secrets.add(text)
    if os.environ.get(TOKEN_VARIABLE) in secrets:
        variables.add(TOKEN_VARIABLE)
    variables |= {name for name, value in os.environ.items() if token in value}
    if secrets or variables or any(token in arg for arg in sys.argv[1:]):
        secrets.add(token)
    return secrets, variables


def hide(token: str, secrets: set[str], variables: set[str]) -> None:
    """Take ``secrets`` out of this process's environment block and command line, in place
    where that can be done and proven (Linux), else by starting again without them (the
    ``token`` in a pipe). ``variables`` are unset first, everywhere: nothing this worker
    starts inherits them (a method sees the worker's variables, bar ``SWAMP_*``)."""
    for name in variables:
        os.environ.pop(name, None)
    if not supported():
        return
    if sys.platform.startswith("linux") and erase_in_place(secrets):
        return
    exec_without_token(token, variables)


def blank(reference: str) -> None:
    """Erase a token reference (``exec:…``) from what ``/proc`` shows, where that is done in
    place (Linux). A reference is no secret, but a command in it may carry a credential for
    the store; elsewhere it stays (starting again for it would lose the way to ask again)."""
    if supported() and sys.platform.startswith("linux"):
        erase_in_place({reference})


def erase_in_place(tokens: set[str]) -> bool:
    """Overwrite every copy of each of ``tokens`` in the memory ``/proc/self/cmdline`` and
    ``/proc/self/environ`` read; whether both then read back without any."""
    import ctypes

    os.environ.pop(TOKEN_VARIABLE, None)  # unset: not in what a child would inherit
    secrets = [token.encode() for token in tokens if token]
    try:
        fields = Path("/proc/self/stat").read_bytes().rsplit(b")", 1)[1].split()
        # fields 48-51 of proc(5): arg_start, arg_end, env_start, env_end (Linux 3.5)
        bounds = [int(f) for f in fields[45:49]]
    except (OSError, ValueError, IndexError):
        return False
    if len(bounds) != 4:
        return False
    for start, end in ((bounds[0], bounds[1]), (bounds[2], bounds[3])):
        if not 0 < start < end:
            return False
        region = ctypes.string_at(start, end - start)
        for secret in secrets:
            at = region.find(secret)
            while at >= 0:
                ctypes.memset(start + at, ord("*"), len(secret))
                at = region.find(secret, at + len(secret))
    try:
        shown = [Path(f"/proc/self/{name}").read_bytes() for name in ("cmdline", "environ")]
    except OSError:
        return False
    return not any(secret in text for secret in secrets for text in shown)


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


def exec_without_token(token: str, variables: Collection[str] = frozenset()) -> None:
    """Start this process again without the token in its environment (``SWAMP_WORKER_TOKEN``
    and ``variables``) or command line; the token goes through a pipe (``--token-fd``).
    Returns only if it cannot."""
    read, write = os.pipe()
    os.write(write, token.encode())  # a few dozen bytes: the pipe holds them all
    os.close(write)
    os.set_inheritable(read, True)
    argv = command_line(list(sys.orig_argv), list(sys.argv), read)
    env = {k: v for k, v in os.environ.items() if k != TOKEN_VARIABLE and k not in variables}
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
