"""Text that came from a peer is data: checked with full matches, escaped when shown.

Two habits, both needed. *Checking*: every identifier a peer sends (names, labels, platform,
ids) is validated with :func:`re.fullmatch` — a ``$`` anchor also matches before a trailing
newline, which once let ``result\\n`` through as a name. *Escaping*: whatever reaches a terminal
or a log line goes through :func:`printable` first, because records written by an older version,
a worker's command output or a close reason can still carry control characters: an ANSI escape
in a worker's ``platform`` once cleared the operator's screen in ``worker list``.
"""

from __future__ import annotations

import re

# C0 and C1 controls, DEL, and the Unicode line/paragraph separators and bidirectional
# overrides that can make text render as something other than what it is.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_UNSAFE_KEEP_TAB = re.compile(
    "[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object, *, keep_tab: bool = False) -> str:
    """``text`` with every control or bidi character shown as ``\\xNN`` / ``\\uNNNN``."""
    pattern = _UNSAFE_KEEP_TAB if keep_tab else _UNSAFE
    return pattern.sub(_escape, text if isinstance(text, str) else str(text))


def is_printable(text: str) -> bool:
    return _UNSAFE.search(text) is None
