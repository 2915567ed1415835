"""The journal: rows made durable by an append, taken into a real store later, idempotently."""

import os

from swamp.bookkeeping.leases import POLICY, key
from swamp.domain.query import parse as parse_predicate
from swamp.store.datastore import Datastore
from swamp.store.journal import Entry, Journal, replay


def lease(n: int) -> Entry:
    attrs = {"leaseId": f"id{n}", "state": "completed", "hasWrites": False}
    return Entry(key(f"id{n}"), POLICY, attrs, 1_800_000_000.0 + n)


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
    assert journal.entries() == [lease(1)]
    assert "skipped 1 unreadable line" in caplog.text


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
        whole.replace('"lease-id2"', "null"),
        '{"key": [], "spec": [], "at": 0, "attributes": []}',
        "[1, 2, 3]",
    ]
    with open(tmp_path / "swamp.journal", "a") as file:
        file.write("\n".join(damaged) + "\n")
    assert replay(store, journal) == 1
    assert leases_in(store) == [("lease-id1", 1, "completed")]
    assert "skipped 7 unreadable line(s)" in caplog.text


def test_replay_puts_each_row_in_once_and_empties_the_journal(tmp_path):
    store = Datastore(tmp_path / "swamp.db", orchestrator=True)
    journal = Journal(tmp_path / "swamp.journal")
    for n in (1, 2):
        journal.append(lease(n))
    assert replay(store, journal) == 2
    assert leases_in(store) == [("lease-id1", 1, "completed"), ("lease-id2", 1, "completed")]
    assert journal.entries() == []
    # a crash between the commit and the emptying leaves the lines: taking them in again adds
    # nothing and doubles nothing
    for n in (1, 2, 3):
        journal.append(lease(n))
    assert replay(store, journal) == 1
    assert [name for name, _, _ in leases_in(store)] == ["lease-id1", "lease-id2", "lease-id3"]
    record = store.latest(key("id3"))
    assert record is not None and record.created_at.startswith("2027-01-15")  # its own time
    assert replay(store, journal) == 0
