"""Random ids, drawn from the operating system a block at a time.

A dispatch needs two (a step id, a dispatch id) and a websocket client a masking key per frame;
one ``getrandom`` system call each was a measurable part of a dispatch. The bytes are the
kernel's CSPRNG output either way (``os.urandom``), handed out in order and never twice; a
forked child starts a block of its own. Secrets do not come from here: a credential, a token or
an id that must not be guessed comes from ``secrets``, one call each, its bytes nowhere else.
"""

from __future__ import annotations

import os
import time

BLOCK = 4096


class _Pool:
    __slots__ = ("_block", "_at")

    def __init__(self) -> None:
        self._block = b""
        self._at = 0

    def take(self, count: int) -> bytes:
        if self._at + count > len(self._block):
            self._block = os.urandom(max(BLOCK, count))
            self._at = 0
        chunk = self._block[self._at : self._at + count]
        self._at += count
        return chunk

    def forget(self) -> None:
        self._block, self._at = b"", 0


_pool = _Pool()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_pool.forget)


def new_id() -> str:
    """128 random bits as 32 hex digits (the shape of ``uuid4().hex``)."""
    return _pool.take(16).hex()


def ordered_id() -> str:
    """32 hex digits that sort by creation time: the wall clock in nanoseconds, then 64 random
    bits. A lease's key is its dispatch id, so each new lease lands at the end of the table's
    index instead of on a random page of it (not a secret)."""
    return f"{time.time_ns():016x}{_pool.take(8).hex()}"


def random_bytes(count: int) -> bytes:
    """``count`` bytes from the same source (a websocket client's masking keys)."""
    return _pool.take(count)
