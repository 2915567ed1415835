"""Where a worker's enrollment token comes from: the rules, no I/O.

``SWAMP_WORKER_TOKEN`` (or ``--token``) holds either the token itself, ``<name>.<secret>``, or a
*reference* ``<scheme>:<reference>`` that a token source resolves: ``file:/run/secrets/swamp``,
``env:CI_SWAMP_TOKEN``, or a plugin's (``exec:``, a vault). Telling the two apart must never
send a real token to a source, nor a reference to the orchestrator as if it were a token:

- a token name is ``[a-z0-9_-]`` (:mod:`swamp.domain.names`) and never holds ``:`` or ``.``, so
  a real token's first ``.`` comes before any ``:`` (its secret is hex, with neither);
- so text with a ``:`` before its first ``.`` (or with a ``:`` and no ``.``) is a reference,
  and anything else is a token given as it is — exactly as before sources existed.

What a source gives back is held to the token's shape here, so that a source printing the wrong
thing (a JSON document, a ``Vault`` banner) fails on the worker with a line naming the source,
not at the orchestrator as "wrong secret"; the value itself is never part of a message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from swamp.domain.text import printable
from swamp.errors import TokenSourceFailed, UserError

SCHEME = re.compile(r"[a-z][a-z0-9+-]{0,31}")
MAX_TOKEN_CHARS = 1024  # a token is ~80; anything far longer is not one
WHERE = "SWAMP_WORKER_TOKEN/--token"

# Rejections a different token could cure: the token is unknown, wrong, revoked, expired,
# already bound, or its policy refuses what this worker claims. A protocol mismatch is the
# build's, not the token's.
CURABLE_BY_ANOTHER_TOKEN = frozenset(
    {
        "malformed_token",
        "token_invalid",
        "token_revoked",
        "token_expired",
        "allowance_exhausted",
        "label_not_allowed",
        "label_pinned",
    }
)


@dataclass(frozen=True)
class Reference:
    """``<scheme>:<ref>``: which source, and what it should look up (not a secret itself)."""

    scheme: str
    ref: str


def is_reference(text: str) -> bool:
    """Whether ``text`` is a ``<scheme>:<reference>`` rather than a token (see the module)."""
    colon = text.find(":")
    dot = text.find(".")
    return colon >= 0 and (dot < 0 or colon < dot)


def parse_reference(text: str, known: list[str]) -> Reference | None:
    """The reference ``text`` names, or ``None`` for a token given as it is. An unknown or
    malformed scheme is one line listing the known ones (the rest of the text is not shown:
    a mangled token could be in it)."""
    text = text.strip()
    if not is_reference(text):
        return None
    scheme, _, ref = text.partition(":")
    listing = ", ".join(sorted(known)) or "none"
    if not SCHEME.fullmatch(scheme):
        raise UserError(
            f"{WHERE} is neither a token (<name>.<secret>) nor a <scheme>:<reference> "
            f"(known schemes: {listing})"
        )
    if scheme not in known:
        raise UserError(f"unknown token source {scheme!r} in {WHERE} (known: {listing})")
    if not ref.strip():
        raise TokenSourceFailed(f"token source {scheme}: nothing after '{scheme}:'")
    return Reference(scheme, ref.strip())


def check_resolved(value: object, scheme: str) -> str:
    """The token a source gave, trimmed, if it has a token's shape; else one line naming the
    source and what is wrong — never the value."""
    if not isinstance(value, str):
        raise TokenSourceFailed(
            f"token source {scheme}: gave a {type(value).__name__}, not text (a bug in the "
            "plugin that provides it)"
        )
    token = value.strip()
    if not token:
        raise TokenSourceFailed(f"token source {scheme}: gave an empty token")
    if len(token) > MAX_TOKEN_CHARS:
        raise TokenSourceFailed(
            f"token source {scheme}: gave {len(token)} characters, more than a token has "
            f"(at most {MAX_TOKEN_CHARS})"
        )
    if any(ch.isspace() or not ch.isprintable() for ch in token):
        raise TokenSourceFailed(
            f"token source {scheme}: gave more than one word or line, not a token (<name>.<secret>)"
        )
    if is_reference(token):
        raise TokenSourceFailed(
            f"token source {scheme}: gave another <scheme>:<reference>, not a token "
            "(references are not followed)"
        )
    name, dot, secret = token.partition(".")
    if not (dot and name and secret):
        raise TokenSourceFailed(
            f"token source {scheme}: gave something that is not a token (<name>.<secret>)"
        )
    return token


def failure(scheme: str, reason: str) -> TokenSourceFailed:
    """A source's own failure as the one line the worker prints."""
    first = printable(reason.strip().splitlines()[0] if reason.strip() else "failed")
    return TokenSourceFailed(f"token source {scheme}: {first[:300]}")


def another_token_may_help(code: str) -> bool:
    """Whether a worker whose token was refused with ``code`` should ask its source again."""
    return code in CURABLE_BY_ANOTHER_TOKEN
