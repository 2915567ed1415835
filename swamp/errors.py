"""One exception tree for the whole project.

Every error a user or a peer can see is a ``SwampError`` with a stable ``code``: the same code goes
on the wire (``error {id, error: {code, message}}``) and decides the CLI's exit status. Two
branches matter to callers: ``UserError`` ("you asked for something wrong": fix the input, do not
retry) and ``PeerError`` ("the peer or the world misbehaved": a retry may help). Library
exceptions (trio, sqlite3, httpx, wsproto) are translated into these at the boundary.
"""

from __future__ import annotations


class SwampError(Exception):
    """Root of every error swamp raises on purpose."""

    code = "error"
    exit_status = 1

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def to_wire(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


class UserError(SwampError):
    """The input was wrong: a bad flag, name, label, duration, predicate, argument or frame."""

    code = "invalid_input"
    exit_status = 2


class NotFound(UserError):
    code = "not_found"


class Conflict(SwampError):
    """The request is well-formed but collides with the current state (exists already, moved)."""

    code = "conflict"


class Forbidden(SwampError):
    """The caller is not allowed to do this (wrong role, missing admin credential)."""

    code = "forbidden"


class Rejected(SwampError):
    """An enrollment that will never succeed as presented: the worker must stop, not retry."""

    code = "rejected"


class PeerError(SwampError):
    """The peer or the world misbehaved: a closed socket, a timeout, a server that is not there."""

    code = "peer_error"


class ChannelClosed(PeerError):
    code = "channel_closed"


class CallTimeout(PeerError):
    code = "timeout"


class DispatchFailed(SwampError):
    """A method ran (or tried to) and did not succeed."""

    code = "dispatch_failed"


def from_wire(error: object) -> SwampError:
    """Rebuild an error received in an ``error`` frame, keeping its code."""
    if not isinstance(error, dict):
        return PeerError(f"peer sent a malformed error: {error!r}")
    code = str(error.get("code") or "error")
    message = str(error.get("message") or code)
    cls = _WIRE_CLASSES.get(code, SwampError)
    return cls(message, code=code)


REJECTION_CODES = frozenset(
    {
        "token_revoked",
        "token_expired",
        "token_invalid",
        "invalid_token",
        "protocol_mismatch",
        "allowance_exhausted",
        "label_not_allowed",
        "label_pinned",
    }
)

_WIRE_CLASSES: dict[str, type[SwampError]] = {code: Rejected for code in REJECTION_CODES}
_WIRE_CLASSES.update(
    {
        "invalid_input": UserError,
        "malformed_frame": UserError,
        "frame_too_large": UserError,
        "unknown_method": UserError,
        "not_found": NotFound,
        "conflict": Conflict,
        "forbidden": Forbidden,
        "unauthorized": Forbidden,
        "dispatch_failed": DispatchFailed,
        "no_matching_worker": DispatchFailed,
        "write_then_drop": DispatchFailed,
        "channel_closed": ChannelClosed,
        "busy": PeerError,
        "timeout": CallTimeout,
    }
)
