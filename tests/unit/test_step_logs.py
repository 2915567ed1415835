"""Step logs in-process, on a real SQLite store: lines batched into chunks (never a write per
line), kept in order, cut at the per-step cap with the gap said where it is, bounded in
memory while the writer is behind, read a page at a time, and forgotten with their owner."""

import functools

import pytest
import trio

from swamp.admin import step_logs as pages
from swamp.domain.step_logs import (
    CHUNK_LINES,
    LogOwner,
    gap_marker,
    line_bytes,
    overflow,
    parse_log_ref,
)
from swamp.errors import NotFound, UserError
from swamp.orchestrator.step_logs import StepLogs
from swamp.protocol.messages import LogsRequest
from swamp.store.datastore import Datastore
from swamp.store.records import SqliteRecords
from swamp.store.step_logs import SqliteLogs, SqliteLogStore

OWNER = LogOwner("command/shell", "printer", "run", run_id=None)


@pytest.fixture
def store(tmp_path):
    store = Datastore(tmp_path / "swamp.db", orchestrator=True)
    yield store
    store.close()


class CountingStore(SqliteLogStore):
    """The real store, counting its transactions."""

    def __init__(self, store):
        super().__init__(store)
        self.writes = 0

    def write(self, started, chunks, ended, *, cap):
        self.writes += 1
        super().write(started, chunks, ended, cap=cap)


def _all_lines(logs, log_id):
    out, after = [], 0
    while True:
        chunks, more = logs.chunks([log_id], after=after, limit_bytes=1 << 20)
        for chunk in chunks:
            out.extend(chunk.lines)
        if chunks:
            after = chunks[-1].id
        if not more:
            return out, chunks


# -- the pure rules -------------------------------------------------------------------------


def test_overflow_drops_the_oldest_chunks_and_keeps_the_newest_whatever_its_size():
    assert overflow([10, 10, 10], 30) == 0
    assert overflow([10, 10, 10], 25) == 1
    assert overflow([10, 10, 10], 5) == 2  # the newest stays
    assert overflow([], 5) == 0


def test_a_reference_is_hex_with_perhaps_a_step():
    assert parse_log_ref("3f9a2c").id == "3f9a2c"
    assert parse_log_ref("3f9a2c/build").step == "build"
    assert parse_log_ref("3f9a2c/ci.build").step == "ci.build"
    for bad in ("3f9", "xyz123", "3f9a2c/", "3f9a\x1b[2J", "3f9a2c\n"):
        with pytest.raises(UserError):
            parse_log_ref(bad)


def test_the_gap_marker_says_how_many_lines_and_bytes():
    text = gap_marker(1234567, 3 * 1024 * 1024, 32 * 1024 * 1024)
    assert "1,234,567 line(s)" in text and "3.0 MiB" in text and "32.0 MiB" in text


# -- batching and order ------------------------------------------------------------------------


async def test_lines_go_in_batches_of_chunks_in_order_and_the_writer_never_blocks_the_caller(
    store,
):
    logs = CountingStore(store)
    sink = StepLogs(SqliteLogs(logs), linger=0.05)
    count = 3 * CHUNK_LINES + 17
    async with trio.open_nursery() as nursery:
        await nursery.start(sink.run)
        sink.open("aa01", OWNER, worker="w1")
        for n in range(count):
            sink.append("aa01", f"line {n}", "stdout")  # no await: it cannot wait
        assert logs.writes == 0  # nothing was written in the caller
        sink.close("aa01")
        while sink.live("aa01"):
            await sink.written()
        nursery.cancel_scope.cancel()
    lines, _ = _all_lines(logs, "aa01")
    assert lines == [f"line {n}" for n in range(count)]
    assert logs.writes <= 3, "a batch per linger, never a write per line or per chunk"
    [info] = logs.logs_with_prefix("aa01")
    assert (info.lines, info.dropped_lines, info.worker) == (count, 0, "w1")
    assert info.bytes == sum(line_bytes(f"line {n}") for n in range(count))
    assert info.ended_at is not None


async def test_streams_are_kept_per_line(store):
    logs = SqliteLogStore(store)
    sink = StepLogs(SqliteLogs(logs))  # no writer: the caller writes (the CLI on a repo)
    sink.open("bb01", OWNER, worker=None)
    for stream in ("stdout", "stderr", "log", None):
        sink.append("bb01", "x", stream)
    sink.close("bb01")
    await sink.flush()
    chunks, _ = logs.chunks(["bb01"], after=0, limit_bytes=1 << 20)
    assert "".join(c.streams for c in chunks) == "oell"


# -- the cap ---------------------------------------------------------------------------------


def test_past_the_cap_the_oldest_part_goes_and_the_gap_is_known(store):
    logs = SqliteLogStore(store)
    cap = 64 * 1024
    sink = StepLogs(SqliteLogs(logs), cap=cap)
    sink.open("cc01", OWNER, worker="w1")
    line = "x" * 99  # 100 bytes with its newline
    for n in range(5000):  # 500 kB: several times the cap
        sink.append("cc01", f"{n:06d}{line[6:]}", "stdout")
        if n % 700 == 0:
            trio.run(sink.flush)  # written in several batches: the store cuts what it holds
    sink.close("cc01")
    trio.run(sink.flush)
    lines, _ = _all_lines(logs, "cc01")
    [info] = logs.logs_with_prefix("cc01")
    assert info.lines == 5000 and info.bytes == 5000 * 100
    assert info.dropped_lines + len(lines) == 5000  # what went plus what is kept is everything
    assert info.dropped_bytes == info.dropped_lines * 100
    assert len(lines) * 100 <= cap + 256 * 1024  # within the cap (a chunk's grain)
    assert lines[-1].startswith("004999") and lines[0].startswith(f"{info.dropped_lines:06d}")
    first, _ = logs.chunks(["cc01"], after=0, limit_bytes=1)
    assert first[0].first_line == info.dropped_lines  # a reader sees the gap before it


def test_while_the_writer_is_behind_memory_holds_at_most_the_cap_per_step(store):
    logs = SqliteLogStore(store)
    cap = 300 * 1024
    sink = StepLogs(SqliteLogs(logs), cap=cap)
    sink.writing = True  # a writer that never gets to write (the database locked, say)
    sink.open("dd01", OWNER, worker="w1")
    for n in range(40_000):
        sink.append("dd01", f"{n:07d}" + "y" * 92, "stdout")  # 100 bytes
    assert sink.pending_bytes <= cap + 256 * 1024
    assert sink.dropped_lines > 0
    sink.writing = False
    sink.close("dd01")
    trio.run(sink.flush)  # written now
    lines, _ = _all_lines(logs, "dd01")
    [info] = logs.logs_with_prefix("dd01")
    assert lines[-1].startswith("0039999")
    assert info.lines == 40_000 and info.dropped_lines + len(lines) == 40_000


# -- pages, references, collection -------------------------------------------------------------


async def test_a_dispatch_is_found_by_a_prefix_and_read_a_page_at_a_time(store):
    logs = SqliteLogStore(store)
    sink = StepLogs(SqliteLogs(logs))
    sink.open("ee0123456789", OWNER, worker="w1")
    for n in range(20_000):
        sink.append("ee0123456789", f"{n}" + "z" * 60, "stdout")
    sink.close("ee0123456789")
    await sink.flush()
    cursor, seen, rounds = 0, 0, 0
    while True:
        page = await pages.read(
            LogsRequest(ref="ee01", after=cursor),
            db=SqliteRecords(store),
            logs=SqliteLogs(logs),
            live=None,
        )
        assert page.kind == "dispatch" and page.id == "ee0123456789" and not page.live
        seen += sum(len(c.lines) for c in page.chunks)
        cursor, rounds = page.cursor, rounds + 1
        if not page.more:
            break
    assert seen == 20_000 and rounds > 1
    with pytest.raises(NotFound):
        await pages.read(
            LogsRequest(ref="ffff"), db=SqliteRecords(store), logs=SqliteLogs(logs), live=None
        )


def test_logs_are_forgotten_with_their_run_or_instance(store):
    logs = SqliteLogStore(store)
    sink = StepLogs(SqliteLogs(logs))
    run_owner = LogOwner("swamp/echo", "e", "echo", run_id="ab" * 16, workflow="wf", step="s")
    for log_id, owner in (("aa10", run_owner), ("aa11", OWNER)):
        sink.open(log_id, owner, worker=None)
        sink.append(log_id, "hello", "log")
        sink.close(log_id)
    trio.run(sink.flush)
    assert logs.runs() == [("ab" * 16, "wf")]
    assert logs.forget_runs(["ab" * 16]) == 1
    assert logs.forget_instances([("command/shell", "printer")]) == 1
    assert logs.logs_with_prefix("aa1") == []
    count = store.db.execute("SELECT COUNT(*) FROM step_log_chunk").fetchone()[0]
    assert count == 0  # their chunks went with them


def test_a_dispatch_that_prints_nothing_costs_no_row(store):
    logs = CountingStore(store)
    sink = StepLogs(SqliteLogs(logs))
    owner = LogOwner("swamp/echo", "e", "echo", run_id="cd" * 16, workflow="wf", step="s")
    sink.open("ab20", owner, worker="w1")
    assert sink.live("ab20") and sink.live_run("cd" * 16)
    sink.close("ab20")
    assert not sink.live("ab20") and not sink.live_run("cd" * 16)
    assert logs.writes == 0 and logs.logs_with_prefix("ab20") == []


def test_a_collected_run_takes_its_logs_and_old_ad_hoc_logs_go_too(store):
    from swamp.bookkeeping.workflow_runs import RunBook
    from swamp.domain.run_record import RunRecord, Status
    from swamp.orchestrator.server import RUN_RETENTION
    from swamp.orchestrator.server import collect_step_logs as collect
    from swamp.store.records import SqliteRecords
    from tests.harness.synced import Synced

    logs = SqliteLogStore(store)
    sink = StepLogs(SqliteLogs(logs))
    old, kept = "a1" * 16, "b2" * 16
    for run_id in (old, kept):
        Synced(RunBook(SqliteRecords(store))).save_whole(
            RunRecord(
                run_id,
                "wf",
                "2020-01-01T00:00:00.000Z",
                status=Status.SUCCEEDED,
                ended_at="2020-01-01T00:00:01.000Z" if run_id == old else "2999-01-01T00:00:00Z",
            )
        )
        owner = LogOwner("swamp/echo", "e", "echo", run_id=run_id, workflow="wf", step="s")
        sink.open(f"{run_id[:2]}30", owner, worker=None)
        sink.append(f"{run_id[:2]}30", "hello", "log")
        sink.close(f"{run_id[:2]}30")
    sink.open("ac40", OWNER, worker=None)  # an ad-hoc run's, long ago
    sink.append("ac40", "hi", "stdout")
    sink.close("ac40")
    trio.run(sink.flush)

    def collect_step_logs(store, logs, **kwargs):
        return trio.run(
            functools.partial(collect, SqliteRecords(store), SqliteLogs(logs), **kwargs)
        )

    store.db.execute("UPDATE step_log SET ended_epoch = 0 WHERE log_id = 'ac40'")
    assert collect_step_logs(store, logs) == 1  # the ad-hoc one: both runs are recorded
    assert (
        Synced(RunBook(SqliteRecords(store))).collect(older_than_seconds=RUN_RETENTION) == 1
    )  # the old run goes
    assert collect_step_logs(store, logs) == 1  # and its logs with it
    assert [i.log_id for i in logs.logs_with_prefix("b2")] == ["b230"]
    assert logs.logs_with_prefix("a1") == [] and logs.logs_with_prefix("ac") == []


def test_the_cli_says_where_lines_are_missing_and_escapes_what_it_prints():
    from swamp.cli.logs_cmd import LogPrinter
    from swamp.protocol.messages import LogChunkItem, LogItem, LogsPage

    def item(log_id, step):
        return LogItem(log_id, "command/shell", "m", "run", 1, "t", 9, 90, 7, 70, False,
                       run_id="r", job="j", step=step)  # fmt: skip

    page = LogsPage(
        kind="run", id="r", cursor=2, more=False, live=False, cap_bytes=1024,
        logs=[item("a1", "build"), item("b2", "test")],
        chunks=[
            LogChunkItem(1, "a1", first=7, first_byte=70, size=20, streams="oe",
                         lines=["x\x1b[2J", "y"]),
            LogChunkItem(2, "b2", first=0, first_byte=0, size=2, streams="l", lines=["z"]),
        ],
    )  # fmt: skip
    printer = LogPrinter(json_output=False, prefixed=False)
    printer.learn(page)
    out = printer.render(page).splitlines()
    assert out[0].startswith("build │ … 7 line(s) (70 bytes) dropped here")
    assert out[1:] == ["build │ x\\x1b[2J", "build │ y", "test │ z"]
    as_json = LogPrinter(json_output=True, prefixed=False)
    as_json.learn(page)
    import json

    objects = [json.loads(line) for line in as_json.render(page).splitlines()]
    assert objects[0]["dropped"] == {"lines": 7, "bytes": 70}
    assert [(o["step"], o["stream"], o["line"]) for o in objects[1:]] == [
        ("build", "stdout", "x\x1b[2J"),
        ("build", "stderr", "y"),
        ("test", "log", "z"),
    ]


async def test_a_reader_right_after_a_log_ends_finds_its_last_lines_stored(store):
    logs = SqliteLogStore(store)
    sink = StepLogs(SqliteLogs(logs), linger=60)  # a writer that would otherwise wait a minute
    async with trio.open_nursery() as nursery:
        await nursery.start(sink.run)
        sink.open("ad50", OWNER, worker="w1")
        sink.append("ad50", "last words", "stdout")
        sink.close("ad50")
        assert _all_lines(logs, "ad50")[0] == []  # the dispatch did not wait for the store
        with trio.fail_after(5):
            await sink.caught_up()  # the writer is hurried, not waited out
        assert _all_lines(logs, "ad50")[0] == ["last words"]
        sink.open("ad51", OWNER, worker="w1")
        sink.append("ad51", "still going", "stdout")
        with trio.CancelScope() as scope:  # an open log is not waited for: it has not ended
            scope.cancel()
            await sink.caught_up()  # returns without waiting (else the scope would catch it)
        assert not scope.cancelled_caught
        nursery.cancel_scope.cancel()


def test_a_log_still_being_written_is_never_collected_nor_its_chunks_orphaned(store):
    import time

    from swamp.orchestrator.server import collect_step_logs as collect
    from swamp.store.step_logs import Chunk, LogEnd, LogStart

    def collect_step_logs(store, logs, **kwargs):
        return trio.run(
            functools.partial(collect, SqliteRecords(store), SqliteLogs(logs), **kwargs)
        )

    logs = SqliteLogStore(store)
    now = time.time()
    owner = LogOwner("command/shell", "build", "run")  # a named instance, printing for an hour
    long_id = f"{1:032x}"
    logs.write(
        [LogStart(long_id, owner, "w", 1, now - 3600)],
        [Chunk(long_id, 0, 0, ["compiling"], "o", 10)],
        [],
        cap=1 << 25,
    )
    started, chunks, ended = [], [], []
    for i in range(1000):  # 1,000 quick ad-hoc runs of the same type meanwhile
        log_id = f"{i + 2:032x}"
        adhoc = LogOwner("command/shell", f"run-{i:016x}", "run")
        started.append(LogStart(log_id, adhoc, "w", 1, now - 60))
        chunks.append(Chunk(log_id, 0, 0, ["ok"], "o", 3))
        ended.append(LogEnd(log_id, now - 59, 1, 3))
    logs.write(started, chunks, ended, cap=1 << 25)
    collect_step_logs(store, logs, live=lambda run_id: False)
    logs.write([], [Chunk(long_id, 1, 10, ["linking"], "o", 8)], [], cap=1 << 25)  # still going
    assert [i.log_id for i in logs.logs_with_prefix(long_id)] == [long_id]
    lines, _ = _all_lines(logs, long_id)
    assert lines == ["compiling", "linking"]
    # a chunk of no log is never written, and one an earlier version left is collected
    logs.write([], [Chunk("ab" * 16, 0, 0, ["lost"], "o", 5)], [], cap=1 << 25)
    orphans = (
        "SELECT count(*) FROM step_log_chunk WHERE log_id NOT IN (SELECT log_id FROM step_log)"
    )
    assert store.db.execute(orphans).fetchone()[0] == 0
    store.db.execute(
        "INSERT INTO step_log_chunk (log_id, first_line, first_byte, line_count, byte_count, "
        "streams, body) VALUES ('cd', 0, 0, 1, 5, 'o', '[\"old\"]')"
    )
    collect_step_logs(store, logs)
    assert store.db.execute(orphans).fetchone()[0] == 0


def test_a_lost_batch_loses_lines_but_never_its_logs_start_or_end(store):
    from swamp.errors import StoreError

    class FailingOnce(SqliteLogStore):
        failed = False

        def write(self, started, chunks, ended, *, cap):
            if not self.failed:
                self.failed = True
                raise StoreError("disk I/O error")
            super().write(started, chunks, ended, cap=cap)

    logs = FailingOnce(store)
    sink = StepLogs(SqliteLogs(logs))
    sink.open("fa01", OWNER, worker="w1")
    sink.append("fa01", "first", "stdout")
    sink.close("fa01")
    trio.run(sink.flush)  # written in the caller: refused
    assert sink.lost_batches == 1 and sink.live("fa01")
    trio.run(sink.flush)  # the next batch carries its start and end
    [info] = logs.logs_with_prefix("fa01")
    assert info.ended_at is not None and info.lines == 1 and not sink.live("fa01")


def test_while_the_writer_is_behind_memory_holds_at_most_the_total_cap_across_steps(store):
    logs = SqliteLogStore(store)
    cap, total = 300 * 1024, 1024 * 1024
    sink = StepLogs(SqliteLogs(logs), cap=cap, total_cap=total)
    sink.writing = True  # a writer that never gets to write (the database locked, say)
    ids = [f"dd{n:02d}" for n in range(20)]  # 20 busy steps: 20 caps would be 6 MB
    for log_id in ids:
        sink.open(log_id, OWNER, worker="w1")
    for n in range(6_000):
        for log_id in ids:
            sink.append(log_id, f"{n:07d}" + "y" * 92, "stdout")  # 100 bytes
        assert sink.pending_bytes <= total + 256 * 1024
    sink.writing = False
    for log_id in ids:  # each written as it closes (StepLogs.opened, without a writer)
        sink.close(log_id)
        trio.run(sink.flush)
    for log_id in ids:  # each says what went, and keeps its newest lines
        lines, _ = _all_lines(logs, log_id)
        [info] = logs.logs_with_prefix(log_id)
        assert lines[-1].startswith("0005999")
        assert info.lines == 6_000 and info.dropped_lines + len(lines) == 6_000
        assert info.dropped_lines > 0
