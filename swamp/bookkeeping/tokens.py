"""Enrollment tokens as ``swamp/enrollment-token`` records (one item ``token`` per token name),
and the machines each admitted as ``swamp/token-binding`` records (instance: the token's name;
one item ``m-<sha256(machineId)>`` per machine).

Every enrollment question is a point lookup or a short range of a primary key — this machine's
binding, the few machines whose digest starts like its name, a token or a worker of that name —
so an enrollment costs the same whatever the size of the fleet.
"""

from __future__ import annotations

import functools
import secrets
import time
from collections.abc import Callable, Collection

from swamp.bookkeeping.records import decoded
from swamp.domain import tokens as rules
from swamp.domain.claims import ClaimPolicy
from swamp.domain.names import check_name
from swamp.domain.tokens import Binding, Redeemed, Token
from swamp.domain.worker_names import fleet_suffix, is_fleet, machine_digest, name_candidates
from swamp.errors import AlreadyExists, NotFound
from swamp.models.builtin import ENROLLMENT_TOKEN, TOKEN_BINDING, WORKER
from swamp.store.datastore import Key, Record, iso
from swamp.store.records import Operations, Records

TYPE = ENROLLMENT_TOKEN.type
BINDING_TYPE = TOKEN_BINDING.type
WORKER_TYPE = WORKER.type
POLICY = ENROLLMENT_TOKEN.resources[0].policy
BINDING_POLICY = TOKEN_BINDING.resources[0].policy
# the name a new binding is decided with before its own is looked up (never stored)
_UNNAMED = ""


def _key(name: str) -> Key:
    return Key(TYPE, name, "token")


def _binding_key(token_name: str, machine_id: str) -> Key:
    return Key(BINDING_TYPE, token_name, "m-" + machine_digest(machine_id))


def _binding(record: Record) -> Binding:
    a = record.attributes
    return Binding(a["machineId"], a["workerName"], a["enrolledAt"])


class TokenBook:
    def __init__(self, db: Records, *, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.clock = clock

    async def get(self, name: str) -> Token | None:
        """The token, or ``None`` when there is none (or its record cannot be read)."""
        return await _get(self.db, name)

    async def all(self) -> list[Token]:
        return list(decoded(await self.db.latest_of_type(TYPE), _token))

    async def mint(
        self,
        name: str,
        *,
        duration_seconds: int,
        max_enrollments: int | rules.Unlimited = 1,
        claims: ClaimPolicy | None = None,
    ) -> tuple[Token, str]:
        """Returns the record and the credential ``<name>.<secret>`` (shown once, never stored).
        A name minted again starts with no machines."""
        check_name(name, what="token name")
        secret = secrets.token_hex(rules.SECRET_BYTES)
        now = self.clock()

        async def write(tx: Operations) -> Token:
            owner = await _owner_of_worker_name(tx, name, besides=name)
            if owner is not None:
                raise AlreadyExists(
                    f"the name {name!r} is already a worker of token {owner!r}; a "
                    "token must not share its name with another token's worker: "
                    "pick another name"
                )
            current = await tx.latest(_key(name))
            existing = Token.from_attributes(current.attributes) if current else None
            token = rules.mint(
                name,
                secret=secret,
                now=now,
                now_iso=iso(now),
                expires_iso=iso(now + duration_seconds),
                duration_seconds=duration_seconds,
                existing=existing,
                max_enrollments=max_enrollments,
                claims=claims,
            )
            await tx.delete_instance(BINDING_TYPE, name)
            await tx.write(
                _key(name),
                token.to_attributes(),
                policy=POLICY,
                expected_version=current.version if current else 0,
            )
            return token

        return await self.db.transact(write), f"{name}.{secret}"

    async def revoke(self, name: str) -> tuple[Token, bool]:
        """Returns the token and whether this call revoked it (``False``: it already was dead)."""
        now = self.clock()

        def decide(current):
            if current is None:
                raise NotFound(f"no token named {name!r}: see 'swamp worker token list'")
            revoked = rules.revoke(Token.from_attributes(current.attributes), now_iso=iso(now))
            return revoked.to_attributes() if revoked else None

        record, wrote = await self.db.transition(_key(name), decide, policy=POLICY)
        if record is None:  # (decide refuses a missing token first)
            raise NotFound(f"no token named {name!r}: see 'swamp worker token list'")
        return Token.from_attributes(record.attributes), wrote

    async def expire(self, name: str) -> bool:
        """Store ``expired`` once the deadline has passed; returns whether it wrote."""
        now = self.clock()

        def decide(current):
            if current is None:
                return None
            expired = rules.expire(Token.from_attributes(current.attributes), now=now)
            return expired.to_attributes() if expired else None

        _, wrote = await self.db.transition(_key(name), decide, policy=POLICY)
        return wrote

    async def redeem(
        self, credential: str, *, machine_id: str, labels: dict | None = None, capacity: int = 1
    ) -> Redeemed:
        """Admit a machine, or raise ``Rejected``. An unknown name reads and writes nothing else.

        One transaction: the token, this machine's binding, and for a new machine a name
        (:func:`~swamp.domain.worker_names.worker_name_for`, avoiding every name another
        machine or token uses), its binding and the token's count — two racing enrollments
        cannot both take the last place.

        The rule is decided first with no name: only when it binds a new machine are the names
        looked up (awaited, so not from inside the rule), and the rule decided again with the
        free one. A refusal, or a machine already bound, looks up no name.
        """
        name, secret = rules.split_credential(credential)
        now = self.clock()

        async def bind(tx: Operations) -> Redeemed:
            current = await tx.latest(_key(name))
            token = Token.from_attributes(current.attributes) if current else None
            known = await _binding_of(tx, name, machine_id) if token is not None else None

            def decide(worker_name: str) -> Redeemed:
                return rules.redeem(
                    token,
                    known=known,
                    name=name,
                    secret=secret,
                    machine_id=machine_id,
                    now=now,
                    now_iso=iso(now),
                    name_new=lambda t: worker_name,
                    labels=labels,
                    capacity=capacity,
                )

            decision = decide(_UNNAMED)
            if decision.write is None:
                return decision
            assert token is not None  # a decision that writes was made for a token
            decision = decide(await _new_worker_name(tx, token, machine_id))
            assert decision.write is not None  # the same decision, named
            await tx.write(
                _binding_key(name, machine_id),
                {**decision.binding.to_json(), "token": name},
                policy=BINDING_POLICY,
                expected_version=0,
            )
            await tx.write(
                _key(name),
                decision.write.to_attributes(),
                policy=POLICY,
                expected_version=current.version if current else 0,
            )
            return decision

        # a fleet's machines enroll at once: one after another on its token (each would
        # otherwise be refused on a server, its snapshot older than the count it writes) —
        # only those that hold its secret: a stranger's guess is refused without queueing
        stored = await self.db.latest(_key(name))
        holds = stored is not None and rules.secret_matches(
            secret, str(stored.attributes.get("secretHash", ""))
        )
        return await self.db.transact(bind, queue_on=f"swamp token {name}" if holds else None)

    async def binding(self, token_name: str, machine_id: str) -> Binding | None:
        return await _binding_of(self.db, token_name, machine_id)

    async def bindings(self, token_name: str) -> list[Binding]:
        """Every machine the token admitted, oldest first (for listings: this one reads them
        all)."""
        found = [
            _binding(r)
            for r in await self.db.latest_of_type(BINDING_TYPE, model_name=token_name)
            if _is_binding(r.attributes)
        ]
        return sorted(found, key=lambda b: (b.enrolled_at, b.worker_name))

    async def prune(self, name: str, machine_ids: Collection[str]) -> bool:
        """Release the bindings of these machines (their places free again); whether any was."""
        keys = [_binding_key(name, m) for m in machine_ids]

        async def release(tx: Operations) -> bool:
            current = await tx.latest(_key(name))
            if current is None:
                return False
            released = await tx.delete_items(keys)
            pruned = rules.prune(Token.from_attributes(current.attributes), released)
            if pruned is None:
                return False
            await tx.write(
                _key(name), pruned.to_attributes(), policy=POLICY, expected_version=current.version
            )
            return True

        return await self.db.transact(release)

    async def migrate(self) -> int:
        """Move the bindings older records hold inline into records of their own (at boot);
        how many tokens were rewritten."""
        moved = 0
        for token in await self.all():
            if not token.legacy_bindings:
                continue
            move = functools.partial(_move_inline_bindings, name=token.name)
            if await self.db.transact(move):
                moved += 1
        return moved


async def _move_inline_bindings(tx: Operations, *, name: str) -> bool:
    """One token's inline bindings as records of their own; whether it still was there."""
    current = await tx.latest(_key(name))
    if current is None:  # deleted since it was listed
        return False
    fresh = Token.from_attributes(current.attributes)
    for b in fresh.legacy_bindings:
        if await tx.latest(_binding_key(fresh.name, b.machine_id)) is None:
            await tx.write(
                _binding_key(fresh.name, b.machine_id),
                {**b.to_json(), "token": fresh.name},
                policy=BINDING_POLICY,
            )
    await tx.write(
        _key(fresh.name),
        fresh.migrated().to_attributes(),
        policy=POLICY,
        expected_version=current.version,
    )
    return True


# -- reads, in a transaction or on their own ------------------------------------------------------


async def _get(ops: Operations, name: str) -> Token | None:
    record = await ops.latest(_key(name))
    found = list(decoded([record] if record else [], _token))
    return found[0] if found else None


async def _binding_of(ops: Operations, token_name: str, machine_id: str) -> Binding | None:
    record = await ops.latest(_binding_key(token_name, machine_id))
    return _binding(record) if record is not None else None


# -- names ----------------------------------------------------------------------------------------


async def _new_worker_name(tx: Operations, token: Token, machine_id: str) -> str:
    """:func:`~swamp.domain.worker_names.worker_name_for`, its questions awaited: the same
    names in the same order, the first free one."""
    if not is_fleet(token):
        return token.name  # named after its token: nothing to ask
    for candidate in name_candidates(token, machine_id):
        if not await _name_taken(tx, token.name, machine_id, candidate):
            return candidate
    # 64 hex digits of SHA-256 equal means the same machine id: unreachable for two machines.
    raise AssertionError(f"no free name for machine {machine_id!r} under token {token.name!r}")


async def _name_taken(ops: Operations, token_name: str, machine_id: str, candidate: str) -> bool:
    """Is ``candidate`` (``<token>-<hex>``) used by another machine of this token, by a
    single-machine token of that name, or by another token's worker? Point lookups and one
    short key range: the machines whose digest starts with the candidate's suffix."""
    suffix = candidate[len(token_name) + 1 :]
    for record in await ops.latest_with_prefix(BINDING_TYPE, token_name, "m-" + suffix):
        a = record.attributes
        if a.get("workerName") == candidate and a.get("machineId") != machine_id:
            return True
    return await _owner_of_worker_name(ops, candidate, besides=token_name) is not None


async def _owner_of_worker_name(ops: Operations, name: str, *, besides: str) -> str | None:
    """The token other than ``besides`` that uses ``name`` for a worker: a single-machine
    token of that name (its worker carries it), another token's worker record, or another
    fleet's binding. ``None`` when the name is free."""
    if name != besides:
        other = await _get(ops, name)
        if other is not None and other.max_enrollments == 1:
            return name
    worker = await ops.latest(Key(WORKER_TYPE, name, "state"))
    owner = worker.attributes.get("tokenName") if worker is not None else None
    if owner and owner != besides:
        return owner
    shaped = fleet_suffix(name)
    if shaped is not None and shaped[0] != besides:
        fleet, suffix = shaped
        for record in await ops.latest_with_prefix(BINDING_TYPE, fleet, "m-" + suffix):
            if record.attributes.get("workerName") == name:
                return fleet
    return None


def _is_binding(attrs: dict) -> bool:
    return all(isinstance(attrs.get(k), str) for k in ("machineId", "workerName", "enrolledAt"))


def _token(record) -> Token:
    return Token.from_attributes(record.attributes)


def token_item(token: Token, now: float, bindings: list[Binding] | None = None) -> dict:
    """The listing shape shared by the CLI (straight to the repo) and the server."""
    bindings = list(token.legacy_bindings) + list(bindings or [])
    return {
        "name": token.name,
        "state": token.effective_state(now).value,
        "storedState": token.state.value,
        "createdAt": token.created_at,
        "expiresAt": token.expires_at,
        "maxEnrollments": token.max_enrollments,
        "enrollments": token.enrollments,
        "bindings": [b.to_json() for b in bindings],
        **({"revokedAt": token.revoked_at} if token.revoked_at else {}),
        **token.claims.to_attributes(),
    }
