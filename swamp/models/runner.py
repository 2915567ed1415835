"""Running one method against a context: the same code in the orchestrator and on a worker."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import trio

from swamp.errors import SwampError
from swamp.models.framework import Method

log = logging.getLogger("swamp.runner")


@dataclass
class Outcome:
    status: str  # succeeded | failed
    error: str | None = None
    result: Any = None
    outputs: list[dict] = field(default_factory=list)
    duration_ms: int = 0

    def to_json(self) -> dict:
        out = {"status": self.status, "outputs": self.outputs, "durationMs": self.duration_ms}
        if self.error:
            out["error"] = self.error
        if self.result is not None:
            out["result"] = self.result
        return out


async def run_method(method: Method, args: dict[str, Any], ctx) -> Outcome:
    """Run and report; a method that raises fails its dispatch, never the process running it.

    Cancellation is not caught: it belongs to whoever cancelled (a lost socket, a shutdown).
    """
    started = time.monotonic()
    try:
        result = await method.run(ctx, args)
        status, error = "succeeded", None
    except SwampError as exc:
        result, status, error = None, "failed", exc.message
    except trio.Cancelled:
        raise
    except Exception as exc:  # a bug in a method must not take the worker down
        log.exception("method %s raised", method.name)
        result, status, error = None, "failed", f"{type(exc).__name__}: {exc}"
    if result is not None and not _jsonable(result):
        result = None
    return Outcome(status=status, error=error, result=result, outputs=list(ctx.outputs),
                   duration_ms=round((time.monotonic() - started) * 1000))


def _jsonable(value: Any) -> bool:
    import json

    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True
