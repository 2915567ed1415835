"""``swamp serve``."""

from __future__ import annotations

import logging
from pathlib import Path

import typer

from swamp.cli.common import JSON, REPO_DIR, command, repo_path


@command
def serve(
    repo_dir: Path = REPO_DIR,
    host: str = typer.Option("127.0.0.1", "--host", envvar="SWAMP_SERVE_HOST",
                             help="Address to listen on. Anything but loopback needs --auth "
                                  "token."),
    port: int = typer.Option(7420, "--port", envvar="SWAMP_SERVE_PORT",
                             help="Port to listen on; 0 picks a free one."),
    auth: str = typer.Option("none", "--auth", envvar="SWAMP_SERVE_AUTH",
                             help="none (loopback only) or token: admin commands then need a "
                                  "server token (swamp server token create NAME)."),
    tls_cert: Path = typer.Option(None, "--tls-cert", help="PEM certificate: serve wss:// and "
                                                          "https://."),
    tls_key: Path = typer.Option(None, "--tls-key", help="PEM private key for --tls-cert."),
    grace_window: str = typer.Option("60s", "--grace-window",
                                     help="How long a disconnected worker keeps its place in "
                                          "the pool, e.g. 60s."),
    heartbeat: str = typer.Option("5s", "--heartbeat",
                                  help="Heartbeat interval; a peer silent for three is "
                                       "dropped."),
    worker_retention: str = typer.Option(
        "24h", "--worker-retention",
        help="Forget workers disconnected for longer than this, and release their fleet "
             "token slots, e.g. 24h."),
    verify_on_enroll: bool = typer.Option(
        False, "--verify-on-enroll", envvar="SWAMP_VERIFY_ON_ENROLL",
        help="Probe every enrolling worker (first connect and reconnect) before it gets work; "
             "one that fails stays 'unverified' with its reason in 'swamp worker list'."),
    json_output: bool = JSON,
) -> None:
    """Run the orchestrator: websocket control plane, HTTP data plane and /health on one port.

    Prints the ws:// URL it listens on and writes it to .swamp/serve.json. Before accepting
    traffic it reconciles what a previous run left: active leases expire, workers that were
    connected are marked disconnected (they reconnect by themselves). Stop with Ctrl-C or
    SIGTERM.
    """
    import trio

    from swamp.domain.durations import parse_duration
    from swamp.orchestrator.server import ServeOptions, serve as run
    from swamp.repo import Repo

    repo = Repo.find(repo_path(repo_dir))
    options = ServeOptions(
        host=host, port=port, auth=auth, tls_cert=tls_cert, tls_key=tls_key,
        grace_seconds=parse_duration(grace_window, what="--grace-window"),
        heartbeat_seconds=parse_duration(heartbeat, what="--heartbeat"),
        worker_retention=parse_duration(worker_retention, what="--worker-retention"),
        verify_on_enroll=verify_on_enroll,
        json=json_output)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: "
                                                   "%(message)s")
    logging.getLogger("hypercorn.error").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    trio.run(run, repo, options)
