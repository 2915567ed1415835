"""Tokens in the record store on both backends of the seam (the contract tests' ``records``
fixture). Enrollment tokens (``swamp.bookkeeping.tokens``): minted, redeemed, revoked, pruned;
names that avoid every other machine's and token's; enrollments racing for the last places,
never more bound than the token allows. Server tokens (``swamp.bookkeeping.server_tokens``):
created, accepted, revoked."""

from __future__ import annotations

import hashlib

import pytest
import trio

from swamp.bookkeeping import tokens as book_module
from swamp.bookkeeping.server_tokens import ServerTokenBook
from swamp.bookkeeping.tokens import TokenBook
from swamp.domain.scopes import Scope
from swamp.domain.tokens import TokenState
from swamp.errors import AlreadyExists, FleetFull, NotFound, Rejected, Unauthorized
from tests.unit.test_store_contract import records  # noqa: F401 - the fixture


def digest(machine_id: str) -> str:
    return hashlib.sha256(machine_id.encode()).hexdigest()


async def test_mint_redeem_revoke(records):  # noqa: F811
    book = TokenBook(records)
    token, credential = await book.mint("t", duration_seconds=600)
    assert token.state is TokenState.UNUSED and credential.startswith("t.")
    with pytest.raises(AlreadyExists, match="already exists"):
        await book.mint("t", duration_seconds=600)
    first = await book.redeem(credential, machine_id="m1", labels={"zone": "a"})
    assert first.binding.worker_name == "t" and first.write is not None
    assert first.token.state is TokenState.ENROLLED and first.token.enrollments == 1
    again = await book.redeem(credential, machine_id="m1")  # the same machine: no write
    assert again.write is None and again.binding == first.binding
    stored = await book.get("t")
    assert stored is not None and stored.enrollments == 1
    assert await book.bindings("t") == [first.binding]
    assert await book.binding("t", "m1") == first.binding
    with pytest.raises(Rejected) as other:
        await book.redeem(credential, machine_id="m2")
    assert other.value.code == "allowance_exhausted"
    revoked, wrote = await book.revoke("t")
    assert wrote and revoked.state is TokenState.REVOKED
    assert (await book.revoke("t"))[1] is False  # already dead: nothing written
    with pytest.raises(Rejected) as refused:
        await book.redeem(credential, machine_id="m1")
    assert refused.value.code == "token_revoked"
    with pytest.raises(NotFound):
        await book.revoke("ghost")
    again_minted, _ = await book.mint("t", duration_seconds=600)  # dead: minted afresh
    assert again_minted.enrollments == 0 and await book.bindings("t") == []
    assert [t.name for t in await book.all()] == ["t"]


async def test_a_fleet_names_each_machine_around_the_names_others_use(records):  # noqa: F811
    book = TokenBook(records)
    _, fleet = await book.mint("pool", duration_seconds=600, max_enrollments=5)
    member = (await book.redeem(fleet, machine_id="m1")).binding.worker_name
    assert member == "pool-" + digest("m1")[:8]
    with pytest.raises(AlreadyExists, match="already a worker of token 'pool'"):
        await book.mint(member, duration_seconds=600)
    await book.mint("pool-" + digest("m2")[:8], duration_seconds=600)  # a token of that name
    named = (await book.redeem(fleet, machine_id="m2")).binding.worker_name
    assert named == "pool-" + digest("m2")[:9]
    assert await book.prune("pool", ["m1", "gone"])  # m1's place is free again
    pruned = await book.get("pool")
    assert pruned is not None and pruned.enrollments == 1
    assert [b.machine_id for b in await book.bindings("pool")] == ["m2"]
    assert not await book.prune("pool", ["gone"])


async def test_only_a_new_binding_looks_its_name_up(records, monkeypatch):  # noqa: F811
    """The rule is decided before any name is looked up: a refusal, or a machine already
    bound, asks nothing about names."""
    asked: list[str] = []
    taken = book_module._name_taken

    async def counted(ops, token_name, machine_id, candidate):
        asked.append(candidate)
        return await taken(ops, token_name, machine_id, candidate)

    monkeypatch.setattr(book_module, "_name_taken", counted)
    book = TokenBook(records)
    _, credential = await book.mint("pool", duration_seconds=600, max_enrollments=1 + 1)
    name, _ = credential.split(".")
    for wrong in (f"{name}.{'0' * 64}", f"ghost.{'0' * 64}"):
        with pytest.raises(Rejected):
            await book.redeem(wrong, machine_id="m1")
    assert asked == []
    await book.redeem(credential, machine_id="m1")
    assert asked == ["pool-" + digest("m1")[:8]]
    await book.redeem(credential, machine_id="m1")  # bound already: its stored name
    await book.redeem(credential, machine_id="m2")
    with pytest.raises(FleetFull):
        await book.redeem(credential, machine_id="m3")  # full
    await book.revoke("pool")
    with pytest.raises(Rejected):
        await book.redeem(credential, machine_id="m4")  # dead
    assert asked == ["pool-" + digest("m1")[:8], "pool-" + digest("m2")[:8]]


@pytest.mark.parametrize("allowance,machines", [(1, 6), (3, 10)])
async def test_racing_enrollments_never_take_more_places_than_there_are(
    records,  # noqa: F811
    allowance,
    machines,
):
    book = TokenBook(records)
    _, credential = await book.mint("race", duration_seconds=600, max_enrollments=allowance)
    outcomes: list[str] = []

    async def enroll(machine: str) -> None:
        try:
            await book.redeem(credential, machine_id=machine)
            outcomes.append("bound")
        except (Rejected, FleetFull) as exc:  # a fleet's worker waits for a place
            outcomes.append(exc.code)

    async with trio.open_nursery() as nursery:
        for i in range(machines):
            nursery.start_soon(enroll, f"m{i}")
    refusal = "allowance_exhausted" if allowance == 1 else "fleet_full"
    assert sorted(outcomes) == sorted(["bound"] * allowance + [refusal] * (machines - allowance))
    token = await book.get("race")
    assert token is not None and token.enrollments == allowance
    bindings = await book.bindings("race")
    assert len(bindings) == allowance == len({b.worker_name for b in bindings})


async def test_inline_bindings_of_older_records_move_to_records_of_their_own(records):  # noqa: F811
    book = TokenBook(records)
    token, _ = await book.mint("old", duration_seconds=600, max_enrollments=3)
    attributes = {
        **token.to_attributes(),
        "bindings": [{"machineId": "m1", "workerName": "old-1", "enrolledAt": token.created_at}],
        "enrollments": 1,
    }
    current = await records.latest(book_module._key("old"))
    assert current is not None
    await records.write(
        book_module._key("old"),
        attributes,
        policy=book_module.POLICY,
        expected_version=current.version,
    )
    assert await book.migrate() == 1
    assert await book.migrate() == 0  # nothing left inline
    migrated = await book.get("old")
    assert migrated is not None and migrated.legacy_bindings == () and migrated.enrollments == 1
    assert [b.worker_name for b in await book.bindings("old")] == ["old-1"]


async def test_server_tokens_are_created_accepted_and_revoked(records):  # noqa: F811
    book = ServerTokenBook(records)
    held, credential = await book.create("ops", Scope.READ)
    assert held.active and (await book.authenticate(credential)).scope is Scope.READ
    with pytest.raises(AlreadyExists, match="already exists"):
        await book.create("ops")
    for wrong in (f"ops.{'0' * 64}", f"ghost.{'0' * 64}"):  # the same words for both
        with pytest.raises(Unauthorized, match="its name is unknown or its secret"):
            await book.authenticate(wrong)
    revoked = await book.revoke("ops")
    assert not revoked.active and (await book.revoke("ops")).revoked_at == revoked.revoked_at
    with pytest.raises(Unauthorized, match="has been revoked"):
        await book.authenticate(credential)
    with pytest.raises(NotFound):
        await book.revoke("ghost")
    _, again = await book.create("ops")  # revoked: the name may be minted again
    assert (await book.authenticate(again)).scope is Scope.ADMIN
    assert [t.name for t in await book.all()] == ["ops"]
    stored = await book.get("ops")
    assert stored is not None and stored.active
