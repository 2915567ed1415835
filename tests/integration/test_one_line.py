"""Every failure is one line: damaged records, hostile nesting and text, a closed pipe."""

import json
import subprocess
import sys

import pytest

from swamp.repo import Repo
from swamp.store.datastore import Datastore, Key, SpecPolicy
from tests.integration.hostile import RawSocket, enroll_params

pytestmark = pytest.mark.integration


def test_a_record_without_a_name_is_skipped_not_fatal(cluster):
    cluster.mint("good")
    store = Datastore(cluster.repo / ".swamp" / "swamp.db")
    store.write(Key("swamp/worker", "ghost", "state"), {"status": "idle"}, policy=SpecPolicy("s"))
    store.write(Key("swamp/enrollment-token", "broken", "token"), {"state": "unused"},
                policy=SpecPolicy("token"))  # fmt: skip
    store.write(Key("swamp/step-lease", "lease", "lease-x"), {"state": "active"},
                policy=SpecPolicy("lease"))  # fmt: skip
    store.close()
    for args in (["worker", "list", "--all"], ["worker", "token", "list"]):
        result = cluster.cli(*args)
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
        assert "skipping the malformed" in result.stderr
    assert [t["name"] for t in cluster.cli_json("worker", "token", "list")] == ["good"]
    serve = cluster.serve()  # boot reconciliation reads every worker and lease
    assert cluster.cli_json("worker", "list", "--server", cluster.url)["workers"] == []
    assert "skipping the malformed" in serve.log.read_text()


def test_over_nested_predicates_are_one_line_on_both_routes(cluster):
    cluster.serve()
    for predicate in ("(" * 3000 + "1" + ")" * 3000, "!" * 3000 + "true", "[" * 3000):
        for extra in ([], ["--server", cluster.url]):
            result = cluster.cli("data", "query", predicate[:4000], *extra)
            assert result.returncode == 2 and "Traceback" not in result.stderr
            assert len(result.stderr.splitlines()) <= 3  # the line and its caret


async def test_over_nested_frames_and_lone_surrogates_get_coded_errors(cluster):
    serve = cluster.serve()
    token = cluster.mint("w1")
    credential = Repo(cluster.repo).admin_credential_for(cluster.url)
    admin = await RawSocket.open(cluster.url, headers=[("authorization", f"Bearer {credential}")])
    await admin.send("[" * 100_000 + "]" * 100_000)
    reply = await admin.next_frame()
    assert reply["error"]["code"] == "malformed_frame" and "nested" in reply["error"]["message"]
    surrogate = '{"type":"request","id":"s","method":"worker.token.create","params":' \
        '{"name":"x\\ud800","duration":"1h"}}'  # fmt: skip
    await admin.send(surrogate)
    reply = await admin.next_frame()
    assert reply["error"]["code"] == "malformed_frame" and "surrogate" in reply["error"]["message"]
    await admin.aclose()
    pending = await RawSocket.open(cluster.url)
    params = json.dumps(enroll_params(token)).replace('"linux"', '"lin\\udc00ux"')
    await pending.send(f'{{"type":"request","id":"e","method":"worker.enroll","params":{params}}}')
    reply = await pending.next_frame()
    assert reply["error"]["code"] == "malformed_frame"
    await pending.aclose()
    # still serving, nothing written, nothing in the log but lines
    assert cluster.cli_json("worker", "list", "--server", cluster.url)["workers"] == []
    assert "Traceback" not in serve.log.read_text()


def test_a_closed_pipe_ends_a_command_quietly(cluster):
    from swamp.domain import tokens as rules

    store = Datastore(cluster.repo / ".swamp" / "swamp.db")
    for i in range(2000):  # well over a pipe's buffer of output
        token = rules.mint(f"t{i:04d}", secret="s", now=1e10, now_iso="t0", expires_iso="t1",
                           duration_seconds=3600, existing=None)  # fmt: skip
        store.write(Key("swamp/enrollment-token", token.name, "token"),
                    token.to_attributes(), policy=SpecPolicy("token"))  # fmt: skip
    store.close()
    result = subprocess.run(
        f"{sys.executable} -m swamp worker token list | head -n 1",
        shell=True, env=cluster.env, capture_output=True, text=True, cwd=cluster.tmp,
    )  # fmt: skip
    assert result.stdout.startswith("NAME")
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr
