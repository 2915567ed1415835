"""What an enrolled machine is called in the pool.

A single-machine token names its worker after itself. (Fleet tokens, which admit many machines,
extend this rule.)
"""

from __future__ import annotations

from swamp.domain.tokens import Token


def worker_name_for(token: Token, machine_id: str) -> str:
    return token.name
