"""Every branch of minting, redeeming, revoking and expiring (pure, no store)."""

from dataclasses import replace

import pytest

from swamp.domain import tokens as rules
from swamp.domain.lifecycle import IllegalTransition
from swamp.domain.tokens import TOKEN_LIFECYCLE, Token, TokenState
from swamp.errors import FleetFull, Rejected, UserError

NOW = 1_000_000.0


def mint(name="pool", secret="s3cret", duration=3600, existing=None, max_enrollments=1):
    return rules.mint(
        name,
        secret=secret,
        now=NOW,
        now_iso="t0",
        expires_iso="t1",
        duration_seconds=duration,
        existing=existing,
        max_enrollments=max_enrollments,
    )


def redeem(token, machine="m1", secret="s3cret", now=NOW + 1, name="pool", known=None):
    return rules.redeem(
        token,
        known=known,
        name=name,
        secret=secret,
        machine_id=machine,
        now=now,
        now_iso="t2",
        name_new=lambda t: f"{t.name}-{machine}",
    )


def test_mint_stores_only_a_hash():
    token = mint()
    assert token.state is TokenState.UNUSED
    assert "s3cret" not in str(token.to_attributes())
    assert token.secret_hash == rules.hash_secret("s3cret")
    assert token.enrollments == 0


def test_mint_refuses_a_live_name_but_allows_a_dead_one():
    live = mint()
    with pytest.raises(UserError, match="already exists"):
        mint(existing=live)
    revoked = rules.revoke(live, now_iso="t")
    assert mint(existing=revoked).state is TokenState.UNUSED
    lapsed = replace(mint(), expires_at_epoch=NOW - 1)
    assert not lapsed.live(NOW)
    assert mint(existing=lapsed).state is TokenState.UNUSED


def test_mint_rejects_bad_names_and_durations():
    with pytest.raises(UserError):
        mint(name="Bad.Name")
    with pytest.raises(UserError):
        mint(duration=0)


def test_first_redeem_binds_and_enrolls():
    decision = redeem(mint())
    assert decision.write is not None
    assert decision.write.state is TokenState.ENROLLED
    assert decision.binding.machine_id == "m1"
    assert decision.binding.worker_name == "pool-m1"  # whatever name_new chose


def test_a_bound_machine_reauthenticates_without_a_write():
    first = redeem(mint())
    again = redeem(first.write, known=first.binding)  # the shell found its binding
    assert again.write is None
    assert again.binding == first.binding and again.token.enrollments == 1


def test_a_second_machine_is_refused_when_the_allowance_is_spent():
    enrolled = redeem(mint()).write
    with pytest.raises(Rejected) as info:
        redeem(enrolled, machine="m2")
    assert info.value.code == "allowance_exhausted"
    assert "1 / 1" in info.value.message


def test_several_enrollments_when_allowed():
    token = mint(max_enrollments=3)
    for machine in ("m1", "m2", "m3"):
        token = redeem(token, machine=machine).write
    assert token.enrollments == 3
    with pytest.raises(FleetFull) as full:
        redeem(token, machine="m4")  # a fleet: not permanent, the worker waits for a place
    assert not isinstance(full.value, Rejected)
    assert "enrollment allowance exhausted (3 / 3)" in full.value.message
    unlimited = mint(max_enrollments="unlimited")
    for i in range(50):
        unlimited = redeem(unlimited, machine=f"m{i}").write
    assert unlimited.enrollments == 50


@pytest.mark.parametrize(
    "case,code",
    [
        ("unknown", "token_invalid"),
        ("revoked", "token_revoked"),
        ("expired", "token_expired"),
        ("stored-expired", "token_expired"),
        ("wrong-secret", "token_invalid"),
    ],
)
def test_rejections_name_the_reason(case, code):
    token = mint()
    kwargs = {}
    if case == "unknown":
        token = None
    elif case == "revoked":
        token = rules.revoke(token, now_iso="t")
    elif case == "expired":
        kwargs["now"] = NOW + 3600
    elif case == "stored-expired":
        token = rules.expire(token, now=NOW + 3600)
    elif case == "wrong-secret":
        kwargs["secret"] = "nope"
    with pytest.raises(Rejected) as info:
        redeem(token, **kwargs)
    assert info.value.code == code
    if code != "token_invalid":
        assert "'pool'" in info.value.message


def test_without_the_secret_nothing_is_learned_about_the_token():
    """Unknown, wrong secret, and a wrong secret for a revoked, expired or full token: one
    answer, so a name cannot be probed for existence or state."""
    live = mint()
    full = redeem(live).write
    cases = [
        (None, {}),
        (live, {}),
        (rules.revoke(live, now_iso="t"), {}),
        (live, {"now": NOW + 3600}),
        (full, {"machine": "m9"}),
    ]
    answers = set()
    for token, kwargs in cases:
        with pytest.raises(Rejected) as info:
            redeem(token, secret="guess", **kwargs)
        answers.add((type(info.value), info.value.code, info.value.message))
    assert len(answers) == 1 and answers.pop()[1] == "token_invalid"


def test_names_that_look_like_instance_ids_are_refused():
    with pytest.raises(UserError, match="instance id"):
        mint(name="0b9a7c1e-1111-4222-8333-444455556666")
    with pytest.raises(UserError, match="instance id"):
        mint(name="0b9a7c1e-1111-4222-8333")  # its fleet names could grow into one
    assert mint(name="0b9a7c1e").name == "0b9a7c1e"


def test_a_revoked_token_refuses_even_its_bound_machine():
    enrolled = redeem(mint()).write
    with pytest.raises(Rejected, match="revoked"):
        redeem(rules.revoke(enrolled, now_iso="t"))


def test_revoke_and_expire_write_only_when_something_changes():
    token = mint()
    revoked = rules.revoke(token, now_iso="later")
    assert revoked.state is TokenState.REVOKED and revoked.revoked_at == "later"
    assert rules.revoke(revoked, now_iso="again") is None
    assert rules.expire(token, now=NOW) is None  # deadline not reached
    expired = rules.expire(token, now=NOW + 3600)
    assert expired.state is TokenState.EXPIRED
    assert rules.expire(expired, now=NOW + 7200) is None
    assert rules.revoke(expired, now_iso="t") is None  # already dead
    assert rules.expire(revoked, now=NOW + 7200) is None


def test_effective_state_shows_a_lapsed_deadline():
    token = mint(duration=10)
    assert token.effective_state(NOW + 9) is TokenState.UNUSED
    assert token.effective_state(NOW + 10) is TokenState.EXPIRED


@pytest.mark.parametrize("text", ["nodot", ".secret", "name.", "", "   "])
def test_bad_credentials_are_rejected(text):
    with pytest.raises(Rejected) as info:
        rules.split_credential(text)
    assert info.value.code == "malformed_token"


def test_credentials_split_at_the_first_dot():
    assert rules.split_credential("pool.ab.cd") == ("pool", "ab.cd")


def test_legacy_records_read_as_one_binding_without_rewrite():
    attrs = mint().to_attributes()
    del attrs["enrollments"]
    del attrs["maxEnrollments"]
    attrs.update(state="enrolled", boundMachineId="m-old", enrolledAt="t-old")
    legacy = Token.from_attributes(attrs)
    (old,) = legacy.legacy_bindings
    assert old.machine_id == "m-old" and old.worker_name == "pool" and legacy.enrollments == 1
    assert redeem(legacy, machine="m-old", known=old).write is None
    with pytest.raises(Rejected, match="allowance exhausted"):
        redeem(legacy, machine="m-new")
    migrated = legacy.migrated().to_attributes()  # the shell moved the binding to a record
    assert "boundMachineId" not in migrated and migrated["enrollments"] == 1


def test_round_trip_of_the_stored_shape():
    token = redeem(mint(max_enrollments=5)).write
    assert Token.from_attributes(token.to_attributes()) == token


@pytest.mark.parametrize("text,value", [("1", 1), ("50", 50), ("unlimited", "unlimited")])
def test_max_enrollments_parse(text, value):
    assert rules.parse_max_enrollments(text) == value


@pytest.mark.parametrize("text", ["0", "-1", "1.5", "lots", "", "3x"])
def test_bad_max_enrollments(text):
    with pytest.raises(UserError, match="positive integer or unlimited"):
        rules.parse_max_enrollments(text)


def test_the_token_lifecycle_table_is_walked_pair_by_pair():
    legal = {
        (TokenState.UNUSED, TokenState.ENROLLED),
        (TokenState.UNUSED, TokenState.EXPIRED),
        (TokenState.UNUSED, TokenState.REVOKED),
        (TokenState.ENROLLED, TokenState.ENROLLED),
        (TokenState.ENROLLED, TokenState.EXPIRED),
        (TokenState.ENROLLED, TokenState.REVOKED),
    }
    for a in TokenState:
        for b in TokenState:
            if (a, b) in legal:
                TOKEN_LIFECYCLE.check(a, b)
            else:
                with pytest.raises(IllegalTransition):
                    TOKEN_LIFECYCLE.check(a, b)
