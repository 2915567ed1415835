"""The record store's contract, held to every backend behind ``swamp.store.records``: SQLite
(the default) and PostgreSQL (``tests.postgres`` starts a server; marked ``postgres``). The
same versions, the same compare-and-swap, the same transactions, the same queries."""

from __future__ import annotations

import pytest
import trio

from swamp.domain.query import parse
from swamp.domain.read_scope import ReadScope
from swamp.errors import Conflict
from swamp.store.datastore import Datastore, Key, SpecPolicy
from swamp.store.records import Records, SqliteRecords

KEY = Key("test/model", "inst", "item")
ITEM = SpecPolicy("item")


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgres", marks=[pytest.mark.postgres, pytest.mark.integration]),
    ]
)
async def records(request, tmp_path):
    if request.param == "sqlite":
        store: Records = SqliteRecords(Datastore(tmp_path / "swamp.db", orchestrator=True))
    else:
        from swamp.store.pg_store import PgStore

        store = await PgStore.open(request.getfixturevalue("pg_url"))
    try:
        yield store
    finally:
        await store.aclose()


async def test_writes_are_versions_and_latest_is_the_newest(records):
    for i in range(3):
        await records.write(KEY, {"i": i}, policy=ITEM)
    assert await records.versions(KEY) == [1, 2, 3]
    latest = await records.latest(KEY)
    assert latest is not None and latest.attributes == {"i": 2} and latest.version == 3
    assert await records.latest(Key("test/model", "inst", "other")) is None


async def test_content_and_attributes_round_trip(records):
    content = bytes(range(256)) * 64
    attributes = {"text": "naïve ✓ \u0000 end", "n": 2**62, "f": 0.5, "list": [1, None, True]}
    written = await records.write(KEY, attributes, policy=ITEM, content=content)
    latest = await records.latest(KEY)
    assert latest is not None and written.version == latest.version == 1
    assert latest.content == content and latest.attributes == attributes
    assert latest.created_at == written.created_at and latest.spec == "item"
    await records.write(KEY, {}, policy=ITEM)
    again = await records.latest(KEY)
    assert again is not None and again.content is None


async def test_garbage_collection_keeps_n_versions_at_write_time(records):
    policy = SpecPolicy("item", garbage_collection=2)
    for i in range(5):
        await records.write(KEY, {"i": i}, policy=policy)
    assert await records.versions(KEY) == [4, 5]


async def test_a_single_version_spec_is_replaced_in_place_by_compare_and_swap(records):
    policy = SpecPolicy("item", garbage_collection=1)
    first = await records.write(KEY, {"i": 0}, policy=policy, expected_version=0)
    second = await records.write(KEY, {"i": 1}, policy=policy, expected_version=first.version)
    assert await records.versions(KEY) == [2] and second.version == 2
    with pytest.raises(Conflict):
        await records.write(KEY, {"i": 2}, policy=policy, expected_version=first.version)
    latest = await records.latest(KEY)
    assert latest is not None and latest.attributes == {"i": 1}


async def test_compare_and_swap_refuses_a_moved_latest_and_fresh_refuses_a_clash(records):
    await records.write(KEY, {"i": 0}, policy=ITEM, expected_version=0)
    with pytest.raises(Conflict):
        await records.write(KEY, {"i": 1}, policy=ITEM, expected_version=0)
    await records.write(KEY, {"i": 1}, policy=ITEM, expected_version=1)
    with pytest.raises(Conflict):
        await records.write(KEY, {"i": 2}, policy=ITEM, expected_version=1)
    fresh = Key("test/model", "inst", "fresh")
    assert (await records.write(fresh, {}, policy=ITEM, fresh=True)).version == 1
    with pytest.raises(Conflict):
        await records.write(fresh, {}, policy=ITEM, fresh=True)
    assert await records.versions(KEY) == [1, 2]


async def test_racing_transitions_never_lose_or_double_an_update(records):
    """Many tasks add one to a counter by read-decide-CAS: every addition lands once."""

    def add_one(current):
        return {"n": (current.attributes["n"] if current else 0) + 1}

    async with trio.open_nursery() as nursery:
        for _ in range(40):
            nursery.start_soon(lambda: records.transition(KEY, add_one, policy=ITEM))
    latest = await records.latest(KEY)
    assert latest is not None and latest.attributes == {"n": 40} and latest.version == 40


async def test_transition_writes_nothing_when_decide_says_none_or_raises(records):
    record, wrote = await records.transition(KEY, lambda current: None, policy=ITEM)
    assert (record, wrote) == (None, False)

    def refuse(current):
        raise ValueError("no")

    with pytest.raises(ValueError):
        await records.transition(KEY, refuse, policy=ITEM)
    assert await records.versions(KEY) == []


async def test_a_transaction_commits_all_or_nothing(records):
    other = Key("test/model", "inst", "other")

    async def both(tx):
        await tx.write(KEY, {"i": 1}, policy=ITEM)
        await tx.write(other, {"i": 1}, policy=ITEM)
        inside = await tx.latest(KEY)
        assert inside is not None and inside.attributes == {"i": 1}
        return "done"

    assert await records.transact(both) == "done"

    async def changed_my_mind(tx):
        await tx.write(KEY, {"i": 2}, policy=ITEM)
        await tx.delete_items([other])
        raise RuntimeError("changed my mind")

    with pytest.raises(RuntimeError):
        await records.transact(changed_my_mind)
    assert await records.versions(KEY) == [1] and await records.versions(other) == [1]


async def test_another_task_never_joins_an_open_transaction(records):
    """Its write waits until the transaction ends: rolled back, the transaction takes nothing
    of the other task's with it."""
    other = Key("test/model", "inst", "other")
    opened, written = trio.Event(), trio.Event()

    async def outsider() -> None:
        await opened.wait()
        await records.write(other, {"by": "outsider"}, policy=ITEM)
        written.set()

    async def rolled_back(tx):
        await tx.write(KEY, {"i": 1}, policy=ITEM)
        opened.set()
        await trio.sleep(0.05)  # the outsider runs meanwhile
        raise RuntimeError("rolled back")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(outsider)
        with pytest.raises(RuntimeError):
            await records.transact(rolled_back)
        await written.wait()
    assert await records.versions(KEY) == [] and await records.versions(other) == [1]


async def test_reads_of_a_type_an_instance_a_prefix_and_a_range(records):
    for model_name in ("b", "a"):
        for name in ("run-1/0000001", "run-1/0000002", "run-2/0000001", "x"):
            await records.write(Key("t/steps", model_name, name), {"n": name}, policy=ITEM)
    await records.write(Key("t/steps", "a", "x"), {"n": "x2"}, policy=ITEM)
    every = await records.latest_of_type("t/steps")
    assert [(r.model_name, r.name) for r in every][:2] == [
        ("a", "run-1/0000001"),
        ("a", "run-1/0000002"),
    ]
    assert len(every) == 8
    assert [r.attributes["n"] for r in await records.latest_of_type("t/steps", model_name="a")][
        -1
    ] == "x2"
    assert await records.model_names("t/steps") == ["a", "b"]
    prefixed = await records.latest_with_prefix("t/steps", "a", "run-1/")
    assert [r.name for r in prefixed] == ["run-1/0000001", "run-1/0000002"]
    ranged = await records.latest_in_range("t/steps", "b", "run-1/0000002", "x", limit=5)
    assert [r.name for r in ranged] == ["run-1/0000002", "run-2/0000001"]


async def test_names_sort_by_their_bytes_not_a_locale(records):
    """A range of the key and the order of a listing are by code point, on every backend:
    'Z' before 'a', 'é' after 'z' (a locale's collation would interleave them)."""
    for name in ("a", "Z", "é", "z", "_", "-"):
        await records.write(Key("t/m", "i", name), {}, policy=ITEM)
    listed = [r.name for r in await records.latest_of_type("t/m")]
    assert listed == sorted(listed) == ["-", "Z", "_", "a", "z", "é"]


async def test_queries_latest_all_versions_scope_and_newest_first(records):
    for i in range(3):
        await records.write(Key("app/thing", "one", f"n{i}"), {"i": i}, policy=ITEM)
    await records.write(Key("app/thing", "one", "n0"), {"i": 10}, policy=ITEM)
    await records.write(Key("app/other", "two", "m"), {"i": 5}, policy=ITEM)
    await records.write(Key("swamp/worker", "w1", "status"), {"i": 7}, policy=ITEM)
    found = await records.query(parse('modelType == "app/thing"'))
    assert sorted(r.attributes["i"] for r in found) == [1, 2, 10]
    assert all(r.content is None for r in found)  # queries read no content
    assert len(await records.query(parse('modelType == "app/thing"'), all_versions=True)) == 4
    big = await records.query(parse("attributes.i >= 5"))
    assert sorted(r.attributes["i"] for r in big) == [5, 7, 10]
    assert len(await records.query(parse("attributes.i >= 0"), limit=2)) == 2
    scope = ReadScope.of("app/thing", "one", type_patterns=["app/*"])
    scoped = await records.query(parse("attributes.i >= 0"), scope=scope)
    assert sorted(r.model_type for r in scoped) == [
        "app/other",
        "app/thing",
        "app/thing",
        "app/thing",
    ]
    newest = await records.query(parse('modelType == "app/thing"'), newest_first=True, limit=1)
    assert [r.attributes["i"] for r in newest] == [10]


async def test_deletes_of_items_a_prefix_and_an_instance(records):
    for i in range(25):
        await records.write(Key("t/s", "run", f"r1/{i:03d}"), {}, policy=ITEM)
        await records.write(Key("t/s", "run", f"r2/{i:03d}"), {}, policy=ITEM)
    assert await records.delete_with_prefix("t/s", "run", "r1/", batch=7) == 25
    assert len(await records.latest_of_type("t/s")) == 25
    assert await records.delete_items([Key("t/s", "run", "r2/000"), Key("t/s", "run", "none")]) == 1

    async def instance(tx):
        return await tx.delete_instance("t/s", "run")

    assert await records.transact(instance) == 24
    assert await records.latest_of_type("t/s") == []


async def test_lapsed_lifetimes_are_collected(records):
    lapsing = SpecPolicy("item", lifetime="1s")
    await records.write(KEY, {}, policy=lapsing, at=1000.0)
    kept = Key("test/model", "inst", "kept")
    await records.write(kept, {}, policy=ITEM, at=1000.0)
    assert await records.collect_garbage(batch=1) == 1
    assert await records.versions(KEY) == [] and await records.versions(kept) == [1]


# -- what a first review found different on PostgreSQL ----------------------------------------

ONE = SpecPolicy("item", garbage_collection=1)


def _is_pg(store) -> bool:
    return type(store).__name__ == "PgStore"


async def test_a_read_in_a_transaction_holds_until_its_writes_land(records):
    """Read, then write what was read plus one, in two transactions at once: neither loses
    the other's update (serializable: PostgreSQL refuses one, and it runs again)."""

    async def add_one(tx) -> None:
        current = await tx.latest(KEY)
        n = current.attributes["n"] if current else 0
        await trio.sleep(0.05)  # any await: the other runs meanwhile
        await tx.write(KEY, {"n": n + 1}, policy=ITEM)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(records.transact, add_one)
        nursery.start_soon(records.transact, add_one)
    latest = await records.latest(KEY)
    assert latest is not None and latest.attributes == {"n": 2}, latest
    if _is_pg(records):
        assert records.retried >= 1  # one was refused and run again


async def test_transactions_writing_two_keys_in_opposite_orders_both_land(records):
    a, b = Key("t/m", "i", "a"), Key("t/m", "i", "b")
    await records.write(a, {}, policy=ITEM)
    await records.write(b, {}, policy=ITEM)
    both = trio.Event()
    started = [0]

    def crossing(first, second):
        async def body(tx):
            await tx.write(first, {}, policy=ITEM)
            started[0] += 1
            if started[0] == 2:
                both.set()
            with trio.move_on_after(0.3):
                await both.wait()
            await tx.write(second, {}, policy=ITEM)

        return body

    async with trio.open_nursery() as nursery:
        nursery.start_soon(records.transact, crossing(a, b))
        nursery.start_soon(records.transact, crossing(b, a))
    assert await records.versions(a) == [1, 2, 3] and await records.versions(b) == [1, 2, 3]


async def test_a_stale_in_place_swap_is_a_conflict_and_a_transaction_goes_on(records):
    other = Key("test/model", "inst", "other")
    await records.write(KEY, {"i": 1}, policy=ITEM)
    await records.write(KEY, {"i": 2}, policy=ITEM)  # versions 1, 2 (as if gc were lowered)
    with pytest.raises(Conflict):
        await records.write(KEY, {"i": 3}, policy=ONE, expected_version=1)

    async def body(tx):
        with pytest.raises(Conflict):
            await tx.write(KEY, {"i": 3}, policy=ONE, expected_version=1)
        with pytest.raises(Conflict):
            await tx.write(KEY, {}, policy=ITEM, expected_version=0)
        with pytest.raises(Conflict):
            await tx.write(KEY, {}, policy=ITEM, fresh=True)
        await tx.write(other, {"ok": True}, policy=ITEM)

    await records.transact(body)
    assert await records.versions(other) == [1] and await records.versions(KEY) == [1, 2]


async def test_a_transition_racing_a_plain_write_of_a_single_version_key(records):
    await records.write(KEY, {"n": 0}, policy=ONE, expected_version=0)
    stale = await records.latest(KEY)
    await records.write(KEY, {"n": 100}, policy=ITEM)  # a plain write caught before its trim
    written, wrote = await records.transition(
        KEY, lambda c: {"n": (c.attributes["n"] if c else 0) + 1}, policy=ONE, current=stale
    )
    assert wrote and written is not None and written.attributes == {"n": 101}


async def test_deleting_items_is_all_or_nothing(records):
    a, b = Key("t/m", "i", "a"), Key("t/m", "i", "b")
    await records.write(a, {}, policy=ITEM)
    await records.write(b, {}, policy=ITEM)

    def keys():
        yield a
        raise RuntimeError("the caller failed half-way")

    with pytest.raises(RuntimeError):
        await records.delete_items(keys())
    assert await records.versions(a) == [1]


async def test_the_store_inside_its_own_transaction_is_refused_and_a_handle_ends_with_it(records):
    kept = []

    async def body(tx):
        kept.append(tx)
        await tx.write(KEY, {"i": 1}, policy=ITEM, expected_version=0)
        with trio.fail_after(5):  # never a wait on its own locks
            with pytest.raises(RuntimeError, match="own transaction"):
                await records.write(KEY, {"i": 2}, policy=ITEM)

    await records.transact(body)
    with pytest.raises(RuntimeError, match="has ended"):
        await kept[0].latest(KEY)
    assert await records.versions(KEY) == [1]


@pytest.mark.parametrize("change", ["deleted", "inserted"])
async def test_a_query_reads_each_record_once_whatever_is_written_between_its_pages(
    records, monkeypatch, change
):
    """A query larger than a page reads it page by page (PostgreSQL): a row deleted or one
    inserted before where the next page starts neither hides a row that was there all along
    nor shows one twice."""
    from swamp.store import pg_store

    for name in ["b", "c", "d", "e", "f"]:
        await records.write(Key("t/q", "i", name), {}, policy=ITEM)
    if _is_pg(records):
        monkeypatch.setattr(pg_store, "QUERY_PAGE", 2)
        real = records._on_any
        pages: list[str] = []

        async def on_any(sql, params=()):
            result = await real(sql, params)
            if sql.startswith("SELECT") and "LIMIT" in sql:
                pages.append(sql)
                if len(pages) == 1 and change == "deleted":
                    await real("DELETE FROM data WHERE model_type='t/q' AND name='b'", ())
                elif len(pages) == 1:
                    await records.write(Key("t/q", "i", "a"), {}, policy=ITEM)
            return result

        monkeypatch.setattr(records, "_on_any", on_any)
    found = [r.name for r in await records.query(parse('modelType == "t/q"'))]
    assert len(found) == len(set(found)) and {"c", "d", "e", "f"} <= set(found), found
    if _is_pg(records):
        assert len(pages) >= 3  # it did read in pages


async def test_a_trim_that_fails_does_not_fail_the_write_that_landed(records, monkeypatch):
    """PostgreSQL trims in a statement after the write: if that fails, the write stands (the
    next write trims), as on SQLite — a caller told it failed would write it twice."""
    if not _is_pg(records):
        return  # SQLite: one connection, nothing to inject between the two
    from swamp.errors import ConnectionLost

    real = records._execute

    async def execute(sql, params=()):
        if sql.startswith("DELETE") and "version<=" in sql:
            raise ConnectionLost("the connection to PostgreSQL was lost: (injected)")
        return await real(sql, params)

    monkeypatch.setattr(records, "_execute", execute)
    await records.write(KEY, {"i": 0}, policy=ONE)
    written = await records.write(KEY, {"i": 1}, policy=ONE)
    assert written.version == 2 and (await records.versions(KEY)) == [1, 2]


async def test_ad_hoc_runs_are_found_and_forgotten_on_both(records):
    """The GC's scan for ad-hoc runs (``run-`` and 16 hex digits, never a bookkeeping type's
    instance named so) and their data forgotten past the retention, whichever the backend."""
    import time

    from swamp.models.builtin import INTERNAL_TYPES
    from swamp.orchestrator.server import forget_adhoc_runs
    from swamp.orchestrator.storage import scan_adhoc_runs
    from swamp.store.records import SqliteRecords

    for model_type, name in (
        ("command/shell", "run-0123456789abcdef"),
        ("command/shell", "named"),
        ("command/shell", "run-not-hex-at-all"),
        ("swamp/worker", "run-0123456789abcdef"),
    ):
        await records.write(Key(model_type, name, "result"), {}, policy=ITEM)
    if isinstance(records, SqliteRecords):
        runs = await trio.to_thread.run_sync(scan_adhoc_runs, records.store.path)
    else:
        runs = await records.adhoc_runs(excluded=INTERNAL_TYPES)
    assert [(t, n) for t, n, _ in runs] == [("command/shell", "run-0123456789abcdef")]
    later = time.time() + 30 * 86400
    assert await forget_adhoc_runs(records, runs, clock=lambda: later) == 1
    assert await records.latest(Key("command/shell", "run-0123456789abcdef", "result")) is None
    assert await records.latest(Key("swamp/worker", "run-0123456789abcdef", "result")) is not None
