"""The WAL stays small through a burst of large writes: a real store and file, checkpoints in a
real thread, as the orchestrator runs them (``swamp.store.checkpoints``)."""

import os
import sqlite3

import pytest
import trio
import trio.testing

from swamp.errors import StoreBusy
from swamp.store import checkpoints, datastore
from swamp.store.checkpoints import CHECKPOINT_WAL_BYTES, run_checkpoints
from swamp.store.datastore import WAL_TRUNCATE_BYTES, Datastore, Key, SpecPolicy, wal_size
from swamp.store.retry import retry_busy

BLOB = os.urandom(2 << 20)
BURST = 40  # 80 MiB in 2 MiB writes: far fewer writes than the count that starts a checkpoint


async def burst(store: Datastore) -> int:
    """The burst, written as the orchestrator writes (busy: retried in trio); the WAL's peak."""
    peak = 0
    for n in range(BURST):
        key = Key("test/blobs", "big", f"blob-{n}")
        await retry_busy(lambda key=key: store.write(key, {}, policy=SpecPolicy("b"), content=BLOB))
        peak = max(peak, wal_size(store.path))
        await trio.testing.wait_all_tasks_blocked()  # a checkpoint it started is under way
    return peak


@pytest.mark.integration  # big data: 80 MiB through a real file, twice
@pytest.mark.parametrize("by_size", [True, False])
async def test_a_burst_of_large_writes_keeps_the_wal_small(tmp_path, by_size):
    store = Datastore(tmp_path / "swamp.db", orchestrator=True)
    store.limit_wal()
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: run_checkpoints(
                store, wal_bytes=CHECKPOINT_WAL_BYTES if by_size else None, task_status=task_status
            )
        )
        peak = await burst(store)
        nursery.cancel_scope.cancel()
    written = BURST * len(BLOB)
    if by_size:  # a checkpoint starts at the write past the mark, and truncates what is left
        assert peak <= WAL_TRUNCATE_BYTES + 2 * len(BLOB), f"{peak >> 20} MiB"
    else:  # the control: counted writes alone (and a quiet spell) let it take the whole burst
        assert peak >= written
    store.close()


def test_a_reader_holding_the_log_is_waited_for_briefly_then_left(tmp_path, monkeypatch):
    monkeypatch.setattr(datastore, "TRUNCATE_WAIT_MS", 20)
    store = Datastore(tmp_path / "swamp.db", orchestrator=True)
    for n in range(12):
        store.write(Key("test/blobs", "big", f"b{n}"), {}, policy=SpecPolicy("b"), content=BLOB)
    reader = sqlite3.connect(tmp_path / "swamp.db", isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT COUNT(*) FROM data").fetchall()  # holds its snapshot in the log
    held = store.checkpoint()
    assert held >= 12 * len(BLOB)  # copied, but not truncated under the reader
    reader.execute("COMMIT")
    assert store.checkpoint() == 0  # once it lets go
    assert store.checkpoint(truncate_over=None) == 0
    store.close()


def test_the_log_is_measured_cheaply_and_without_a_file_yet(tmp_path):
    size = checkpoints.WalSize(tmp_path / "nothing.db")
    assert size() == 0
    store = Datastore(tmp_path / "swamp.db", orchestrator=True)
    store.write(Key("test/blobs", "big", "b"), {}, policy=SpecPolicy("b"), content=BLOB)
    size = checkpoints.WalSize(tmp_path / "swamp.db")
    assert size() == wal_size(tmp_path / "swamp.db") > len(BLOB)
    size.close()
    store.close()


def test_writes_paused_are_busy_and_the_store_is_not_broken(tmp_path):
    """While a truncation has the log, the orchestrator's writes are busy (retried), whichever
    way they write; nothing is mistaken for a read-only database."""
    store = Datastore(tmp_path / "swamp.db", orchestrator=True)
    key = Key("test/blobs", "big", "b")
    with store.writes_paused("the write-ahead log is being truncated"):
        with pytest.raises(StoreBusy, match="being truncated"):
            store.write(key, {}, policy=SpecPolicy("b"), content=b"x")
        with pytest.raises(StoreBusy), store.transaction():
            store.write(key, {}, policy=SpecPolicy("b"))
        with pytest.raises(StoreBusy):
            store.collect_garbage()
        assert store.latest(key) is None  # reads go on
    assert store.broken is None and store.paused is None
    assert store.write(key, {"n": 1}, policy=SpecPolicy("b")).version == 1
    store.close()
