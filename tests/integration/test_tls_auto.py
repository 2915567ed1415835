"""``swamp serve --tls auto`` on real processes: its own CA, a worker that holds nothing but
the pin, a wrong pin refused in one line, and the repo's CLI trusting its own server."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

from tests.integration.conftest import result_of


def _pin_of(cluster) -> str:
    return json.loads((cluster.repo / ".swamp" / "serve.json").read_text())["caPin"]


def test_off_loopback_serve_speaks_tls_with_its_own_ca_and_a_pinned_worker_runs_a_step(cluster):
    serve = cluster.serve("--host", "0.0.0.0")  # no TLS flag: off loopback means --tls auto
    listening = serve.wait_for(lambda e: e.get("event") == "listening")
    assert cluster.url.startswith("wss://") and listening["tls"] == "auto"
    pin = listening["caPin"]
    assert pin == _pin_of(cluster) and pin.startswith("sha256:")
    assert (cluster.repo / ".swamp" / "tls" / "ca.key").stat().st_mode & 0o777 == 0o600

    # the repo's CLI: no --ca-cert, through the server (minting prints the pin)
    created = cluster.cli_json(
        "worker", "token", "create", "w1", "--duration", "1h", "--server", cluster.url
    )
    assert created["caPin"] == pin
    plain = cluster.cli("worker", "token", "create", "w2", "--duration", "1h")
    assert plain.returncode == 0 and f"ca pin: {pin}" in plain.stdout

    worker = cluster.spawn(
        "worker", "connect", "--json",
        env={"SWAMP_ORCHESTRATOR_URL": cluster.url, "SWAMP_WORKER_TOKEN": created["token"],
             "SWAMP_CA_PIN": pin},
    )  # fmt: skip
    worker.wait_for(lambda e: e.get("event") == "enrolled")
    code, lines = cluster.run("test/steps", "round_trip", "--arg", "value=pinned", "--target", "w1")
    assert code == 0, lines
    assert result_of(lines)["status"] == "succeeded"

    # the CA is kept across a restart: the same pin, and the worker comes back by itself
    mark = worker.mark()
    serve.signal(signal.SIGTERM)
    assert serve.wait_exit() == 0
    again = cluster.serve("--host", "0.0.0.0", port=int(cluster.url.rsplit(":", 1)[1]))
    assert again.wait_for(lambda e: e.get("event") == "listening")["caPin"] == pin
    worker.wait_for(lambda e: e.get("event") == "enrolled", start=mark)


def test_a_wrong_pin_is_one_line_and_exit_1(cluster):
    cluster.serve("--tls", "auto")
    token = cluster.mint("w1")
    wrong = "sha256:" + "0" * 64
    result = cluster.cli(
        "worker", "connect", cluster.url,
        env={"SWAMP_WORKER_TOKEN": token, "SWAMP_CA_PIN": wrong},
    )  # fmt: skip
    assert result.returncode == 1
    said = (result.stdout + result.stderr).splitlines()
    errors = [line for line in said if not line.startswith("connecting to")]
    assert len(errors) == 1, said
    assert wrong in errors[0] and _pin_of(cluster) in errors[0] and "refusing" in errors[0]
    assert token.split(".", 1)[1] not in result.stdout + result.stderr
    assert cluster.workers("--all") == []  # nothing enrolled: the token never left


def test_plain_text_off_loopback_is_only_what_was_asked_for(cluster):
    serve = cluster.serve("--host", "0.0.0.0", "--tls", "off")
    assert cluster.url.startswith("ws://")
    assert serve.wait_for(lambda e: e.get("event") == "listening")["tls"] == "off"
    refused = cluster.cli("serve", "--tls", "auto", "--tls-cert", "x.pem", "--tls-key", "y.pem")
    assert refused.returncode == 2 and "two choices" in refused.stderr


IMPOSTOR = """
import socket, ssl, sys, tempfile
from datetime import datetime, timezone
from pathlib import Path
from swamp.tls import certificates

real_ca, mode, record, port = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
now = datetime.now(timezone.utc)
evil = certificates.authority(name="swamp orchestrator CA", now=now)
cert = certificates.server(ca=evil, ca_name="swamp orchestrator CA", names=["127.0.0.1"], now=now)
folder = Path(tempfile.mkdtemp())
(folder / "s.pem").write_text(cert.certificate_pem())
(folder / "s.key").write_text(cert.key_pem())
context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
context.load_cert_chain(folder / "s.pem", folder / "s.key")
# the real CA (it is public) and the impostor's own, in a block OpenSSL reads as well
smuggled = Path(real_ca).read_text() + certificates.pem("X509 CERTIFICATE", evil.certificate)
listener = socket.create_server(("127.0.0.1", port))
print(listener.getsockname()[1], flush=True)
while True:
    conn, _ = listener.accept()
    try:
        with context.wrap_socket(conn, server_side=True) as tls:
            head = tls.recv(65536)
            with record.open("ab") as out:
                out.write(head + b"\\n--\\n")
            if head.startswith(b"GET /tls/ca.pem"):
                if mode == "smuggle":
                    body, status = smuggled.encode(), b"200 OK"
                else:
                    body, status = b"<html>maintenance</html>", b"404 Not Found"
                length = str(len(body)).encode()
                tls.sendall(b"HTTP/1.1 " + status + b"\\r\\nContent-Length: " + length
                            + b"\\r\\nConnection: close\\r\\n\\r\\n" + body)
            else:
                with record.open("ab") as out:
                    out.write(tls.recv(65536))
    except (OSError, ssl.SSLError):
        pass
"""


def _impostor(cluster, mode: str, port: int = 0):
    script = cluster.tmp / "impostor.py"
    script.write_text(IMPOSTOR)
    record = cluster.tmp / f"impostor-{mode}.log"
    ca = cluster.repo / ".swamp" / "tls" / "ca.pem"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(ca), mode, str(record), str(port)],
        env=cluster.env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    return proc, int(proc.stdout.readline()), record


def test_an_impostor_that_smuggles_its_ca_beside_the_real_one_gets_no_token(cluster):
    """The impostor sends the real CA certificate (public), whose pin is right, followed by its
    own CA in a ``BEGIN X509 CERTIFICATE`` block that OpenSSL also loads. A worker trusts the
    one certificate its pin proved: the handshake fails and the token never leaves."""
    cluster.serve("--tls", "auto")
    token = cluster.mint("w1")
    impostor, port, record = _impostor(cluster, "smuggle")
    try:
        worker = cluster.spawn(
            "worker", "connect", f"wss://127.0.0.1:{port}", "--json",
            env={"SWAMP_WORKER_TOKEN": token, "SWAMP_CA_PIN": _pin_of(cluster)},
        )  # fmt: skip
        refused = worker.wait_for(lambda e: e.get("event") == "disconnected")
        assert "CERTIFICATE_VERIFY_FAILED" in refused["reason"], refused
        worker.stop()
    finally:
        impostor.kill()
        impostor.wait(timeout=10)
    seen = record.read_bytes()
    assert b"GET /tls/ca.pem" in seen  # the control: it did ask the impostor for a CA
    assert token.split(".", 1)[1].encode() not in seen and b"enroll" not in seen


def test_a_worker_the_pin_let_in_asks_again_when_the_path_answers_without_the_ca(cluster):
    """Once enrolled, a CA answer that does not match the pin came from the path, not from a
    wrong pin: the worker keeps asking (nothing sent), and is back when the orchestrator is."""
    serve = cluster.serve("--tls", "auto")
    port = int(cluster.url.rsplit(":", 1)[1])
    worker = cluster.spawn(
        "worker", "connect", cluster.url, "--json",
        env={"SWAMP_WORKER_TOKEN": cluster.mint("w1"), "SWAMP_CA_PIN": _pin_of(cluster)},
    )  # fmt: skip
    worker.wait_for(lambda e: e.get("event") == "enrolled")
    serve.signal(signal.SIGTERM)
    assert serve.wait_exit() == 0
    mark = worker.mark()
    impostor, _, record = _impostor(cluster, "404", port)  # a maintenance page on the port
    try:
        worker.wait_for(
            lambda e: e.get("event") == "disconnected" and "no CA of its own" in e["reason"],
            start=mark,
        )
        worker.wait_for(lambda e: e.get("event") == "retrying", start=mark)
    finally:
        impostor.kill()
        impostor.wait(timeout=10)
    assert not [e for e in worker.events()[mark:] if e.get("event") == "stopped"]
    mark = worker.mark()
    cluster.serve("--tls", "auto", port=port)
    worker.wait_for(lambda e: e.get("event") == "enrolled", start=mark)
    assert b"enroll" not in record.read_bytes()
