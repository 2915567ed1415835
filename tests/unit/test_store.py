"""The datastore on a real SQLite file, including a cross-process race."""

import multiprocessing
import sqlite3

import pytest

from swamp.bookkeeping.tokens import TokenBook
from swamp.domain.query import parse
from swamp.errors import Conflict, Rejected
from swamp.store.datastore import Datastore, Key, SpecPolicy


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
    assert [r.attributes["status"] for r in store.query(parse('attributes.status == "a"'))] == \
        ["a"]
    history = store.query(parse('modelType == "test/model"'), all_versions=True)
    assert [r.version for r in history] == [1, 2]


def _redeem_in_process(args):
    path, credential, machine = args
    book = TokenBook(Datastore(path))
    try:
        book.redeem(credential, machine_id=machine, name_for=lambda t: t.name)
        return "bound"
    except Rejected as exc:
        return exc.code


def test_processes_racing_for_the_last_slot_never_both_win(tmp_path):
    path = tmp_path / "race.db"
    book = TokenBook(Datastore(path))
    _, credential = book.mint("race", duration_seconds=600)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(8) as pool:
        results = pool.map(_redeem_in_process, [(path, credential, f"m{i}") for i in range(16)])
    assert results.count("bound") == 1
    assert results.count("allowance_exhausted") == 15
    assert len(book.get("race").bindings) == 1


def test_an_unknown_token_name_writes_nothing(tmp_path):
    path = tmp_path / "x.db"
    book = TokenBook(Datastore(path))
    with pytest.raises(Rejected) as info:
        book.redeem("ghost.secret", machine_id="m1", name_for=lambda t: t.name)
    assert info.value.code == "token_unknown"
    rows = sqlite3.connect(path).execute("SELECT COUNT(*) FROM data").fetchone()[0]
    assert rows == 0


def test_wal_and_synchronous_settings(store):
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.db.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    assert store.db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    store.checkpoint()
