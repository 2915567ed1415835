"""Roles, auth and hostile input against a real orchestrator socket."""

import json
import shutil
import subprocess
import uuid

import httpx
import pytest
import trio
import trio_websocket

from swamp.protocol.frames import MAX_FRAME_BYTES, PROTOCOL_VERSION

pytestmark = pytest.mark.integration


async def _request(ws, method, params=None, frame_id="1"):
    await ws.send_message(json.dumps({"type": "request", "id": frame_id, "method": method,
                                      "params": params or {}}))
    return await _reply(ws, frame_id)


async def _reply(ws, frame_id):
    with trio.fail_after(20):
        while True:
            frame = json.loads(await ws.get_message())
            if frame.get("type") in ("response", "error") and frame.get("id") == frame_id:
                return frame


def _enroll_params(token, **over):
    return {"token": token, "instanceId": str(uuid.uuid4()), "machineId": str(uuid.uuid4()),
            "protocolVersion": PROTOCOL_VERSION, "version": "test", "platform": "linux",
            "arch": "x86_64", "labels": {}, "capacity": 1, **over}


async def test_a_worker_socket_can_never_call_admin_frames(cluster):
    cluster.serve()
    token = cluster.mint("w1")
    async with trio_websocket.open_websocket_url(cluster.url) as ws:
        before = await _request(ws, "worker.session.refresh", frame_id="0")
        assert before["error"]["code"] == "forbidden" and "enroll first" in \
            before["error"]["message"]
        enrolled = await _request(ws, "worker.enroll", _enroll_params(token))
        assert enrolled["result"]["workerName"] == "w1"
        for i, method in enumerate(["worker.list", "worker.token.create", "worker.token.revoke",
                                    "model.method.run", "data.query", "worker.enroll"]):
            reply = await _request(ws, method, {"name": "w1"}, frame_id=f"a{i}")
            assert reply["error"]["code"] == "forbidden", (method, reply)
        refreshed = await _request(ws, "worker.session.refresh", frame_id="r")
        assert refreshed["result"]["sessionCredential"] != enrolled["result"][
            "sessionCredential"]
    tokens = cluster.cli_json("worker", "token", "list", "--repo-dir", str(cluster.repo))
    assert [t["state"] for t in tokens] == ["enrolled"]


async def test_hostile_frames_get_coded_errors_and_the_server_survives(cluster):
    cluster.serve()
    async with trio_websocket.open_websocket_url(cluster.url,
                                                 max_message_size=MAX_FRAME_BYTES * 4) as ws:
        for text, code in [
            ("not json", "malformed_frame"), ("[1,2]", "malformed_frame"),
            ('{"type":"request","id":"","method":"x"}', "malformed_frame"),
            ('{"type":"request","id":"x","method":"worker.enroll","params":"zzz"}',
             "malformed_frame"),
            ('{"type":"nonsense"}', "malformed_frame"),
            ('{"type":"request","id":"big","method":"x","params":{"p":"' +
             "x" * (MAX_FRAME_BYTES + 10) + '"}}', "frame_too_large"),
        ]:
            await ws.send_message(text)
            reply = json.loads(await ws.get_message())
            assert reply["type"] == "error" and reply["error"]["code"] == code, (text[:60], reply)
        for i, (params, code) in enumerate([
            ({"token": "w1"}, "invalid_input"),
            (_enroll_params("nodot"), "invalid_token"),
            (_enroll_params("ghost.secret"), "token_unknown"),
            (_enroll_params("ghost.secret", protocolVersion=999), "protocol_mismatch"),
            (_enroll_params("ghost.secret", labels={"bad key": "v"}), "invalid_input"),
            (_enroll_params("ghost.secret", capacity=0), "invalid_input"),
        ]):
            reply = await _request(ws, "worker.enroll", params, frame_id=f"e{i}")
            assert reply["error"]["code"] == code, (params, reply)
        unknown = await _request(ws, "no.such.method", frame_id="u")
        assert unknown["error"]["code"] == "unknown_method"
        for i, (method, params, code) in enumerate([
            ("model.method.run", {"model": "no/such", "method": "run"}, "unknown_model"),
            ("model.method.run", {"model": "command/shell", "method": "walk"}, "unknown_method"),
            ("model.method.run", {"model": "command/shell", "method": "run",
                                  "args": {"command": 5}}, "invalid_input"),
            ("model.method.run", {"model": "command/shell", "method": "run",
                                  "args": {"command": "true"}, "placement": {"labels": {"a": 1}}},
             "invalid_input"),
            ("data.query", {"predicate": "version =="}, "invalid_predicate"),
            ("worker.token.create", {"name": "x", "duration": "0s"}, "invalid_input"),
            ("worker.token.create", {"name": "Bad.Name", "duration": "1h"}, "invalid_input"),
        ]):
            reply = await _request(ws, method, params, frame_id=f"m{i}")
            assert reply["error"]["code"] == code, (method, params, reply)
    # still serving, nothing written
    assert cluster.cli_json("worker", "list", "--server", cluster.url)["workers"] == []
    assert cluster.query("version > 0") == []


async def test_the_data_plane_refuses_without_a_dispatch_credential(cluster):
    cluster.serve()
    base = cluster.url.replace("ws://", "http://")
    async with httpx.AsyncClient() as http:
        health = await http.get(f"{base}/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"
        for headers in ({}, {"Authorization": "Bearer nonsense"}):
            reply = await http.put(f"{base}/data/resources/result/x", json={"a": 1},
                                   headers=headers)
            assert reply.status_code == 401 and reply.json()["error"]["code"] == "unauthorized"
        missing = await http.get(f"{base}/nowhere")
        assert missing.status_code == 404


def test_off_loopback_without_auth_refuses_to_start(cluster):
    result = cluster.cli("serve", "--repo-dir", str(cluster.repo), "--host", "0.0.0.0",
                         "--port", "0")
    assert result.returncode != 0
    assert "--auth token" in result.stderr and "Traceback" not in result.stderr
    assert not (cluster.repo / ".swamp" / "serve.json").exists()


def test_serve_outside_a_repo_says_how_to_make_one(cluster, tmp_path):
    result = cluster.cli("serve", "--repo-dir", str(tmp_path / "nowhere"))
    assert result.returncode != 0 and "swamp init" in result.stderr


def test_token_auth_guards_admin_frames_but_not_enrollment(cluster):
    admin = cluster.cli_json("server", "token", "create", "ops", "--repo-dir", str(cluster.repo))
    cluster.serve("--auth", "token")
    denied = cluster.cli("worker", "list", "--server", cluster.url)
    assert denied.returncode != 0 and "server token" in denied.stderr
    wrong = cluster.cli("worker", "list", "--server", cluster.url,
                        env={"SWAMP_SERVER_TOKEN": "ops." + "1" * 64})
    assert wrong.returncode != 0
    cluster.worker(cluster.mint("w1"))  # workers need only their enrollment token
    allowed = cluster.cli_json("worker", "list", "--server", cluster.url,
                               env={"SWAMP_SERVER_TOKEN": admin["token"]})
    assert [w["name"] for w in allowed["workers"]] == ["w1"]
    secret = admin["token"].split(".", 1)[1].encode()
    for path in (cluster.repo / ".swamp").glob("swamp.db*"):
        assert secret not in path.read_bytes()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls_end_to_end_with_a_private_ca(cluster):
    cert, key = cluster.tmp / "cert.pem", cluster.tmp / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    cluster.serve("--tls-cert", str(cert), "--tls-key", str(key))
    assert cluster.url.startswith("wss://")
    untrusted = cluster.worker(cluster.mint("w0"), wait=False)
    untrusted.wait_for(lambda e: e.get("event") == "disconnected" and "CERTIFICATE" in
                       e["reason"].upper())
    untrusted.stop()
    cluster.worker(cluster.mint("w1"), "--ca-cert", str(cert))
    code, lines = cluster.run("test/steps", "round_trip", "--arg", "value=tls", "--target", "w1",
                              env={"SWAMP_CA_CERT": str(cert)})
    assert code == 0, lines
