"""Fleet naming, pruning and legacy records (pure)."""

import hashlib

import pytest

from swamp.domain import tokens as rules
from swamp.domain.tokens import Binding, Token, TokenState
from swamp.domain.worker_names import fleet_suffix, name_candidates, worker_name_for

# Two machine ids whose SHA-256 digests share their first 8 hex digits (found by search).
CLASH_A, CLASH_B = "clash-machine-00022136", "clash-machine-00080544"


def token(max_enrollments=3, enrollments=0, name="pool"):
    return Token(
        name=name,
        state=TokenState.UNUSED,
        created_at="t0",
        expires_at="t1",
        expires_at_epoch=10**10,
        secret_hash=rules.hash_secret("s"),
        max_enrollments=max_enrollments,
        enrollments=enrollments,
    )


def digest(machine_id):
    return hashlib.sha256(machine_id.encode()).hexdigest()


def test_the_collision_pair_really_collides_on_eight_digits():
    assert digest(CLASH_A)[:8] == digest(CLASH_B)[:8]
    assert digest(CLASH_A)[:9] != digest(CLASH_B)[:9]


def test_a_single_machine_token_names_its_worker_after_itself():
    assert worker_name_for(token(max_enrollments=1), "m1") == "pool"


@pytest.mark.parametrize("allowance", [2, 50, "unlimited"])
def test_fleet_members_get_a_stable_hash_suffix(allowance):
    name = worker_name_for(token(allowance), "machine-1")
    assert name == f"pool-{digest('machine-1')[:8]}"
    assert worker_name_for(token(allowance), "machine-1") == name


def test_a_clash_with_another_machine_of_the_token_lengthens_the_suffix():
    first = worker_name_for(token(), CLASH_A)
    second = worker_name_for(token(enrollments=1), CLASH_B, lambda name: name == first)
    assert first == f"pool-{digest(CLASH_A)[:8]}"
    assert second == f"pool-{digest(CLASH_B)[:9]}"


def test_a_clash_with_another_tokens_worker_lengthens_the_suffix_too():
    short = f"pool-{digest('m1')[:8]}"
    assert worker_name_for(token(), "m1", {short}.__contains__) == f"pool-{digest('m1')[:9]}"
    longer = {short, f"pool-{digest('m1')[:9]}"}
    assert worker_name_for(token(), "m1", longer.__contains__) == f"pool-{digest('m1')[:10]}"


def test_the_candidates_are_the_names_worker_name_for_tries_in_its_order():
    candidates = list(name_candidates(token(), "m1"))
    assert candidates[:2] == [f"pool-{digest('m1')[:8]}", f"pool-{digest('m1')[:9]}"]
    assert candidates[-1] == f"pool-{digest('m1')}" and len(candidates) == 64 - 8 + 1
    asked = []
    taken = set(candidates[:3])
    assert worker_name_for(token(), "m1", lambda n: asked.append(n) or n in taken) == candidates[3]
    assert asked == candidates[:4]


def test_the_name_stored_in_the_binding_is_reused_by_redeem():
    calls = []
    decision = rules.redeem(
        token(enrollments=1),
        known=Binding("m1", "pool-custom", "t"),
        name="pool",
        secret="s",
        machine_id="m1",
        now=1,
        now_iso="t",
        name_new=lambda t: calls.append(t) or "unused",
    )
    assert decision.write is None and decision.binding.worker_name == "pool-custom"
    assert calls == []  # naming is only consulted for a new binding


def test_prune_frees_places_and_writes_nothing_when_nothing_was_released():
    full = token(max_enrollments=2, enrollments=2)
    assert not full.has_room()
    pruned = rules.prune(full, 1)
    assert pruned.enrollments == 1 and pruned.has_room()
    assert rules.prune(full, 0) is None


def test_a_fleet_members_name_is_recognised_by_its_shape():
    assert fleet_suffix(f"pool-{digest('m1')[:8]}") == ("pool", digest("m1")[:8])
    assert fleet_suffix("a-b-0123abcd") == ("a-b", "0123abcd")
    for not_one in ("pool", "pool-abc", "pool-XYZ01234", "-0123abcd"):
        assert fleet_suffix(not_one) is None


def test_a_legacy_record_without_the_stored_epoch_still_reads():
    attrs = token(max_enrollments=1).to_attributes()
    attrs.update(expiresAt="2030-01-01T00:00:00.000Z", boundMachineId="m-old", state="enrolled")
    for key in ("expiresAtEpoch", "enrollments", "maxEnrollments"):
        del attrs[key]
    legacy = Token.from_attributes(attrs)
    assert legacy.expires_at_epoch == 1893456000.0
    assert legacy.legacy_bindings == (Binding("m-old", "pool", attrs["createdAt"]),)
    rewritten = rules.prune(legacy, 1).to_attributes()
    assert "boundMachineId" not in rewritten and rewritten["enrollments"] == 0


@pytest.mark.parametrize("value,expected", [(3, 3), ("unlimited", "unlimited")])
def test_max_enrollments_from_a_json_frame(value, expected):
    assert rules.parse_max_enrollments(value) == expected


@pytest.mark.parametrize("value", [0, -2, True, 1.5, None, "many"])
def test_bad_max_enrollments_from_a_json_frame(value):
    with pytest.raises(Exception, match="positive integer or unlimited"):
        rules.parse_max_enrollments(value)
