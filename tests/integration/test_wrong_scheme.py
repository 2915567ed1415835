"""The wrong scheme for the port: ``ws://`` to a TLS orchestrator, ``wss://`` to a plain one.

Each used to wait for an answer that could never come (the CLI for its 10 s handshake timeout,
the worker retrying for ten minutes, with "timed out" as the only reason). Now the listener
answers at once in plain HTTP, and the CLI and the worker say in one line which scheme to use.
The verdicts are on what is said, never on how long it took: the old server said nothing.
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
from urllib.parse import urlsplit

import pytest

from swamp.protocol.transport import SPEAKS_PLAIN, SPEAKS_TLS

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")

UPGRADE = (
    b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


def _tls_serve(cluster):
    cert, key = cluster.tmp / "cert.pem", cluster.tmp / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    cluster.serve("--tls-cert", str(cert), "--tls-key", str(key))
    assert cluster.url.startswith("wss://")
    return cert


def _port(url: str) -> int:
    return urlsplit(url).port


def _answer(port: int, request: bytes) -> bytes:
    """Send ``request`` on a fresh connection; everything the server says until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def _client_hello() -> bytes:
    """The first bytes a real TLS client sends."""
    tls = ssl.create_default_context().wrap_bio(ssl.MemoryBIO(), outgoing := ssl.MemoryBIO())
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def _one_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_plain_text_to_a_tls_port_is_told_to_use_wss(cluster):
    cert = _tls_serve(cluster)
    port = _port(cluster.url)
    plain_url = f"ws://127.0.0.1:{port}"
    # the listener: a websocket upgrade and a plain HTTP request each get the answer at once
    for request in (UPGRADE, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"):
        answer = _answer(port, request)
        assert answer.startswith(b"HTTP/1.1 400 "), answer
        assert answer.endswith(f"\r\n\r\n{SPEAKS_TLS}\n".encode()), answer
    # the CLI: one line, naming the URL to use; bad input, exit 2
    result = cluster.cli("worker", "list", "--server", plain_url)
    assert result.returncode == 2
    assert _one_line(result) == (
        f"error: the server at 127.0.0.1:{port} speaks TLS on this port: use wss://127.0.0.1:{port}"
    )
    # the worker stops (retrying can never help) instead of retrying for ten minutes
    worker = cluster.spawn("worker", "connect", plain_url, "--json",
                           env={"SWAMP_WORKER_TOKEN": cluster.mint("w1")})  # fmt: skip
    stopped = worker.wait_for(lambda e: e.get("event") == "stopped", timeout=60)
    assert stopped["code"] == "wrong_scheme" and stopped["exitCode"] == 1
    assert f"use wss://127.0.0.1:{port}" in stopped["reason"]
    assert worker.wait_exit() == 1
    # the control: the same port, the right scheme, works
    listed = cluster.cli(
        "worker", "list", "--server", cluster.url, "--ca-cert", str(cert), "--json"
    )
    assert listed.returncode == 0, listed.stderr


def test_tls_to_a_plain_port_is_told_to_use_ws(cluster):
    cluster.serve()
    port = _port(cluster.url)
    tls_url = f"wss://127.0.0.1:{port}"
    # the listener answers a real ClientHello in plain HTTP at once (it used to wait 10 s for
    # a request head and close without a word)
    answer = _answer(port, _client_hello())
    assert answer.startswith(b"HTTP/1.1 400 "), answer
    assert answer.endswith(f"\r\n\r\n{SPEAKS_PLAIN}\n".encode()), answer
    result = cluster.cli("worker", "list", "--server", tls_url)
    assert result.returncode == 2
    assert _one_line(result) == (
        f"error: the server at 127.0.0.1:{port} does not speak TLS on this port: "
        f"use ws://127.0.0.1:{port}"
    )
    worker = cluster.spawn("worker", "connect", tls_url, "--json",
                           env={"SWAMP_WORKER_TOKEN": cluster.mint("w1")})  # fmt: skip
    stopped = worker.wait_for(lambda e: e.get("event") == "stopped", timeout=60)
    assert stopped["code"] == "wrong_scheme" and stopped["exitCode"] == 1
    assert f"use ws://127.0.0.1:{port}" in stopped["reason"]
    assert worker.wait_exit() == 1
    # the control: the right scheme on the same port works, and the refusals harmed nothing
    cluster.worker(cluster.mint("w2"))
    assert [w["name"] for w in cluster.workers()] == ["w2"]
