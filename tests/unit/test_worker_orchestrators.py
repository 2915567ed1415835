"""The connect loop with a list of orchestrators, its sessions played by a stand-in (what
each orchestrator answers): a refusal of one orchestrator's own moves on to the next; the
worker stops only when every one has refused since it last enrolled."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import trio
import trio.testing

from swamp.errors import PeerError, PinMismatch, ProtocolMismatch
from swamp.worker import agent
from swamp.worker.config import WorkerConfig
from swamp.worker.drain import Drain
from swamp.worker.events import Reporter
from swamp.worker.runs import Runs

PIN = "sha256:" + "a" * 64


class Enough(BaseException):
    """Ends the probe's loop (what the probe wanted to see has happened)."""


def run_loop(monkeypatch, behaviour, url, **config):
    """``behaviour(url, attempt)``: raise, or return a reason (enrolled, then dropped)."""
    seen = []

    class FakeSession:
        def __init__(self, config, **kw):
            self.config, self.enrollment = config, None

        async def run(self):
            seen.append(self.config.url)
            result = behaviour(self.config.url, len(seen))
            self.enrollment = SimpleNamespace(token_expires_at=None)
            return result

    monkeypatch.setattr(agent, "Session", FakeSession)
    out = io.StringIO()
    reporter = Reporter(json_lines=True, stream=out)
    cfg = WorkerConfig(url=url, token="t.s", connect_timeout=60, **config)

    async def main():
        try:
            return await agent._connect_loop(
                cfg, reporter, "m", "i", None, None, None, Drain(reporter), Runs()
            )
        except Enough:
            return None

    code = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    return code, seen, events


def test_a_pin_mismatch_at_the_first_orchestrator_does_not_stop_a_list(monkeypatch):
    """A proxy at A answers /tls/ca.pem with a page of its own (PinMismatch); B is fine."""

    def behaviour(url, attempt):
        if "a.example" in url:
            raise PinMismatch("a.example:7420 has no CA of its own to check --ca-pin against")
        if attempt > 6:
            raise Enough  # enough: it reached B
        return "dropped"

    code, seen, events = run_loop(
        monkeypatch, behaviour, "wss://a.example:7420,wss://b.example:7420", ca_pin=PIN
    )
    assert "wss://b.example:7420" in seen, (code, seen, events[-1])


def test_one_orchestrator_refusing_the_protocol_does_not_stop_a_list(monkeypatch):
    """A rolling upgrade: B speaks a newer protocol already. Enrolled at A, A restarts, the
    loop moves to B, B refuses: the worker goes back to A rather than exit 1."""

    def behaviour(url, attempt):
        if "b.example" in url:
            raise ProtocolMismatch("the orchestrator speaks protocol 9, this worker 8")
        if attempt == 1:
            return "the orchestrator restarted"
        raise Enough

    code, seen, events = run_loop(
        monkeypatch, behaviour, "wss://a.example:7420,wss://b.example:7420"
    )
    assert code != 1, (seen, events[-1])


def test_every_orchestrator_refusing_stops_the_worker(monkeypatch):
    def behaviour(url, attempt):
        raise ProtocolMismatch(f"{url} speaks protocol 9, this worker 8")

    code, seen, events = run_loop(
        monkeypatch, behaviour, "wss://a.example:7420,wss://b.example:7420"
    )
    assert code == 1 and seen == ["wss://a.example:7420", "wss://b.example:7420"]
    assert events[-1]["event"] == "stopped" and "b.example" in events[-1]["reason"]


def test_a_pin_refused_by_one_orchestrator_is_said_while_another_comes_back(monkeypatch):
    """Enrolled at A; B's CA is not the pinned one (its own serve --tls auto): the worker
    keeps going back to A (it let the worker in, and may return), and each refusal at B is
    said in its event, with the reason."""

    def behaviour(url, attempt):
        if attempt == 1:
            return "dropped"
        if "b.example" in url:
            raise PinMismatch("the orchestrator at b.example:7420 presents another CA")
        if attempt > 8:
            raise Enough
        raise PeerError("a.example: connection refused")

    code, seen, events = run_loop(
        monkeypatch, behaviour, "wss://a.example:7420,wss://b.example:7420", ca_pin=PIN
    )
    assert code is None and not [e for e in events if e["event"] == "stopped"]
    said = [e["reason"] for e in events if e["event"] == "disconnected"]
    assert "the orchestrator at b.example:7420 presents another CA" in said
