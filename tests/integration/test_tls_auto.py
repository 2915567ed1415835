"""``swamp serve --tls auto`` on real processes: its own CA, a worker that holds nothing but
the pin, a wrong pin refused in one line, and the repo's CLI trusting its own server."""

from __future__ import annotations

import json

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
    serve.signal(__import__("signal").SIGTERM)
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
