"""What a worker may claim about itself: the fleet label, pinned and allowed labels, capacity."""

import pytest

from swamp.domain.claims import DEFAULT_MAX_CONCURRENCY, MAX_CAPACITY, ClaimPolicy, grant
from swamp.domain.tokens import Token, TokenState, hash_secret
from swamp.errors import Rejected, UserError


def admit(policy=ClaimPolicy(), labels=None, capacity=1, fleet=True):
    return grant(policy, token_name="pool", fleet=fleet, labels=labels or {}, capacity=capacity)


def test_by_default_a_worker_is_believed_and_a_fleet_member_is_labelled():
    assert admit(labels={"zone": "a"}).labels == {"zone": "a", "fleet": "pool"}
    own = admit(labels={"fleet": "gpu-pool"})
    assert own.labels == {"fleet": "gpu-pool"} and own.kept_own_fleet
    same = admit(labels={"fleet": "pool"})
    assert same.labels == {"fleet": "pool"} and not same.kept_own_fleet
    single = admit(labels={"zone": "a"}, fleet=False)
    assert single.labels == {"zone": "a"} and not single.kept_own_fleet
    assert admit(capacity=DEFAULT_MAX_CONCURRENCY).capacity == DEFAULT_MAX_CONCURRENCY


def test_capacity_is_capped_by_default_and_a_token_may_raise_the_cap():
    """A worker claiming 1024 slots used to get them, and with them every matching step."""
    claimed = admit(capacity=MAX_CAPACITY)
    assert claimed.capacity == DEFAULT_MAX_CONCURRENCY and claimed.capacity_capped
    raised = admit(ClaimPolicy.build(max_concurrency=MAX_CAPACITY), capacity=MAX_CAPACITY)
    assert raised.capacity == MAX_CAPACITY and not raised.capacity_capped


def test_pinned_labels_are_added_and_cannot_be_overridden():
    policy = ClaimPolicy.build(pinned={"zone": "eu", "fleet": "gpu"})
    granted = admit(policy, labels={"disk": "ssd"})
    assert granted.labels == {"disk": "ssd", "zone": "eu", "fleet": "gpu"}
    assert not granted.kept_own_fleet  # the token itself chose the fleet label
    assert admit(policy, labels={"zone": "eu"}).labels["zone"] == "eu"  # the same value is fine
    for key, value in (("zone", "us"), ("fleet", "pool"), ("fleet", "other")):
        with pytest.raises(Rejected) as info:
            admit(policy, labels={key: value})
        assert info.value.code == "label_pinned" and f"{key}=" in info.value.message


def test_allowed_keys_refuse_every_other_key_including_fleet():
    policy = ClaimPolicy.build(allowed_keys=["zone"])
    assert admit(policy, labels={"zone": "a"}).labels == {"zone": "a", "fleet": "pool"}
    for labels in ({"gpu": "true"}, {"fleet": "gpu-pool"}, {"zone": "a", "x": "1"}):
        with pytest.raises(Rejected) as info:
            admit(policy, labels=labels)
        assert info.value.code == "label_not_allowed"
    nothing = ClaimPolicy.build(allowed_keys=[], pinned={"zone": "eu"})
    assert admit(nothing, labels={"zone": "eu"}).labels == {"zone": "eu", "fleet": "pool"}
    with pytest.raises(Rejected):
        admit(nothing, labels={"a": "b"})


def test_capacity_is_capped_not_refused():
    policy = ClaimPolicy.build(max_concurrency=2)
    granted = admit(policy, capacity=1024)
    assert granted.capacity == 2 and granted.capacity_capped
    modest = admit(policy, capacity=1)
    assert modest.capacity == 1 and not modest.capacity_capped


@pytest.mark.parametrize(
    "kwargs",
    [
        {"pinned": {"bad key": "v"}},
        {"pinned": {"k": "v\n"}},
        {"allowed_keys": ["ok", "no\n"]},
        {"max_concurrency": 0},
        {"max_concurrency": MAX_CAPACITY + 1},
        {"max_concurrency": True},
        {"max_concurrency": "2"},
    ],
)
def test_bad_policies_are_input_errors(kwargs):
    with pytest.raises(UserError):
        ClaimPolicy.build(**kwargs)


def test_the_policy_round_trips_through_the_token_record():
    policy = ClaimPolicy.build(pinned={"zone": "eu"}, allowed_keys=["disk"], max_concurrency=3)
    token = Token(
        name="pool",
        state=TokenState.UNUSED,
        created_at="t0",
        expires_at="t1",
        expires_at_epoch=1.0,
        secret_hash=hash_secret("s"),
        max_enrollments=5,
        claims=policy,
    )
    attrs = token.to_attributes()
    assert attrs["pinnedLabels"] == {"zone": "eu"} and attrs["allowedLabelKeys"] == ["disk"]
    assert Token.from_attributes(attrs).claims == policy
    legacy = {
        k: v
        for k, v in attrs.items()
        if k not in ("pinnedLabels", "allowedLabelKeys", "maxConcurrency")
    }
    assert Token.from_attributes(legacy).claims == ClaimPolicy()
    assert "zone=eu pinned" in policy.describe() and "3 slot" in policy.describe()
