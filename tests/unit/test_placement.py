import uuid

import pytest

from swamp.domain.placement import Placement, WorkerView, choose_worker, matches, resolve_target
from swamp.domain.workers import is_schedulable


def worker(
    name,
    *,
    labels=None,
    platform="linux",
    arch="x86_64",
    status="idle",
    connected=True,
    capacity=1,
    active=0,
    instance=None,
):
    return WorkerView(
        name,
        instance or str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
        labels or {},
        platform,
        arch,
        status,
        connected,
        capacity,
        active,
    )


def test_a_target_is_the_name_the_orchestrator_gave_or_a_unique_instance_id():
    w = worker("w1", labels={"gpu": "true"})
    assert matches(Placement(target="w1"), w)
    assert not matches(Placement(target="w2"), w)
    assert resolve_target("w1", [w]) is w
    assert resolve_target(w.instance_id, [w]) is w
    assert choose_worker(Placement(target=w.instance_id), [w]).worker is w


def test_an_impostor_cannot_take_a_victims_targeted_work():
    victim = worker("victim", capacity=1, active=1)  # busy: the impostor would be "free"
    # instance ids that are not UUIDs are never matched, whatever they say
    impostor = worker("pool-1234abcd", capacity=1024, instance="victim")
    assert resolve_target("victim", [impostor, victim]) is victim
    assert choose_worker(Placement(target="victim"), [impostor, victim]).worker is None
    assert resolve_target("victim", [impostor]) is None  # a name never matches an instance id
    # a copied instance id is ambiguous: it names nobody
    twin = worker("twin", capacity=1024, instance=victim.instance_id)
    assert resolve_target(victim.instance_id, [victim, twin]) is None
    assert choose_worker(Placement(target=victim.instance_id), [twin, victim]).worker is None


def test_labels_must_all_match_exactly():
    w = worker("w1", labels={"gpu": "true", "zone": "a"})
    assert matches(Placement(labels={"gpu": "true"}), w)
    assert matches(Placement(labels={"gpu": "true", "zone": "a"}), w)
    assert not matches(Placement(labels={"gpu": "false"}), w)
    assert not matches(Placement(labels={"gpu": "true", "zone": "b"}), w)
    assert not matches(Placement(labels={"ssd": "true"}), w)


@pytest.mark.parametrize(
    "platform,ok",
    [
        ("linux", True),
        ("linux/x86_64", True),
        ("linux/aarch64", False),
        ("darwin", False),
        ("/x86_64", True),
    ],
)
def test_platform_matching(platform, ok):
    assert matches(Placement(platform=platform), worker("w")) is ok


def test_least_loaded_then_name():
    pool = [
        worker("b", capacity=4, active=1),
        worker("a", capacity=4, active=2),
        worker("c", capacity=4, active=1),
    ]
    assert choose_worker(Placement(labels={}, platform="linux"), pool).worker.name == "b"
    pool = [worker("b"), worker("a")]
    assert choose_worker(Placement(platform="linux"), pool).worker.name == "a"


def test_full_disconnected_and_unknown_statuses_are_skipped():
    pool = [
        worker("full", active=1),
        worker("gone", connected=False),
        worker("odd", status="unverified"),
        worker("draining", status="draining"),
        worker("ok", status="busy", capacity=2, active=1),
    ]
    choice = choose_worker(Placement(platform="linux"), pool)
    assert choice.worker.name == "ok"
    assert choice.matching == 2 and choice.full == 1


def test_no_match_explains_itself():
    choice = choose_worker(Placement(target="ghost"), [worker("w1")])
    assert choice.worker is None and choice.matching == 0
    busy = choose_worker(Placement(target="w1"), [worker("w1", active=1)])
    assert busy.worker is None and busy.matching == 1 and busy.full == 1


def test_describe_placement():
    assert Placement(target="w1").describe() == "target 'w1'"
    assert (
        Placement(labels={"b": "2", "a": "1"}, platform="linux").describe()
        == "labels a=1,b=2 and platform 'linux'"
    )
    assert Placement().describe() == "any worker"
    assert not Placement().is_remote() and Placement(labels={"a": "b"}).is_remote()


def test_unknown_statuses_are_not_schedulable():
    assert is_schedulable("idle") and is_schedulable("busy")
    for status in ("disconnected", "unverified", "draining", "something-new"):
        assert not is_schedulable(status)


def test_what_a_worker_lacks_of_a_placement():
    from swamp.domain.placement import Placement, unmet

    gpu = Placement(labels={"gpu": "true", "zone": "eu"}, platform="linux/arm64")
    assert unmet(gpu, labels={"gpu": "true", "zone": "eu"}, platform="linux", arch="arm64") == []
    assert unmet(gpu, labels={"zone": "eu"}, platform="linux", arch="x86_64") == [
        "gpu=true",
        "platform linux/arm64",
    ]
    assert unmet(Placement(target="w1"), labels={}, platform="linux", arch="x86_64") == []
