"""Running one method against a context: the same code in the orchestrator and on a worker."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import trio

from swamp.errors import SwampError
from swamp.models.framework import Method
from swamp.protocol.messages import DispatchResult, OutputHandle

log = logging.getLogger("swamp.runner")


@dataclass
class Outcome:
    status: Literal["succeeded", "failed"]
    error: str | None = None
    result: Any = None
    outputs: list[dict] = field(default_factory=list)
    duration_ms: int = 0

    def to_message(self) -> DispatchResult:
        return DispatchResult(
            status=self.status,
            duration_ms=self.duration_ms,
            error=self.error or None,
            result=self.result,
            outputs=[OutputHandle(o["spec"], o["name"], o["version"]) for o in self.outputs],
        )


async def run_method(method: Method, args: dict[str, Any], ctx) -> Outcome:
    """Run and report; a method that raises fails its dispatch, never the process running it.

    Cancellation is not caught: it belongs to whoever cancelled (a lost socket, a shutdown).
    """
    started = time.monotonic()
    status: Literal["succeeded", "failed"]
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
    return Outcome(
        status=status,
        error=error,
        result=result,
        outputs=list(ctx.outputs),
        duration_ms=round((time.monotonic() - started) * 1000),
    )


def _jsonable(value: Any) -> bool:
    import json

    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True
