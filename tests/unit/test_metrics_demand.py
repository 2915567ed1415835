"""Demand per requirement on ``/metrics``: steps waiting and running, idle matching slots and
the oldest wait, for the requirements that have series (active, recently seen, bounded).

The rules (``Requirement.text``, ``PoolIndex.idle_slots``, ``Series``) are checked against
plain specifications; the collector against a real pool and queue service, with members whose
sockets are stand-ins, scraped as Prometheus would (the text format, parsed back)."""

from __future__ import annotations

import uuid

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from swamp.bookkeeping.leases import LeaseBook
from swamp.domain.demand import Demand, Series
from swamp.domain.placement import Placement
from swamp.domain.queue import WaitingQueue, WaitingStep, requirement_text
from swamp.domain.scheduler import PoolIndex, Requirement, Slots
from swamp.orchestrator.bookkeeper import Bookkeeper
from swamp.orchestrator.metrics import Metrics
from swamp.orchestrator.pool import Member, Pool
from swamp.orchestrator.queue import DispatchQueue, StepInfo
from swamp.store.datastore import Datastore
from swamp.store.records import SqliteRecords

KEYS = st.sampled_from(["gpu", "zone", "a", "a-b", "pool"])
VALUES = st.sampled_from(["true", "eu", "x", "1"])
LABELS = st.dictionaries(KEYS, VALUES, max_size=3)
PLATFORMS = st.sampled_from([None, "linux", "linux/amd64", "darwin/arm64", "/amd64"])
OFFERED_PLATFORMS = st.sampled_from([("linux", "amd64"), ("darwin", "arm64"), ("linux", "arm64")])


# -- the rules ------------------------------------------------------------------------------------


@given(labels=LABELS, platform=PLATFORMS)
def test_a_requirement_is_named_as_the_queue_names_its_placement(labels, platform):
    placement = Placement(labels=labels, platform=platform)
    assert Requirement.of(placement).text() == requirement_text(placement.to_json())


def test_a_target_is_named_by_the_target_alone():
    assert Requirement.of(Placement(target="w1")).text() == "target=w1"
    assert Requirement.of(Placement()).text() == "any worker"


members = st.lists(
    st.tuples(LABELS, OFFERED_PLATFORMS, st.integers(1, 4), st.integers(0, 4), st.booleans()),
    max_size=12,
)


@given(members=members, wanted=st.lists(st.tuples(LABELS, PLATFORMS), max_size=6))
def test_idle_slots_are_the_free_slots_of_the_schedulable_members_that_match(members, wanted):
    index = PoolIndex()
    for n, (labels, (os_name, arch), capacity, active, schedulable) in enumerate(members):
        index.put(
            Slots(f"w{n}", f"i{n}", labels, os_name, arch, capacity, min(active, capacity),
                  schedulable=schedulable)
        )  # fmt: skip
    requirements = [Requirement.of(Placement(labels=labels, platform=p)) for (labels, p) in wanted]
    idle = index.idle_slots(requirements)
    for requirement in requirements:  # the specification: a plain scan
        assert idle[requirement] == sum(
            s.free for s in index.members() if s.satisfies(requirement)
        ), requirement


def test_a_target_has_its_one_member_s_free_slots():
    index = PoolIndex()
    index.put(Slots("w1", "i1", {}, "linux", "amd64", 3, 1))
    index.put(Slots("w2", "i2", {}, "linux", "amd64", 3, 0, schedulable=False))
    idle = index.idle_slots([Requirement(target="w1"), Requirement(target="w2")])
    assert idle == {Requirement(target="w1"): 2, Requirement(target="w2"): 0}
    assert index.idle_slots([Requirement(target="nobody")]) == {Requirement(target="nobody"): 0}


def _req(text: str) -> Requirement:
    key, _, value = text.partition("=")
    return Requirement.of(Placement(labels={key: value}))


def test_series_are_the_active_then_the_recently_seen_and_forget_the_rest():
    series = Series(keep=900, limit=10)
    gpu, arm = _req("gpu=true"), _req("arch=arm")
    assert series.select({gpu: Demand(3, 0, 5.0), arm: Demand(0, 2)}, now=0) == [gpu, arm]
    assert series.select({arm: Demand(0, 1)}, now=100) == [arm, gpu]  # gpu: seen, at 0 now
    assert series.select({}, now=950) == [arm]  # gpu was last seen 950 s ago
    assert series.select({}, now=1001) == []
    assert series.seen == {} and series.omitted == 0


def test_past_the_limit_the_idle_go_first_then_the_least_demand():
    series = Series(keep=900, limit=3)
    old, recent = _req("old=1"), _req("recent=1")
    series.select({old: Demand(1)}, now=0)
    series.select({recent: Demand(1)}, now=10)
    a, b = _req("a=1"), _req("b=1")
    assert series.select({a: Demand(2)}, now=20) == [a, recent, old]
    assert series.select({a: Demand(2), b: Demand(0, 1)}, now=30) == [a, b, recent]  # old goes
    many = {_req(f"k{n}=1"): Demand(n) for n in range(1, 6)}
    chosen = series.select(many, now=40)
    assert [r.text() for r in chosen] == ["k5=1", "k4=1", "k3=1"]
    assert series.omitted == 2 and len(series.seen) == 3  # bounded: the rest forgotten


def test_a_group_s_oldest_step_is_the_first_to_arrive_whoever_submitted_it():
    queue = WaitingQueue()
    gpu = _req("gpu=true")
    steps = [
        WaitingStep(gpu, priority=p, submitter=s)
        for p, s in ((5, "bob"), (0, "alice"), (0, "bob"), (9, "carol"))
    ]
    for step in steps:
        queue.add(step)
    assert queue.groups[gpu].oldest() is steps[0]
    queue.discard(steps[0])
    assert queue.groups[gpu].oldest() is steps[1]


# -- the collector on a real pool and queue service ----------------------------------------------


class Socket:
    """What the pool asks of a member's channel: is it open?"""

    closed = False


def member(name: str, *, labels: dict[str, str], capacity: int) -> Member:
    return Member(
        name=name,
        instance_id=str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
        machine_id=name,
        token_name="t",
        labels=labels,
        platform="linux",
        arch="x86_64",
        capacity=capacity,
        version="1",
        channel=Socket(),  # type: ignore[arg-type]
    )


INFO = StepInfo("command/shell", "default", "run")


async def ignore(event: dict) -> None:
    return None


@pytest.fixture
async def queue(tmp_path):
    store = Datastore(tmp_path / "swamp.db", orchestrator=True)
    bookkeeper = Bookkeeper(LeaseBook(SqliteRecords(store)))
    service = DispatchQueue(Pool(), bookkeeper.leases.db, bookkeeper, tokens=lambda name: None)
    async with trio.open_nursery() as nursery:
        await nursery.start(bookkeeper.run)
        yield service
        nursery.cancel_scope.cancel()
    store.close()


def scrape(metrics: Metrics) -> dict[tuple[str, str], float]:
    """``(series, requirement) → value`` of the per-requirement families."""
    return {
        (sample.name, sample.labels["requirement"]): sample.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for sample in family.samples
        if "requirement" in sample.labels
    }


async def test_waiting_running_idle_and_oldest_per_requirement(queue):
    now = [0.0]
    metrics = Metrics()
    metrics.watch(queue.pool, queue, clock=lambda: now[0])
    cpu = member("cpu", labels={"kind": "cpu"}, capacity=4)
    gpu = member("gpu", labels={"kind": "gpu", "gpu": "true"}, capacity=2)
    queue.pool.put(cpu)
    queue.pool.put(gpu)
    grants = [
        await queue.acquire(Placement(labels=labels), INFO, deadline=None, emit=ignore)
        for labels in ({"gpu": "true"}, {"gpu": "true"}, {})
    ]
    assert [g.member.name for g in grants] == ["gpu", "gpu", "cpu"]

    async with trio.open_nursery() as nursery:
        for _ in range(3):  # no gpu slot is free: these wait
            nursery.start_soon(
                lambda: queue.acquire(
                    Placement(labels={"gpu": "true"}), INFO, deadline=None, emit=ignore
                )
            )
        await trio.testing.wait_all_tasks_blocked()
        seen = scrape(metrics)
        assert seen[("swamp_queue_waiting", "gpu=true")] == 3
        assert seen[("swamp_queue_running", "gpu=true")] == 2
        assert seen[("swamp_queue_running", "any worker")] == 1
        assert seen[("swamp_queue_waiting", "any worker")] == 0
        # the cpu worker's 3 free slots are idle for "any worker", never for gpu=true
        assert seen[("swamp_queue_idle_slots", "gpu=true")] == 0
        assert seen[("swamp_queue_idle_slots", "any worker")] == 3
        assert seen[("swamp_queue_oldest_wait_seconds", "gpu=true")] >= 0
        assert seen[("swamp_queue_oldest_wait_seconds", "any worker")] == 0
        nursery.cancel_scope.cancel()  # the waiting steps' clients go away

    for grant in grants:
        queue.release(grant.member, grant.dispatch_id)
    seen = scrape(metrics)  # nothing waits or runs: still there, at 0 (recently seen)
    assert seen[("swamp_queue_waiting", "gpu=true")] == 0
    assert seen[("swamp_queue_running", "gpu=true")] == 0
    assert seen[("swamp_queue_idle_slots", "gpu=true")] == 2
    assert seen[("swamp_queue_idle_slots", "any worker")] == 6
    now[0] = 901.0
    assert scrape(metrics) == {}  # 15 minutes on: gone
    helps = {
        family.name: family.documentation
        for family in text_string_to_metric_families(metrics.render().decode())
    }
    assert "may match several requirements and counts in each" in helps["swamp_queue_idle_slots"]
    assert "at 0 for 15 minutes" in helps["swamp_queue_waiting"]
