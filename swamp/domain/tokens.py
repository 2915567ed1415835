"""Enrollment tokens: minting, redeeming, revoking and expiring, as pure decisions.

A token is ``<name>.<secret>``. Only ``sha256(secret)`` is stored; the plaintext is shown once, at
mint. A token admits up to ``max_enrollments`` machines (1 by default, an integer, or
``"unlimited"``); each admitted machine is a *binding* ``{machineId, workerName, enrolledAt}``,
stored as a record of its own — the token keeps only their count, so an enrollment costs the
same in a fleet of ten thousand as in a fleet of ten.

Redeem is the heart of it. The shell reads the token and the machine's binding (if any), calls
:func:`redeem`, and gets a decision: reject (with a coded reason), re-authenticate (no write), or
bind (write the binding and the token with its count one higher). The shell does all of it in
one write transaction, so two processes racing for the last place can never both win.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import Enum
from typing import Literal

from swamp.domain.claims import ClaimPolicy, Granted, grant
from swamp.domain.lifecycle import Lifecycle
from swamp.domain.names import check_name
from swamp.domain.workers import looks_like_instance_id
from swamp.errors import (
    AllowanceExhausted,
    AlreadyExists,
    FleetFull,
    MalformedToken,
    TokenExpired,
    TokenInvalid,
    TokenRevoked,
    UserError,
)

Unlimited = Literal["unlimited"]
SECRET_BYTES = 32


class TokenState(str, Enum):
    UNUSED = "unused"
    ENROLLED = "enrolled"
    EXPIRED = "expired"
    REVOKED = "revoked"


TOKEN_LIFECYCLE = Lifecycle(
    "an enrollment token",
    {
        TokenState.UNUSED: {TokenState.ENROLLED, TokenState.EXPIRED, TokenState.REVOKED},
        TokenState.ENROLLED: {TokenState.ENROLLED, TokenState.EXPIRED, TokenState.REVOKED},
        TokenState.EXPIRED: set(),
        TokenState.REVOKED: set(),
    },
)


@dataclass(frozen=True)
class Binding:
    machine_id: str
    worker_name: str
    enrolled_at: str

    def to_json(self) -> dict[str, str]:
        return {
            "machineId": self.machine_id,
            "workerName": self.worker_name,
            "enrolledAt": self.enrolled_at,
        }


@dataclass(frozen=True)
class Token:
    name: str
    state: TokenState
    created_at: str
    expires_at: str
    expires_at_epoch: float
    secret_hash: str
    max_enrollments: int | Unlimited = 1
    enrollments: int = 0  # machines bound (each binding is a record of its own)
    # bindings an old record held inline (the shell moves them to records of their own)
    legacy_bindings: tuple[Binding, ...] = field(default_factory=tuple)
    revoked_at: str | None = None
    claims: ClaimPolicy = field(default_factory=ClaimPolicy)

    # -- reading and writing the stored shape ------------------------------------------------

    @classmethod
    def from_attributes(cls, attrs: dict) -> Token:
        """Read a stored record, including the older shapes.

        An older fleet record lists its ``bindings`` inline; an older single-machine one has
        ``boundMachineId`` (+ ``enrolledAt``) instead, read as one binding named after the
        token. Both come back in ``legacy_bindings`` (and count as enrollments); nothing is
        rewritten here.
        """
        bindings = tuple(
            Binding(b["machineId"], b.get("workerName") or attrs["name"], b["enrolledAt"])
            for b in attrs.get("bindings") or ()
        )
        if not bindings and attrs.get("boundMachineId"):
            bindings = (
                Binding(
                    attrs["boundMachineId"],
                    attrs["name"],
                    attrs.get("enrolledAt") or attrs["createdAt"],
                ),
            )
        return cls(
            name=attrs["name"],
            state=TokenState(attrs["state"]),
            created_at=attrs["createdAt"],
            expires_at=attrs["expiresAt"],
            expires_at_epoch=float(attrs["expiresAtEpoch"])
            if "expiresAtEpoch" in attrs
            else _epoch(attrs["expiresAt"]),
            secret_hash=attrs["secretHash"],
            max_enrollments=attrs.get("maxEnrollments", 1),
            enrollments=int(attrs.get("enrollments", len(bindings))),
            legacy_bindings=bindings,
            revoked_at=attrs.get("revokedAt"),
            claims=ClaimPolicy.from_attributes(attrs),
        )

    def to_attributes(self) -> dict:
        attrs = {
            "name": self.name,
            "state": self.state.value,
            "createdAt": self.created_at,
            "expiresAt": self.expires_at,
            "expiresAtEpoch": self.expires_at_epoch,
            "secretHash": self.secret_hash,
            "maxEnrollments": self.max_enrollments,
            "enrollments": self.enrollments,
        }
        if self.revoked_at:
            attrs["revokedAt"] = self.revoked_at
        attrs.update(self.claims.to_attributes())
        return attrs

    # -- derived views -------------------------------------------------------------------------

    def effective_state(self, now: float) -> TokenState:
        """The state to show and to act on: a lapsed deadline means expired, stored or not."""
        if self.state in (TokenState.UNUSED, TokenState.ENROLLED) and now >= self.expires_at_epoch:
            return TokenState.EXPIRED
        return self.state

    def live(self, now: float) -> bool:
        return self.effective_state(now) in (TokenState.UNUSED, TokenState.ENROLLED)

    def has_room(self) -> bool:
        return self.max_enrollments == "unlimited" or self.enrollments < self.max_enrollments

    def enrollments_text(self) -> str:
        return f"{self.enrollments} / {self.max_enrollments}"

    def migrated(self) -> Token:
        """This token in the current shape: its inline bindings gone (the shell has written
        them as records), their count kept."""
        return replace(self, legacy_bindings=())


def _epoch(text: str) -> float:
    """Seconds since the epoch for an ISO-8601 UTC timestamp (records written before the epoch
    was stored beside it)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# -- credentials --------------------------------------------------------------------------------


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def secret_matches(secret: str, secret_hash: str) -> bool:
    return secrets.compare_digest(hash_secret(secret).encode(), secret_hash.encode())


def split_credential(text: str) -> tuple[str, str]:
    """Split ``<name>.<secret>`` at the first dot; anything else is a ``Rejected`` input."""
    name, sep, secret = (text or "").strip().partition(".")
    if not sep or not name or not secret:
        raise MalformedToken(
            "a token must have the form <name>.<secret> (as printed by 'token create')"
        )
    return name, secret


def parse_max_enrollments(text: str | int) -> int | Unlimited:
    """``--max-enrollments``: a positive integer or ``unlimited`` (also from a JSON frame)."""
    if text == "unlimited":
        return "unlimited"
    if isinstance(text, bool):
        value = 0
    elif isinstance(text, int):
        value = text
        text = str(text)
    else:
        try:
            value = int(text)
        except (TypeError, ValueError):
            value = 0
    if value <= 0 or str(text).strip() != str(value):
        raise UserError(
            f"invalid --max-enrollments {text!r}: expected a positive integer or unlimited"
        )
    return value


# -- transitions --------------------------------------------------------------------------------


def mint(
    name: str,
    *,
    secret: str,
    now: float,
    now_iso: str,
    expires_iso: str,
    duration_seconds: int,
    existing: Token | None,
    max_enrollments: int | Unlimited = 1,
    claims: ClaimPolicy | None = None,
) -> Token:
    """A new token; a name still live is refused, a revoked or expired one may be minted again."""
    check_name(name, what="token name")
    if looks_like_instance_id(name):
        raise UserError(
            f"invalid token name {name!r}: it looks like a worker instance id (a "
            "UUID), which --target must never confuse with a name; pick another"
        )
    if duration_seconds <= 0:
        raise UserError("a token's duration must be positive")
    if existing is not None and existing.live(now):
        raise AlreadyExists(
            f"token {name!r} already exists and is {existing.effective_state(now).value}: "
            "revoke it first or pick another name"
        )
    return Token(
        name=name,
        state=TokenState.UNUSED,
        created_at=now_iso,
        expires_at=expires_iso,
        expires_at_epoch=now + duration_seconds,
        secret_hash=hash_secret(secret),
        max_enrollments=max_enrollments,
        claims=claims or ClaimPolicy(),
    )


_NO_SUCH_TOKEN_HASH = hash_secret("no such token")


@dataclass(frozen=True)
class Redeemed:
    """A successful redeem: ``write`` is the record to store (``None`` for a re-authentication),
    ``granted`` the labels and slots the worker is admitted with."""

    token: Token
    binding: Binding
    write: Token | None
    granted: Granted


def redeem(
    token: Token | None,
    *,
    known: Binding | None,
    name: str,
    secret: str,
    machine_id: str,
    now: float,
    now_iso: str,
    name_new: Callable[[Token], str],
    labels: Mapping[str, str] | None = None,
    capacity: int = 1,
) -> Redeemed:
    """Decide an enrollment attempt. Raises ``Rejected`` with a code naming the reason.

    ``known`` is this machine's binding under this token, if it has one: it keeps the name
    stored there. ``name_new(token)`` gives the name a *new* binding gets (called only when one
    is made). The worker's claimed ``labels`` and
    ``capacity`` are judged by the token's claim policy *before* anything is bound, so a refused
    worker never uses up an enrollment.
    """
    # Whoever does not hold the secret learns nothing, not even whether the name exists: an
    # unknown name and a wrong secret get the same answer (the detail goes to the log only),
    # and an unknown name still costs a hash comparison. Only the holder of the secret is told
    # that the token is revoked, expired or full.
    if token is None:
        secret_matches(secret, _NO_SUCH_TOKEN_HASH)
        raise TokenInvalid(name=name, detail="no token has this name")
    if not secret_matches(secret, token.secret_hash):
        raise TokenInvalid(name=name, detail="the secret does not match")
    if token.state is TokenState.REVOKED:
        raise TokenRevoked(f"token {name!r} has been revoked")
    if token.effective_state(now) is TokenState.EXPIRED:
        raise TokenExpired(f"token {name!r} has expired")
    granted = grant(
        token.claims,
        token_name=token.name,
        fleet=token.max_enrollments != 1,
        labels=labels or {},
        capacity=capacity,
    )
    if known is not None:
        return Redeemed(token=token, binding=known, write=None, granted=granted)
    if not token.has_room():
        if token.max_enrollments != 1:  # a fleet: a gone machine's place frees in time
            raise FleetFull(
                f"fleet token {name!r}: enrollment allowance exhausted "
                f"({token.enrollments_text()}); a place frees when one of its machines has "
                "been gone for the orchestrator's --worker-retention"
            )
        raise AllowanceExhausted(
            f"token {name!r}: enrollment allowance exhausted ({token.enrollments_text()})"
        )
    binding = Binding(machine_id=machine_id, worker_name=name_new(token), enrolled_at=now_iso)
    TOKEN_LIFECYCLE.check(token.state, TokenState.ENROLLED)
    updated = replace(token, state=TokenState.ENROLLED, enrollments=token.enrollments + 1)
    return Redeemed(token=updated, binding=binding, write=updated, granted=granted)


def revoke(token: Token, *, now_iso: str) -> Token | None:
    """The revoked record, or ``None`` when the token is already revoked or expired (no write)."""
    if TOKEN_LIFECYCLE.terminal(token.state):
        return None
    TOKEN_LIFECYCLE.check(token.state, TokenState.REVOKED)
    return replace(token, state=TokenState.REVOKED, revoked_at=now_iso)


def prune(token: Token, released: int) -> Token | None:
    """The token once ``released`` of its bindings are gone (their places free again), or
    ``None`` when none was (no write)."""
    if released <= 0:
        return None
    return replace(token, enrollments=max(0, token.enrollments - released))


def expire(token: Token, *, now: float) -> Token | None:
    """The expired record once the deadline has passed, else ``None`` (no write)."""
    if token.state not in (TokenState.UNUSED, TokenState.ENROLLED):
        return None
    if now < token.expires_at_epoch:
        return None
    TOKEN_LIFECYCLE.check(token.state, TokenState.EXPIRED)
    return replace(token, state=TokenState.EXPIRED)
