"""The dispatch path in-process (``tests/harness/dispatch.py``), and its walk (``bench/walk.py``):
the request flows downward — it climbs back up (calls against the import arrow) at most 3 times
on its way to the worker's transport, and at most 5 followed into the episode. Not a timing test:
it counts calls."""

import importlib.util
import sys
from pathlib import Path

from swamp.domain.query import parse as parse_predicate
from tests.harness.dispatch import dispatch_harness, echo_request

ROOT = Path(__file__).resolve().parents[2]


def load_walk():
    spec = importlib.util.spec_from_file_location("swamp_bench_walk", ROOT / "bench" / "walk.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


async def test_a_dispatch_in_process_succeeds_and_leaves_its_lease(tmp_path):
    async with dispatch_harness(tmp_path, workers=2) as harness:
        result = await harness.run(echo_request())
        assert result.status == "succeeded" and result.worker in ("w0", "w1")
        assert all(not member.active for member in harness.workers)  # its slot came back
        await harness.bookkeeper.flush()
        leases = harness.store.query(parse_predicate('modelType == "swamp/step-lease"'))
        assert [r.attributes["state"] for r in leases] == ["completed"]


def test_the_dispatch_request_flows_downward():
    walk = load_walk()
    result = walk.walk()
    assert result["to_transport"]["climbs"] <= 3, result["to_transport"]["climbs_at"]
    assert result["into_episode"]["climbs"] <= 5, result["into_episode"]["climbs_at"]
    # the walk saw the path: the queue, the episode and the channel, not an empty trace
    path = result["to_transport"]["path"]
    for room in ("swamp.orchestrator.queue", "swamp.orchestrator.episode", "swamp.protocol.rpc"):
        assert room in path


def test_a_climb_is_a_call_against_the_import_arrow():
    walk = load_walk()
    under = {"top": {"low"}, "low": set()}
    calls = walk.Walk(
        [
            walk.Call("top", "run", None, None),
            walk.Call("low", "work", "top", "run"),  # down: not a climb
            walk.Call("top", "callback", "low", "work"),  # back up, called from below: a climb
            walk.Call("low", "more", "top", "run"),
        ]
    )
    assert calls.stays() == ["top", "low", "top", "low"]
    assert [c.function for c in calls.climbs(under)] == ["callback"]
