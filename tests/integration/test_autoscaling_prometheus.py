"""docs/autoscaling.md on real processes: a real Prometheus (Debian's ``prometheus``) scrapes a
real ``swamp serve`` with a metrics-only token, using the scrape job the document shows, and
answers the document's queries — the workers-needed query word for word from
``docs/autoscaling/workers-needed.promql`` — with the right numbers while steps wait, run and
end; and that token, which Prometheus holds, cannot run a command.

Every wait is on an answer (Prometheus's HTTP API, a process's JSON line), bounded generously;
the steps' commands wait for a file the test writes, so nothing depends on how fast this
machine is.
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from tests.external import command
from tests.integration.conftest import ROOT, Proc, wait_until
from tests.integration.hostile import RawSocket

pytestmark = pytest.mark.integration

DOCS = ROOT / "docs" / "autoscaling"
WORKERS_NEEDED = (DOCS / "workers-needed.promql").read_text()
GPU = 'requirement="gpu=true"'
CPU = 'requirement="fleet=cpu"'
PATIENCE = 120  # seconds for Prometheus to start, scrape and answer: generous, never a verdict


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Prometheus:
    """A Prometheus of the test's own: its config, its storage, a free port on loopback."""

    def __init__(self, tmp: Path, target: str, token: str) -> None:
        token_file = tmp / "prometheus-token"
        token_file.write_text(token + "\n")
        token_file.chmod(0o600)
        # the document's scrape job, pointed here: plain HTTP on loopback, every second
        config = yaml.safe_load((DOCS / "prometheus.yml").read_text())
        [job] = config["scrape_configs"]
        assert job["authorization"]["type"] == "Bearer"
        job["authorization"]["credentials_file"] = str(token_file)
        job["scheme"] = "http"
        job.pop("tls_config")
        job["scrape_interval"] = job["scrape_timeout"] = "1s"
        job["static_configs"] = [{"targets": [target]}]
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.url = f"http://127.0.0.1:{_free_port()}"
        self.log = tmp / "prometheus.log"
        self.process = subprocess.Popen(
            [
                command("prometheus"),
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'prometheus-data'}",
                f"--web.listen-address={self.url.removeprefix('http://')}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("wb"),
        )
        wait_until(self._ready, timeout=PATIENCE, what=f"Prometheus ready ({self.log})")

    def _ready(self) -> bool:
        assert self.process.poll() is None, self.log.read_text()[-3000:]
        try:
            return httpx.get(self.url + "/-/ready", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def value(self, query: str) -> float | None:
        """The query's one value now, or ``None`` if it has none (yet)."""
        answer = httpx.get(self.url + "/api/v1/query", params={"query": query}, timeout=10)
        assert answer.status_code == 200, answer.text
        result = answer.json()["data"]["result"]
        assert len(result) <= 1, result
        return float(result[0]["value"][1]) if result else None

    def answers(self, expected: dict[str, float]) -> dict[str, float | None]:
        """Wait until every query answers as ``expected`` (Prometheus scrapes every second);
        the answers it gave last are in the failure."""
        seen: dict[str, float | None] = {}

        def agree() -> bool:
            seen.update({query: self.value(query) for query in expected})
            return seen == expected

        try:
            wait_until(agree, timeout=PATIENCE, what="Prometheus's answers")
        except AssertionError:
            raise AssertionError(f"expected {expected}, Prometheus said {seen}") from None
        return seen

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _run_step(cluster, label: str, go: Path) -> Proc:
    """A step that needs ``label`` and, once it runs, waits for ``go`` to exist."""
    script = f"while [ ! -e {go} ]; do sleep 0.1; done"
    return cluster.spawn(
        "model", "method", "run", "command/shell", "run", "--arg", f"command={script}",
        "--label", label, "--queue-timeout", "30m", "--server", cluster.url, "--json",
    )  # fmt: skip


def _event(kind: str):
    return lambda e: e.get("event", {}).get("kind") == kind


async def test_prometheus_answers_the_documented_queries_while_steps_wait_run_and_end(cluster):
    command("prometheus")  # a skip (a failure under CI) that says what is missing
    cluster.serve()
    scraper = cluster.cli_json("server", "token", "create", "prometheus", "--scope", "metrics")
    assert scraper["scope"] == "metrics"
    cpu = cluster.worker(cluster.mint_fleet("cpu", "2"), "--concurrency", "2")
    go = cluster.tmp / "go"
    on_cpu = _run_step(cluster, "fleet=cpu", go)  # runs at once, on one of the cpu slots
    on_cpu.wait_for(_event("dispatched"))
    steps = [_run_step(cluster, "gpu=true", go) for _ in range(3)]
    for step in steps:
        step.wait_for(_event("queued"))

    host = cluster.url.removeprefix("ws://")
    prometheus = Prometheus(cluster.tmp, host, scraper["token"])
    try:
        # 3 steps wait for a gpu worker; the cpu worker's idle slot is not gpu supply
        prometheus.answers(
            {
                'up{job="swamp"}': 1,  # the metrics-only token reads /metrics
                f"sum(swamp_queue_waiting{{{GPU}}})": 3,
                f"sum(swamp_queue_running{{{GPU}}})": 0,
                f"sum(swamp_queue_idle_slots{{{GPU}}})": 0,
                f"sum(swamp_queue_running{{{CPU}}})": 1,
                f"sum(swamp_queue_idle_slots{{{CPU}}})": 1,
                'sum(swamp_slots{fleet="cpu"})': 2,
                WORKERS_NEEDED: 2,  # ceil(3 / 4) + a warm worker
            }
        )
        oldest = prometheus.value(f"swamp_queue_oldest_wait_seconds{{{GPU}}}")
        assert oldest is not None and oldest > 0

        # ...and that token cannot run a command, over the real websocket
        touched = cluster.tmp / "touched"
        sock = await RawSocket.open(
            cluster.url, headers=[("authorization", f"Bearer {scraper['token']}")]
        )
        try:
            reply = await sock.request(
                "model.method.run",
                {
                    "model": "command/shell",
                    "method": "run",
                    "args": {"command": f"touch {touched}"},
                },
            )
        finally:
            await sock.aclose()
        assert reply["type"] == "error" and reply["error"]["code"] == "insufficient_scope", reply
        assert not touched.exists()

        # a gpu worker of 4 slots joins: the 3 run on it, 1 slot idle, still 2 workers needed
        gpu = cluster.worker(
            cluster.mint_fleet("gpu", "1", "--label", "gpu=true"), "--concurrency", "4"
        )
        for step in steps:
            step.wait_for(_event("dispatched"))
        prometheus.answers(
            {
                f"sum(swamp_queue_waiting{{{GPU}}})": 0,
                f"sum(swamp_queue_running{{{GPU}}})": 3,
                f"sum(swamp_queue_idle_slots{{{GPU}}})": 1,
                f"sum(swamp_queue_oldest_wait_seconds{{{GPU}}})": 0,
                WORKERS_NEEDED: 2,
            }
        )

        # the steps end: nothing waits or runs, so no worker is needed (scale to zero)
        go.touch()
        for step in (*steps, on_cpu):
            assert step.wait_exit(timeout=PATIENCE) == 0, step.log.read_text()
        prometheus.answers(
            {
                f"sum(swamp_queue_waiting{{{GPU}}})": 0,  # a series still, at 0
                f"sum(swamp_queue_running{{{GPU}}})": 0,
                f"sum(swamp_queue_idle_slots{{{GPU}}})": 4,
                f"sum(swamp_queue_running{{{CPU}}})": 0,
                f"sum(swamp_queue_idle_slots{{{CPU}}})": 2,
                WORKERS_NEEDED: 0,
            }
        )
    finally:
        prometheus.stop()
    for worker in (cpu, gpu):
        worker.stop()
        assert worker.p.returncode == 0, worker.log.read_text()  # drained: nothing lost
    assert "Traceback" not in cluster.serve_proc.log.read_text()
