"""The workflow run record: typed inside, the same JSON object on disk and on the wire as
before, and records saved by earlier versions read back (and rewritten) without losing a key."""

from swamp.bookkeeping.workflow_runs import INTERRUPTED, RunBook, key
from swamp.domain.run_record import JobRecord, RunRecord, Status, StepRecord
from swamp.models.builtin import WORKFLOW_RUN
from swamp.store.datastore import Datastore
from swamp.store.records import SqliteRecords
from tests.harness.synced import Synced

# as the engine of the previous version saved one: a job that ran a fan-out step on a worker,
# one skipped, and a run still running when its orchestrator died
SAVED = {
    "runId": "0123456789abcdef",
    "workflow": "deploy",
    "status": "running",
    "inputs": {"hosts": ["a", "b"]},
    "startedAt": "2026-01-02T03:04:05.000Z",
    "jobs": [
        {
            "name": "build",
            "status": "running",
            "steps": [
                {
                    "name": "compile-a",
                    "status": "running",
                    "template": "compile",
                    "startedAt": "2026-01-02T03:04:06.000Z",
                    "model": "cc",
                    "modelType": "swamp/shell",
                    "method": "execute",
                    "requirement": "labels fleet=x",
                    "queuedAt": "2026-01-02T03:04:06.000Z",
                    "worker": "w-1",
                    "dispatchId": "d-1",
                    "queuedMs": 12,
                    "logTail": ["one", "two"],
                    "allowedFailure": None,
                    "somethingNewer": {"kept": True},
                },
                {"name": "lint", "status": "skipped", "reason": "guard x"},
            ],
        },
        {"name": "ship", "status": "pending", "steps": [{"name": "push", "status": "pending"}]},
    ],
}


def test_a_saved_record_reads_back_typed_and_writes_back_as_it_was():
    run = RunRecord.from_json(SAVED)
    assert run.status is Status.RUNNING and run.jobs[0].steps[0].worker == "w-1"
    assert run.jobs[0].steps[0].log_tail == ["one", "two"]
    assert run.jobs[0].steps[0].extra == {"somethingNewer": {"kept": True}}
    again = run.to_json()
    # every key and value, an unknown one included; only a null is no longer written
    expected = {**SAVED}
    expected["jobs"] = [dict(j) for j in SAVED["jobs"]]
    expected["jobs"][0]["steps"] = [
        {k: v for k, v in s.items() if v is not None} for s in SAVED["jobs"][0]["steps"]
    ]
    assert again == expected


def test_statuses_are_their_wire_values():
    assert Status.FAILED == "failed" and f"{Status.FAILED}" == "failed"
    step = StepRecord("s", Status.SUCCEEDED)
    assert step.to_json() == {"name": "s", "status": "succeeded"}
    assert type(step.to_json()["status"]) is str
    # a status this version does not know is kept as the text it was
    assert StepRecord.from_json({"name": "s", "status": "paused"}).status == "paused"


def test_a_new_record_is_what_the_engine_wrote_before():
    run = RunRecord(
        run_id="r",
        workflow="w",
        started_at="t",
        inputs={},
        jobs=[JobRecord("j", steps=[StepRecord("s")])],
    )
    assert run.to_json() == {
        "runId": "r",
        "workflow": "w",
        "status": "running",
        "inputs": {},
        "startedAt": "t",
        "jobs": [{"name": "j", "status": "pending", "steps": [{"name": "s", "status": "pending"}]}],
    }


def test_a_restart_marks_a_saved_running_run_failed_and_keeps_the_rest(tmp_path):
    store = Datastore(tmp_path / "data.db")
    try:
        policy = WORKFLOW_RUN.resources[0].policy
        store.write(key("deploy", SAVED["runId"]), SAVED, policy=policy)
        book = Synced(RunBook(SqliteRecords(store), clock=lambda: 1767323045.0))
        assert book.reconcile() == 1
        raw = store.latest(key("deploy", SAVED["runId"])).attributes
        assert raw["status"] == "failed" and raw["error"] == INTERRUPTED
        build, ship = raw["jobs"]
        assert build["status"] == "failed" and build["steps"][0]["error"] == INTERRUPTED
        assert build["steps"][0]["somethingNewer"] == {"kept": True}
        assert build["steps"][1] == {"name": "lint", "status": "skipped", "reason": "guard x"}
        assert ship == SAVED["jobs"][1]  # pending: untouched
        assert book.get(SAVED["runId"][:6]).status == Status.FAILED
        assert book.reconcile() == 0
    finally:
        store.close()
