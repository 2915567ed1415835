"""What an enrolled machine is called in the pool (its labels are decided in ``claims``).

A single-machine token (``maxEnrollments == 1``) names its worker after itself. A fleet token
names each machine ``<token>-<suffix>``, the suffix the first hex digits of SHA-256(machineId):
8 by default, stable across reconnects and restarts of the same machine. If that name is already
taken — by a different machine under the same token, or by another token's worker — the suffix
grows one digit at a time until the name is free: never a refusal, never a takeover. The name
chosen is stored in the machine's binding and reused from then on, so it never changes.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterator

from swamp.domain.tokens import Token

SUFFIX_LENGTH = 8
_HEX = re.compile(r"[0-9a-f]+")


def machine_digest(machine_id: str) -> str:
    return hashlib.sha256(machine_id.encode("utf-8")).hexdigest()


def is_fleet(token: Token) -> bool:
    return token.max_enrollments != 1


def name_candidates(token: Token, machine_id: str) -> Iterator[str]:
    """A fleet member's names, in the order they are tried: ``<token>-<suffix>``, the suffix
    one hex digit longer each time. The first nobody else uses is its name (the shell, whose
    questions may be awaited, walks them as :func:`worker_name_for` does)."""
    digest = machine_digest(machine_id)
    for length in range(SUFFIX_LENGTH, len(digest) + 1):
        yield f"{token.name}-{digest[:length]}"


def worker_name_for(
    token: Token, machine_id: str, taken: Callable[[str], bool] = lambda name: False
) -> str:
    """The name a *new* binding gets. ``taken(name)``: is that name used by another machine
    (of this token or another) or by another token? The shell answers with indexed lookups,
    never a scan of the fleet. A single-machine token's worker is named after it: nothing is
    asked."""
    if not is_fleet(token):
        return token.name
    for candidate in name_candidates(token, machine_id):
        if not taken(candidate):
            return candidate
    # 64 hex digits of SHA-256 equal means the same machine id: unreachable for two machines.
    raise AssertionError(f"no free name for machine {machine_id!r} under token {token.name!r}")


def fleet_suffix(worker_name: str) -> tuple[str, str] | None:
    """``(token, hex suffix)`` when ``worker_name`` has the shape of a fleet member's name."""
    token, sep, suffix = worker_name.rpartition("-")
    if sep and token and len(suffix) >= SUFFIX_LENGTH and _HEX.fullmatch(suffix):
        return token, suffix
    return None
