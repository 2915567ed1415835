"""Verification: the fleet probe on one worker, and its verdict.

The probe runs as an ordinary dispatch episode (lease, credential, frame, data plane), straight to
the named connected worker: it skips the queue and takes no slot, so it can prove a worker that
is unverified or full. It never changes the worker's scheduling status — membership does that
with the verdict under ``--verify-on-enroll``. ``worker verify`` and membership both use it.
"""

from __future__ import annotations

import secrets
import uuid

import trio

from swamp.domain.episodes import Ending
from swamp.domain.read_scope import ReadScope
from swamp.errors import MalformedFrame, SwampError
from swamp.models.fleet_probe import FLEET_PROBE, MARKER_ENV
from swamp.models.fleet_probe import INSTANCE as FLEET_PROBE_INSTANCE
from swamp.orchestrator.episode import Episodes, Step, Work
from swamp.orchestrator.pool import Pool
from swamp.protocol.messages import Verdict

PROBE_TIMEOUT = 60


class Verifier:
    def __init__(
        self, episodes: Episodes, pool: Pool, *, shipped: dict[str, str] | None = None
    ) -> None:
        self.episodes = episodes
        self.pool = pool
        self.shipped = dict(shipped or {})  # serve --ship-env: every dispatch carries it

    def __repr__(self) -> str:
        return f"<Verifier {self.pool!r}>"

    async def probe(self, name: str) -> Verdict:
        """Run the fleet probe on worker ``name``; every way it can go wrong is a verdict."""
        member = self.pool.get(name)
        if member is None or not member.connected:
            return Verdict(name, "error", error=f"worker {name!r} is not connected")
        marker = secrets.token_hex(8)
        work = Work(
            model_type=FLEET_PROBE,
            model_name=FLEET_PROBE_INSTANCE,
            method="verify",
            args=FLEET_PROBE.method("verify").validate({"marker": marker}),
            environment={**self.shipped, MARKER_ENV: marker},
            read_scope=ReadScope.of(FLEET_PROBE.type, FLEET_PROBE_INSTANCE),
            takes_slot=False,
        )

        async def ignore(event: dict) -> None:
            return None

        try:
            with trio.fail_after(PROBE_TIMEOUT):
                episode = await self.episodes.run(
                    member, uuid.uuid4().hex, work, Step(uuid.uuid4().hex), ignore
                )
        except trio.TooSlowError:
            said = f"the probe got no answer within {PROBE_TIMEOUT:g}s"
            return Verdict(name, "error", error=said)
        except SwampError as exc:
            return Verdict(name, "error", error=exc.message)
        end = episode.end
        if end.how is Ending.LOST:
            return Verdict(
                name, "error", error=f"worker {name} was lost during the probe ({end.reason})"
            )
        result = episode.result
        summary = result.result if result is not None else None
        if end.how is not Ending.SUCCEEDED or not isinstance(summary, dict):
            return Verdict(
                name,
                "error",
                error=(result.error if result else None)
                or end.reason
                or "the probe returned no verdict",
            )
        try:
            return Verdict.decode(
                {
                    "name": name,
                    "status": "pass" if summary.get("ok") is True else "fail",
                    "platform": summary.get("platform"),
                    "arch": summary.get("arch"),
                    "seams": summary.get("seams") or {},
                    "failures": summary.get("failures") or [],
                }
            )
        except MalformedFrame as exc:
            return Verdict(name, "error", error=f"the probe's verdict is malformed: {exc.message}")
