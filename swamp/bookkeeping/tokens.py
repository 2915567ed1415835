"""Enrollment tokens as ``swamp/enrollment-token`` records (one item ``token`` per token name)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Collection

from swamp.bookkeeping.records import decoded, has_fields
from swamp.domain import tokens as rules
from swamp.domain.claims import ClaimPolicy
from swamp.domain.names import check_name
from swamp.domain.tokens import Redeemed, Token
from swamp.domain.worker_names import worker_name_for
from swamp.errors import AlreadyExists, NotFound
from swamp.models.builtin import ENROLLMENT_TOKEN, WORKER
from swamp.store.datastore import Datastore, Key, iso

TYPE = ENROLLMENT_TOKEN.type
WORKER_TYPE = WORKER.type
POLICY = ENROLLMENT_TOKEN.resources[0].policy


def _key(name: str) -> Key:
    return Key(TYPE, name, "token")


class TokenBook:
    def __init__(self, store: Datastore, *, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock

    def get(self, name: str) -> Token | None:
        """The token, or ``None`` when there is none (or its record cannot be read)."""
        record = self.store.latest(_key(name))
        found = list(decoded([record] if record else [], _token))
        return found[0] if found else None

    def all(self) -> list[Token]:
        return list(decoded(self.store.latest_of_type(TYPE), _token))

    def mint(
        self,
        name: str,
        *,
        duration_seconds: int,
        max_enrollments: int | str = 1,
        claims: ClaimPolicy | None = None,
    ) -> tuple[Token, str]:
        """Returns the record and the credential ``<name>.<secret>`` (shown once, never stored)."""
        check_name(name, what="token name")
        owner = self.worker_names_of_others(name).get(name)
        if owner is not None:
            raise AlreadyExists(
                f"the name {name!r} is already a worker of token {owner!r}; a "
                "token must not share its name with another token's worker: "
                "pick another name"
            )
        secret = secrets.token_hex(rules.SECRET_BYTES)
        now = self.clock()

        def decide(current):
            existing = Token.from_attributes(current.attributes) if current else None
            return rules.mint(
                name,
                secret=secret,
                now=now,
                now_iso=iso(now),
                expires_iso=iso(now + duration_seconds),
                duration_seconds=duration_seconds,
                existing=existing,
                max_enrollments=max_enrollments,
                claims=claims,
            ).to_attributes()

        record, _ = self.store.transition(_key(name), decide, policy=POLICY)
        return Token.from_attributes(record.attributes), f"{name}.{secret}"

    def revoke(self, name: str) -> tuple[Token, bool]:
        """Returns the token and whether this call revoked it (``False``: it already was dead)."""
        now = self.clock()

        def decide(current):
            if current is None:
                raise NotFound(f"no token named {name!r}: see 'swamp worker token list'")
            revoked = rules.revoke(Token.from_attributes(current.attributes), now_iso=iso(now))
            return revoked.to_attributes() if revoked else None

        record, wrote = self.store.transition(_key(name), decide, policy=POLICY)
        return Token.from_attributes(record.attributes), wrote

    def expire(self, name: str) -> bool:
        """Store ``expired`` once the deadline has passed; returns whether it wrote."""
        now = self.clock()

        def decide(current):
            if current is None:
                return None
            expired = rules.expire(Token.from_attributes(current.attributes), now=now)
            return expired.to_attributes() if expired else None

        _, wrote = self.store.transition(_key(name), decide, policy=POLICY)
        return wrote

    def redeem(
        self, credential: str, *, machine_id: str, labels: dict | None = None, capacity: int = 1
    ) -> Redeemed:
        """Admit a machine, or raise ``Rejected``. An unknown name reads and writes nothing else.

        A new binding is named by :func:`worker_name_for`, avoiding every name another machine
        or another token already uses.
        """
        name, secret = rules.split_credential(credential)
        now = self.clock()
        outcome: list[Redeemed] = []

        def name_new(token: Token) -> str:
            return worker_name_for(token, machine_id, self.worker_names_of_others(token.name))

        def decide(current):
            token = Token.from_attributes(current.attributes) if current else None
            decision = rules.redeem(
                token,
                name=name,
                secret=secret,
                machine_id=machine_id,
                now=now,
                now_iso=iso(now),
                name_new=name_new,
                labels=labels,
                capacity=capacity,
            )
            outcome[:] = [decision]
            return decision.write.to_attributes() if decision.write else None

        self.store.transition(_key(name), decide, policy=POLICY)
        return outcome[0]

    def prune(self, name: str, machine_ids: Collection[str]) -> bool:
        """Drop the bindings of these machines from a token (a compare-and-swap transition)."""

        def decide(current):
            if current is None:
                return None
            pruned = rules.prune(Token.from_attributes(current.attributes), machine_ids)
            return pruned.to_attributes() if pruned else None

        _, wrote = self.store.transition(_key(name), decide, policy=POLICY)
        return wrote

    def worker_names_of_others(self, token_name: str) -> dict[str, str]:
        """Every worker name in use, or reserved, by tokens other than ``token_name``, mapped to
        the token that owns it: other tokens' bindings and workers, and the names of other
        single-machine tokens (their worker will carry the token's name)."""
        names: dict[str, str] = {}
        for token in self.all():
            if token.name == token_name:
                continue
            if token.max_enrollments == 1:
                names[token.name] = token.name
            for binding in token.bindings:
                names[binding.worker_name] = token.name
        for attrs in decoded(self.store.latest_of_type(WORKER_TYPE), has_fields("name")):
            owner = attrs.get("tokenName")
            if owner and owner != token_name:
                names[attrs["name"]] = owner
        return names


def _token(record) -> Token:
    return Token.from_attributes(record.attributes)


def token_item(token: Token, now: float) -> dict:
    """The listing shape shared by the CLI (straight to the repo) and the server."""
    return {
        "name": token.name,
        "state": token.effective_state(now).value,
        "storedState": token.state.value,
        "createdAt": token.created_at,
        "expiresAt": token.expires_at,
        "maxEnrollments": token.max_enrollments,
        "enrollments": len(token.bindings),
        "bindings": [b.to_json() for b in token.bindings],
        **({"revokedAt": token.revoked_at} if token.revoked_at else {}),
        **token.claims.to_attributes(),
    }
