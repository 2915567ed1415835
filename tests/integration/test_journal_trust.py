"""The lease journal, planted before a real boot: only step leases go in, a value the store
cannot take is skipped, and a file of any size is taken in with bounded memory."""

import json
import stat

import httpx
import pytest

from swamp.bookkeeping.leases import POLICY, LeaseBook, key
from swamp.domain.leases import LeaseState
from swamp.domain.tokens import hash_secret
from swamp.store.datastore import Datastore, Key, SpecPolicy
from swamp.store.journal import MAX_LINE_BYTES, Entry

pytestmark = pytest.mark.integration

SECRET = "s" * 64
TOKEN = {"name": "planted", "state": "active", "createdAt": "2027-01-01T00:00:00.000Z",
         "secretHash": hash_secret(SECRET)}  # fmt: skip


def lease_line(n: int, *, at: float = 1.8e9) -> bytes:
    book = LeaseBook(None, clock=lambda: 1.8e9)
    opened = book.opened(lease_id=f"{n:032x}", worker="w1", model_type="swamp/echo",
                         model_name="default", method="echo")  # fmt: skip
    return Entry(key(f"{n:032x}"), POLICY, book.ended(opened, LeaseState.COMPLETED), at).to_line()


def token_line() -> bytes:
    body = {"key": ["swamp/server-token", "planted", "token"], "spec": ["token", "infinite", 10],
            "at": 1.8e9, "attributes": TOKEN}  # fmt: skip
    return (json.dumps(body) + "\n").encode()


def admin_ok(cluster, credential: str) -> bool:
    metrics = cluster.url.replace("ws://", "http://") + "/metrics"
    reply = httpx.get(metrics, headers={"authorization": f"Bearer {credential}"}, timeout=10)
    assert reply.status_code in (200, 401), reply.text
    return reply.status_code == 200


def peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


LEASES = 20_000
LONG_LINES = 100  # each just over the line limit: 100 MiB that no boot may hold


def test_a_planted_journal_gives_no_credential_stops_no_boot_and_is_streamed(cluster):
    serve = cluster.serve()
    quiet_peak = peak_rss(serve.p.pid)  # the same boot with an empty journal
    serve.stop()
    journal = cluster.repo / ".swamp" / "swamp.journal"
    # who can write it: the orchestrator's own user (0600, in the repo's 0700 state directory)
    assert stat.S_IMODE(journal.stat().st_mode) == 0o600
    assert stat.S_IMODE(journal.parent.stat().st_mode) == 0o700
    with open(journal, "wb") as file:
        file.write(token_line())  # once, this became a working admin credential
        file.write(lease_line(1, at=1e308))  # once, a traceback that stopped the boot
        file.write(lease_line(2))  # its twin with a time the store can take
        long = b'{"key": "' + b"x" * MAX_LINE_BYTES + b'"}\n'
        for _ in range(LONG_LINES):
            file.write(long)
        for n in range(3, LEASES + 3):
            file.write(lease_line(n))
    size = journal.stat().st_size
    assert size > LONG_LINES * MAX_LINE_BYTES

    serve = cluster.serve()
    grown = peak_rss(serve.p.pid) - quiet_peak
    log = serve.log.read_text()
    assert "Traceback" not in log
    [warning] = [line for line in log.splitlines() if "the journal" in line and "skipped" in line]
    assert "1 with a value the store cannot take" in warning
    assert f"{LONG_LINES} longer than" in warning
    assert "1 not a step lease" in warning
    assert f"took {LEASES + 1} lease row(s)" in log
    assert journal.stat().st_size == 0
    # memory did not follow the file: reading it whole would hold more than this by itself
    assert grown < 64 * 2**20 < size, f"the boot grew by {grown >> 20} MiB for {size >> 20} MiB"
    assert not admin_ok(cluster, f"planted.{SECRET}")
    leases = cluster.query('modelType == "swamp/step-lease" && attributes.workerName == "w1"',
                           "--limit", "5")  # fmt: skip
    assert len(leases) == 5
    assert cluster.query(f'name == "lease-{1:032x}"') == []
    assert [r["name"] for r in cluster.query(f'name == "lease-{2:032x}"')] == [f"lease-{2:032x}"]

    # the control: that very record, once in the store (as the old replay put it there), is a
    # working admin credential
    store = Datastore(cluster.repo / ".swamp" / "swamp.db")
    store.write(Key("swamp/server-token", "planted", "token"), TOKEN,
                policy=SpecPolicy("token", "infinite", 10))  # fmt: skip
    store.close()
    assert admin_ok(cluster, f"planted.{SECRET}")


def test_a_journal_others_may_write_stops_the_start_in_one_line(cluster):
    journal = cluster.repo / ".swamp" / "swamp.journal"
    journal.write_bytes(lease_line(1))
    journal.chmod(0o666)  # anyone could have put lines in it
    refused = cluster.cli("serve", "--port", "0")
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    [line] = refused.stderr.strip().splitlines()
    assert "may be written by others" in line and "chmod 600" in line
    journal.chmod(0o600)  # the control: the same file, the user's alone, is taken in
    cluster.serve()
    assert cluster.query(f'name == "lease-{1:032x}"')
