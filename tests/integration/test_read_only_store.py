"""A database made read-only while a real ``swamp serve`` runs — the file, its ``-wal`` or its
``-shm`` — is noticed like a deleted one: every write refused in one line naming the file,
``/health`` 503, one log line, nothing acknowledged that is not kept."""

import os
import subprocess
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from swamp.repo import Repo
from swamp.store.datastore import Datastore, Key, SpecPolicy
from tests.integration.conftest import wait_until

pytestmark = pytest.mark.integration
ROOT = os.geteuid() == 0


@contextmanager
def unwritable(path: Path):
    """Take the right to write ``path`` away, as its owner would: ``chmod a-w`` (root may
    write whatever the mode says, so for root the file is made immutable instead)."""
    if ROOT:
        if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
            pytest.skip("chattr +i is not available to make a file unwritable for root here")
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(path)], check=True)
    else:
        mode = path.stat().st_mode
        path.chmod(0o444)
        try:
            yield
        finally:
            path.chmod(mode)


# As root the file is made immutable (chattr +i); an immutable -shm faults SQLite's mapped
# page (SIGBUS, before this change as after), so root tries the other two.
@pytest.mark.parametrize("suffix", ["", "-wal"] + ([] if ROOT else ["-shm"]))
def test_a_database_made_read_only_while_serving_refuses_writes_naming_the_file(cluster, suffix):
    serve = cluster.serve()
    before = cluster.cli("worker", "token", "create", "before", "--duration", "1h",
                         "--server", cluster.url)  # fmt: skip
    assert before.returncode == 0, before.stderr
    db = cluster.repo / ".swamp" / "swamp.db"
    target = db.with_name(db.name + suffix)
    assert target.exists()
    control = Datastore(db)  # a connection opened before, as serve's own was
    health = cluster.url.replace("ws://", "http://") + "/health"
    admin = {"authorization": f"Bearer {Repo(cluster.repo).admin_credential_for(cluster.url)}"}
    with unwritable(target):
        if not suffix:
            # the control: a connection opened before goes on committing into the file, as
            # serve's did, acknowledging writes the next start cannot open
            control.write(Key("test/control", "c", "row"), {"kept": True}, policy=SpecPolicy("x"))
        wait_until(lambda: httpx.get(health).status_code == 503, what="the store to notice")
        refused = cluster.cli("worker", "token", "create", "after", "--duration", "1h",
                              "--server", cluster.url)  # fmt: skip
        assert refused.returncode == 1 and "Traceback" not in refused.stderr
        [line] = refused.stderr.strip().splitlines()
        assert "store_broken" in line or "read-only" in line
        assert f"{target} cannot be written" in line
        reason = httpx.get(health, headers=admin).json()
        assert reason["status"] == "degraded" and f"{target} cannot be written" in reason["reason"]
        serve.stop()
    control.close()
    log = serve.log.read_text()
    assert "Traceback" not in log
    assert len([line for line in log.splitlines() if "read-only" in line]) == 1
    # nothing was acknowledged that is not kept: a restart finds no token 'after'
    cluster.serve()
    names = [t["name"] for t in cluster.cli_json("worker", "token", "list")]
    assert "before" in names and "after" not in names
