import pytest

from swamp.domain.placement import Placement, WorkerView, choose_worker, matches
from swamp.domain.workers import is_schedulable


def worker(name, *, labels=None, platform="linux", arch="x86_64", status="idle",
           connected=True, capacity=1, active=0, instance="i-" + "x"):
    return WorkerView(name, f"iid-{name}", labels or {}, platform, arch, status, connected,
                      capacity, active)


def test_target_matches_name_or_instance_id_and_ignores_labels():
    w = worker("w1", labels={"gpu": "true"})
    assert matches(Placement(target="w1"), w)
    assert matches(Placement(target="iid-w1"), w)
    assert not matches(Placement(target="w2"), w)


def test_labels_must_all_match_exactly():
    w = worker("w1", labels={"gpu": "true", "zone": "a"})
    assert matches(Placement(labels={"gpu": "true"}), w)
    assert matches(Placement(labels={"gpu": "true", "zone": "a"}), w)
    assert not matches(Placement(labels={"gpu": "false"}), w)
    assert not matches(Placement(labels={"gpu": "true", "zone": "b"}), w)
    assert not matches(Placement(labels={"ssd": "true"}), w)


@pytest.mark.parametrize("platform,ok", [("linux", True), ("linux/x86_64", True),
                                         ("linux/aarch64", False), ("darwin", False),
                                         ("/x86_64", True)])
def test_platform_matching(platform, ok):
    assert matches(Placement(platform=platform), worker("w")) is ok


def test_least_loaded_then_name():
    pool = [worker("b", capacity=4, active=1), worker("a", capacity=4, active=2),
            worker("c", capacity=4, active=1)]
    assert choose_worker(Placement(labels={}, platform="linux"), pool).worker.name == "b"
    pool = [worker("b"), worker("a")]
    assert choose_worker(Placement(platform="linux"), pool).worker.name == "a"


def test_full_disconnected_and_unknown_statuses_are_skipped():
    pool = [worker("full", active=1), worker("gone", connected=False),
            worker("odd", status="unverified"), worker("draining", status="draining"),
            worker("ok", status="busy", capacity=2, active=1)]
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
    assert Placement(labels={"b": "2", "a": "1"}, platform="linux").describe() == \
        "labels a=1,b=2 and platform 'linux'"
    assert Placement().describe() == "any worker"
    assert not Placement().is_remote() and Placement(labels={"a": "b"}).is_remote()


def test_unknown_statuses_are_not_schedulable():
    assert is_schedulable("idle") and is_schedulable("busy")
    for status in ("disconnected", "unverified", "draining", "something-new"):
        assert not is_schedulable(status)
