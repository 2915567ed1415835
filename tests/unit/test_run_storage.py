"""Runs stored step by step (real SQLite): a small header and a record per step, written a
batch at a time, each changed step once; read back whole, listed from the headers alone,
reconciled and collected with their steps."""

import json

import pytest
import trio
import trio.testing

from swamp.admin.local import RepoAdmin
from swamp.bookkeeping.workflow_runs import (
    INTERRUPTED,
    STEP_TYPE,
    TYPE,
    RunBook,
    RunWriter,
    key,
    step_key,
)
from swamp.domain.run_record import JobRecord, RunRecord, Status, StepRecord
from swamp.errors import NotFound, QueueTimeout, UserError
from swamp.models.builtin import WORKFLOW_RUN
from swamp.protocol.messages import RunRef, WorkflowRunRequest
from swamp.store.datastore import Datastore
from swamp.store.records import SqliteRecords
from swamp.workflows import engine as engine_module
from swamp.workflows.engine import FEED_FLOOR, FLUSH_CHUNK, Engine, Host
from swamp.workflows.loader import Workflows
from tests.harness.synced import Synced
from tests.unit.engine_harness import Worker, open_rig

NOW = 1767323045.0


def _run(steps: int, run_id: str = "ab12cd34ef56") -> RunRecord:
    return RunRecord(
        run_id=run_id,
        workflow="deploy",
        started_at="2026-01-02T03:04:05.000Z",
        inputs={"n": steps},
        jobs=[
            JobRecord("build", Status.RUNNING, steps=[StepRecord(f"s-{i}") for i in range(steps)]),
            JobRecord("ship", steps=[StepRecord("push")]),
        ],
    )


def run_book(store: Datastore, **kwargs) -> Synced:
    return Synced(RunBook(SqliteRecords(store), **kwargs))


def run_writer(store: Datastore, run: RunRecord) -> Synced:
    return Synced(RunWriter(SqliteRecords(store), run))


def _writer(store: Datastore, run: RunRecord) -> Synced:
    writer = run_writer(store, run)
    for job in run.jobs:
        for step in job.steps:
            writer.add(job.name, step)
    writer.flush()
    return writer


def test_a_run_is_a_small_header_and_a_record_per_step_and_reads_back_whole(tmp_path):
    store = Datastore(tmp_path / "data.db")
    try:
        run = _run(3)
        writer = _writer(store, run)
        first, second = run.jobs[0].steps[:2]
        first.status, first.worker = Status.SUCCEEDED, "w-1"
        second.status = Status.RUNNING
        writer.changed(first)
        writer.changed(second)
        writer.flush()
        header = store.latest(key("deploy", run.run_id)).attributes
        assert "steps" not in header["jobs"][0] and header["layout"] == 2
        assert header["jobs"][0]["stepCounts"] == {"succeeded": 1, "running": 1, "pending": 1}
        assert header["jobs"][1]["stepCounts"] == {"pending": 1}
        stored = store.latest(step_key("deploy", run.run_id, 0)).attributes
        assert stored == {
            "name": "s-0",
            "status": "succeeded",
            "worker": "w-1",
            "runId": run.run_id,
            "job": "build",
            "seq": 0,
        }
        book = run_book(store)
        assert book.get(run.run_id[:6]) == run  # the whole tree, in its order
        assert book.get(run.run_id).to_json() == run.to_json()
        [summary] = book.summaries()
        assert (summary["steps"], summary["succeeded"], summary["status"]) == (4, 1, "running")
        assert book.status(run.run_id) == "running"
    finally:
        store.close()


def test_a_step_changed_many_times_in_a_window_is_written_once(tmp_path):
    store = Datastore(tmp_path / "data.db")
    try:
        run = _run(2)
        writer = _writer(store, run)
        step = run.jobs[0].steps[1]
        for status in (Status.RUNNING, Status.RUNNING, Status.SUCCEEDED):
            step.status = status
            writer.changed(step)
        before = store.writes
        assert writer.flush() == 1
        assert store.writes - before == 2  # that step once, and the header
        assert store.versions(step_key("deploy", run.run_id, 1)) == [2]  # replaced in place
        assert store.latest(step_key("deploy", run.run_id, 1)).attributes["status"] == "succeeded"
        assert not writer.pending and writer.flush() == 0
    finally:
        store.close()


def test_a_transition_costs_the_same_at_the_ten_thousandth_step(tmp_path):
    store = Datastore(tmp_path / "data.db")
    try:
        small, large = _run(10, "a" * 12), _run(10_000, "b" * 12)
        sizes = []
        for run in (small, large):
            writer = _writer(store, run)
            step = run.jobs[0].steps[-1]
            step.status = Status.SUCCEEDED
            writer.changed(step)
            before = store.writes
            writer.flush()
            assert store.writes - before == 2
            header = store.latest(key("deploy", run.run_id)).attributes
            sizes.append(len(json.dumps(header)))
        assert abs(sizes[0] - sizes[1]) < 16  # the header says how many, not which
    finally:
        store.close()


def test_a_restart_fails_a_running_run_and_every_step_that_had_not_ended(tmp_path):
    """A crash loses the last batch window at most: a step stored pending may have started
    in it, so every step that had not ended is failed, interrupted; ended ones stay."""
    store = Datastore(tmp_path / "data.db")
    try:
        run = _run(3)
        writer = _writer(store, run)
        done, running, _ = run.jobs[0].steps
        done.status, running.status = Status.SUCCEEDED, Status.RUNNING
        writer.changed(done)
        writer.changed(running)
        writer.flush()
        book = run_book(store, clock=lambda: NOW)
        assert book.reconcile() == 1
        again = book.get(run.run_id)
        assert (again.status, again.error) == (Status.FAILED, INTERRUPTED)
        build, ship = again.jobs
        assert build.status == Status.FAILED
        assert [(s.status, s.error) for s in build.steps] == [
            (Status.SUCCEEDED, None),
            (Status.FAILED, INTERRUPTED),
            (Status.FAILED, INTERRUPTED),
        ]
        assert ship.status == Status.PENDING  # a job that had not started: as it was
        assert (ship.steps[0].status, ship.steps[0].error) == (Status.FAILED, INTERRUPTED)
        header = store.latest(key("deploy", run.run_id)).attributes
        assert header["jobs"][0]["stepCounts"] == {"succeeded": 1, "failed": 2}
        assert book.summaries()[0]["status"] == "failed"
        assert book.reconcile() == 0
    finally:
        store.close()


def test_a_crash_during_the_final_save_leaves_no_step_running_under_an_ended_run(tmp_path):
    """The final save of a large run takes several transactions; the header's end goes in the
    last. Cut short after the first, the stored run is still running: the next start fails it
    and every step left unended."""
    store = Datastore(tmp_path / "data.db")
    try:
        run = RunRecord(
            run_id="ab12cd34ef56ab12cd34ef56ab12cd34",
            workflow="wide",
            started_at="2026-01-02T03:04:05.000Z",
            status=Status.RUNNING,
            jobs=[
                JobRecord(
                    "j",
                    Status.RUNNING,
                    steps=[StepRecord(f"s-{i}", Status.RUNNING) for i in range(1200)],
                )
            ],
        )
        writer = run_writer(store, run)
        for step in run.jobs[0].steps:
            writer.add("j", step)
        while writer.pending:
            writer.flush(limit=FLUSH_CHUNK)
        for step in run.jobs[0].steps:  # workflow cancel: then save() a chunk at a time
            step.status = Status.CANCELLED
            writer.changed(step)
        run.status = run.jobs[0].status = Status.CANCELLED
        writer.header_changed()
        writer.flush(limit=FLUSH_CHUNK)  # the first of three transactions; then the crash
        book = run_book(store, clock=lambda: NOW)
        assert book.header(run.run_id)["status"] == "running"
        assert book.reconcile() == 1  # the next start
        stored = book.get(run.run_id)
        assert (stored.status, stored.error) == (Status.FAILED, INTERRUPTED)
        statuses = [s.status for s in stored.jobs[0].steps]
        assert statuses.count(Status.CANCELLED) == FLUSH_CHUNK
        assert statuses.count(Status.FAILED) == 1200 - FLUSH_CHUNK
    finally:
        store.close()


def test_a_restart_fails_steps_left_unended_under_a_run_that_ended(tmp_path):
    """A run stored by a final save cut short before this version wrote the header last: its
    header ended, some steps still running. The next start fails those steps and keeps the
    run's status; a run that ended whole is not read again."""
    store = Datastore(tmp_path / "data.db")
    try:
        run = _run(3)
        writer = _writer(store, run)
        for step in run.jobs[0].steps:
            step.status = Status.RUNNING
            writer.changed(step)
        writer.flush()
        first = run.jobs[0].steps[0]
        first.status = Status.CANCELLED
        writer.changed(first)
        run.status = run.jobs[0].status = run.jobs[1].status = Status.CANCELLED
        run.error = "cancelled"
        writer.header_changed()
        writer.flush()  # an ended header over two running steps and a pending one
        book = run_book(store, clock=lambda: NOW)
        assert book.reconcile() == 1
        again = book.get(run.run_id)
        assert (again.status, again.error) == (Status.CANCELLED, "cancelled")
        assert [s.status for s in again.jobs[0].steps] == [
            Status.CANCELLED,
            Status.FAILED,
            Status.FAILED,
        ]
        assert again.jobs[1].steps[0].status == Status.FAILED
        assert book.reconcile() == 0
    finally:
        store.close()


def test_collecting_a_run_takes_its_steps_and_never_a_running_run(tmp_path):
    store = Datastore(tmp_path / "data.db")
    try:
        old, running = _run(1500, "0ld0ld0ld0ld"), _run(2, "11ve11ve11ve")
        old.status, old.ended_at = Status.SUCCEEDED, "2026-01-01T00:00:00.000Z"
        _writer(store, old)
        _writer(store, running)  # running, no end: never collected, however old
        policy = WORKFLOW_RUN.resources[0].policy
        whole = _run(1, "wh01ewh01ewh").to_json()  # as earlier versions stored runs
        whole.update(status="failed", endedAt="2026-01-01T00:00:00.000Z")
        store.write(key("deploy", whole["runId"]), whole, policy=policy)
        book = run_book(store, clock=lambda: NOW + 30 * 86400)
        assert book.collect(older_than_seconds=7 * 86400) == 1501 + 1 + 1  # steps, headers
        assert [h["runId"] for h in book.headers()] == [running.run_id]
        assert len(store.latest_of_type(STEP_TYPE)) == 3  # the running run's
        assert len(store.latest_of_type(TYPE)) == 1
    finally:
        store.close()


def test_a_whole_run_stored_by_an_earlier_version_is_listed_and_read(tmp_path):
    store = Datastore(tmp_path / "data.db")
    try:
        run = _run(2)
        run.jobs[0].steps[0].status = Status.SUCCEEDED
        policy = WORKFLOW_RUN.resources[0].policy
        store.write(key("deploy", run.run_id), run.to_json(), policy=policy)
        book = run_book(store)
        assert book.get(run.run_id) == run
        [summary] = book.summaries("deploy")
        assert (summary["steps"], summary["succeeded"]) == (3, 1)
    finally:
        store.close()


ECHO = 'task = { type = "model_method", modelIdOrName = "swamp/echo", methodName = "echo" }'
WIDE = f"""\
    name = "wide"
    [inputs.properties.items]
    type = "array"
    [[jobs]]
    name = "fan"
    [[jobs.steps]]
    name = "each"
    forEach = {{ item = "i", in = "${{{{ inputs.items }}}}" }}
    labels = {{ fleet = "edge" }}
    {ECHO}
    [[jobs.steps]]
    name = "after"
    dependsOn = [{{ step = "each", condition = {{ type = "succeeded" }} }}]
    labels = {{ fleet = "edge" }}
    {ECHO}
"""


async def test_a_fan_out_is_fed_a_window_at_a_time_and_written_in_batches(tmp_path):
    async with open_rig(tmp_path, Worker("edge-1", {"fleet": "edge"}, capacity=8)) as rig:
        rig.workflow("wide", WIDE)
        size = FEED_FLOOR * 3
        gates = [rig.fleet.hold(f"each-{i}") for i in range(size)]
        ran: list[dict] = []
        async with trio.open_nursery() as nursery:

            async def run() -> None:
                ran.append(await rig.run("wide", {"items": list(range(size))}))

            nursery.start_soon(run)
            await rig.fleet.started("each-0")
            await trio.testing.wait_all_tasks_blocked()
            # one window started (8 slots connected: the floor), the rest wait their turn
            assert len(rig.fleet.dispatches) == FEED_FLOOR
            gates[0].set()
            await rig.fleet.started(f"each-{FEED_FLOOR}")
            await trio.testing.wait_all_tasks_blocked()
            assert len(rig.fleet.dispatches) == FEED_FLOOR + 1  # one ended, one more fed
            for gate in gates:
                gate.set()
        [record] = ran
        steps = rig.steps(record)
        assert len(steps) == size + 1 and all(s["status"] == "succeeded" for s in steps.values())
        assert [s for _, s in rig.said("dispatched")][-1] == "after"  # after all of them
        # each step is written a few times at most (made, started, ended — fewer when they
        # fall in one window), never the whole run at each transition
        assert len(rig.store.latest_of_type(STEP_TYPE)) == size + 1
        assert rig.store.writes < (size + 1) * 4


async def test_more_items_than_the_orchestrator_allows_fail_the_job_naming_the_setting(tmp_path):
    async with open_rig(tmp_path, Worker("edge-1", {"fleet": "edge"})) as rig:
        rig.workflow("wide", WIDE)
        host = Host(run_step=rig.fleet.run_step, workers_connected=rig.fleet.connected)
        rig.engine = Engine(
            Workflows(rig.repo, rig.fleet.registry),
            SqliteRecords(rig.store),
            host,
            max_fan_out=3,
        )
        record = await rig.run("wide", {"items": [1, 2, 3]})
        assert record["status"] == "succeeded"
        record = await rig.run("wide", {"items": [1, 2, 3, 4]})
        job = record["jobs"][0]
        assert job["status"] == "failed" and record["status"] == "failed"
        assert "gave 4 items; a step runs at most 3 times" in job["error"]
        assert "--max-fan-out (max-fan-out in swamp.toml [serve])" in job["error"]
        assert rig.fleet.dispatches and len(rig.fleet.dispatches) == 4  # the first run's only


def test_a_run_larger_than_a_frame_holds_comes_in_pages_that_add_up_to_it(tmp_path):
    from swamp.domain.run_record import merge_page, page

    run = _run(1000)
    run.jobs[1].steps[0].log_tail = ["x" * 400]
    store = Datastore(tmp_path / "data.db")
    try:
        _writer(store, run)  # every step has its place
        whole = run.to_json()
        for read in (
            lambda offset: page(run, offset, budget=8000),  # the live run's
            lambda offset: run_book(store).page(run.run_id, offset),
        ):  # the stored
            first, offset = read(0)
            pages = 1
            while offset is not None:
                more, offset = read(offset)
                merge_page(first, more)
                pages += 1
            assert first == whole
        # a page from the store is a range of at most PAGE_ROWS steps
        shown, offset = run_book(store).page(run.run_id[:6], 0)
        assert offset is None and shown == whole
        first, offset = page(run, 0, budget=8000)
        assert offset is not None and 0 < len(first["jobs"][0]["steps"]) < 1000
        assert first["jobs"][1]["steps"] == [] and first["runId"] == run.run_id
        assert len(json.dumps(first, separators=(",", ":"))) < 8000 + 1000
        assert page(run, 0)[1] is None  # the default budget: all of it in one
        huge, offset = page(run, 1000, budget=10)  # one step at least, however large
        assert len(huge["jobs"][1]["steps"]) == 1 and offset is None
    finally:
        store.close()


def test_pages_of_a_stored_run_are_read_a_range_at_a_time(tmp_path, monkeypatch):
    from swamp.bookkeeping import workflow_runs
    from swamp.domain.run_record import merge_page

    monkeypatch.setattr(workflow_runs, "PAGE_ROWS", 7)
    store = Datastore(tmp_path / "data.db")
    try:
        run = _run(30)
        _writer(store, run)
        book = run_book(store)
        first, offset = book.page(run.run_id, 0)
        assert offset == 7 and len(first["jobs"][0]["steps"]) == 7
        reads = 1
        while offset is not None:
            more, offset = book.page(run.run_id, offset)
            merge_page(first, more)
            reads += 1
        assert first == run.to_json() and reads == 5  # 31 steps, 7 a read
    finally:
        store.close()


async def test_an_item_fed_late_in_a_long_fan_out_gets_its_whole_queue_timeout(
    tmp_path, autojump_clock
):
    """An item's queueTimeout counts from when it was fed, as any step's: the 65th item of a
    window of 64, fed 601 s in (the first window ran ten minutes), is given its own 60 s,
    not the second the fan-out's feeding had left of it."""
    async with open_rig(tmp_path, Worker("edge-1", {"fleet": "edge"}, capacity=8)) as rig:
        rig.workflow(
            "wide",
            WIDE.replace(
                'labels = { fleet = "edge" }\n',
                'labels = { fleet = "edge" }\n    queueTimeout = "60s"\n',
                1,
            ),
        )
        given: dict[str, str | None] = {}

        async def run_step(request, emit):
            given[request.step] = request.queue_timeout
            return await rig.fleet.run_step(request, emit)

        host = Host(run_step=run_step, workers_connected=rig.fleet.connected)
        rig.engine = Engine(Workflows(rig.repo, rig.fleet.registry), SqliteRecords(rig.store), host)
        window = [rig.fleet.hold(f"each-{i}") for i in range(FEED_FLOOR)]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(rig.run, "wide", {"items": list(range(FEED_FLOOR + 1))})
            await rig.fleet.started(f"each-{FEED_FLOOR - 1}")
            await trio.sleep(601)
            assert f"each-{FEED_FLOOR}" not in given  # still waiting its turn
            for gate in window:
                gate.set()
        assert given["each-0"] == given[f"each-{FEED_FLOOR}"] == "60s"
        assert given["after"] is None  # not an expansion: its own (the orchestrator's)


async def test_a_fan_out_over_workers_that_never_come_ends_after_one_queue_timeout(
    tmp_path, autojump_clock
):
    """No worker has the fan-out's labels: the first window waits its queue timeout, an item
    times out with no matching worker connected, and the items not yet fed fail with that
    reason at once — the run ends about one queue timeout after it began, not a window after
    a window."""
    async with open_rig(tmp_path, Worker("other-1", {"fleet": "other"}, capacity=8)) as rig:
        rig.workflow(
            "wide",
            WIDE.replace(
                'labels = { fleet = "edge" }\n',
                'labels = { fleet = "edge" }\n    queueTimeout = "60s"\n',
                1,
            ),
        )
        fed: list[str] = []

        async def run_step(request, emit):  # the queue: nobody matching ever takes it
            fed.append(request.step)
            assert request.queue_timeout == "60s"
            await trio.sleep(60)
            raise QueueTimeout(
                f"timed out waiting for a worker matching {request.placement.describe()} "
                "to become available"
            )

        host = Host(run_step=run_step, workers_connected=rig.fleet.connected)
        rig.engine = Engine(Workflows(rig.repo, rig.fleet.registry), SqliteRecords(rig.store), host)
        began = trio.current_time()
        record = await rig.run("wide", {"items": list(range(FEED_FLOOR * 4))})
        assert trio.current_time() - began < 61
        assert len(fed) == FEED_FLOOR  # one window was fed, no more
        steps = rig.steps(record)
        assert record["status"] == "failed"
        unfed = steps[f"each-{FEED_FLOOR * 4 - 1}"]
        assert unfed["status"] == "failed"
        assert unfed["error"].startswith("not started: each-")
        assert "no worker matching" in unfed["error"]
        assert steps["each-0"]["status"] == "failed"
        assert steps["after"]["status"] == "skipped"


async def test_a_fan_out_on_a_busy_fleet_keeps_feeding_after_an_item_times_out(
    tmp_path, autojump_clock
):
    """An item that timed out in the queue while a matching worker is connected waited on a
    busy fleet: it fails, the items after it are still fed."""
    async with open_rig(tmp_path, Worker("edge-1", {"fleet": "edge"}, capacity=8)) as rig:
        rig.workflow("wide", WIDE)
        fed: list[str] = []

        async def run_step(request, emit):
            fed.append(request.step)
            if request.step == "each-0":
                raise QueueTimeout("timed out waiting for a worker matching fleet=edge")
            return await rig.fleet.run_step(request, emit)

        host = Host(run_step=run_step, workers_connected=rig.fleet.connected)
        rig.engine = Engine(Workflows(rig.repo, rig.fleet.registry), SqliteRecords(rig.store), host)
        record = await rig.run("wide", {"items": list(range(FEED_FLOOR * 2))})
        steps = rig.steps(record)
        assert steps["each-0"]["status"] == "failed"
        assert all(steps[f"each-{i}"]["status"] == "succeeded" for i in range(1, FEED_FLOOR * 2))
        assert len([n for n in fed if n.startswith("each-")]) == FEED_FLOOR * 2


ONE = f"""\
    name = "one"
    [[jobs]]
    name = "j"
    [[jobs.steps]]
    name = "s"
    labels = {{ fleet = "edge" }}
    {ECHO}
"""


class _Dispatch:
    """What workflow cancel needs of the orchestrator's dispatch: a step runner."""

    def __init__(self, run_step) -> None:
        self.run = run_step


async def test_workflow_cancel_waits_for_the_run_to_end_and_answers_a_page(tmp_path, monkeypatch):
    """workflow cancel waits on the run's end (not a re-read of every run) and answers the
    first page, read as the header and a range of steps — never the whole run."""
    async with open_rig(tmp_path, Worker("edge-1", {"fleet": "edge"})) as rig:
        rig.workflow("one", ONE)
        admin = RepoAdmin(
            rig.repo, rig.store, dispatch=_Dispatch(rig.fleet.run_step), registry=rig.fleet.registry
        )
        rig.fleet.hold("s")
        replies: list[dict] = []

        async def run() -> None:
            reply = await admin.workflow_run(WorkflowRunRequest(name="one", inputs={}))
            replies.append(reply.run)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            await rig.fleet.started("s")
            run_id = (await RunBook(SqliteRecords(rig.store)).headers())[0]["runId"]

            async def whole(*_args, **_kw):
                raise AssertionError("read whole")

            monkeypatch.setattr(RunBook, "get", whole)
            monkeypatch.setattr(RunBook, "status", whole)
            reply = await admin.workflow_cancel(RunRef(run=run_id[:8], reason="enough"))
        assert reply.run["status"] == "cancelled" and reply.run["error"] == "enough"
        assert reply.run["jobs"][0]["steps"][0]["status"] == "cancelled"
        assert replies[0]["status"] == "cancelled"


async def test_a_run_of_more_steps_than_its_places_number_fails_the_job(tmp_path, monkeypatch):
    """A run's steps are numbered in seven digits, read back in text order: a job that would
    take the run past the places fails, saying so, instead of breaking the order."""
    monkeypatch.setattr(engine_module, "RUN_PLACES", 10)
    async with open_rig(tmp_path, Worker("edge-1", {"fleet": "edge"}, capacity=8)) as rig:
        rig.workflow("wide", WIDE)
        # the file's 2 steps, then the 9 expansions and 'after' again (places are not reused)
        record = await rig.run("wide", {"items": list(range(9))})
        (job,) = record["jobs"]
        assert job["status"] == "failed"
        said = "job 'fan' would number the run's steps to 12; a run numbers at most 10"
        assert job["error"] == f"{said} (split the work between runs)"
        assert rig.fleet.dispatches == []


def test_a_run_is_found_by_its_id_without_reading_every_run(tmp_path):
    """Found in review: finding a run by its id (a page of it, its cancel, the web pages'
    run page) decoded every run header in the repo, on the event loop — a third of a second
    at a week of runs. Now each workflow's runs are read as a range of the key."""
    store = Datastore(tmp_path / "data.db")
    try:
        for n in range(30):
            _writer(store, _run(1, run_id=f"{n:02d}aa{n:08d}"))
        for twin in ("cafe00000001", "cafe00000002"):
            _writer(store, _run(1, run_id=twin))
        other = _run(1, run_id="99bb00000000")
        other.workflow = "release"
        _writer(store, other)
        book = run_book(store)
        calls = []
        every = store.latest_of_type
        store.latest_of_type = lambda *a, **k: calls.append(a) or every(*a, **k)  # type: ignore[method-assign]
        assert book.header("07aa")["runId"] == "07aa00000007"
        assert book.header("99bb")["workflow"] == "release"  # any workflow's runs
        with pytest.raises(UserError, match="ambiguous"):
            book.header("cafe")
        with pytest.raises(NotFound):
            book.header("dead")
        assert calls == []  # no run read but the matches
    finally:
        store.close()


READS = """\
    name = "reads"
    [[jobs]]
    name = "j"
    [[jobs.steps]]
    name = "look"
    forEach = { item = "i", in = "${{ [data.latest('inst', 'item').attributes.v] }}" }
    labels = { fleet = "edge" }
    task = { type = "model_method", modelIdOrName = "swamp/echo", methodName = "echo", \
inputs = { message = "${{ data.query('modelType == \\"test/thing\\"')[0].attributes.v }}|\
${{ data.latest('nothing', 'here') }}|${{ data.query('name == \\"zzz\\"') }}" } }
"""


async def test_expressions_read_data_through_the_seam_each_piece_once_a_rendering(tmp_path):
    """An expression's data is read by the engine, awaited (the store may be a server), and
    the expression evaluated again with it: a rendering reads each piece it asks for once."""
    from swamp.store.datastore import Key, SpecPolicy

    async with open_rig(tmp_path, Worker("edge-1", {"fleet": "edge"})) as rig:
        rig.store.write(Key("test/thing", "inst", "item"), {"v": 7}, policy=SpecPolicy("thing"))
        rig.workflow("reads", READS)
        reads = []
        look_up = rig.engine.db.query
        rig.engine.db.query = lambda *a, **k: reads.append(a[0]) or look_up(*a, **k)  # type: ignore[method-assign]
        record = await rig.run("reads")
        assert record["status"] == "succeeded", record
        [dispatch] = rig.fleet.dispatches
        assert dispatch.step == "look-7"  # its forEach read it
        assert dispatch.args["message"] == "7||[]"  # found, none (null), none ([])
        assert len(reads) == 4  # the forEach's one; the message's three, each read once
