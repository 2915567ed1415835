"""Each seam's verdicts, including its failure reports (a stand-in context: no sockets here)."""

import pytest
import trio

from swamp.errors import PeerError
from swamp.models import fleet_probe
from swamp.models.fleet_probe import BUILTIN_SEAMS, MARKER_ENV, Seam, SeamFailed, ordered, run_seam


class StandInContext:
    """Only what the seams touch; each capability can be made to fail."""

    def __init__(self, *, env=None, query_error=None, write_error=None, read_back="same"):
        self.env = env or {}
        self.query_error = query_error
        self.write_error = write_error
        self.read_back = read_back
        self.stored = {}

    async def query_data(self, predicate):
        if self.query_error:
            raise self.query_error
        return [{"modelType": "swamp/fleet-probe"}]

    async def write_resource(self, spec, name, value):
        if self.write_error:
            raise self.write_error
        self.stored[name] = value
        return {"spec": spec, "name": name, "version": 1}

    async def read_resource(self, name):
        return self.stored.get(name) if self.read_back == "same" else {"other": True}


SEAMS = {s.name: s for s in BUILTIN_SEAMS}
ARGS = {"marker": "m-123"}


async def test_every_builtin_seam_passes_on_a_healthy_context():
    ctx = StandInContext(env={MARKER_ENV: "m-123"})
    for seam in BUILTIN_SEAMS:
        verdict = await run_seam(seam, ctx, ARGS)
        assert verdict["ok"], (seam.name, verdict)


@pytest.mark.parametrize(
    "env,needle", [({}, "is unset"), ({MARKER_ENV: "other"}, "another dispatch's marker")]
)
async def test_env_seam_failures(env, needle):
    verdict = await run_seam(SEAMS["env"], StandInContext(env=env), ARGS)
    assert not verdict["ok"] and needle in verdict["detail"]


async def test_capability_seam_failure():
    ctx = StandInContext(query_error=PeerError("channel closed"))
    verdict = await run_seam(SEAMS["capability"], ctx, ARGS)
    assert verdict == {"ok": False, "detail": "channel closed"}


async def test_data_plane_seam_failures():
    broken = StandInContext(write_error=PeerError("the data plane at http://x is unreachable"))
    verdict = await run_seam(SEAMS["data-plane"], broken, ARGS)
    assert not verdict["ok"] and "unreachable" in verdict["detail"]
    garbled = StandInContext(read_back="different")
    verdict = await run_seam(SEAMS["data-plane"], garbled, ARGS)
    assert not verdict["ok"] and "read back something else" in verdict["detail"]


async def test_a_plugin_seam_that_raises_anything_fails_only_itself():
    async def crashes(ctx, args):
        raise KeyError("boom")

    async def refuses(ctx, args):
        raise SeamFailed("too hot")

    assert (await run_seam(Seam("x", crashes), None, ARGS)) == {
        "ok": False,
        "detail": "KeyError: 'boom'",
    }
    assert (await run_seam(Seam("y", refuses), None, ARGS)) == {"ok": False, "detail": "too hot"}


async def test_a_seam_that_hangs_times_out(monkeypatch, autojump_clock):
    async def hangs(ctx, args):
        await trio.sleep_forever()

    verdict = await run_seam(Seam("slow", hangs), None, ARGS)
    assert not verdict["ok"] and f"{fleet_probe.SEAM_TIMEOUT}s" in verdict["detail"]


def test_builtin_seams_come_first_then_plugins_by_name():
    async def ok(ctx, args):
        return "ok"

    mixed = [Seam("zeta", ok), *reversed(BUILTIN_SEAMS), Seam("alpha", ok), Seam("env", ok)]
    assert [s.name for s in ordered(mixed)] == ["env", "capability", "data-plane", "alpha", "zeta"]


async def test_a_plugin_seam_named_as_a_built_in_one_replaces_it():
    from types import SimpleNamespace

    from swamp.models import fleet_probe
    from swamp.models.fleet_probe import BUILTIN_SEAMS, Seam

    async def plugins_own(ctx, args):
        return "the plugin's check"

    contributed = [Seam(s.name, plugins_own) for s in BUILTIN_SEAMS]  # a plugin replacing each

    async def write_resource(spec, name, value):
        pass

    ctx = SimpleNamespace(probe_seams=lambda: contributed, write_resource=write_resource)
    summary = await fleet_probe._verify(ctx, {})
    details = {name: seam["detail"] for name, seam in summary["seams"].items()}
    assert list(details) == [s.name for s in BUILTIN_SEAMS]  # in the built-ins' order
    assert set(details.values()) == {"the plugin's check"}, details
