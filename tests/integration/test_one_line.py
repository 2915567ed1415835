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


PARENT = """\
name = "parent"
[[jobs]]
name = "main"
[[jobs.steps]]
name = "child"
task = {{ type = "workflow", workflowIdOrName = "{child}" }}
"""


def test_a_very_long_workflow_name_is_one_line_the_same_on_both_routes(cluster):
    """A name too long for the file system was OSError: a traceback straight on the repo, a
    logged traceback and handler_failed through a server."""
    long_names = ("a" * 300, "b" * 100_000)
    (cluster.repo / "workflows").mkdir(exist_ok=True)
    (cluster.repo / "workflows" / "parent.toml").write_text(PARENT.format(child="c" * 300))
    commands = [
        (verb, name) for verb in ("run", "show", "validate", "history") for name in long_names
    ]

    def answers(*route: str) -> list[tuple[int, str]]:
        out = []
        for verb, name in commands:
            result = cluster.cli("workflow", verb, name, *route)
            assert result.returncode == 2, (verb, result.stderr[-300:])
            assert result.stderr.count("\n") == 1 and len(result.stderr) < 300, result.stderr
            assert result.stderr.startswith("error: invalid workflow name"), result.stderr
            out.append((result.returncode, result.stderr))
        nested = cluster.cli("workflow", "validate", "parent", *route)
        assert nested.returncode == 2 and "Traceback" not in nested.stderr, nested.stderr[-300:]
        assert "no workflow 'ccc" in nested.stderr and len(nested.stderr) < 600, nested.stderr
        out.append((nested.returncode, nested.stderr))
        return out

    on_the_repo = answers()  # no server yet: the repo route
    serve = cluster.serve()
    assert answers("--server", cluster.url) == on_the_repo
    assert "Traceback" not in serve.log.read_text()


async def test_a_lone_surrogate_in_a_predicate_is_one_line_at_once_on_both_routes(cluster):
    """Straight on the repo it matched nothing; through a server the frame's refusal went out
    without its id, so the CLI waited for the socket to be closed for not authenticating
    (5 s) and said so: exit 1, a misleading line."""
    predicate = 'attributes.x == "\udcff"'  # how Python decodes a byte that is not UTF-8
    on_the_repo = cluster.cli("data", "query", predicate)
    serve = cluster.serve()
    through = cluster.cli("data", "query", predicate, "--server", cluster.url)
    for result in (on_the_repo, through):
        assert result.returncode == 2, result.stderr
        assert "is a lone surrogate" in result.stderr.splitlines()[0]
        assert len(result.stderr.splitlines()) == 3  # the line and its caret, as any predicate
    assert on_the_repo.stderr == through.stderr
    # a frame that holds one is answered by its id (not left for the socket's deadline)
    credential = Repo(cluster.repo).admin_credential_for(cluster.url)
    admin = await RawSocket.open(cluster.url, headers=[("authorization", f"Bearer {credential}")])
    await admin.send('{"type":"request","id":"q","method":"data.query",'
                     '"params":{"predicate":"name == \\"\\udcff\\""}}')  # fmt: skip
    reply = await admin.next_frame()
    assert reply["id"] == "q" and reply["error"]["code"] == "malformed_frame"
    assert "lone surrogate" in reply["error"]["message"]
    await admin.aclose()
    # any other argument the CLI cannot send as text: refused at once, not a closed socket
    sent = cluster.cli(
        "model", "method", "run", "command/shell", "run", "--arg", "command=echo \udcff",
        "--server", cluster.url,
    )  # fmt: skip
    assert sent.returncode == 2 and "lone surrogate" in sent.stderr, sent.stderr
    assert "Traceback" not in serve.log.read_text()
