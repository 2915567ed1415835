"""Admin server tokens (``swamp/server-token``): ``<name>.<secret>``, stored only as a hash,
each with its scope (``swamp.domain.scopes``: ``metrics``, ``read`` or ``admin``); read and
written through the record store's seam (``swamp.store.records``)."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

from swamp.bookkeeping.records import decoded, has_fields
from swamp.domain.names import check_name
from swamp.domain.scopes import DEFAULT, Scope, stored_scope
from swamp.domain.tokens import hash_secret, secret_matches, split_credential
from swamp.errors import AlreadyExists, NotFound, Rejected, Unauthorized
from swamp.models.builtin import SERVER_TOKEN
from swamp.store.datastore import Key, Record, iso
from swamp.store.records import Records

TYPE = SERVER_TOKEN.type
_NO_SUCH_TOKEN_HASH = hash_secret("no such token")
POLICY = SERVER_TOKEN.resources[0].policy
_FIELDS = has_fields("name", "state", "createdAt")


@dataclass(frozen=True)
class ServerToken:
    """A server token as stored: its secret only as a hash, and the scope it holds (one minted
    before scopes holds ``admin``; a scope this version does not know, the narrowest)."""

    name: str
    state: str  # active | revoked
    created_at: str
    scope: Scope
    secret_hash: str = ""
    revoked_at: str | None = None

    @property
    def active(self) -> bool:
        return self.state == "active"

    @classmethod
    def from_record(cls, record: Record) -> ServerToken:
        attrs = _FIELDS(record)
        revoked_at = attrs.get("revokedAt")
        return cls(
            name=attrs["name"],
            state=attrs["state"],
            created_at=attrs["createdAt"],
            scope=stored_scope(attrs),
            secret_hash=str(attrs.get("secretHash", "")),
            revoked_at=revoked_at if isinstance(revoked_at, str) else None,
        )


class ServerTokenBook:
    def __init__(self, db: Records, *, clock=time.time) -> None:
        self.db = db
        self.clock = clock

    async def create(self, name: str, scope: Scope = DEFAULT) -> tuple[ServerToken, str]:
        check_name(name, what="server token name")
        secret = secrets.token_hex(32)
        now = iso(self.clock())

        def decide(current):
            if current is not None and current.attributes["state"] == "active":
                raise AlreadyExists(
                    f"server token {name!r} already exists: revoke it first or pick another name"
                )
            return {
                "name": name,
                "state": "active",
                "createdAt": now,
                "scope": scope.value,
                "secretHash": hash_secret(secret),
            }

        record, _ = await self.db.transition(Key(TYPE, name, "token"), decide, policy=POLICY)
        assert record is not None  # decide always writes
        return ServerToken.from_record(record), f"{name}.{secret}"

    async def revoke(self, name: str) -> ServerToken:
        now = iso(self.clock())

        def decide(current):
            if current is None:
                raise NotFound(f"no server token named {name!r}")
            if current.attributes["state"] == "revoked":
                return None
            return dict(current.attributes, state="revoked", revokedAt=now)

        record, _ = await self.db.transition(Key(TYPE, name, "token"), decide, policy=POLICY)
        if record is None:  # (decide refuses a missing token first)
            raise NotFound(f"no server token named {name!r}")
        return ServerToken.from_record(record)

    async def all(self) -> list[ServerToken]:
        return list(decoded(await self.db.latest_of_type(TYPE), ServerToken.from_record))

    async def get(self, name: str) -> ServerToken | None:
        record = await self.db.latest(Key(TYPE, name, "token"))
        return ServerToken.from_record(record) if record else None

    async def authenticate(self, credential: str) -> ServerToken:
        """The token if the credential is a live server token, else ``Unauthorized``.

        An unknown name and a wrong secret get the same answer (and both cost a hash
        comparison); only whoever holds the secret is told that the token was revoked.
        """
        try:
            name, secret = split_credential(credential)
        except Rejected:
            raise Unauthorized(
                "the server token must have the form <name>.<secret> (as printed "
                "by 'swamp server token create')"
            ) from None
        record = await self.db.latest(Key(TYPE, name, "token"))
        stored = record.attributes["secretHash"] if record else _NO_SUCH_TOKEN_HASH
        if not secret_matches(secret, stored) or record is None:
            raise Unauthorized(
                f"the server token {name!r} was not accepted: its name is unknown "
                "or its secret does not match"
            )
        token = ServerToken.from_record(record)
        if not token.active:
            raise Unauthorized(f"the server token {name!r} has been revoked")
        return token
