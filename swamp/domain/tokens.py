"""Enrollment tokens: minting, redeeming, revoking and expiring, as pure decisions.

A token is ``<name>.<secret>``. Only ``sha256(secret)`` is stored; the plaintext is shown once, at
mint. A token admits up to ``max_enrollments`` machines (1 by default, an integer, or
``"unlimited"``); each admitted machine is a *binding* ``{machineId, workerName, enrolledAt}``.

Redeem is the heart of it. The shell reads the latest record, calls :func:`redeem`, and gets a
decision: reject (with a coded reason), re-authenticate (no write), or bind (write the returned
record). The shell writes it as a compare-and-swap on the record's version, so two processes
racing for the last slot can never both win: the loser re-reads and decides again.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Collection, Mapping
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
    bindings: tuple[Binding, ...] = field(default_factory=tuple)
    revoked_at: str | None = None
    claims: ClaimPolicy = field(default_factory=ClaimPolicy)

    # -- reading and writing the stored shape ------------------------------------------------

    @classmethod
    def from_attributes(cls, attrs: dict) -> Token:
        """Read a stored record, including the legacy single-machine shape.

        A legacy record has ``boundMachineId`` (+ ``enrolledAt``) and no ``bindings``; it reads as
        a one-element binding list named after the token. Nothing is rewritten here: the next
        transition writes the new shape.
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
            bindings=bindings,
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
            "bindings": [b.to_json() for b in self.bindings],
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

    def binding_for(self, machine_id: str) -> Binding | None:
        for binding in self.bindings:
            if binding.machine_id == machine_id:
                return binding
        return None

    def has_room(self) -> bool:
        return self.max_enrollments == "unlimited" or len(self.bindings) < self.max_enrollments

    def enrollments_text(self) -> str:
        return f"{len(self.bindings)} / {self.max_enrollments}"


def _epoch(text: str) -> float:
    """Seconds since the epoch for an ISO-8601 UTC timestamp (records written before the epoch
    was stored beside it)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# -- credentials --------------------------------------------------------------------------------


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def secret_matches(secret: str, secret_hash: str) -> bool:
    return hmac.compare_digest(hash_secret(secret).encode(), secret_hash.encode())


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

    ``name_new(token)`` gives the name a *new* binding gets (called only when one is made); a
    known machine keeps the name stored in its binding. The worker's claimed ``labels`` and
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
    known = token.binding_for(machine_id)
    if known is not None:
        return Redeemed(token=token, binding=known, write=None, granted=granted)
    if not token.has_room():
        if token.max_enrollments != 1:  # a fleet: a gone machine's place frees in time
            raise FleetFull(
                f"fleet token {name!r} has all its places taken ({token.enrollments_text()}); "
                "a place frees when one of its machines has been gone for the orchestrator's "
                "--worker-retention"
            )
        raise AllowanceExhausted(
            f"token {name!r}: enrollment allowance exhausted ({token.enrollments_text()})"
        )
    binding = Binding(machine_id=machine_id, worker_name=name_new(token), enrolled_at=now_iso)
    TOKEN_LIFECYCLE.check(token.state, TokenState.ENROLLED)
    updated = replace(token, state=TokenState.ENROLLED, bindings=token.bindings + (binding,))
    return Redeemed(token=updated, binding=binding, write=updated, granted=granted)


def revoke(token: Token, *, now_iso: str) -> Token | None:
    """The revoked record, or ``None`` when the token is already revoked or expired (no write)."""
    if TOKEN_LIFECYCLE.terminal(token.state):
        return None
    TOKEN_LIFECYCLE.check(token.state, TokenState.REVOKED)
    return replace(token, state=TokenState.REVOKED, revoked_at=now_iso)


def prune(token: Token, machine_ids: Collection[str]) -> Token | None:
    """The token without the bindings of these machines (their slots free again), or ``None``
    when none of them is bound (no write)."""
    kept = tuple(b for b in token.bindings if b.machine_id not in machine_ids)
    if len(kept) == len(token.bindings):
        return None
    return replace(token, bindings=kept)


def expire(token: Token, *, now: float) -> Token | None:
    """The expired record once the deadline has passed, else ``None`` (no write)."""
    if token.state not in (TokenState.UNUSED, TokenState.ENROLLED):
        return None
    if now < token.expires_at_epoch:
        return None
    TOKEN_LIFECYCLE.check(token.state, TokenState.EXPIRED)
    return replace(token, state=TokenState.EXPIRED)
