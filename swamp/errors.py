"""One exception tree for the whole project, one class per error code.

Every error a user or a peer can see is a ``SwampError``. Its class decides everything else:
the stable ``code`` that goes on the wire (``error {id, error: {code, message}}``) and the CLI's
exit status. A class declares its code once; the table the wire decoder uses (:data:`BY_CODE`)
is built from the classes as they are defined, never kept by hand, so
``from_wire(e.to_wire())`` gives back the same class — and the same exit status — for every
code, whichever route a command took.

Three branches matter to callers:

- :class:`UserError` — "you asked for something wrong": fix the input, do not retry; exit 2.
- :class:`PeerError` — "the peer or the world misbehaved": a retry may help; exit 1.
- everything else — the request was understood and failed (refused, conflicting, a method
  that failed); exit 1.

Library exceptions (trio, sqlite3, httpx, wsproto) are translated into these at the boundary.
"""

from __future__ import annotations

from typing import ClassVar

BY_CODE: dict[str, type[SwampError]] = {}


class SwampError(Exception):
    """Root of every error swamp raises on purpose."""

    code: ClassVar[str] = "error"
    exit_status: ClassVar[int] = 1
    answered = False  # the peer sent it (an error frame), rather than it arising here

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "code" in cls.__dict__:
            owner = BY_CODE.setdefault(cls.code, cls)
            if owner is not cls:
                raise TypeError(f"error code {cls.code!r} is taken by {owner.__name__}")

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_wire(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


BY_CODE[SwampError.code] = SwampError


# -- you asked for something wrong (exit 2) ---------------------------------------------------


class UserError(SwampError):
    """The input was wrong: a bad flag, name, label, duration, predicate, argument or frame."""

    code = "invalid_input"
    exit_status = 2


class NotFound(UserError):
    """It names something that does not exist (a worker, a token)."""

    code = "not_found"


class AlreadyExists(UserError):
    """A name that is taken (a live token, a worker's name)."""

    code = "already_exists"


class UnknownModel(UserError):
    code = "unknown_model"


class ExpressionError(UserError):
    """A ``${{ … }}`` expression that does not parse, or cannot be evaluated."""

    code = "invalid_expression"


class UnknownMethod(UserError):
    """No such method: of a model type, or of the wire protocol."""

    code = "unknown_method"


class InvalidPredicate(UserError):
    """A query that does not parse; the message shows a caret at the position."""

    code = "invalid_predicate"

    def __init__(
        self, message: str, source: str | None = None, position: int | None = None
    ) -> None:
        if source is not None and position is not None:
            caret = f"\n  {source}\n  {' ' * position}^"
            message = f"invalid predicate at position {position}: {message}{caret}"
        super().__init__(message)
        self.position = position


class MalformedFrame(UserError):
    """A frame or payload that is not what the protocol says (``frame_id``, and the frame's
    ``frame_type``, when known)."""

    code = "malformed_frame"

    def __init__(
        self, message: str, *, frame_id: str | None = None, frame_type: object = None
    ) -> None:
        super().__init__(message)
        self.frame_id = frame_id
        self.frame_type = frame_type


class FrameTooLarge(MalformedFrame):
    code = "frame_too_large"


class DuplicateId(MalformedFrame):
    code = "duplicate_id"


class TooLarge(UserError):
    """A data-plane body over the limit."""

    code = "too_large"


class QuotaExceeded(TooLarge):
    """A dispatch tried to write more than its quota allows (bytes or records)."""

    code = "quota_exceeded"


class TokenSourceFailed(UserError):
    """A worker's token source (``file:``, ``env:``, a plugin's) gave no usable token. Its
    message names the source and the reason, never the secret. A user error (exit 2), as an
    unreadable ``--token-file`` always was: a service manager restarts the worker, and a
    secret store that was away, or a mount not there yet, may answer then."""

    code = "token_source_failed"


class WrongScheme(UserError):
    """A URL whose scheme the port does not speak: ``ws://`` to a TLS port, ``wss://`` to a
    plain one. Asking again the same way can never work (a worker stops)."""

    code = "wrong_scheme"


# -- refused, conflicting, or failed (exit 1) ---------------------------------------------------


class Conflict(SwampError):
    """Well-formed, but it collides with the current state (it moved, it is in use)."""

    code = "conflict"


class Fenced(Conflict):
    """A write made for a worker's connection that another connection has replaced since
    (``swamp.domain.holding``): the orchestrator that made it no longer holds the worker."""

    code = "fenced"


class IllegalTransition(Conflict):
    code = "illegal_transition"


class AlreadyConnected(Conflict):
    """Another process of the same machine is connected: transient, the worker retries."""

    code = "already_connected"


class Forbidden(SwampError):
    """The caller is not allowed to do this (a worker socket calling an admin frame)."""

    code = "forbidden"


class Unauthorized(Forbidden):
    """The admin credential is missing, wrong or revoked."""

    code = "unauthorized"


class ScopeTooNarrow(Forbidden):
    """An accepted server token whose scope does not cover what it asked for (the message
    names both scopes); the same answer on the websocket and over HTTP."""

    code = "insufficient_scope"


class DispatchEnded(Forbidden):
    """A data-plane credential whose dispatch has ended."""

    code = "dispatch_ended"


class Rejected(SwampError):
    """An enrollment that will never succeed as presented: the worker must stop, not retry."""

    code = "rejected"


class PinMismatch(Rejected):
    """The orchestrator's CA is not the one ``--ca-pin`` names: it may be another server."""

    code = "ca_pin_mismatch"


class MalformedToken(Rejected):
    code = "malformed_token"


class TokenInvalid(Rejected):
    """An unknown token name or a wrong secret: one answer for both (``detail`` is for logs)."""

    code = "token_invalid"

    def __init__(
        self,
        message: str = "the enrollment token was not accepted: its name is "
        "unknown or its secret does not match (check SWAMP_WORKER_TOKEN / "
        "--token-file)",
        *,
        name: str = "",
        detail: str = "",
    ) -> None:
        super().__init__(message)
        self.name, self.detail = name, detail


class TokenRevoked(Rejected):
    code = "token_revoked"


class TokenExpired(Rejected):
    code = "token_expired"


class AllowanceExhausted(Rejected):
    code = "allowance_exhausted"


class FleetFull(SwampError):
    """Every place of a fleet token is bound to a machine. Not permanent: a machine gone for
    the orchestrator's ``--worker-retention`` frees its place, so a worker waits and retries."""

    code = "fleet_full"


class ProtocolMismatch(Rejected):
    code = "protocol_mismatch"


class LabelNotAllowed(Rejected):
    code = "label_not_allowed"


class LabelPinned(Rejected):
    code = "label_pinned"


class DispatchFailed(SwampError):
    """A method ran (or tried to) and did not succeed."""

    code = "dispatch_failed"


class NoMatchingWorker(DispatchFailed):
    code = "no_matching_worker"


class QueueTimeout(DispatchFailed):
    """A step waited its whole queue timeout and no matching worker could take it."""

    code = "queue_timeout"


class QueueFull(DispatchFailed):
    """The queue holds as many waiting steps as it may: this one was not queued."""

    code = "queue_full"


class WorkerLostError(DispatchFailed):
    code = "worker_lost"


class ExecutionTimeout(DispatchFailed):
    """A step ran on its worker for longer than its timeout and was stopped there."""

    code = "execution_timeout"


class WriteThenDrop(DispatchFailed):
    code = "write_then_drop"


class WorkerBusy(DispatchFailed):
    code = "worker_busy"


class WorkerDraining(DispatchFailed):
    """The worker is draining: it takes no new dispatch (the step goes back in the queue)."""

    code = "worker_draining"


class WorkerStopped(DispatchFailed):
    """The worker was stopped (a second signal) while the dispatch ran."""

    code = "worker_stopped"


class MethodFailed(DispatchFailed):
    """Raised by a method to fail its dispatch with a message for the user."""

    code = "method_failed"


class SeamFailed(SwampError):
    """Raised by a probe seam's check with a one-line reason."""

    code = "seam_failed"


class AlreadyServing(Conflict):
    """Another ``swamp serve`` holds this repo."""

    code = "already_serving"


class CannotListen(SwampError):
    """The address to listen on is taken or not ours to bind."""

    code = "cannot_listen"


class NeedsOrchestrator(SwampError):
    """The operation needs a running ``swamp serve``, and the route taken has none."""

    code = "needs_orchestrator"


class StoreError(SwampError):
    """The database refused."""

    code = "store_error"


class StoreBusy(StoreError):
    """Another process holds the database's write lock: try again shortly."""

    code = "store_busy"


class StoreBroken(StoreError):
    """The database cannot take writes any more (read-only, corrupt, deleted or replaced):
    nothing will be acknowledged until it is fixed and ``swamp serve`` restarted."""

    code = "store_broken"


class SqlError(StoreError):
    """PostgreSQL refused a statement: ``sqlstate`` is the server's five-character code
    (``23505`` unique_violation, ``40001`` serialization_failure, ``40P01`` deadlock_detected,
    ``42P01`` undefined_table…), the message is the server's own."""

    code = "sql_error"

    def __init__(self, message: str, *, sqlstate: str = "", detail: str = "") -> None:
        super().__init__(message)
        self.sqlstate, self.detail = sqlstate, detail


class QueryTimeout(SwampError):
    """A query ran past its time budget and was stopped; nothing was changed."""

    code = "query_timeout"


# -- the peer or the world misbehaved (exit 1; a retry may help) --------------------------------


class PeerError(SwampError):
    """The peer or the world misbehaved: a closed socket, a timeout, a server that is not there."""

    code = "peer_error"


class ChannelClosed(PeerError):
    code = "channel_closed"


class CallTimeout(PeerError):
    code = "timeout"


class DatabaseUnavailable(PeerError):
    """No connection to PostgreSQL could be opened: the message says where and why (never a
    password)."""

    code = "database_unavailable"


class ConnectionLost(DatabaseUnavailable):
    """A connection to PostgreSQL broke (the server ended it, the network dropped it) or was
    closed: it is not used again. What was in flight may or may not have been committed."""

    code = "connection_lost"


class LockLost(ConnectionLost):
    """The connection that held a PostgreSQL advisory lock is gone, and the lock with it:
    whatever ran because it was held must stop (another may hold it now)."""

    code = "lock_lost"


class ClaimGone(Conflict):
    """Another orchestrator no longer holds the slot it claimed for a step (its hold expired
    before the step came): the step is queued again."""

    code = "claim_gone"


class LockHeld(Conflict):
    """Another process holds a PostgreSQL advisory lock asked for without waiting."""

    code = "lock_held"


class PoolTimeout(CallTimeout):
    """Every connection of a pool stayed busy for as long as the caller would wait."""

    code = "pool_timeout"


class Busy(PeerError):
    """Too many requests in flight on one socket: wait for answers, then retry."""

    code = "busy"


class MalformedReply(PeerError):
    """A peer answered with something that is not what the protocol says."""

    code = "malformed_reply"


class HandlerFailed(PeerError):
    """The peer's handler crashed (a bug on its side)."""

    code = "handler_failed"


class Cancelled(PeerError):
    code = "cancelled"


class DataPlaneError(PeerError):
    """The data plane answered with something that is not a coded error."""

    code = "data_plane_error"


def from_wire(error: object) -> SwampError:
    """Rebuild an error received in an ``error`` frame: the class of its code, its message.

    A code this version does not know (a newer peer) keeps its code on a plain
    :class:`PeerError`, so the caller still sees it.
    """
    if not isinstance(error, dict):
        return PeerError(f"the peer sent a malformed error: {str(error)[:200]!r}")
    code = error.get("code")
    message = error.get("message")
    code = code if isinstance(code, str) and code else "error"
    message = message if isinstance(message, str) and message else code
    cls = BY_CODE.get(code)
    if cls is None:
        unknown = PeerError(message)
        unknown.code = code  # type: ignore[misc]  # an instance attribute, for display only
        unknown.answered = True
        return unknown
    rebuilt = cls(message)
    rebuilt.answered = True
    return rebuilt
