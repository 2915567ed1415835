"""The fleet probe: one method that checks every seam a real deployment can break.

``swamp/fleet-probe`` (instance ``probe``), method ``verify``, runs on a worker through the
ordinary dispatch path and checks each *seam*:

- ``env`` — a marker the orchestrator put in this dispatch's environment arrived, and matches
  the one in the dispatch's arguments: dispatch metadata and environment shipping work;
- ``capability`` — a ``query_data`` round trip over the control socket;
- ``data-plane`` — a small resource written over HTTP and read back, compared;
- plus every seam contributed through the ``swamp_probe_seams`` hook (``plugins/`` has one).

A seam returns a short detail or raises with a one-line reason; one failing seam never stops the
others. The method always succeeds and returns ``{platform, arch, ok, seams: {name: {ok,
detail}}, failures}``: the orchestrator reads the verdict from the dispatch result, which does
not depend on the data plane working.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from swamp.errors import SeamFailed, SwampError

__all__ = ["FLEET_PROBE", "Seam", "SeamFailed", "run_seam"]  # SeamFailed: for seam authors
from swamp.hooks import hookimpl
from swamp.hostinfo import local_platform
from swamp.models.framework import Arg, Method, ModelType, ResourceSpec

MARKER_ENV = "FLEET_PROBE_MARKER"
SEAM_TIMEOUT = 20
INSTANCE = "probe"


@dataclass(frozen=True)
class Seam:
    name: str
    check: Callable[[Any, dict], Awaitable[str]]
    help: str = ""


async def _env(ctx, args: dict) -> str:
    got = ctx.env.get(MARKER_ENV)
    if not got:
        raise SeamFailed(f"the dispatch's environment did not arrive ({MARKER_ENV} is unset)")
    if got != args["marker"]:
        raise SeamFailed(f"{MARKER_ENV} carries another dispatch's marker")
    return "the dispatch's marker arrived in its environment"


async def _capability(ctx, args: dict) -> str:
    records = await ctx.query_data(f'modelType == "{FLEET_PROBE.type}"')
    return f"query_data answered over the control socket ({len(records)} record(s))"


async def _data_plane(ctx, args: dict) -> str:
    # An item of its own per probe: probes of many workers run at once on the same instance.
    name = f"check-{args['marker']}"
    value = {"marker": args["marker"], "writtenAt": time.time()}
    handle = await ctx.write_resource("result", name, value)
    back = await ctx.read_resource(name)
    if back != value:
        raise SeamFailed(f"wrote version {handle['version']} but read back something else")
    return f"wrote and read back version {handle['version']} over HTTP"


BUILTIN_SEAMS = (
    Seam("env", _env, "dispatch metadata and environment shipping"),
    Seam("capability", _capability, "capability RPC over the control socket"),
    Seam("data-plane", _data_plane, "resource write and read over the HTTP data plane"),
)


def ordered(seams: list[Seam]) -> list[Seam]:
    """Built-in seams first, in their order, then plugin seams by name; a name counts once."""
    builtin = [s.name for s in BUILTIN_SEAMS]
    unique: dict[str, Seam] = {}
    for seam in seams:
        unique.setdefault(seam.name, seam)
    return sorted(
        unique.values(),
        key=lambda s: (builtin.index(s.name) if s.name in builtin else len(builtin), s.name),
    )


async def run_seam(seam: Seam, ctx, args: dict) -> dict:
    try:
        with trio.fail_after(SEAM_TIMEOUT):
            detail = await seam.check(ctx, args)
        return {"ok": True, "detail": str(detail or "ok")}
    except trio.TooSlowError:
        return {"ok": False, "detail": f"no answer within {SEAM_TIMEOUT}s"}
    except SwampError as exc:
        return {"ok": False, "detail": exc.message}
    except Exception as exc:  # a broken plugin seam fails its seam, not the probe
        return {"ok": False, "detail": f"{type(exc).__name__}: {exc}"}


async def _verify(ctx, args: dict) -> dict:
    seams = {}
    # the plugins' seams come through the context: this module does not know the plugins.
    # Theirs first: a plugin's seam named as a built-in one replaces it (a name counts once);
    # the built-ins stand in for a context that brings none
    for seam in ordered([*ctx.probe_seams(), *BUILTIN_SEAMS]):
        seams[seam.name] = await run_seam(seam, ctx, args)
    system, arch = local_platform()
    failures = [f"{name}: {r['detail']}" for name, r in seams.items() if not r["ok"]]
    summary = {
        "platform": system,
        "arch": arch,
        "ok": not failures,
        "seams": seams,
        "failures": failures,
    }
    try:
        await ctx.write_resource("result", "result", summary)
    except SwampError:
        pass  # the data-plane seam has already said why; the verdict travels in the result
    return summary


FLEET_PROBE = ModelType(
    "swamp/fleet-probe",
    description="Check every seam of a worker: environment, capability RPC, data plane, plugins.",
    methods=(
        Method(
            "verify",
            _verify,
            args=(
                Arg(
                    "marker",
                    required=True,
                    help=f"the value the orchestrator also put in {MARKER_ENV}",
                ),
            ),
            help="Run every seam; report each one's verdict.",
        ),
    ),
    resources=(ResourceSpec("result", lifetime="ephemeral", garbage_collection=1),),
)


@hookimpl
def swamp_probe_seams() -> list[Seam]:
    return list(BUILTIN_SEAMS)
