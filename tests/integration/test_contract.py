"""One contract on every route: the same answer straight on the repo and through a server,
coded errors for any payload, and a CLI that stays one line when its server talks nonsense."""

import json
import random

import pytest
import trio
import trio_websocket

from swamp.errors import BY_CODE
from swamp.protocol import messages
from swamp.repo import Repo
from tests.integration.hostile import RawSocket, enroll_params

pytestmark = pytest.mark.integration


# -- the same bad input, the same answer, whichever route ---------------------------------------


def result_text(lines):
    return "\n".join(lines)


def _answer(result):
    lines = result.stderr.strip().splitlines()
    return result.returncode, lines


def test_the_same_bad_input_gets_the_same_answer_on_both_routes(cluster):
    cluster.serve()
    cluster.mint("dup")
    cases = [
        ["worker", "token", "create", "dup", "--duration", "1h"],  # an existing name
        ["worker", "token", "create", "x", "--duration", "0s"],
        ["worker", "token", "create", "x", "--duration", "1h", "--max-concurrency", "0"],
        ["worker", "token", "revoke", "ghost"],
        ["model", "method", "run", "no-such-model", "run"],  # an unknown model
        ["model", "method", "run", "command/shell", "walk"],
        ["model", "method", "run", "command/shell", "run", "--arg", "cmd=x"],
        ["data", "query", "version =="],  # a bad predicate
        ["worker", "verify", "ghost"],  # an unknown worker
    ]
    for args in cases:
        on_repo = _answer(cluster.cli(*args))
        via_server = _answer(cluster.cli(*args, "--server", cluster.url))
        assert on_repo == via_server, (args, on_repo, via_server)
        code, lines = on_repo
        assert code == 2 and lines[0].startswith("error: "), (args, lines)
        # one line, but for a predicate's caret, which continues it (indented)
        assert len(lines) == (3 if args[0] == "data" else 1), (args, lines)
        assert all(line.startswith("  ") for line in lines[1:])
        assert "Traceback" not in result_text(lines)
    # --json: the same coded error on stdout too
    on_repo = cluster.cli("worker", "token", "revoke", "ghost", "--json")
    via_server = cluster.cli(
        "worker", "token", "revoke", "ghost", "--json", "--server", cluster.url
    )
    assert (
        json.loads(on_repo.stdout)
        == json.loads(via_server.stdout)
        == {
            "error": {
                "code": "not_found",
                "message": json.loads(on_repo.stdout)["error"]["message"],
            }
        }
    )


def test_server_tokens_are_told_apart_from_a_missing_one(cluster):
    cluster.cli_json("server", "token", "create", "ops")
    enrollment = cluster.mint("pool")
    cluster.serve()
    elsewhere = {"SWAMP_REPO_DIR": str(cluster.tmp)}
    for env, needle in (
        ({}, "need a credential"),
        ({"SWAMP_SERVER_TOKEN": "ops." + "0" * 64}, "'ops' was not accepted"),
        ({"SWAMP_SERVER_TOKEN": enrollment}, "'pool' was not accepted"),
    ):
        code, lines = _answer(
            cluster.cli("worker", "list", "--server", cluster.url, env={**elsewhere, **env})
        )
        assert code == 1 and len(lines) == 1 and needle in lines[0], (env, lines)


# -- any payload, a coded answer ------------------------------------------------------------------


def _random_json(rng: random.Random, depth: int = 0):
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.randint(-(2**40), 2**40)
    if kind == 3:
        return rng.uniform(-1e9, 1e9)
    if kind in (4, 5):
        return "".join(rng.choice("ab/.-_=\n\x1b é0") for _ in range(rng.randrange(12)))
    if kind == 6:
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {
        rng.choice(
            [
                "name",
                "token",
                "labels",
                "args",
                "x",
                "predicate",
                "placement",
                "model",
                "method",
                "all",
                "dispatchId",
                "capacity",
            ]
        ): _random_json(rng, depth + 1)
        for _ in range(rng.randrange(5))
    }


def _mutations(rng: random.Random, valid: dict, count: int):
    """Random payloads, and valid ones with one field replaced by random JSON."""
    for i in range(count):
        if i % 2 or not valid:
            yield _random_json(rng)
        else:
            key = rng.choice(sorted(valid))
            yield dict(valid, **{key: _random_json(rng)})


def _coded(reply: dict) -> bool:
    if reply.get("type") == "response":
        return True
    error = reply.get("error") or {}
    return reply.get("type") == "error" and error.get("code") in BY_CODE


async def test_random_payloads_to_every_verb_get_coded_errors_and_serving_goes_on(cluster):
    cluster.serve()
    rng = random.Random(20261130)
    sent = 0
    # a worker's own verb, on an enrolled worker socket (minted first: a socket has only
    # seconds to enroll)
    token = cluster.mint("raw")
    worker = await RawSocket.open(cluster.url)
    enrolled = await worker.request("worker.enroll", enroll_params(token))
    assert enrolled["result"]["workerName"] == "raw"
    for params in _mutations(rng, {"dispatchId": "x", "predicate": "1 == 1"}, 40):
        reply = await worker.request("capability.queryData", params)
        assert _coded(reply), (params, reply)
        sent += 1
    # its drain announcement: only the three reasons; anything else is a coded error
    for params in [{"reason": "because"}, {"reason": 7}, {}, *_mutations(rng, {}, 20)]:
        reply = await worker.request("worker.drain", params)
        assert reply["type"] == "error" and _coded(reply), (params, reply)
        sent += 1

    async def answer_pings() -> None:  # it is a worker: silent for 3 s, it would be dropped
        while await worker.next_frame() is not None:
            pass

    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer_pings)
        listed = await trio.to_thread.run_sync(
            lambda: cluster.cli_json("worker", "list", "--server", cluster.url)["workers"]
        )
        nursery.cancel_scope.cancel()
    assert [w["status"] for w in listed if w["name"] == "raw"] == ["idle"]  # nothing changed
    assert (await worker.request("worker.drain", {"reason": "signal"}))["type"] == "response"
    await worker.aclose()
    # every admin verb, on an admin socket
    credential = Repo(cluster.repo).admin_credential_for(cluster.url)
    admin = await RawSocket.open(cluster.url, headers=[("authorization", f"Bearer {credential}")])
    valid = {
        "worker.token.create": {"name": "fuzz", "duration": "1h"},
        "worker.token.revoke": {"name": "nobody"},
        "data.query": {"predicate": "1 == 1"},
        "model.method.run": {"model": "swamp/echo", "method": "echo"},
        "worker.verify": {"name": "nobody"},
        "worker.list": {},
        "worker.token.list": {},
        "server.info": {},
    }
    for method in sorted(messages.REQUESTS):
        if method in ("worker.dispatch", "worker.enroll", "capability.queryData"):
            continue
        for params in _mutations(rng, valid.get(method, {}), 40):
            reply = await admin.request(method, params)
            assert _coded(reply), (method, params, reply)
            sent += 1
    await admin.aclose()
    # enrollment, on fresh sockets (a pending socket has a small budget of frames); a mutation
    # may happen to be a valid enrollment (an empty label table, say): any coded answer will do
    payloads = list(_mutations(rng, enroll_params(cluster.mint("fuzzed")), 60))
    for start in range(0, len(payloads), 20):
        pending = await RawSocket.open(cluster.url)
        for params in payloads[start : start + 20]:
            reply = await pending.request("worker.enroll", params)
            assert _coded(reply), (params, reply)
            sent += 1
        await pending.aclose()
    assert sent > 400
    # the orchestrator kept serving: a real worker enrolls with its token and runs a step
    cluster.worker(cluster.mint("w1"))
    code, _ = cluster.run("swamp/echo", "echo", "--target", "w1")
    assert code == 0


# -- a server that talks nonsense ----------------------------------------------------------------


NONSENSE = {
    "model.method.run": {"status": "perhaps", "outputs": 3},
    "worker.list": {"workers": "lots"},
    "worker.token.list": {"tokens": [{"name": 5}]},
    "data.query": {"records": [1, 2]},
    "worker.verify": {"workers": [{"name": "w", "status": "maybe"}]},
}


async def _nonsense_server(task_status=trio.TASK_STATUS_IGNORED):
    """Answers every request with malformed events and a malformed result."""

    async def handler(request):
        ws = await request.accept()
        while True:
            try:
                frame = json.loads(await ws.get_message())
            except trio_websocket.ConnectionClosed:
                return
            if frame.get("type") != "request":
                continue
            for event in (
                {"kind": "log", "line": "a real line"},
                {"kind": "log", "line": 5},
                {"kind": "teleported"},
                "not even an object",
            ):
                await ws.send_message(
                    json.dumps({"type": "stream", "id": frame["id"], "event": event})
                )
            await ws.send_message(
                json.dumps(
                    {
                        "type": "response",
                        "id": frame["id"],
                        "result": NONSENSE.get(frame.get("method")),
                    }
                )
            )

    async with trio.open_nursery() as nursery:
        server = await nursery.start(trio_websocket.serve_websocket, handler, "127.0.0.1", 0, None)
        task_status.started(f"ws://127.0.0.1:{server.port}")


async def test_the_cli_fed_malformed_events_and_results_prints_one_line(cluster, nursery):
    url = await nursery.start(_nonsense_server)
    env = {"SWAMP_SERVER_TOKEN": "ops." + "0" * 64}
    for args in (
        ["model", "method", "run", "swamp/echo", "echo", "--server", url],
        ["worker", "list", "--server", url],
        ["worker", "token", "list", "--server", url],
        ["data", "query", "version > 0", "--server", url],
        ["worker", "verify", "--server", url],
    ):
        result = await trio.to_thread.run_sync(lambda a=args: cluster.cli(*a, env=env))
        errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
        assert result.returncode == 1, (args, result.stderr)
        assert len(errors) == 1 and "malformed reply" in errors[0], (args, result.stderr)
        assert "Traceback" not in result.stderr
    run = await trio.to_thread.run_sync(
        lambda: cluster.cli(
            "model", "method", "run", "swamp/echo", "echo", "--server", url, env=env
        )
    )
    assert "a real line" in run.stdout
    warnings = [line for line in run.stderr.splitlines() if line.startswith("warning: ")]
    # one line per malformed event (a stream frame whose event is not even an object is
    # refused by the channel itself, which answers the server with a coded error)
    assert len(warnings) == 2 and all("ignored a malformed event" in w for w in warnings)
