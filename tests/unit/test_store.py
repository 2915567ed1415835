"""The datastore on a real SQLite file, including a cross-process race."""

import multiprocessing
import sqlite3

import pytest
import trio

from swamp.bookkeeping.tokens import TokenBook
from swamp.domain.query import parse
from swamp.domain.read_scope import ReadScope, parse_reads
from swamp.errors import Conflict, FleetFull, Rejected, UserError
from swamp.store.datastore import Datastore, Key, SpecPolicy
from swamp.store.records import Operations, SqliteRecords
from swamp.store.retry import retry_busy


@pytest.fixture
def store(tmp_path):
    s = Datastore(tmp_path / "swamp.db", orchestrator=True)
    yield s
    s.close()


KEY = Key("test/model", "inst", "item")


def test_writes_are_versions_and_latest_is_the_newest(store):
    policy = SpecPolicy("item")
    for i in range(3):
        store.write(KEY, {"i": i}, policy=policy)
    assert store.versions(KEY) == [1, 2, 3]
    assert store.latest(KEY).attributes == {"i": 2}


def test_bytes_are_kept(store):
    record = store.write(KEY, {}, policy=SpecPolicy("item"), content=b"\x00\x01")
    assert store.latest(KEY).content == b"\x00\x01" and record.version == 1


def test_garbage_collection_keeps_n_versions_at_write_time(store):
    policy = SpecPolicy("item", garbage_collection=2)
    for i in range(5):
        store.write(KEY, {"i": i}, policy=policy)
    assert store.versions(KEY) == [4, 5]


def test_a_single_version_spec_is_one_row_replaced_by_compare_and_swap(store):
    policy = SpecPolicy("item", garbage_collection=1)
    first = store.write(KEY, {"state": "active"}, policy=policy, expected_version=0)
    store.db.execute("CREATE TEMP TABLE seen (n INTEGER)")
    store.db.execute(
        "CREATE TEMP TRIGGER no_insert AFTER INSERT ON main.data BEGIN "
        "INSERT INTO seen VALUES (1); END"
    )
    ended, wrote = store.transition(
        KEY, lambda cur: {"state": "done"}, policy=policy, current=first
    )
    assert wrote and ended.version == 2 and store.versions(KEY) == [2]
    assert store.latest(KEY).attributes == {"state": "done"}
    assert store.db.execute("SELECT COUNT(*) FROM seen").fetchone()[0] == 0  # updated in place
    with pytest.raises(Conflict):  # the compare-and-swap still refuses a stale version
        store.write(KEY, {"state": "late"}, policy=policy, expected_version=1)
    assert store.latest(KEY).attributes == {"state": "done"}


def test_a_fresh_key_is_version_one_and_a_clash_is_still_refused(store):
    policy = SpecPolicy("item", garbage_collection=1)
    record = store.write(KEY, {"state": "done"}, policy=policy, fresh=True)
    assert record.version == 1 and store.latest(KEY).attributes == {"state": "done"}
    with pytest.raises(Conflict):
        store.write(KEY, {"state": "other"}, policy=policy, fresh=True)
    assert store.versions(KEY) == [1] and store.latest(KEY).attributes == {"state": "done"}


def test_lifetimes_expire(tmp_path):
    now = [1000.0]
    s = Datastore(tmp_path / "x.db", clock=lambda: now[0])
    s.write(KEY, {}, policy=SpecPolicy("item", lifetime="1h"))
    s.write(Key("t/m", "i", "keep"), {}, policy=SpecPolicy("keep"))
    assert s.collect_garbage() == 0
    now[0] += 3601
    assert s.collect_garbage() == 1
    assert s.latest(KEY) is None and s.latest(Key("t/m", "i", "keep")) is not None


def test_compare_and_swap_refuses_a_moved_latest(store):
    policy = SpecPolicy("item")
    store.write(KEY, {"v": 1}, policy=policy, expected_version=0)
    with pytest.raises(Conflict):
        store.write(KEY, {"v": 2}, policy=policy, expected_version=0)
    store.write(KEY, {"v": 2}, policy=policy, expected_version=1)
    assert store.latest(KEY).version == 2


def test_transition_retries_its_decision_when_another_writer_won(store, tmp_path):
    policy = SpecPolicy("item")
    store.write(KEY, {"n": 0}, policy=policy)
    other = Datastore(tmp_path / "swamp.db")
    calls = []

    def decide(current):
        calls.append(current.version)
        if len(calls) == 1:  # another process sneaks in between our read and our write
            other.write(KEY, {"n": current.attributes["n"] + 100}, policy=policy)
        return {"n": current.attributes["n"] + 1}

    record, wrote = store.transition(KEY, decide, policy=policy)
    assert wrote and calls == [1, 2] and record.attributes == {"n": 101}


def test_transition_writes_nothing_when_decide_says_none_or_raises(store):
    policy = SpecPolicy("item")
    assert store.transition(KEY, lambda cur: None, policy=policy) == (None, False)

    def refuse(cur):
        raise Rejected("no")

    with pytest.raises(Rejected):
        store.transition(KEY, refuse, policy=policy)
    assert store.latest(KEY) is None


def test_query_latest_and_all_versions(store):
    policy = SpecPolicy("item")
    store.write(KEY, {"status": "a"}, policy=policy)
    store.write(KEY, {"status": "b"}, policy=policy)
    store.write(Key("other/type", "x", "y"), {"status": "a"}, policy=policy)
    assert [r.attributes["status"] for r in store.query(parse('attributes.status == "a"'))] == ["a"]
    history = store.query(parse('modelType == "test/model"'), all_versions=True)
    assert [r.version for r in history] == [1, 2]


def _scoped_world(store):
    policy = SpecPolicy("item")
    store.write(Key("command/shell", "build", "result"), {"exitCode": 0}, policy=policy)
    store.write(Key("command/shell", "deploy", "result"), {"exitCode": 1}, policy=policy)
    store.write(Key("test/steps", "default", "progress"), {"step": 1}, policy=policy)
    store.write(Key("test/other", "x", "y"), {"step": 2}, policy=policy)
    store.write(Key("swamp/worker", "w1", "state"), {"machineId": "abc123"}, policy=policy)
    store.write(Key("swamp/enrollment-token", "pool", "token"), {"secretHash": "9f"}, policy=policy)
    store.write(Key("swamp/token-binding", "pool", "m-1a"), {"machineId": "m-77"}, policy=policy)


def _names(records):
    return sorted(f"{r.model_type}:{r.model_name}" for r in records)


def test_a_scoped_query_sees_only_its_own_model_and_what_it_declares(store):
    _scoped_world(store)
    everything = parse("version > 0")
    own = ReadScope.of("command/shell", "build")
    assert _names(store.query(everything, scope=own)) == ["command/shell:build"]
    wider = ReadScope.of(
        "command/shell", "build", also=[("command/shell", "deploy")], type_patterns=["test/*"]
    )
    assert _names(store.query(everything, scope=wider)) == [
        "command/shell:build",
        "command/shell:deploy",
        "test/other:x",
        "test/steps:default",
    ]
    assert _names(store.query(everything, scope=ReadScope.of("a/b", "c", type_patterns=["*"]))) == [
        "command/shell:build",
        "command/shell:deploy",
        "test/other:x",
        "test/steps:default",
    ]


def test_infrastructure_is_out_of_scope_and_indistinguishable_from_nothing(store):
    """The oracle: a predicate over a worker's machine id or a token hash must answer exactly as
    a predicate over data that does not exist, even when the scope claims every type."""
    _scoped_world(store)
    greedy = ReadScope.of(
        "command/shell", "build", type_patterns=["*", "swamp/*"], also=[("swamp/worker", "w1")]
    )
    for predicate in (
        'modelType == "swamp/worker"',
        'attributes.machineId == "abc123"',
        'attributes.secretHash == "9f"',
        'modelType == "swamp/enrollment-token"',
        'modelType == "swamp/token-binding"',
        'attributes.machineId == "m-77"',
        'modelType == "no/such"',
        'attributes.machineId == "zzz"',
    ):
        assert store.query(parse(predicate), scope=greedy) == [], predicate
    assert not greedy.allows("swamp/worker", "w1") and greedy.allows("test/steps", "x")


def _redeem_in_process(args):
    path, credential, machine = args
    return trio.run(_redeem, path, credential, machine)


async def _redeem(path, credential: str, machine: str) -> str:
    db = SqliteRecords(Datastore(path))
    try:
        await TokenBook(db).redeem(credential, machine_id=machine)
        return "bound"
    except (Rejected, FleetFull) as exc:
        return exc.code
    finally:
        await db.aclose()


@pytest.mark.integration  # real processes: eight of them, each starting Python
@pytest.mark.parametrize("allowance,machines", [(1, 16), (10, 40)])
async def test_processes_racing_for_the_last_slots_never_overbook(tmp_path, allowance, machines):
    path = tmp_path / "race.db"
    book = TokenBook(SqliteRecords(Datastore(path)))
    _, credential = await book.mint("race", duration_seconds=600, max_enrollments=allowance)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(8) as pool:
        results = await trio.to_thread.run_sync(
            pool.map, _redeem_in_process, [(path, credential, f"m{i}") for i in range(machines)]
        )
    assert results.count("bound") == allowance
    refusal = "allowance_exhausted" if allowance == 1 else "fleet_full"
    assert results.count(refusal) == machines - allowance
    token = await book.get("race")
    assert token is not None and token.enrollments == allowance
    bindings = await book.bindings("race")
    assert len(bindings) == allowance
    assert len({b.worker_name for b in bindings}) == allowance


async def test_names_in_use_by_other_tokens_are_avoided_and_reserved(tmp_path):
    book = TokenBook(SqliteRecords(Datastore(tmp_path / "x.db")))
    _, fleet = await book.mint("pool", duration_seconds=600, max_enrollments=5)
    member = (await book.redeem(fleet, machine_id="m1")).binding.worker_name
    assert member.startswith("pool-") and len(member) == len("pool-") + 8
    with pytest.raises(Exception, match="already a worker of token 'pool'"):
        await book.mint(member, duration_seconds=600)
    # a single-machine token named like the suffix a fleet member would get pushes it longer
    import hashlib

    short = "pool-" + hashlib.sha256(b"m2").hexdigest()[:8]
    await book.mint(short, duration_seconds=600)
    assert (await book.redeem(fleet, machine_id="m2")).binding.worker_name == (
        "pool-" + hashlib.sha256(b"m2").hexdigest()[:9]
    )


async def test_an_unknown_token_name_writes_nothing(tmp_path):
    path = tmp_path / "x.db"
    book = TokenBook(SqliteRecords(Datastore(path)))
    with pytest.raises(Rejected) as info:
        await book.redeem("ghost.secret", machine_id="m1")
    assert info.value.code == "token_invalid"
    rows = sqlite3.connect(path).execute("SELECT COUNT(*) FROM data").fetchone()[0]
    assert rows == 0


async def test_a_transaction_refused_as_busy_is_retried_until_the_other_process_commits(tmp_path):
    """``retry_busy`` awaits an operation through the seam as it calls a plain one: the
    orchestrator's connection is refused at once while another holds the lock, and tries again
    until it is free."""
    path = tmp_path / "swamp.db"
    db = SqliteRecords(Datastore(path, orchestrator=True))
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    attempts = []

    async def body(tx: Operations):
        return await tx.write(KEY, {"n": 1}, policy=SpecPolicy("item"))

    async def transact():
        attempts.append(trio.current_time())
        return await db.transact(body)

    async def commit_later():
        await trio.sleep(0.05)
        other.execute("COMMIT")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(commit_later)
        written = await retry_busy(transact)
    assert len(attempts) > 1 and written.version == 1
    latest = await db.latest(KEY)
    assert latest is not None and latest.attributes == {"n": 1}
    other.close()
    await db.aclose()


def test_wal_and_synchronous_settings(store):
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.db.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    assert store.db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    store.checkpoint()


@pytest.mark.parametrize("entry", ["Bad", "@", "@a b", "@a/[b]", "@a?", "x/y", 5, "a\n"])
def test_bad_reads_entries_are_input_errors(entry):
    with pytest.raises(UserError, match="reads entry"):
        parse_reads([entry], source="models/x.toml reads")


def test_reads_entries_parse():
    entries = parse_reads(["cache", "@command/shell", "@test/*"], source="x")
    assert [e.instance for e in entries] == ["cache", None, None]
    assert [e.type_pattern for e in entries] == [None, "command/shell", "test/*"]


def test_iso_formats_as_datetime_does_rounding_and_all():
    import random
    from datetime import datetime, timezone

    from swamp.store.datastore import iso

    def by_datetime(epoch: float) -> str:
        text = datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="milliseconds")
        return text.replace("+00:00", "Z")

    edges = [
        whole + fraction
        for whole in (0, 1, 1_796_040_000)
        for fraction in (0.0, 0.0000005, 0.0005, 0.5, 0.999, 0.9995, 0.9999994, 0.9999995)
    ]
    rng = random.Random(7)
    for epoch in edges + [rng.uniform(0, 4e9) for _ in range(20_000)]:
        assert iso(epoch) == by_datetime(epoch), epoch
    assert iso(1_796_040_000.25) == "2026-11-30T12:00:00.250Z"


_OLD_LAYOUT = """
CREATE TABLE data (
    model_type TEXT NOT NULL, model_name TEXT NOT NULL, name TEXT NOT NULL,
    version INTEGER NOT NULL, spec TEXT NOT NULL, attributes TEXT NOT NULL, content BLOB,
    created_at TEXT NOT NULL, created_epoch REAL NOT NULL, expires_epoch REAL,
    PRIMARY KEY (model_type, model_name, name, version)
) WITHOUT ROWID;
"""


def test_a_database_of_the_old_layout_is_rebuilt_once_with_its_rows(tmp_path):
    """The content used to sit before columns every query reads, so reading a row's metadata
    walked its content's overflow pages. A database written that way is rebuilt at open."""
    path = tmp_path / "swamp.db"
    old = sqlite3.connect(path)
    old.executescript(_OLD_LAYOUT)
    old.execute(
        "INSERT INTO data VALUES ('t/m','i','blob',1,'blob','{}',?,'2026-01-01T00:00:00.000Z',"
        "1.0,NULL)",
        (b"x" * 100_000,),
    )
    old.execute(
        "INSERT INTO data VALUES ('t/m','i','rec',1,'rec','{\"a\":1}',NULL,"
        "'2026-01-01T00:00:00.000Z',1.0,5.0)"
    )
    old.commit()
    old.close()
    store = Datastore(path, orchestrator=True)
    try:
        assert store.migrated
        assert store.latest(Key("t/m", "i", "blob")).content == b"x" * 100_000
        sizes = {r.name: r.to_json()["size"] for r in store.query(parse("modelType == 't/m'"))}
        assert sizes == {"blob": 100_000, "rec": 0}
        store.write(Key("t/m", "i", "rec"), {"a": 2}, policy=SpecPolicy("rec"))
        assert store.collect_garbage() == 1  # the old row's expiry is kept (and indexed)
    finally:
        store.close()
    again = Datastore(path)
    assert not again.migrated  # once
    again.close()


def test_a_query_past_its_budget_stops_with_a_coded_error(store):
    from swamp.errors import QueryTimeout

    policy = SpecPolicy("item")
    for i in range(3000):
        store.write(Key("test/model", "inst", f"item-{i}"), {"i": i}, policy=policy)
    assert len(store.query(parse("attributes.i >= 0"), budget=60)) == 3000
    with pytest.raises(QueryTimeout, match="budget"):
        store.query(parse("attributes.i >= 0"), budget=0)
    # the connection is left as it was: no handler stays behind
    assert len(store.query(parse("attributes.i >= 0"))) == 3000


async def test_the_reader_queries_in_a_thread_while_the_loop_goes_on(tmp_path):
    import trio

    from swamp.errors import QueryTimeout
    from swamp.store.reader import Reader

    store = Datastore(tmp_path / "swamp.db", orchestrator=True)
    policy = SpecPolicy("item")
    with store.transaction():
        for i in range(5_000):
            store.write(Key("test/model", "inst", f"item-{i}"), {"i": i}, policy=policy)
    reader = Reader(store.path)
    ticks = 0
    done = trio.Event()

    async def tick() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await trio.lowlevel.checkpoint()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tick)
            found = await reader.query(parse("attributes.i >= 0"), budget=60)
            at_end = ticks
            done.set()
        assert len(found) == 5_000 and at_end > 0  # the loop ran while the rows were read
        with pytest.raises(QueryTimeout):
            await reader.query(parse("attributes.i >= 0"), budget=0)
        assert reader.timed_out == 1
        scoped = await reader.query(
            parse("attributes.i < 3"), budget=60, scope=ReadScope.of("other/type", "inst")
        )
        assert scoped == []  # the scope applies there too
    finally:
        reader.close()
        store.close()


def test_adhoc_runs_are_forgotten_past_their_retention_and_beyond_the_newest_of_a_type(tmp_path):
    import trio

    from swamp.domain.adhoc_runs import runs_to_forget
    from swamp.orchestrator.server import forget_adhoc_runs
    from swamp.orchestrator.storage import scan_adhoc_runs
    from swamp.store.records import SqliteRecords

    def forget() -> int:
        return trio.run(
            lambda: forget_adhoc_runs(
                SqliteRecords(store), scan_adhoc_runs(store.path), clock=lambda: clock[0]
            )
        )

    now = 1_000_000.0
    runs = [("a/x", f"run-{i:016x}", now - i) for i in range(5)]
    runs += [("a/x", "run-00000000000000ff", now - 8 * 86400), ("b/y", "run-0000000000000aaa", now)]
    assert runs_to_forget(runs, now=now, keep=3) == [
        ("a/x", "run-0000000000000003"),
        ("a/x", "run-0000000000000004"),
        ("a/x", "run-00000000000000ff"),
    ]
    clock = [now]
    store = Datastore(tmp_path / "swamp.db", orchestrator=True, clock=lambda: clock[0])
    try:
        policy = SpecPolicy("result")
        store.write(Key("command/shell", "run-0123456789abcdef", "result"), {}, policy=policy)
        store.write(Key("command/shell", "named", "result"), {}, policy=policy)  # a model's
        store.write(Key("command/shell", "run-not-hex-at-all", "result"), {}, policy=policy)
        # a token, a worker and a workflow may be named so too: never taken for ad-hoc runs
        for kind in ("swamp/enrollment-token", "swamp/worker", "swamp/workflow-run"):
            store.write(Key(kind, "run-0123456789abcdef", "state"), {}, policy=policy)
        assert forget() == 0  # young: kept
        clock[0] = now + 8 * 86400
        assert forget() == 1
        left = {r.model_name for r in store.query(parse("modelType == 'command/shell'"))}
        assert left == {"named", "run-not-hex-at-all"}
        kept = {r.model_type for r in store.query(parse("modelName == 'run-0123456789abcdef'"))}
        assert kept == {"swamp/enrollment-token", "swamp/worker", "swamp/workflow-run"}
    finally:
        store.close()


async def test_a_cancelled_query_is_cancelled_and_its_thread_stops(tmp_path):
    import trio

    from swamp.store.reader import Reader

    store = Datastore(tmp_path / "swamp.db", orchestrator=True)
    with store.transaction():
        for i in range(20_000):
            store.write(Key("test/model", "inst", f"item-{i}"), {"i": i}, policy=SpecPolicy("x"))
    reader = Reader(store.path)
    try:
        with trio.move_on_after(0.01) as scope:  # a caller that goes away
            await reader.query(parse("attributes.i >= 0"), budget=60)
        assert scope.cancelled_caught  # not a query_timeout: the caller was cancelled
        assert len(await reader.query(parse("attributes.i < 3"), budget=60)) == 3
    finally:
        reader.close()
        store.close()


def test_the_newest_runs_are_read_from_an_index_of_their_own(store):
    """The runs page asks for the run headers newest first: SQLite walks the partial index of
    the run headers and stops at the limit, instead of sorting every header (a week of runs
    took most of a second)."""
    from swamp.models.builtin import WORKFLOW_RUN
    from swamp.store.datastore import NEWEST_INDEXED

    assert WORKFLOW_RUN.type == NEWEST_INDEXED
    policy = SpecPolicy("run", garbage_collection=5)
    for i in range(50):
        store.write(
            Key(NEWEST_INDEXED, f"wf{i % 3}", f"run-{i:04d}"), {"i": i}, policy=policy, at=1000 + i
        )
    store.write(
        Key(NEWEST_INDEXED, "wf0", "run-0003"), {"i": 3, "again": True}, policy=policy, at=2000
    )
    traced: list[str] = []
    store.db.set_trace_callback(traced.append)
    try:
        found = store.query(parse(f'modelType == "{NEWEST_INDEXED}"'), limit=4, newest_first=True)
    finally:
        store.db.set_trace_callback(None)
    assert [r.attributes["i"] for r in found] == [3, 49, 48, 47]  # the latest written first
    [sql] = [s for s in traced if "FROM data" in s]
    plan = store.db.execute("EXPLAIN QUERY PLAN " + sql).fetchall()
    assert any("data_newest_runs" in row[-1] for row in plan), plan
    assert not any("TEMP B-TREE" in row[-1] for row in plan), plan  # no sort of every header
