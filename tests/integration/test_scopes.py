"""Server-token scopes against a real orchestrator: what a metrics, a read and an admin token
may do, over raw frames, raw HTTP and the CLI.

The attack: the README suggested a server token for a Prometheus scraper, and every server token
was a full admin — whoever read the scraper's configuration could run commands. Each refusal
here is paired with the same call made with a token whose scope covers it, which succeeds, so
a test would catch the defence going missing.
"""

from __future__ import annotations

import json
import textwrap

import httpx
import pytest

from swamp.domain.scopes import VERBS, Scope
from swamp.domain.tokens import hash_secret
from swamp.store.datastore import Datastore, Key, SpecPolicy
from tests.integration.hostile import RawSocket
from tests.integration.test_downloads import _small_pyz

pytestmark = pytest.mark.integration

SLEEPER = """\
    name = "sleeper"
    [[jobs]]
    name = "main"
    [[jobs.steps]]
    name = "wait"
    [jobs.steps.task]
    type = "model_method"
    modelIdOrName = "test/steps"
    methodName = "wait"
    inputs = { seconds = 120 }
"""


def _tokens(cluster) -> dict[Scope, str]:
    out = {}
    for scope, name in ((Scope.METRICS, "prom"), (Scope.READ, "dash"), (Scope.ADMIN, "ops")):
        made = cluster.cli_json("server", "token", "create", name, "--scope", scope.value)
        assert made["scope"] == scope.value
        out[scope] = made["token"]
    return out


async def _call(cluster, token: str, method: str, params: dict) -> dict:
    """One admin frame on a socket of its own (a refused socket is never trusted, and its
    deadline to authenticate must not decide a verdict)."""
    socket = await RawSocket.open(cluster.url, headers=[("authorization", f"Bearer {token}")])
    try:
        return await socket.request(method, params)
    finally:
        await socket.aclose()


def _refused(reply: dict, held: Scope, verb: str) -> None:
    assert reply["type"] == "error", reply
    error = reply["error"]
    assert error["code"] == "insufficient_scope", error
    assert f"has the {held.value} scope, and {verb} needs {VERBS[verb].value}" in error["message"]


async def test_every_admin_frame_checks_the_scope_and_changes_nothing_when_refused(cluster):
    """Every admin verb of ``swamp.domain.scopes`` (a new one fails here until it has a case):
    a metrics token is refused them all, a read token those that change or run something —
    and what they would have changed is unchanged — while the same frame with a token of
    the scope it needs succeeds."""
    serve = cluster.serve()
    tokens = _tokens(cluster)
    victim = cluster.mint("victim")
    assert victim
    drainee = cluster.worker(cluster.mint("drainee"))  # asked to drain by the admin token
    assert cluster.cli("workflow", "create", "hello").returncode == 0
    (cluster.repo / "workflows" / "sleeper.toml").write_text(textwrap.dedent(SLEEPER))
    ran = cluster.cli("workflow", "run", "hello", "--json")
    assert ran.returncode == 0, ran.stderr
    finished = json.loads(ran.stdout.splitlines()[-1])["run"]
    running = cluster.spawn("workflow", "run", "sleeper", "--json", "--server", cluster.url)
    sleeper = running.wait_for(lambda e: e.get("event", {}).get("line") == "waiting")["event"]
    touched = cluster.tmp / "touched"

    def runs() -> int:
        return len(cluster.cli_json("workflow", "history", "hello")["runs"])

    def token_state(name: str) -> str | None:
        listed = cluster.cli_json("worker", "token", "list")
        return next((t["state"] for t in listed if t["name"] == name), None)

    def drainee_status() -> str | None:
        listed = cluster.cli_json("worker", "list")["workers"]
        return next((w["status"] for w in listed if w["name"] == "drainee"), None)

    def server_token_names() -> list[tuple[str, str]]:
        listed = cluster.cli_json("server", "token", "list")
        return sorted((t["name"], t["state"]) for t in listed)

    def sleeper_status() -> str:
        return cluster.cli_json("workflow", "history", "get", sleeper["runId"])["run"]["status"]

    # verb -> (params, what it changes: a probe read before and after)
    cases = {
        "server.info": ({}, None),
        "worker.list": ({}, None),
        "worker.queue.list": ({}, None),
        "worker.token.list": ({}, None),
        "workflow.list": ({}, None),
        "workflow.show": ({"name": "hello"}, None),
        "workflow.validate": ({"name": "hello"}, None),
        "workflow.history": ({"name": "hello"}, None),
        "workflow.history.get": ({"run": finished["runId"]}, None),
        "data.query": ({"predicate": 'modelType == "command/shell"'}, None),
        "logs.read": ({"ref": finished["runId"]}, None),
        "ui.login": ({}, None),  # a login link for the web pages, of the caller's scope
        "worker.token.create": (
            {"name": "minted", "duration": "1h"},
            lambda: token_state("minted"),
        ),
        "worker.token.revoke": ({"name": "victim"}, lambda: token_state("victim")),
        "worker.verify": ({}, None),  # the drainee is gone by then: admin all the same
        "worker.drain.ask": ({"name": "drainee"}, drainee_status),
        "model.method.run": (
            {"model": "command/shell", "method": "run", "args": {"command": f"touch {touched}"}},
            touched.exists,
        ),
        "workflow.run": ({"name": "hello"}, runs),
        "workflow.cancel": ({"run": sleeper["runId"]}, sleeper_status),
        # past the scope, answered as the orchestrator answers them to anyone (below)
        "model.method.follow": ({"stepId": "0" * 32}, None),
        "server.token.create": ({"name": "minted2"}, server_token_names),
        "server.token.list": ({}, None),
        "server.token.revoke": ({"name": "prom"}, server_token_names),
    }
    # verb -> the error a token whose scope covers it gets all the same: a step is followed
    # on a shared database only (this one's is its own file); server tokens are managed
    # with the orchestrator machine's own credential, never with a server token
    answered = {
        "model.method.follow": "not_found",
        "server.token.create": "forbidden",
        "server.token.list": "forbidden",
        "server.token.revoke": "forbidden",
    }
    frames = sorted(verb for verb in VERBS if not verb.startswith("GET "))
    assert sorted(cases) == frames, "every admin frame needs a case here"
    for verb in frames:
        params, probe = cases[verb]
        before = probe() if probe else None
        for held in (Scope.METRICS, Scope.READ, Scope.ADMIN):
            reply = await _call(cluster, tokens[held], verb, params)
            if not held.covers(VERBS[verb]):
                _refused(reply, held, verb)
                assert (probe() if probe else None) == before, f"{verb} changed something"
                continue
            if verb in answered:
                assert reply["type"] == "error", (verb, held, reply)
                assert reply["error"]["code"] == answered[verb], (verb, held, reply)
                assert (probe() if probe else None) == before, f"{verb} changed something"
                continue
            assert reply["type"] == "response", (verb, held, reply)  # the control
            if probe is not None and held is Scope.ADMIN:
                assert probe() != before, f"{verb} with admin changed nothing"
    assert running.wait_exit() == 1  # its run was cancelled, by the admin token only
    assert drainee.wait_exit() == 0  # it drained, asked by the admin token only
    assert "Traceback" not in serve.log.read_text()


async def test_http_routes_check_the_scope_the_same_way(cluster):
    """/metrics opens to every scope; /health's details and private downloads to read and
    admin; the data plane to no server token at all."""
    built = _small_pyz(cluster.tmp)
    cluster.serve("--pyz", str(built), "--private-downloads")
    tokens = _tokens(cluster)
    base = cluster.url.replace("ws://", "http://")

    def get(path: str, held: Scope | None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {tokens[held]}"} if held else {}
        return httpx.get(base + path, headers=headers)

    nobody = get("/metrics", None)
    assert nobody.status_code == 401 and nobody.json()["error"]["code"] == "unauthorized"
    for held in Scope:
        scraped = get("/metrics", held)
        assert scraped.status_code == 200 and "swamp_workers" in scraped.text
    for path in ("/swamp.pyz", "/swamp.pyz.sha256"):
        refused = get(path, Scope.METRICS)
        assert refused.status_code == 403
        error = refused.json()["error"]
        assert error["code"] == "insufficient_scope"
        assert (
            "'prom' has the metrics scope" in error["message"] and "needs read" in error["message"]
        )
        assert get(path, Scope.READ).status_code == 200  # the control
    assert get("/swamp.pyz", Scope.READ).content == built.read_bytes()
    plain = get("/health", Scope.METRICS)
    assert plain.status_code == 200 and plain.json() == {"status": "ok"}
    detailed = get("/health", Scope.READ).json()
    assert detailed["status"] == "ok" and "version" in detailed and "pool" in detailed
    # the data plane takes only a running dispatch's credential: no server token opens it
    for held in Scope:
        answer = get("/data/resources/result", held)
        assert answer.status_code == 401, (held, answer.text)
        assert "dispatch credential" in answer.json()["error"]["message"]


def test_the_cli_refuses_beyond_the_scope_in_one_line(cluster):
    """From another directory, as an operator elsewhere would: a read token lists and queries
    but cannot mint or run; a metrics token cannot even list. Each refusal is one line naming
    both scopes (exit 1, the code with --json) and writes nothing; an admin token does it."""
    cluster.serve()
    tokens = _tokens(cluster)
    elsewhere = {"SWAMP_REPO_DIR": str(cluster.tmp)}

    def cli(held: Scope, *args: str):
        env = {**elsewhere, "SWAMP_SERVER_TOKEN": tokens[held]}
        return cluster.cli(*args, "--server", cluster.url, env=env)

    for args in (
        ("worker", "list"),
        ("worker", "queue"),
        ("worker", "token", "list"),
        ("data", "query", 'modelType == "swamp/worker"'),
        ("workflow", "list"),
    ):
        listed = cli(Scope.READ, *args)
        assert listed.returncode == 0, (args, listed.stderr)
        refused = cli(Scope.METRICS, *args)
        assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
        assert refused.stderr.startswith("error: server token 'prom' has the metrics scope")
        assert "needs read" in refused.stderr

    touched = cluster.tmp / "touched"
    attempts = [
        (("worker", "token", "create", "minted", "--duration", "1h"), lambda: _has(cluster)),
        (
            ("model", "method", "run", "command/shell", "run", "--arg", f"command=touch {touched}"),
            touched.exists,
        ),
    ]
    for args, changed in attempts:
        for held in (Scope.METRICS, Scope.READ):
            refused = cli(held, *args)
            assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
            assert f"has the {held.value} scope" in refused.stderr
            assert "needs admin" in refused.stderr and "--scope admin" in refused.stderr
            as_json = cli(held, *args, "--json")
            assert json.loads(as_json.stdout)["error"]["code"] == "insufficient_scope"
            assert not changed()
        done = cli(Scope.ADMIN, *args)  # the control
        assert done.returncode == 0, done.stderr
        assert changed()


def _has(cluster) -> bool:
    tokens = cluster.cli_json("worker", "token", "list")
    return any(t["name"] == "minted" for t in tokens)


def test_tokens_list_their_scope_a_bad_scope_writes_nothing_and_old_tokens_are_admin(cluster):
    serve = cluster.serve()
    made = cluster.cli("server", "token", "create", "prom", "--scope", "metrics")
    assert made.returncode == 0 and "scope metrics" in made.stdout
    bad = cluster.cli("server", "token", "create", "nope", "--scope", "write")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert "invalid --scope 'write': expected one of metrics, read, admin" in bad.stderr
    # a token stored before scopes existed (no scope field) is admin, as it always was
    secret = "5" * 64
    store = Datastore(cluster.repo / ".swamp" / "swamp.db")
    old = {"name": "old", "state": "active", "createdAt": "2026-01-01T00:00:00.000Z"}
    store.write(
        Key("swamp/server-token", "old", "token"),
        dict(old, secretHash=hash_secret(secret)),
        policy=SpecPolicy("token"),
    )
    store.close()
    listed = cluster.cli_json("server", "token", "list")
    assert {(t["name"], t["scope"]) for t in listed} == {("prom", "metrics"), ("old", "admin")}
    table = cluster.cli("server", "token", "list").stdout.splitlines()
    assert table[0].split() == ["NAME", "SCOPE", "STATE", "CREATED"]
    env = {"SWAMP_REPO_DIR": str(cluster.tmp), "SWAMP_SERVER_TOKEN": f"old.{secret}"}
    minted = cluster.cli(
        "worker", "token", "create", "w", "--duration", "1h", "--server", cluster.url, env=env
    )
    assert minted.returncode == 0, minted.stderr
    assert "Traceback" not in serve.log.read_text()
