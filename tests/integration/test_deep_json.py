"""JSON nested deeper than the protocol's limit, from a real hostile worker against a real
``swamp serve``: one coded error and at most one log line, never a traceback; the same shapes
within the limit go through whole (the control: the path really carries a worker's JSON)."""

import json
import subprocess
import sys

import httpx
import pytest
import trio

from swamp.protocol.frames import MAX_JSON_DEPTH, MAX_VALUE_DEPTH
from swamp.store.datastore import Datastore, Key, SpecPolicy
from tests.integration.hostile import RawSocket, enroll_params

pytestmark = pytest.mark.integration


def nested(depth: int) -> list:
    """A list ``depth`` levels deep (``[]`` is one level)."""
    return json.loads("[" * depth + "]" * depth)


def depth_of(value) -> int:
    level = 0
    while isinstance(value, list):
        level, value = level + 1, value[0] if value else None
    return level


class HostileWorker:
    """A worker spoken by hand: enrolls, then answers each dispatch as the test says."""

    def __init__(self, ws: RawSocket) -> None:
        self.ws = ws

    @classmethod
    async def enroll(cls, cluster, name: str) -> "HostileWorker":
        ws = await RawSocket.open(cluster.url)
        reply = await ws.request("worker.enroll", enroll_params(cluster.mint(name)))
        assert reply["result"]["workerName"] == name
        return cls(ws)

    async def next_dispatch(self) -> dict:
        while True:
            frame = await self.ws.next_frame()
            assert frame is not None, self.ws.closed
            if frame.get("type") == "request" and frame.get("method") == "worker.dispatch":
                return frame

    async def answer(self, dispatch: dict, result: dict) -> None:
        await self.ws.send({"type": "response", "id": dispatch["id"], "result": result})


def run_on(cluster, worker: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "swamp", "model", "method", "run", "command/shell", "run",
         "--arg", "command=true", "--target", worker, "--server", cluster.url, *extra],
        env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


async def finished(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = await trio.to_thread.run_sync(proc.communicate)
    return proc.returncode, out, err


async def test_a_worker_s_result_nested_too_deep_is_one_coded_error_and_one_line(cluster):
    serve = cluster.serve()
    evil = await HostileWorker.enroll(cluster, "evil")
    # the control: a result as deep as a frame can carry it reaches the client whole
    deepest = MAX_JSON_DEPTH - 2  # the response frame and its result object around it
    client = run_on(cluster, "evil", "--json")
    await evil.answer(
        await evil.next_dispatch(), {"status": "succeeded", "result": nested(deepest)}
    )
    code, out, err = await finished(client)
    assert code == 0, err
    [result] = [json.loads(line)["result"] for line in out.splitlines() if '"result"' in line]
    assert depth_of(result["result"]) == deepest

    before = serve.log.read_text().splitlines()
    for depth in (deepest + 1, 600):  # 600 was read whole, then blew the stack on the way out
        client = run_on(cluster, "evil")
        await evil.answer(
            await evil.next_dispatch(), {"status": "succeeded", "result": nested(depth)}
        )
        code, out, err = await finished(client)
        assert code == 1 and "Traceback" not in err
        [line] = [line for line in err.splitlines() if line.startswith("error")]
        assert "malformed_reply" in line and f"nested more than {MAX_JSON_DEPTH} levels" in line
    added = serve.log.read_text().splitlines()[len(before) :]
    assert "Traceback" not in "\n".join(added)
    assert len(added) == 2 and all("refused its answer" in line for line in added), added
    # still serving, the worker too
    client = run_on(cluster, "evil", "--json")
    await evil.answer(await evil.next_dispatch(), {"status": "succeeded"})
    assert (await finished(client))[0] == 0
    await evil.ws.aclose()


async def test_a_resource_nested_too_deep_is_refused_and_deep_stored_data_is_one_line(cluster):
    serve = cluster.serve()
    evil = await HostileWorker.enroll(cluster, "evil")
    client = run_on(cluster, "evil")
    dispatch = await evil.next_dispatch()
    plane = cluster.url.replace("ws://", "http://") + "/data/resources"
    auth = {"authorization": f"Bearer {dispatch['params']['credential']}",
            "content-type": "application/json"}  # fmt: skip
    async with httpx.AsyncClient() as http:
        # the control: as deep as a stored value may be, written and queried back whole
        ok = await http.put(f"{plane}/result/ok", headers=auth,
                            json={"v": nested(MAX_VALUE_DEPTH - 1)})  # fmt: skip
        assert ok.status_code == 200, ok.text
        for depth in (MAX_VALUE_DEPTH, 600):
            refused = await http.put(
                f"{plane}/result/deep", headers=auth, json={"v": nested(depth)}
            )
            assert refused.status_code == 400
            assert (
                f"nested more than {MAX_VALUE_DEPTH} levels" in refused.json()["error"]["message"]
            )
    query = {"dispatchId": dispatch["params"]["dispatchId"], "predicate": "version > 0"}
    reply = await evil.ws.request("capability.queryData", query)
    [record] = reply["result"]["records"]
    assert record["name"] == "ok" and depth_of(record["attributes"]["v"]) == MAX_VALUE_DEPTH - 1
    await evil.answer(dispatch, {"status": "succeeded"})
    assert (await finished(client))[0] == 0
    await evil.ws.aclose()

    # data nested 600 deep that reached the store another way (an older version, the CLI on
    # the repo): a query through the server is one coded error, not a traceback
    store = Datastore(cluster.repo / ".swamp" / "swamp.db")
    store.write(Key("test/deep", "m", "deep"), {"v": nested(600)}, policy=SpecPolicy("x"))
    store.close()
    result = cluster.cli("data", "query", 'modelType == "test/deep"', "--server", cluster.url)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert f"nested more than {MAX_JSON_DEPTH} levels" in result.stderr
    assert "Traceback" not in serve.log.read_text()
    listed = cluster.cli_json("worker", "token", "list", "--server", cluster.url)
    assert [t["name"] for t in listed] == ["evil"]
