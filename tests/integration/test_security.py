"""Roles, auth, browsers and hostile input against a real orchestrator.

Each attack is done to a real ``swamp serve`` the way the hostile test of the running system did
it; each test also shows the attack would have worked without the defence (a control), so it
cannot pass by accident.
"""

import contextlib
import json
import os
import shutil
import socket
import stat
import subprocess
import threading

import httpx
import pytest
import trio

from swamp import client
from swamp.errors import ChannelClosed, Forbidden
from swamp.protocol.frames import MAX_FRAME_BYTES
from swamp.protocol.transport import DRAIN_QUIET
from swamp.repo import Repo
from tests.integration.hostile import RawSocket, Refused, enroll_params

pytestmark = pytest.mark.integration


def _local_credential(cluster) -> str:
    credential = Repo(cluster.repo).admin_credential_for(cluster.url)
    assert credential and credential.startswith("local.")
    return credential


def _bearer(credential: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {credential}")]


def _shell_run(path) -> dict:
    return {"model": "command/shell", "method": "run", "args": {"command": f"touch {path}"}}


# -- browsers are not clients ---------------------------------------------------------------------


async def test_a_web_page_cannot_run_commands_on_the_orchestrator(cluster):
    """The critical one: with auth off (loopback) a page the operator visits opened a websocket
    and ran command/shell in the orchestrator. Browsers always send Origin."""
    cluster.serve("--auth", "none")
    pwned = cluster.tmp / "pwned"
    for origin in ("https://evil.example", "null", cluster.url.replace("ws://", "http://")):
        with pytest.raises(Refused) as info:
            await RawSocket.open(cluster.url, headers=[("origin", origin)])
        assert info.value.status == 403
        assert b"browsers are not clients" in info.value.body
    # DNS rebinding: the page's own name now points at 127.0.0.1
    port = cluster.url.rsplit(":", 1)[1]
    with pytest.raises(Refused) as info:
        await RawSocket.open(cluster.url, host=f"evil.example:{port}")
    assert info.value.status == 403 and b"DNS rebinding" in info.value.body
    assert not pwned.exists()
    # the control: the same request without a browser's headers does run (auth is off here)
    control = cluster.tmp / "control"
    ws = await RawSocket.open(cluster.url)
    reply = await ws.request("model.method.run", _shell_run(control))
    await ws.aclose()
    assert reply["result"]["status"] == "succeeded" and control.exists()
    assert not pwned.exists()


async def test_the_data_plane_refuses_browsers_and_rebinding(cluster):
    cluster.serve()
    base = cluster.url.replace("ws://", "http://")
    port = base.rsplit(":", 1)[1]
    async with httpx.AsyncClient() as http:
        for headers in ({"Origin": "https://evil.example"}, {"Host": f"evil.example:{port}"}):
            for method in ("GET", "PUT"):
                path = "/health" if method == "GET" else "/data/resources/result/x"
                reply = await http.request(
                    method, base + path, headers=headers, json={"a": 1} if method == "PUT" else None
                )
                assert reply.status_code == 403, (headers, method, reply.text)
                assert reply.json()["error"]["code"] == "forbidden"
        allowed = await http.get(base + "/health")
        assert allowed.status_code == 200


async def test_an_allowed_origin_is_admitted(cluster):
    cluster.serve("--allow-origin", "https://ops.example.com")
    ws = await RawSocket.open(
        cluster.url,
        headers=[("origin", "https://ops.example.com"), *_bearer(_local_credential(cluster))],
    )
    reply = await ws.request("worker.list")
    await ws.aclose()
    assert reply["result"]["workers"] == []
    with pytest.raises(Refused):
        await RawSocket.open(cluster.url, headers=[("origin", "https://evil.example")])


# -- admin credentials ----------------------------------------------------------------------------


def test_the_cli_in_the_repo_needs_nothing_and_anyone_else_is_refused(cluster):
    cluster.serve()
    state = cluster.repo / ".swamp"
    assert stat.S_IMODE(os.stat(state / "serve.json").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(state).st_mode) == 0o700
    assert "adminCredential" in json.loads((state / "serve.json").read_text())
    # the operator, in the repo: the local credential is picked up
    assert cluster.cli_json("worker", "list", "--server", cluster.url)["workers"] == []
    # anyone who cannot read the repo's .swamp/ (another local user): refused, told how
    elsewhere = {"SWAMP_REPO_DIR": str(cluster.tmp)}
    denied = cluster.cli("worker", "list", "--server", cluster.url, env=elsewhere)
    assert denied.returncode == 1 and "need a credential" in denied.stderr
    assert "--server-token" in denied.stderr and "Traceback" not in denied.stderr
    ran = cluster.cli(
        "model",
        "method",
        "run",
        "command/shell",
        "run",
        "--arg",
        f"command=touch {cluster.tmp / 'pwned'}",
        "--server",
        cluster.url,
        env=elsewhere,
    )
    assert ran.returncode == 1 and not (cluster.tmp / "pwned").exists()


class _Impostor:
    """Another local user's listener on a loopback address serve did not bind: it records the
    request head of every connection and answers 403."""

    def __init__(self, host: str, port: int) -> None:
        self.heads: list[bytes] = []
        self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self.sock.bind((host, port))
        self.sock.listen(8)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                head = b""
                while b"\r\n\r\n" not in head and len(head) < 65536:
                    data = conn.recv(65536)
                    if not data:
                        break
                    head += data
                self.heads.append(head)
                conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")

    def close(self) -> None:
        self.sock.close()


def test_the_local_credential_goes_only_to_the_address_serve_announced(cluster):
    """Another local user listening on [::1]:PORT (serve bound 127.0.0.1:PORT) received the
    local admin credential from 'swamp worker list --server ws://[::1]:PORT' in the repo, and
    could replay it to run commands as the orchestrator's user."""
    cluster.serve()
    port = int(cluster.url.rsplit(":", 1)[1])
    impostor = _Impostor("::1", port)
    try:
        for url in (f"ws://[::1]:{port}", f"ws://localhost:{port}", f"ws://LOCALHOST:{port}/"):
            result = cluster.cli("worker", "list", "--server", url)
            assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
            if "need a credential" in result.stderr:  # the real server, reached as localhost
                assert f"pass --server {cluster.url}" in result.stderr, result.stderr
    finally:
        impostor.close()
    # the impostor did get the CLI's upgrade request (a credential would have been in it) ...
    assert impostor.heads and all(b"upgrade: websocket" in h.lower() for h in impostor.heads)
    credential = _local_credential(cluster).encode()
    for head in impostor.heads:
        assert credential not in head and b"authorization" not in head.lower()
    # ... and the control: the exact address serve announced gets it, and it works
    assert cluster.cli_json("worker", "list", "--server", cluster.url)["workers"] == []


async def test_health_tells_strangers_only_that_it_is_up(cluster):
    cluster.serve()
    base = cluster.url.replace("ws://", "http://")
    async with httpx.AsyncClient() as http:
        assert (await http.get(f"{base}/health")).json() == {"status": "ok"}
        bad = await http.get(f"{base}/health", headers={"Authorization": "Bearer local.00"})
        assert bad.json() == {"status": "ok"}
        admin = await http.get(
            f"{base}/health", headers={"Authorization": f"Bearer {_local_credential(cluster)}"}
        )
        assert admin.json()["status"] == "ok" and "version" in admin.json()
        assert admin.json()["pool"]["connected"] == 0


def test_server_tokens_guard_admin_frames_but_not_enrollment(cluster):
    admin = cluster.cli_json("server", "token", "create", "ops")
    cluster.serve()
    elsewhere = {"SWAMP_REPO_DIR": str(cluster.tmp)}
    cases = [
        ({}, "need a credential"),
        ({"SWAMP_SERVER_TOKEN": "ops." + "1" * 64}, "'ops' was not accepted"),
        ({"SWAMP_SERVER_TOKEN": "ghost." + "1" * 64}, "'ghost' was not accepted"),
        ({"SWAMP_SERVER_TOKEN": "no-dot"}, "<name>.<secret>"),
    ]
    for env, needle in cases:
        denied = cluster.cli("worker", "list", "--server", cluster.url, env={**elsewhere, **env})
        assert denied.returncode == 1 and needle in denied.stderr, (env, denied.stderr)
    # an unknown name and a wrong secret read the same, but for the name itself
    assert cases[1][1].replace("ops", "x") == cases[2][1].replace("ghost", "x")
    cluster.worker(cluster.mint("w1"))  # workers need only their enrollment token
    allowed = cluster.cli_json(
        "worker",
        "list",
        "--server",
        cluster.url,
        env={**elsewhere, "SWAMP_SERVER_TOKEN": admin["token"]},
    )
    assert [w["name"] for w in allowed["workers"]] == ["w1"]
    secret = admin["token"].split(".", 1)[1].encode()
    for path in (cluster.repo / ".swamp").glob("swamp.db*"):
        assert secret not in path.read_bytes()


async def test_revoking_a_server_token_closes_the_sockets_it_opened(cluster):
    ops = cluster.cli_json("server", "token", "create", "ops")["token"]
    other = cluster.cli_json("server", "token", "create", "other")["token"]
    cluster.serve()
    async with (
        client.connect(cluster.url, server_token=ops) as channel,
        client.connect(cluster.url, server_token=other) as bystander,
    ):
        assert (await channel.call("worker.list"))["workers"] == []
        assert (await bystander.call("worker.list"))["workers"] == []
        # in a thread: the channels go on answering meanwhile, however long the CLI takes
        revoked = await trio.to_thread.run_sync(
            lambda: cluster.cli("server", "token", "revoke", "ops")
        )
        assert revoked.returncode == 0, revoked.stderr
        with trio.fail_after(30):
            reason = await channel.wait_closed()
        assert "revoked" in reason
        with pytest.raises(ChannelClosed):
            await channel.call("worker.list")
        assert (await bystander.call("worker.list"))["workers"] == []  # untouched
    with pytest.raises(Forbidden, match="'ops' has been revoked"):
        await client.call(cluster.url, "worker.list", server_token=ops)


async def test_sockets_quiet_for_a_while_are_still_told_why_they_are_closed(cluster):
    """A socket whose peer had sent nothing for longer than the close's drain window was cut
    with no close frame about half the time (the wait for a quiet peer could end before the
    frame went out): the client saw code 1006, not why. Eight such sockets, one revoke."""
    ops = cluster.cli_json("server", "token", "create", "ops")["token"]
    cluster.serve("--heartbeat", "30s")  # no pings meanwhile: the sockets stay quiet
    async with contextlib.AsyncExitStack() as stack:
        channels = [
            await stack.enter_async_context(client.connect(cluster.url, server_token=ops))
            for _ in range(8)
        ]
        for channel in channels:
            assert (await channel.call("worker.list"))["workers"] == []
        await trio.sleep(DRAIN_QUIET + 0.5)  # the condition itself: longer quiet than the window
        revoked = cluster.cli("server", "token", "revoke", "ops")
        assert revoked.returncode == 0, revoked.stderr
        with trio.fail_after(10):
            reasons = [await channel.wait_closed() for channel in channels]
    assert all("has been revoked" in reason for reason in reasons), reasons


def test_auth_none_off_loopback_refuses_to_start(cluster):
    result = cluster.cli("serve", "--host", "0.0.0.0", "--port", "0", "--auth", "none")
    assert result.returncode == 2
    assert "--auth none" in result.stderr and "Traceback" not in result.stderr
    assert not (cluster.repo / ".swamp" / "serve.json").exists()


def test_serve_outside_a_repo_says_how_to_make_one(cluster, tmp_path):
    result = cluster.cli("serve", "--repo-dir", str(tmp_path / "nowhere"))
    assert result.returncode != 0 and "swamp init" in result.stderr


# -- roles and hostile frames ---------------------------------------------------------------------


async def test_a_worker_socket_can_never_call_admin_frames(cluster):
    cluster.serve()
    token = cluster.mint("w1")
    ws = await RawSocket.open(cluster.url, headers=_bearer(_local_credential(cluster)))
    before = await ws.request("capability.queryData", {"predicate": "version > 0"})
    assert before["error"]["code"] == "forbidden" and "enroll first" in before["error"]["message"]
    enrolled = await ws.request("worker.enroll", enroll_params(token))
    assert enrolled["result"]["workerName"] == "w1"
    # even a socket that presented the admin credential is a worker once it enrolled
    for method in [
        "worker.list",
        "worker.token.create",
        "worker.token.revoke",
        "model.method.run",
        "data.query",
        "worker.enroll",
    ]:
        reply = await ws.request(method, {"name": "w1"})
        assert reply["error"]["code"] == "forbidden", (method, reply)
    outside = await ws.request("capability.queryData", {"dispatchId": "x", "predicate": "1 == 1"})
    assert outside["error"]["code"] == "forbidden"
    await ws.aclose()
    tokens = cluster.cli_json("worker", "token", "list")
    assert [t["state"] for t in tokens] == ["enrolled"]


async def test_hostile_frames_get_coded_errors_and_the_server_survives(cluster):
    cluster.serve()
    ws = await RawSocket.open(cluster.url, headers=_bearer(_local_credential(cluster)))
    for text, code in [
        ("not json", "malformed_frame"),
        ("[1,2]", "malformed_frame"),
        ('{"type":"request","id":"","method":"x"}', "malformed_frame"),
        ('{"type":"request","id":"x","method":"worker.enroll","params":"zzz"}', "malformed_frame"),
        ('{"type":"nonsense"}', "malformed_frame"),
        (
            '{"type":"request","id":"big","method":"x","params":{"p":"'
            + "x" * (MAX_FRAME_BYTES + 10)
            + '"}}',
            "frame_too_large",
        ),
    ]:
        await ws.send(text)
        reply = await ws.next_frame()
        assert reply["type"] == "error" and reply["error"]["code"] == code, (text[:60], reply)
    for params, code in [
        ({"token": "w1"}, "malformed_frame"),
        (enroll_params("nodot"), "malformed_token"),
        (enroll_params("ghost.secret"), "token_invalid"),
        (enroll_params("ghost.secret", protocolVersion=999), "protocol_mismatch"),
        (enroll_params("ghost.secret", labels={"bad key": "v"}), "invalid_input"),
        (enroll_params("ghost.secret", capacity=0), "invalid_input"),
    ]:
        reply = await ws.request("worker.enroll", params)
        assert reply["error"]["code"] == code, (params, reply)
    unknown = await ws.request("no.such.method")
    assert unknown["error"]["code"] == "unknown_method"
    for method, params, code in [
        ("model.method.run", {"model": "no/such", "method": "run"}, "unknown_model"),
        ("model.method.run", {"model": "command/shell", "method": "walk"}, "unknown_method"),
        (
            "model.method.run",
            {"model": "command/shell", "method": "run", "args": {"command": 5}},
            "invalid_input",
        ),
        (
            "model.method.run",
            {
                "model": "command/shell",
                "method": "run",
                "args": {"command": "true"},
                "placement": {"labels": {"a": 1}},
            },
            "malformed_frame",
        ),
        (
            "model.method.run",
            {
                "model": "command/shell",
                "method": "run",
                "args": {"command": "true"},
                "placement": {"labels": {"a b": "1"}},
            },
            "invalid_input",
        ),
        (
            "model.method.run",
            {
                "model": "command/shell",
                "method": "run",
                "args": {"command": "true"},
                "env": ["PATH"],
            },
            "invalid_input",
        ),
        ("data.query", {"predicate": "version =="}, "invalid_predicate"),
        ("worker.token.create", {"name": "x", "duration": "0s"}, "invalid_input"),
        ("worker.token.create", {"name": "Bad.Name", "duration": "1h"}, "invalid_input"),
        (
            "worker.token.create",
            {"name": "x", "duration": "1h", "maxConcurrency": 0},
            "invalid_input",
        ),
        ("worker.token.create", {"name": "x"}, "malformed_frame"),
        ("worker.list", {"all": "yes"}, "malformed_frame"),
    ]:
        reply = await ws.request(method, params)
        assert reply["error"]["code"] == code, (method, params, reply)
    await ws.aclose()
    # still serving, nothing written
    assert cluster.cli_json("worker", "list", "--server", cluster.url)["workers"] == []
    assert cluster.query("version > 0") == []


async def test_the_data_plane_refuses_without_a_dispatch_credential(cluster):
    cluster.serve()
    base = cluster.url.replace("ws://", "http://")
    async with httpx.AsyncClient() as http:
        for headers in (
            {},
            {"Authorization": "Bearer nonsense"},
            {"Authorization": f"Bearer {_local_credential(cluster)}"},
        ):
            reply = await http.put(
                f"{base}/data/resources/result/x", json={"a": 1}, headers=headers
            )
            assert reply.status_code == 401 and reply.json()["error"]["code"] == "unauthorized"
        missing = await http.get(f"{base}/nowhere")
        assert missing.status_code == 404


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls_end_to_end_with_a_private_ca(cluster):
    cert, key = cluster.tmp / "cert.pem", cluster.tmp / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    cluster.serve("--tls-cert", str(cert), "--tls-key", str(key))
    assert cluster.url.startswith("wss://")
    untrusted = cluster.worker(cluster.mint("w0"), wait=False)
    untrusted.wait_for(
        lambda e: e.get("event") == "disconnected" and "CERTIFICATE" in e["reason"].upper()
    )
    untrusted.stop()
    cluster.worker(cluster.mint("w1"), "--ca-cert", str(cert))
    code, lines = cluster.run(
        "test/steps",
        "round_trip",
        "--arg",
        "value=tls",
        "--target",
        "w1",
        env={"SWAMP_CA_CERT": str(cert)},
    )
    assert code == 0, lines
