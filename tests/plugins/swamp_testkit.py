"""A test-only plugin (loaded with SWAMP_PLUGINS=swamp_testkit): methods that write, wait and
query, so tests can kill workers at precise moments."""

import json
import time

import trio

from swamp.errors import SwampError
from swamp.hooks import hookimpl
from swamp.models.framework import Arg, Method, ModelType, ResourceSpec


async def write_then_wait(ctx, args):
    await ctx.write_resource("progress", "progress", {"step": 1})
    await ctx.log("wrote")
    await trio.sleep(args["seconds"])
    return {"done": True}


async def wait(ctx, args):
    await ctx.log("waiting")
    await trio.sleep(args["seconds"])
    return {"done": True}


async def _until_exists(path: str, limit: float) -> None:
    """Until the test creates ``path`` (its go-ahead), at most ``limit`` seconds."""
    with trio.fail_after(limit):
        # the test makes it from another process: no event crosses to this one
        while not await trio.Path(path).exists():  # noqa: ASYNC110
            await trio.sleep(0.02)


async def hold(ctx, args):
    """Runs until the file ``until`` exists, then succeeds: a step that ends when the test says
    so, not after a time a busy machine may not keep."""
    await ctx.log("holding")
    await _until_exists(args["until"], args["limit"])
    return {"done": True}


async def slow_cleanup(ctx, args):
    """Waits until cancelled, then takes ``cleanup`` seconds to let go (a process group being
    killed and reaped, a temp dir removed) — or, given ``release``, until that file exists."""
    await ctx.log("waiting")
    try:
        await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True):
            if args["release"]:
                await _until_exists(args["release"], 120)
            else:
                await trio.sleep(args["cleanup"])


async def run_then_wait(ctx, args):
    """Runs a command to its end, then lingers: a worker lost now has had an effect."""
    await ctx.run_process(args["command"])
    await ctx.log("ran")
    await trio.sleep(60)


async def query(ctx, args):
    records = await ctx.query_data(args["predicate"])
    await ctx.log(f"found {len(records)}")
    return {"count": len(records)}


async def round_trip(ctx, args):
    await ctx.write_resource("progress", "echo", {"value": args["value"]})
    back = await ctx.read_resource("echo")
    missing = await ctx.read_resource("never-written")
    await ctx.log(f"read back {back['value']} missing={missing}")
    return {"value": back["value"]}


async def hoard(ctx, args):
    """Writes ``count`` records of ``size`` bytes, one after another, until one is refused."""
    kept = 0
    try:
        for i in range(int(args["count"])):
            await ctx.write_resource("progress", f"blob-{i}", b"x" * int(args["size"]))
            kept += 1
    except SwampError as exc:
        await ctx.log(f"refused after {kept}: {exc.code}")
        return {"kept": kept, "refused": exc.code}
    return {"kept": kept}


async def parallel_put(ctx, args):
    """``count`` writes of ``size`` bytes at once; how each ended (``ok`` or an error code)."""
    body = b"x" * int(args["size"])
    outcomes: dict = {}

    async def one(i: int) -> None:
        try:
            await ctx.write_resource("progress", f"put-{i}", body)
            key = "ok"
        except SwampError as exc:
            key = exc.code
        outcomes[key] = outcomes.get(key, 0) + 1

    async with trio.open_nursery() as nursery:
        for i in range(int(args["count"])):
            nursery.start_soon(one, i)
    await ctx.log(json.dumps(outcomes))
    return {"outcomes": outcomes}


async def flood(ctx, args):
    """``parallel`` loops of queryData until ``queries`` have been answered; how each ended
    (``ok`` or an error code) and the longest one took."""
    outcomes: dict = {}
    left = int(args["queries"])
    longest = 0.0

    async def loop():
        nonlocal left, longest
        while left > 0:
            left -= 1
            started = time.monotonic()
            try:
                await ctx.query_data(args["predicate"])
                key = "ok"
            except SwampError as exc:
                key = exc.code
            longest = max(longest, time.monotonic() - started)
            outcomes[key] = outcomes.get(key, 0) + 1

    async with trio.open_nursery() as nursery:
        for _ in range(int(args["parallel"])):
            nursery.start_soon(loop)
    await ctx.log(json.dumps({"outcomes": outcomes, "longest": round(longest, 3)}))
    return {"outcomes": outcomes, "longest": longest}


async def env(ctx, args):
    await ctx.log(f"{args['name']}={ctx.env.get(args['name'], '<unset>')}")


@hookimpl
def swamp_model_types():
    return [
        ModelType(
            "test/steps",
            methods=(
                Method(
                    "write_then_wait", write_then_wait, args=(Arg("seconds", "number", default=60),)
                ),
                Method("wait", wait, args=(Arg("seconds", "number", default=60),)),
                Method("query", query, args=(Arg("predicate", required=True),)),
                Method(
                    "slow_cleanup",
                    slow_cleanup,
                    args=(Arg("cleanup", "number", default=3), Arg("release", default="")),
                ),
                Method(
                    "hold",
                    hold,
                    args=(Arg("until", required=True), Arg("limit", "number", default=120)),
                ),
                Method("run_then_wait", run_then_wait, args=(Arg("command", required=True),)),
                Method("round_trip", round_trip, args=(Arg("value", required=True),)),
                Method("env", env, args=(Arg("name", required=True),)),
                Method(
                    "hoard",
                    hoard,
                    args=(Arg("count", "number", required=True), Arg("size", "number", default=1)),
                ),
                Method(
                    "parallel_put",
                    parallel_put,
                    args=(Arg("count", "number", required=True), Arg("size", "number", default=1)),
                ),
                Method(
                    "flood",
                    flood,
                    args=(
                        Arg("predicate", required=True),
                        Arg("queries", "number", default=8),
                        Arg("parallel", "number", default=4),
                    ),
                ),
            ),
            resources=(ResourceSpec("progress"),),
        )
    ]
