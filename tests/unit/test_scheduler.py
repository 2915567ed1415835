"""The pool index and the assignment: the index agrees with the plain scan (the specification)
whatever the pool and whatever happened to it; assignments go oldest first, least-loaded,
and never overbook."""

import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from swamp.domain.placement import Placement, WorkerView, choose_worker
from swamp.domain.queue import WaitingQueue, WaitingStep
from swamp.domain.scheduler import (
    Dispatch,
    PoolIndex,
    Refuse,
    Requirement,
    Slots,
    Wait,
    admit,
    assign,
    requirements_of,
)
from tests.profiles import examples


def slots(name, *, labels=None, platform="linux", arch="x86_64", capacity=1, active=0, ok=True):
    return Slots(
        name,
        str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
        labels or {},
        platform,
        arch,
        capacity,
        active,
        schedulable=ok,
    )


def view(s: Slots) -> WorkerView:
    return WorkerView(
        s.name,
        s.instance_id,
        s.labels,
        s.platform,
        s.arch,
        "idle" if s.schedulable else "unverified",
        True,
        s.capacity,
        s.active,
    )


def index_of(*members: Slots) -> PoolIndex:
    index = PoolIndex()
    for m in members:
        index.put(m)
    return index


def step(placement: Placement) -> WaitingStep:
    return WaitingStep(Requirement.of(placement), ticket=placement)


# -- the index ------------------------------------------------------------------------------------


def test_the_least_loaded_matching_member_then_the_name():
    index = index_of(
        slots("b", labels={"pool": "x"}, capacity=4, active=1),
        slots("a", labels={"pool": "x"}, capacity=4, active=1),
        slots("c", labels={"pool": "x"}, capacity=2),
        slots("d", labels={"pool": "y"}, capacity=8),
    )
    assert index.choose(Requirement.of(Placement(labels={"pool": "x"}))).name == "a"
    index.take("a")
    assert index.choose(Requirement.of(Placement(labels={"pool": "x"}))).name == "b"
    assert index.choose(Requirement.of(Placement(labels={"pool": "z"}))) is None
    assert index.choose(Requirement()).name == "d"  # any worker


def test_full_unschedulable_and_removed_members_get_nothing():
    index = index_of(slots("a", capacity=1), slots("b", ok=False), slots("c"))
    index.take("a")
    index.remove("c")
    assert index.choose(Requirement()) is None
    index.update("b", schedulable=True)
    assert index.choose(Requirement()).name == "b"
    index.release("a")
    assert index.choose(Requirement()).name == "a"  # a < b, both one free slot


def test_platform_and_arch_are_keys():
    index = index_of(slots("l", platform="linux"), slots("m", platform="darwin", arch="arm64"))
    assert index.choose(Requirement.of(Placement(platform="darwin"))).name == "m"
    assert index.choose(Requirement.of(Placement(platform="darwin/arm64"))).name == "m"
    assert index.choose(Requirement.of(Placement(platform="darwin/x86_64"))) is None
    assert index.choose(Requirement.of(Placement(platform="linux/x86_64"))).name == "l"


def test_a_target_is_a_name_or_a_unique_instance_id_and_labels_are_ignored():
    victim = slots("victim")
    twin = Slots("twin", victim.instance_id, capacity=1024)
    index = index_of(victim)
    assert index.choose(Requirement(target="victim")) is victim
    assert index.choose(Requirement(target=victim.instance_id)) is victim
    index.put(twin)  # a copied instance id names nobody
    assert index.choose(Requirement(target=victim.instance_id)) is None
    assert index.choose(Requirement(target="victim")) is victim


def test_re_enrolling_under_the_same_name_replaces_the_member():
    index = index_of(slots("w", labels={"gpu": "true"}, capacity=1, active=1))
    index.put(slots("w", labels={"cpu": "big"}, capacity=2))
    assert index.choose(Requirement.of(Placement(labels={"gpu": "true"}))) is None
    assert index.choose(Requirement.of(Placement(labels={"cpu": "big"}))).free == 2


def test_stale_heap_entries_stay_bounded():
    index = index_of(slots("a", capacity=64), slots("b", capacity=64))
    for _ in range(10_000):
        index.take("a")
        index.release("a")
    assert all(len(heap) <= 64 + 4 * 2 + 3 for heap in index._heaps.values())


def test_supply_counts_schedulable_matching_members_and_their_free_slots():
    index = index_of(
        slots("a", labels={"pool": "x"}, capacity=4, active=3),
        slots("b", labels={"pool": "x"}, capacity=2),
        slots("c", labels={"pool": "x"}, ok=False),
    )
    assert index.supply(Requirement.of(Placement(labels={"pool": "x"}))) == (2, 3)
    assert index.supply(Requirement(target="a")) == (1, 1)
    assert index.supply(Requirement.of(Placement(labels={"pool": "nope"}))) == (0, 0)


NAMES = st.sampled_from(["a", "b", "c", "d", "e", "f"])
LABELS = st.dictionaries(
    st.sampled_from(["pool", "gpu", "zone"]), st.sampled_from(["x", "y"]), max_size=3
)
OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("put"),
            NAMES,
            LABELS,
            st.sampled_from(["linux", "darwin"]),
            st.integers(1, 3),
        ),
        st.tuples(st.just("take"), NAMES),
        st.tuples(st.just("release"), NAMES),
        st.tuples(st.just("remove"), NAMES),
        st.tuples(st.just("schedulable"), NAMES, st.booleans()),
    ),
    max_size=40,
)
PLACEMENTS = st.one_of(
    st.builds(Placement, labels=LABELS),
    st.builds(Placement, target=NAMES),
    st.builds(Placement, platform=st.sampled_from(["linux", "darwin", "linux/x86_64"])),
)


@settings(max_examples=examples(1000))
@given(OPS, st.lists(PLACEMENTS, min_size=1, max_size=5))
def test_the_index_decides_as_the_scan_does(ops, placements):
    index = PoolIndex()
    for op in ops:
        kind, name = op[0], op[1]
        if kind == "put":
            index.put(slots(name, labels=op[2], platform=op[3], capacity=op[4]))
        elif kind == "take" and name in index and index.get(name).free > 0:
            index.take(name)
        elif kind == "release":
            index.release(name)
        elif kind == "remove":
            index.remove(name)
        elif kind == "schedulable":
            index.update(name, schedulable=op[2])
    for placement in placements:
        expected = choose_worker(placement, [view(s) for s in index.members()]).worker
        got = index.choose(Requirement.of(placement))
        assert (got.name if got else None) == (expected.name if expected else None)


# -- the assignment -------------------------------------------------------------------------------


def test_oldest_step_first_and_never_overbooked():
    index = index_of(slots("w", labels={"pool": "x"}, capacity=2))
    queue = WaitingQueue()
    steps = [step(Placement(labels={"pool": "x"})) for _ in range(3)]
    for s in steps:
        queue.add(s)
    first = assign(queue, index)
    assert [a.step for a in first] == steps[:2] and {a.worker for a in first} == {"w"}
    assert assign(queue, index) == []  # full: the third waits
    assert len(queue) == 1
    index.release("w")
    [last] = assign(queue, index)
    assert last.step is steps[2] and len(queue) == 0


def test_a_freed_worker_takes_the_oldest_step_it_matches_across_requirements():
    index = index_of(slots("w", labels={"pool": "x", "gpu": "true"}, capacity=1, active=1))
    queue = WaitingQueue()
    other = step(Placement(labels={"zone": "mars"}))  # oldest, but w does not match it
    gpu = step(Placement(labels={"gpu": "true"}))
    pool = step(Placement(labels={"pool": "x"}))
    for s in (other, gpu, pool):
        queue.add(s)
    index.release("w")
    wanted = requirements_of(index.get("w"), queue)
    assert set(wanted) == {gpu.requirement, pool.requirement}
    [only] = assign(queue, index, wanted)
    assert only.step is gpu and len(queue) == 2


def test_a_step_that_left_the_queue_is_never_assigned():
    index = index_of(slots("w"))
    queue = WaitingQueue()
    gone, kept = step(Placement(labels={})), step(Placement(labels={}))
    queue.add(gone)
    queue.add(kept)
    assert queue.discard(gone) and not queue.discard(gone)
    [only] = assign(queue, index)
    assert only.step is kept


def test_each_step_goes_to_the_least_loaded_worker():
    index = index_of(
        slots("a", labels={"pool": "x"}, capacity=2),
        slots("b", labels={"pool": "x"}, capacity=2),
        slots("c", labels={"pool": "x"}, capacity=2),
    )
    queue = WaitingQueue()
    for _ in range(6):
        queue.add(step(Placement(labels={"pool": "x"})))
    got = [a.worker for a in assign(queue, index)]
    assert got == ["a", "b", "c", "a", "b", "c"]


def test_the_waiting_queue_stays_bounded_when_steps_leave_from_the_middle():
    queue = WaitingQueue()
    head = step(Placement(labels={"pool": "x"}))
    queue.add(head)
    for _ in range(1000):
        s = step(Placement(labels={"pool": "x"}))
        queue.add(s)
        queue.discard(s)
    assert len(queue) == 1 and len(queue.groups[head.requirement]) <= 64 + 2 + 1


def test_every_label_must_match_not_only_the_rarest():
    index = index_of(
        slots("a", labels={"pool": "x", "gpu": "true"}, capacity=1),
        slots("b", labels={"pool": "x"}, capacity=8),  # more free, but no gpu
        slots("c", labels={"gpu": "true", "pool": "y"}, capacity=8),
    )
    both = Requirement.of(Placement(labels={"pool": "x", "gpu": "true"}))
    assert index.choose(both).name == "a"
    index.take("a")
    assert index.choose(both) is None
    assert index.choose(Requirement.of(Placement(labels={"pool": "x"}))).name == "b"


# -- admission: one decision for a step that asks for a worker --------------------------------


def test_admission_dispatches_at_once_to_the_least_loaded_free_worker():
    index = index_of(slots("a", capacity=2, active=1), slots("b", capacity=2))
    queue = WaitingQueue()
    decision = admit(Requirement.of(Placement()), queue, index, max_waiting=10)
    assert decision == Dispatch("b") and index.get("b").active == 1 and len(queue) == 0


def test_admission_waits_when_no_free_worker_matches_and_the_step_is_queued():
    index = index_of(slots("a", labels={"gpu": "no"}))
    queue = WaitingQueue()
    decision = admit(Requirement.of(Placement(labels={"gpu": "yes"})), queue, index, max_waiting=9)
    assert isinstance(decision, Wait) and decision.handed == ()
    assert queue.head(decision.step.requirement) is decision.step and len(queue) == 1


def test_admission_refuses_when_the_queue_is_full_and_changes_nothing():
    index = index_of(slots("a"))
    queue = WaitingQueue()
    queue.add(step(Placement(labels={"gpu": "yes"})))
    decision = admit(Requirement.of(Placement()), queue, index, max_waiting=1)
    assert isinstance(decision, Refuse) and "1 steps are already waiting" in decision.reason
    assert len(queue) == 1 and index.get("a").active == 0


def test_admission_behind_older_steps_hands_the_free_slot_to_the_oldest_first():
    index = index_of(slots("a", capacity=2, active=2))
    queue = WaitingQueue()
    older = step(Placement())
    queue.add(older)
    index.update("a", active=1)  # a slot freed, the queue not yet told
    decision = admit(Requirement.of(Placement()), queue, index, max_waiting=10)
    assert isinstance(decision, Wait)
    assert [(a.step, a.worker) for a in decision.handed] == [(older, "a")]
    assert len(queue) == 1 and queue.head(decision.step.requirement) is decision.step


def test_admission_gives_the_step_a_worker_after_the_older_ones_when_there_are_enough():
    index = index_of(slots("a", capacity=2, active=2))
    queue = WaitingQueue()
    older = step(Placement())
    queue.add(older)
    index.update("a", active=0)
    decision = admit(Requirement.of(Placement()), queue, index, max_waiting=10)
    assert isinstance(decision, Dispatch) and decision.worker == "a"
    assert [a.step for a in decision.handed] == [older] and len(queue) == 0
    assert index.get("a").free == 0
