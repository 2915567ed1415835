"""Durations as operators type them: ``30s``, ``15m``, ``2h``, ``7d``, ``1w``."""

from __future__ import annotations

import re

from swamp.errors import UserError

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_PATTERN = re.compile(r"(-?\d+)([smhdw])")
HINT = (
    "a duration is a positive whole number followed by s, m, h, d or w, e.g. 30s, 15m, 2h, 7d, 1w"
)


def parse_duration(text: str, *, what: str = "duration") -> int:
    """Return the duration in seconds; zero, negative or malformed input is a ``UserError``."""
    match = _PATTERN.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise UserError(f"invalid {what} {text!r}: {HINT}")
    amount = int(match.group(1))
    if amount <= 0:
        raise UserError(f"invalid {what} {text!r}: it must be positive ({HINT})")
    return amount * _UNITS[match.group(2)]


def parse_timeout(text: str, *, what: str = "timeout") -> int | None:
    """A timeout: a duration, or ``0`` (with or without a unit) for none at all."""
    if isinstance(text, str) and text.strip().rstrip("smhdw") == "0":
        return None
    return parse_duration(text, what=what)
