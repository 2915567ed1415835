"""Enrollment tokens as ``swamp/enrollment-token`` records (one item ``token`` per token name),
and the machines each admitted as ``swamp/token-binding`` records (instance: the token's name;
one item ``m-<sha256(machineId)>`` per machine).

Every enrollment question is a point lookup or a short range of a primary key — this machine's
binding, the few machines whose digest starts like its name, a token or a worker of that name —
so an enrollment costs the same whatever the size of the fleet.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Collection

from swamp.bookkeeping.records import decoded
from swamp.domain import tokens as rules
from swamp.domain.claims import ClaimPolicy
from swamp.domain.names import check_name
from swamp.domain.tokens import Binding, Redeemed, Token
from swamp.domain.worker_names import fleet_suffix, machine_digest, worker_name_for
from swamp.errors import AlreadyExists, NotFound
from swamp.models.builtin import ENROLLMENT_TOKEN, TOKEN_BINDING, WORKER
from swamp.store.datastore import Datastore, Key, Record, iso

TYPE = ENROLLMENT_TOKEN.type
BINDING_TYPE = TOKEN_BINDING.type
WORKER_TYPE = WORKER.type
POLICY = ENROLLMENT_TOKEN.resources[0].policy
BINDING_POLICY = TOKEN_BINDING.resources[0].policy


def _key(name: str) -> Key:
    return Key(TYPE, name, "token")


def _binding_key(token_name: str, machine_id: str) -> Key:
    return Key(BINDING_TYPE, token_name, "m-" + machine_digest(machine_id))


def _binding(record: Record) -> Binding:
    a = record.attributes
    return Binding(a["machineId"], a["workerName"], a["enrolledAt"])


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
        max_enrollments: int | rules.Unlimited = 1,
        claims: ClaimPolicy | None = None,
    ) -> tuple[Token, str]:
        """Returns the record and the credential ``<name>.<secret>`` (shown once, never stored).
        A name minted again starts with no machines."""
        check_name(name, what="token name")
        secret = secrets.token_hex(rules.SECRET_BYTES)
        now = self.clock()
        with self.store.transaction():
            owner = self.owner_of_worker_name(name, besides=name)
            if owner is not None:
                raise AlreadyExists(
                    f"the name {name!r} is already a worker of token {owner!r}; a "
                    "token must not share its name with another token's worker: "
                    "pick another name"
                )
            current = self.store.latest(_key(name))
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
            self.store.delete_instance(BINDING_TYPE, name)
            self.store.write(
                _key(name),
                token.to_attributes(),
                policy=POLICY,
                expected_version=current.version if current else 0,
            )
        return token, f"{name}.{secret}"

    def revoke(self, name: str) -> tuple[Token, bool]:
        """Returns the token and whether this call revoked it (``False``: it already was dead)."""
        now = self.clock()

        def decide(current):
            if current is None:
                raise NotFound(f"no token named {name!r}: see 'swamp worker token list'")
            revoked = rules.revoke(Token.from_attributes(current.attributes), now_iso=iso(now))
            return revoked.to_attributes() if revoked else None

        record, wrote = self.store.transition(_key(name), decide, policy=POLICY)
        if record is None:  # (decide refuses a missing token first)
            raise NotFound(f"no token named {name!r}: see 'swamp worker token list'")
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

        One write transaction: the token, this machine's binding, and for a new machine a name
        (:func:`worker_name_for`, avoiding every name another machine or token uses), its
        binding and the token's count — two racing enrollments cannot both take the last place.
        """
        name, secret = rules.split_credential(credential)
        now = self.clock()
        with self.store.transaction():
            current = self.store.latest(_key(name))
            token = Token.from_attributes(current.attributes) if current else None
            known = self.binding(name, machine_id) if token is not None else None
            decision = rules.redeem(
                token,
                known=known,
                name=name,
                secret=secret,
                machine_id=machine_id,
                now=now,
                now_iso=iso(now),
                name_new=lambda t: worker_name_for(
                    t, machine_id, lambda n: self._name_taken(t.name, machine_id, n)
                ),
                labels=labels,
                capacity=capacity,
            )
            if decision.write is not None:
                b = decision.binding
                self.store.write(
                    _binding_key(name, machine_id),
                    {**b.to_json(), "token": name},
                    policy=BINDING_POLICY,
                    expected_version=0,
                )
                self.store.write(
                    _key(name),
                    decision.write.to_attributes(),
                    policy=POLICY,
                    expected_version=current.version if current else 0,
                )
        return decision

    def binding(self, token_name: str, machine_id: str) -> Binding | None:
        record = self.store.latest(_binding_key(token_name, machine_id))
        return _binding(record) if record is not None else None

    def bindings(self, token_name: str) -> list[Binding]:
        """Every machine the token admitted, oldest first (for listings: this one reads them
        all)."""
        found = [
            _binding(r)
            for r in self.store.latest_of_type(BINDING_TYPE, model_name=token_name)
            if _is_binding(r.attributes)
        ]
        return sorted(found, key=lambda b: (b.enrolled_at, b.worker_name))

    def prune(self, name: str, machine_ids: Collection[str]) -> bool:
        """Release the bindings of these machines (their places free again); whether any was."""
        with self.store.transaction():
            current = self.store.latest(_key(name))
            if current is None:
                return False
            released = self.store.delete_items(_binding_key(name, m) for m in machine_ids)
            pruned = rules.prune(Token.from_attributes(current.attributes), released)
            if pruned is None:
                return False
            self.store.write(
                _key(name), pruned.to_attributes(), policy=POLICY, expected_version=current.version
            )
        return True

    def migrate(self) -> int:
        """Move the bindings older records hold inline into records of their own (at boot);
        how many tokens were rewritten."""
        moved = 0
        for token in self.all():
            if not token.legacy_bindings:
                continue
            with self.store.transaction():
                current = self.store.latest(_key(token.name))
                if current is None:  # deleted since it was listed
                    continue
                fresh = Token.from_attributes(current.attributes)
                for b in fresh.legacy_bindings:
                    if self.store.latest(_binding_key(fresh.name, b.machine_id)) is None:
                        self.store.write(
                            _binding_key(fresh.name, b.machine_id),
                            {**b.to_json(), "token": fresh.name},
                            policy=BINDING_POLICY,
                        )
                self.store.write(
                    _key(fresh.name),
                    fresh.migrated().to_attributes(),
                    policy=POLICY,
                    expected_version=current.version,
                )
            moved += 1
        return moved

    # -- names ------------------------------------------------------------------------------------

    def _name_taken(self, token_name: str, machine_id: str, candidate: str) -> bool:
        """Is ``candidate`` (``<token>-<hex>``) used by another machine of this token, by a
        single-machine token of that name, or by another token's worker? Point lookups and one
        short key range: the machines whose digest starts with the candidate's suffix."""
        suffix = candidate[len(token_name) + 1 :]
        for record in self.store.latest_with_prefix(BINDING_TYPE, token_name, "m-" + suffix):
            a = record.attributes
            if a.get("workerName") == candidate and a.get("machineId") != machine_id:
                return True
        return self.owner_of_worker_name(candidate, besides=token_name) is not None

    def owner_of_worker_name(self, name: str, *, besides: str) -> str | None:
        """The token other than ``besides`` that uses ``name`` for a worker: a single-machine
        token of that name (its worker carries it), another token's worker record, or another
        fleet's binding. ``None`` when the name is free."""
        if name != besides:
            other = self.get(name)
            if other is not None and other.max_enrollments == 1:
                return name
        worker = self.store.latest(Key(WORKER_TYPE, name, "state"))
        owner = worker.attributes.get("tokenName") if worker is not None else None
        if owner and owner != besides:
            return owner
        shaped = fleet_suffix(name)
        if shaped is not None and shaped[0] != besides:
            fleet, suffix = shaped
            for record in self.store.latest_with_prefix(BINDING_TYPE, fleet, "m-" + suffix):
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
