"""The journal: rows made durable by an append, taken into a real store later, idempotently;
only step leases, read as a stream."""

import functools
import json
import os

import pytest
import trio

from swamp.bookkeeping.leases import POLICY, LeaseBook, journaled_lease, key
from swamp.domain.leases import LeaseState
from swamp.domain.query import parse as parse_predicate
from swamp.errors import StoreError
from swamp.store.datastore import Datastore
from swamp.store.journal import MAX_LINE_BYTES, Entry, Journal, Skipped, replay
from swamp.store.records import SqliteRecords


def lease_id(n: int) -> str:
    return f"{n:032x}"


def lease(n: int) -> Entry:
    book = LeaseBook(None, clock=lambda: 1_800_000_000.0 + n)
    opened = book.opened(lease_id=lease_id(n), worker="w1", model_type="swamp/echo",
                         model_name="default", method="echo")  # fmt: skip
    attrs = book.ended(opened, LeaseState.COMPLETED)
    return Entry(key(lease_id(n)), POLICY, attrs, 1_800_000_000.0 + n)


def take(store: Datastore, journal: Journal) -> int:
    return trio.run(functools.partial(replay, SqliteRecords(store), journal, admit=journaled_lease))


def leases_in(store: Datastore) -> list[tuple[str, int, str]]:
    found = store.query(parse_predicate('modelType == "swamp/step-lease"'), all_versions=True)
    return sorted((r.name, r.version, r.attributes["state"]) for r in found)


def test_entries_come_back_whole_and_in_order(tmp_path):
    journal = Journal(tmp_path / "swamp.journal")
    journal.append(lease(1))
    journal.append(lease(2))
    assert journal.entries() == [lease(1), lease(2)]
    journal.clear()
    assert journal.entries() == []
    assert os.path.getsize(tmp_path / "swamp.journal") == 0


def test_a_line_cut_short_is_skipped_and_the_whole_ones_kept(tmp_path, caplog):
    journal = Journal(tmp_path / "swamp.journal")
    journal.append(lease(1))
    with open(tmp_path / "swamp.journal", "ab") as file:
        file.write(lease(2).to_line()[:40])  # the machine stopped mid-write
    skipped = Skipped()
    assert journal.entries(skipped) == [lease(1)]
    assert skipped == Skipped(unreadable=1)


def test_a_damaged_line_that_is_still_json_is_skipped_and_the_boot_goes_on(tmp_path, caplog):
    store = Datastore(tmp_path / "swamp.db", orchestrator=True)
    journal = Journal(tmp_path / "swamp.journal")
    journal.append(lease(1))
    whole = lease(2).to_line().decode()
    damaged = [
        whole.replace('"infinite"', "7"),  # a lifetime that is not a duration
        whole.replace('"infinite"', '"forever"'),
        whole.replace(",1],", ',"ten"],'),  # versions kept, not a number
        whole.replace('"at":1800000002.0', '"at":"noon"'),
        whole.replace(f'"lease-{lease_id(2)}"', "null"),
        '{"key": [], "spec": [], "at": 0, "attributes": []}',
        "[1, 2, 3]",
    ]
    assert all(d != whole for d in damaged)
    with open(tmp_path / "swamp.journal", "a") as file:
        file.write("\n".join(damaged) + "\n")
    assert take(store, journal) == 1
    assert leases_in(store) == [(f"lease-{lease_id(1)}", 1, "completed")]
    assert "skipped 7 unreadable" in caplog.text
    assert len(caplog.records) == 1  # one line for all of them


def test_replay_puts_each_row_in_once_and_empties_the_journal(tmp_path):
    store = Datastore(tmp_path / "swamp.db", orchestrator=True)
    journal = Journal(tmp_path / "swamp.journal")
    for n in (1, 2):
        journal.append(lease(n))
    assert take(store, journal) == 2
    assert leases_in(store) == [
        (f"lease-{lease_id(1)}", 1, "completed"),
        (f"lease-{lease_id(2)}", 1, "completed"),
    ]
    assert journal.entries() == []
    # a crash between the commit and the emptying leaves the lines: taking them in again adds
    # nothing and doubles nothing
    for n in (1, 2, 3):
        journal.append(lease(n))
    assert take(store, journal) == 1
    assert [name for name, _, _ in leases_in(store)] == [f"lease-{lease_id(n)}" for n in (1, 2, 3)]
    record = store.latest(key(lease_id(3)))
    assert record is not None and record.created_at.startswith("2027-01-15")  # its own time
    assert take(store, journal) == 0


def planted(store: Datastore, journal: Journal, *lines: str) -> int:
    """Lines written into the journal by hand (as anyone who can write the file could), then
    the boot's replay."""
    journal.append(lease(1))  # one real row beside them: it goes in
    with open(journal.path, "a") as file:
        file.write("".join(line + "\n" for line in lines))
    return take(store, journal)


def line(model_type: str, model_name: str, name: str, spec: list, attributes: dict, at=1.8e9):
    body = {"key": [model_type, model_name, name], "spec": spec, "at": at,
            "attributes": attributes}  # fmt: skip
    return json.dumps(body)


def test_only_step_leases_are_taken_in_from_the_journal(tmp_path, caplog):
    store = Datastore(tmp_path / "swamp.db", orchestrator=True)
    journal = Journal(tmp_path / "swamp.journal")
    token = {"name": "evil", "state": "active", "createdAt": "2027-01-01T00:00:00.000Z",
             "secretHash": "0" * 64}  # fmt: skip
    good = lease(2).attributes
    as_lease = ["lease", "infinite", 1]
    foreign = [
        # the line that became a working admin credential
        line("swamp/server-token", "evil", "token", ["token", "infinite", 10], token),
        line("swamp/worker", "w9", "state", ["state", "infinite", 20], {"status": "idle"}),
        line("swamp/enrollment-token", "t", "token", ["token", "infinite", 10], token),
        # a lease's shape under another instance, spec or key
        line("swamp/step-lease", "other", f"lease-{lease_id(2)}", as_lease, good),
        line("swamp/step-lease", "leases", f"lease-{lease_id(2)}", ["lease", "1h", 1], good),
        line("swamp/step-lease", "leases", f"lease-{lease_id(3)}", as_lease, good),
        line("swamp/step-lease", "leases", "lease-x", as_lease, dict(good, leaseId="x")),
        # the lease's own key with attributes of the wrong kinds
        *(
            line("swamp/step-lease", "leases", f"lease-{lease_id(2)}", as_lease, attrs)
            for attrs in (
                dict(good, state="running"),
                dict(good, hasWrites="no"),
                dict(good, dispatchId=lease_id(9)),
                dict(good, workerName=["w1"]),
                dict(good, createdAt="noon"),
                dict(good, endedAt=7),
                dict(good, error={"deep": [1]}),
                dict(good, error="e" * 5000),
                dict(good, secretHash={"not": "scalar"}),
                dict(good, modelName="x\ud800"),
                {k: v for k, v in good.items() if k != "workerName"},
            )
        ),
    ]
    assert planted(store, journal, *foreign) == 1
    assert leases_in(store) == [(f"lease-{lease_id(1)}", 1, "completed")]
    assert store.latest_of_type("swamp/server-token") == []
    assert store.latest_of_type("swamp/worker") == []
    assert f"skipped {len(foreign)} not a step lease" in caplog.text
    assert len(caplog.records) == 1


def test_the_control_a_well_formed_lease_line_written_by_hand_is_taken_in(tmp_path):
    """The lines above are refused for what they hold, not for being written by hand."""
    store = Datastore(tmp_path / "swamp.db", orchestrator=True)
    journal = Journal(tmp_path / "swamp.journal")
    by_hand = line("swamp/step-lease", "leases", f"lease-{lease_id(2)}", ["lease", "infinite", 1],
                   dict(lease(2).attributes, later="a field a later version adds"))  # fmt: skip
    assert planted(store, journal, by_hand) == 2


def test_values_the_store_cannot_take_are_skipped_not_the_boots_end(tmp_path, caplog):
    store = Datastore(tmp_path / "swamp.db", orchestrator=True)
    journal = Journal(tmp_path / "swamp.journal")
    whole = lease(2).to_line().decode().strip()
    far = [whole.replace('"at":1800000002.0', f'"at":{at}') for at in ("1e308", "-1", "3e11")]
    deep = whole.replace('"hasWrites":false', '"hasWrites":' + "[" * 5000 + "]" * 5000)
    assert planted(store, journal, *far, deep) == 1
    assert "skipped 1 unreadable (cut short, or not an entry), 3 with a value the store" in (
        caplog.text
    )


def test_a_line_longer_than_any_row_is_skipped_without_being_held(tmp_path, caplog):
    store = Datastore(tmp_path / "swamp.db", orchestrator=True)
    journal = Journal(tmp_path / "swamp.journal")
    huge = '{"key": "' + "x" * (3 * MAX_LINE_BYTES) + '"}'
    assert planted(store, journal, huge, lease(2).to_line().decode().strip()) == 2
    assert "skipped 1 longer than" in caplog.text


def test_a_journal_is_taken_in_as_a_stream_in_bounded_batches(tmp_path, monkeypatch):
    """Memory does not follow the file: lines are read one at a time and taken in a batch at
    a time (counted here by the transactions it takes)."""
    store = Datastore(tmp_path / "swamp.db", orchestrator=True)
    journal = Journal(tmp_path / "swamp.journal")
    with open(journal.path, "wb") as file:
        for n in range(1, 2501):
            file.write(lease(n).to_line())
    transactions = []
    real = store.transaction

    def counted():
        transactions.append(len(transactions))
        return real()

    monkeypatch.setattr(store, "transaction", counted)
    read = []
    real_parse = Entry.parse

    def parse(line):
        read.append(len(transactions))  # how many batches had gone in when this line was read
        return real_parse(line)

    monkeypatch.setattr(Entry, "parse", staticmethod(parse))
    assert take(store, journal) == 2500
    assert len(transactions) == 3  # 1000, 1000, 500
    assert read[0] == 0 and read[1500] == 1 and read[-1] == 2  # read as the batches went in
    assert len(leases_in(store)) == 2500
    assert os.path.getsize(journal.path) == 0


def test_a_worker_s_long_error_is_capped_so_its_lease_comes_back_from_the_journal(tmp_path):
    """A failed dispatch's lease quotes the worker's error: capped, its line stays far below
    the line limit and is taken in like any other."""
    store = Datastore(tmp_path / "swamp.db", orchestrator=True)
    journal = Journal(tmp_path / "swamp.journal")
    book = LeaseBook(None, clock=lambda: 1.8e9)
    opened = book.opened(lease_id=lease_id(7), worker="w1", model_type="swamp/echo",
                         model_name="default", method="echo")  # fmt: skip
    ended = book.ended(opened, LeaseState.FAILED, error="\u00e9\U0001f600" * (2 << 20))
    entry = Entry(key(lease_id(7)), POLICY, ended, 1.8e9)
    assert len(entry.to_line()) < MAX_LINE_BYTES // 10
    journal.append(entry)
    assert take(store, journal) == 1


def test_a_journal_another_user_could_have_written_is_refused(tmp_path):
    """Its lines become the store's: a file others may write, or a link, is not opened."""
    path = tmp_path / "swamp.journal"
    Journal(path).close()
    path.chmod(0o666)
    with pytest.raises(StoreError, match="may be written by others"):
        Journal(path)
    path.chmod(0o600)
    Journal(path).close()  # the control: the same file, this user's alone
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("")
    path.unlink()
    path.symlink_to(elsewhere)
    with pytest.raises(StoreError, match="cannot open the journal"):
        Journal(path)
