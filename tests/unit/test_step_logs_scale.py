"""Step logs of a fan-out: a page costs the page, not the run — a run of thousands of steps is
read whole in a bounded number of requests, each reply well under the frame limit."""

import time

import trio

from swamp.admin import step_logs as pages
from swamp.bookkeeping.workflow_runs import RunWriter
from swamp.domain.run_record import JobRecord, RunRecord, Status, StepRecord
from swamp.domain.step_logs import LogOwner
from swamp.protocol.frames import MAX_FRAME_BYTES
from swamp.protocol.messages import LogsRequest
from swamp.store.datastore import Datastore
from swamp.store.records import SqliteRecords
from swamp.store.step_logs import Chunk, LogEnd, LogStart, SqliteLogs, SqliteLogStore
from tests.harness.synced import Synced

N = 10_000
# a forEach over a fleet's host names (name = "uptime-${{ item }}")
STEP_NAMES = [f"web-{i:05d}.eu-west-1.prod" for i in range(N)]
RUN_ID = "0123456789abcdef0123456789abcdef"


def _setup(tmp_path, db=None, n=None):
    N = n or globals()["N"]
    store = Datastore(db or tmp_path / "swamp.db", orchestrator=True)
    run = RunRecord(
        run_id=RUN_ID,
        workflow="uptime-everywhere",
        started_at="2026-01-02T03:04:05.000Z",
        status=Status.SUCCEEDED,
        jobs=[
            JobRecord(
                "check",
                Status.SUCCEEDED,
                steps=[
                    StepRecord(f"uptime-{STEP_NAMES[i]}", Status.SUCCEEDED, template="uptime")
                    for i in range(N)
                ],
            )
        ],
    )
    writer = Synced(RunWriter(SqliteRecords(store), run))
    for step in run.jobs[0].steps:
        writer.add("check", step)
    while writer.pending:
        writer.flush(limit=1000)
    logs = SqliteLogStore(store)
    started, chunks, ended = [], [], []
    for i in range(N):
        log_id = f"{RUN_ID[:8]}{i:024x}"
        owner = LogOwner(
            "swamp/echo",
            f"run-{i:016x}",
            "run",
            run_id=RUN_ID,
            workflow="uptime-everywhere",
            job="check",
            step=f"uptime-{STEP_NAMES[i]}",
        )
        started.append(LogStart(log_id, owner, f"edge-{i % 4:08x}", 1, time.time()))
        chunks.append(Chunk(log_id, 0, 0, ["up 3 days"], "o", 10))
        ended.append(LogEnd(log_id, time.time(), 1, 10))
    logs.write(started, chunks, ended, cap=1 << 25)
    return store, logs


def _frame_bytes(page) -> int:
    import json

    return len(json.dumps(page.to_json(), separators=(",", ":")))


def test_a_logs_page_of_a_10000_step_run_fits_in_a_frame(tmp_path):
    store, logs = _setup(tmp_path)
    for request in (LogsRequest(ref=RUN_ID, chunks=False), LogsRequest(ref=RUN_ID)):
        page = trio.run(
            lambda r=request: pages.read(
                r, db=SqliteRecords(store), logs=SqliteLogs(logs), live=None
            )
        )
        assert _frame_bytes(page) < MAX_FRAME_BYTES // 2
    assert page.log_count == N and page.open_logs == 0 and page.status == "succeeded"


class CountingAdmin:
    """``logs.read`` as the local route answers it, counting requests and the largest reply."""

    def __init__(self, store, logs):
        self.store, self.logs = store, logs
        self.requests = 0
        self.largest = 0

    async def logs_read(self, request):
        self.requests += 1
        page = await pages.read(
            request, db=SqliteRecords(self.store), logs=SqliteLogs(self.logs), live=None
        )
        self.largest = max(self.largest, _frame_bytes(page))
        return page


def test_swamp_logs_reads_a_run_of_thousands_of_steps_in_a_few_requests(tmp_path, capsys):
    from swamp.cli.logs_cmd import show

    n = 3000
    store, logs = _setup(tmp_path, n=n)
    admin = CountingAdmin(store, logs)
    shown = trio.run(lambda: show(admin, RUN_ID[:8], follow=False, json_output=False))
    out = capsys.readouterr().out.splitlines()
    assert shown["lines"] == n and shown["logs"] == n and not shown["unfinished"]
    assert len(out) == n and out[0] == f"uptime-{STEP_NAMES[0]} │ up 3 days"
    assert admin.requests <= 2 + n // 1000  # pages of chunks, not a request per step
    assert admin.largest < MAX_FRAME_BYTES // 2
    one = CountingAdmin(store, logs)  # one step of it, by name, as JOB.STEP
    shown = trio.run(
        lambda: show(one, f"{RUN_ID}/check.uptime-{STEP_NAMES[7]}", follow=False, json_output=False)
    )
    assert capsys.readouterr().out.splitlines() == ["up 3 days"] and one.requests == 2


def test_one_log_of_a_run_is_read_by_its_id_and_a_log_of_another_run_is_not(tmp_path):
    store, logs = _setup(tmp_path, n=50)
    five = f"{RUN_ID[:8]}{5:024x}"
    page = trio.run(
        lambda: pages.read(
            LogsRequest(ref=RUN_ID, log=five),
            db=SqliteRecords(store),
            logs=SqliteLogs(logs),
            live=None,
        )
    )
    assert [c.log for c in page.chunks] == [five] and [i.id for i in page.logs] == [five]
    assert page.kind == "run" and page.log_count == 50
    other = "f" * 32
    page = trio.run(
        lambda: pages.read(
            LogsRequest(ref=RUN_ID, log=other),
            db=SqliteRecords(store),
            logs=SqliteLogs(logs),
            live=None,
        )
    )
    assert page.chunks == [] and page.logs == []
