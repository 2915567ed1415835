"""Token sources: where ``swamp worker connect`` gets its enrollment token.

``SWAMP_WORKER_TOKEN`` / ``--token`` is the token itself or ``<scheme>:<reference>``
(:mod:`swamp.domain.token_sources` tells them apart). A reference is resolved by the source
registered for its scheme through the ``swamp_token_sources`` hook: ``file:`` and ``env:`` here,
registered like any plugin's; ``exec:`` in ``plugins/swamp-token-exec``; a vault the same way.

A source is asked in a thread with a deadline, so a hung secret store is a one-line failure, not
a worker that never starts; what it returns is held to a token's shape and never shown. The
:class:`Supply` it gives keeps the way to ask again, for the agent to use when the orchestrator
refuses the token in hand for good (a rotated secret): not at every reconnect, which would put
the secret store in the path of every network blip and orchestrator restart.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from swamp.domain.text import printable
from swamp.domain.token_sources import (
    Reference,
    check_resolved,
    failure,
    is_reference,
    parse_reference,
)
from swamp.errors import TokenSourceFailed
from swamp.hooks import hookimpl

TIMEOUT = 300.0  # seconds a source may take; plugins keep their own, shorter, limits
FILE_LIMIT = 16 * 1024  # bytes read from a file: far more than a token, far less than /dev/zero
VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
TOKEN_VARIABLE = "SWAMP_WORKER_TOKEN"


@dataclass(frozen=True)
class TokenSource:
    """A scheme and how to resolve its references. ``asks_again``: whether a later call can
    give a different token (a file or a secret store can; the environment a process was
    started with cannot, and ``env:`` has unset its variable by then)."""

    scheme: str
    resolve: Callable[[str], str]
    summary: str = ""
    asks_again: bool = True


@dataclass(frozen=True)
class Supply:
    """The token a worker starts with, what it came from (for messages), and how to ask that
    source for another (``None``: a token given as it is, which cannot change)."""

    token: str = field(repr=False)
    source: str
    again: Callable[[], str] | None = field(default=None, repr=False)


# -- the built-in sources ------------------------------------------------------------------------


def from_file(ref: str) -> str:
    """``file:<path>``: the file's text, trimmed (a Kubernetes or Docker secret mount; one that
    is updated in place is read again when the token in hand is refused)."""
    try:
        with open(ref, "rb") as f:
            data = f.read(FILE_LIMIT + 1)
    except OSError as exc:
        raise TokenSourceFailed(f"cannot read {printable(ref)}: {exc.strerror}") from None
    if len(data) > FILE_LIMIT:
        raise TokenSourceFailed(f"{printable(ref)} holds more than {FILE_LIMIT} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise TokenSourceFailed(f"{printable(ref)} is not UTF-8 text") from None


def from_environment(ref: str) -> str:
    """``env:<NAME>``: another variable's value — a CI system's secret, say, under a name it
    chose. The variable is then unset and erased like ``SWAMP_WORKER_TOKEN`` would be."""
    if not VARIABLE.fullmatch(ref):
        raise TokenSourceFailed(f"{printable(ref)!r} is not a variable name")
    if ref == TOKEN_VARIABLE:
        raise TokenSourceFailed(f"{TOKEN_VARIABLE} cannot name itself")
    value = os.environ.get(ref)
    if value is None:
        raise TokenSourceFailed(f"the variable {ref} is not set")
    return value


@hookimpl
def swamp_token_sources():
    return [
        TokenSource("file", from_file, "a file holding the token, e.g. a secret mount"),
        TokenSource("env", from_environment, "another environment variable", asks_again=False),
    ]


# -- resolving -----------------------------------------------------------------------------------


def collect(contributed: list) -> dict[str, TokenSource]:
    """Every source by scheme, from the hook's answers; a scheme registered twice is an
    error (a plugin cannot take over ``file``)."""
    sources: dict[str, TokenSource] = {}
    for batch in contributed:
        for source in batch or ():
            if source.scheme in sources:
                raise TokenSourceFailed(f"token source {source.scheme!r} is registered twice")
            sources[source.scheme] = source
    return sources


def resolve(reference: Reference, source: TokenSource, *, timeout: float = TIMEOUT) -> str:
    """The token ``source`` gives for ``reference``, asked in a thread that has ``timeout``
    seconds to answer. Every failure is one :class:`TokenSourceFailed` line naming the scheme;
    an exception other than that is shown by its type alone (its text could hold the secret)."""
    scheme = reference.scheme
    answer: dict[str, object] = {}

    def ask() -> None:
        try:
            answer["value"] = source.resolve(reference.ref)
        except TokenSourceFailed as exc:
            answer["error"] = failure(scheme, exc.message)
        except Exception as exc:
            answer["error"] = TokenSourceFailed(
                f"token source {scheme}: failed with {type(exc).__name__} (a bug in the "
                "plugin that provides it)"
            )

    thread = threading.Thread(target=ask, name=f"token source {scheme}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():  # a daemon thread: it cannot keep the worker from exiting
        raise TokenSourceFailed(f"token source {scheme}: no answer within {timeout:g}s")
    error = answer.get("error")
    if isinstance(error, TokenSourceFailed):
        raise error
    return check_resolved(answer.get("value"), scheme)


def supply(
    token: str | None,
    token_file: Path | None,
    *,
    sources: Callable[[], dict[str, TokenSource]],
) -> Supply:
    """The worker's token from ``--token``/``SWAMP_WORKER_TOKEN`` (a token, or a reference
    resolved now) or ``--token-file``. ``sources`` is called only for a reference, so a plain
    token loads no plugin to get started."""
    from swamp.worker.config import read_token  # not at import: every plugin manager loads us

    if token_file is not None or not token or not is_reference(token.strip()):
        value = read_token(token, token_file)  # also: not both
        again = partial(read_token, None, token_file) if token_file is not None else None
        return Supply(value, "--token-file" if token_file is not None else "the token", again)
    known = sources()
    reference = parse_reference(token, list(known))
    assert reference is not None  # is_reference said so
    source = known[reference.scheme]
    ask = partial(resolve, reference, source)
    return Supply(ask(), f"{reference.scheme}:", ask if source.asks_again else None)
