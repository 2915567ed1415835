"""A third-party token source: ``exec:<command>``.

``SWAMP_WORKER_TOKEN='exec:vault kv get -field=token secret/swamp'`` makes ``swamp worker
connect`` run that command and enroll with what it prints: the shape any secret-store source
takes (Vault, AWS Secrets Manager, ``gcloud secrets versions access``, ``op read``).

The command is split with :func:`shlex.split` and run without a shell — a reference is
configuration, and a shell would turn a stray ``;`` or ``$(...)`` in it into code. It inherits
the worker's environment (the store's address and credentials live there), gets no stdin, and
has ``SWAMP_TOKEN_EXEC_TIMEOUT`` seconds (default 30); its stdout is read up to 4 KiB and,
trimmed, is the token. A failure is one line: the program's name — never its arguments, which
can hold a credential — why, and the last line of its stderr with whatever it printed on
stdout, and anything shaped like a token's secret, blanked out.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import threading

from swamp.domain.text import printable
from swamp.errors import TokenSourceFailed
from swamp.hooks import hookimpl
from swamp.worker.token_sources import TokenSource

TIMEOUT_ENV = "SWAMP_TOKEN_EXEC_TIMEOUT"
DEFAULT_TIMEOUT = 30.0
MAX_TIMEOUT = 240.0  # under the worker's own limit on any source (token_sources.TIMEOUT)
STDOUT_LIMIT = 4096  # a token is ~80 bytes
STDERR_KEPT = 4096  # the end of stderr, for the reason a command failed
SHOWN = 200  # characters of that reason shown
# a token's secret is 64 hex digits: a long hex run in stderr is blanked whatever it is
HEX_RUN = re.compile(r"[0-9a-fA-F]{32,}")


class _Reader(threading.Thread):
    """Reads a pipe to its end (so the command never blocks writing) keeping at most ``keep``
    bytes: the first ones (stdout) or the last ones (stderr, where the reason is)."""

    def __init__(self, pipe, keep: int, *, last: bool) -> None:
        super().__init__(daemon=True)
        self.pipe, self.keep, self.last = pipe, keep, last
        self.data = bytearray()
        self.total = 0

    def run(self) -> None:
        try:
            while chunk := os.read(self.pipe.fileno(), 65536):
                self.total += len(chunk)
                if self.last:
                    self.data += chunk
                    del self.data[: -self.keep]
                elif len(self.data) <= self.keep:
                    self.data += chunk[: self.keep + 1 - len(self.data)]
        except OSError:
            pass


def _timeout() -> float:
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not 0 < value <= MAX_TIMEOUT:
        raise TokenSourceFailed(
            f"{TIMEOUT_ENV}={printable(raw)!r}: expected seconds, more than 0 and at most "
            f"{MAX_TIMEOUT:g}"
        )
    return value


def _stop(process: subprocess.Popen) -> None:
    """Kill the command and whatever it started (its own process group)."""
    try:
        if os.name == "posix":
            os.killpg(process.pid, signal.SIGKILL)
        else:
            process.kill()
    except (ProcessLookupError, PermissionError):
        pass


def _said(stderr: bytes, stdout: bytes) -> str:
    """``": <the last line of stderr>"`` with every stdout line, and hex runs, blanked; or
    ``""`` when stderr said nothing."""
    lines = [line.strip() for line in stderr.decode("utf-8", "replace").splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        return ""
    line = lines[-1]
    printed = stdout.decode("utf-8", "replace")
    for secret in sorted({printed.strip(), *printed.split()}, key=len, reverse=True):
        if len(secret) >= 4:
            line = line.replace(secret, "***")
    line = HEX_RUN.sub("***", line)
    return ": " + printable(line)[:SHOWN]


def run_command(command: str, *, timeout: float) -> str:
    """What ``command`` prints on stdout, trimmed, if it exits 0 within ``timeout`` seconds;
    else :class:`TokenSourceFailed` with a reason that holds no secret."""
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise TokenSourceFailed(f"the command does not parse: {exc}") from None
    if not argv:
        raise TokenSourceFailed("the command is empty")
    program = printable(argv[0])
    try:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=os.name == "posix",
        )
    except FileNotFoundError:
        raise TokenSourceFailed(f"{program}: no such program") from None
    except OSError as exc:
        raise TokenSourceFailed(f"cannot run {program}: {exc.strerror}") from None
    out = _Reader(process.stdout, STDOUT_LIMIT, last=False)
    err = _Reader(process.stderr, STDERR_KEPT, last=True)
    out.start()
    err.start()
    try:
        process.wait(timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        _stop(process)
        process.wait()
        timed_out = True
    # a daemon it left behind may hold the pipes open: its output is not waited for
    out.join(2)
    err.join(2)
    stdout, stderr = bytes(out.data), bytes(err.data)
    if timed_out:
        raise TokenSourceFailed(
            f"{program} gave no answer within {timeout:g}s and was stopped{_said(stderr, stdout)}"
        )
    code = process.returncode
    if code != 0:
        if code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with status {code}"
        raise TokenSourceFailed(f"{program} {how}{_said(stderr, stdout)}")
    if out.total > STDOUT_LIMIT:
        raise TokenSourceFailed(f"{program} printed more than {STDOUT_LIMIT} bytes")
    try:
        text = stdout.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise TokenSourceFailed(f"{program} printed something that is not UTF-8 text") from None
    if not text:
        raise TokenSourceFailed(f"{program} printed nothing on stdout{_said(stderr, stdout)}")
    return text


def from_command(ref: str) -> str:
    return run_command(ref, timeout=_timeout())


@hookimpl
def swamp_token_sources():
    return [
        TokenSource(
            "exec",
            from_command,
            "a command that prints the token, e.g. exec:vault kv get -field=token secret/swamp",
        )
    ]
