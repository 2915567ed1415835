"""Login codes and sessions (pure: a clock and secrets passed in), and the pages' origin
rules (``RequestPolicy.page_refusal``, ``same_origin``)."""

from __future__ import annotations

import itertools

import pytest

from swamp.domain.request_policy import RequestPolicy, is_page
from swamp.domain.scopes import Scope
from swamp.errors import Unauthorized
from swamp.ui.sessions import CODE_SECONDS, Logins


def logins(**kw) -> tuple[Logins, list[float]]:
    now = [0.0]
    counter = itertools.count()
    return Logins(clock=lambda: now[0], secret=lambda: f"s{next(counter)}", **kw), now


def test_a_code_is_good_once_and_for_a_minute():
    held, now = logins()
    code = held.issue("local", Scope.ADMIN)
    session_id, session = held.redeem(code)
    assert session.scope is Scope.ADMIN and held.session(session_id) == session
    with pytest.raises(Unauthorized):
        held.redeem(code)
    late = held.issue("local", Scope.READ)
    now[0] += CODE_SECONDS + 0.1
    with pytest.raises(Unauthorized):
        held.redeem(late)


def test_sessions_expire_end_and_are_bounded():
    held, now = logins(max_sessions=2, session_seconds=100)
    first, _ = held.open("a", Scope.READ)
    second, _ = held.open("b", Scope.READ)
    third, _ = held.open("c", Scope.READ)
    assert held.session(first) is None  # the oldest went
    assert held.session(second) is not None
    held.end(second)
    assert held.session(second) is None
    now[0] += 101
    assert held.session(third) is None


def test_codes_and_sessions_end_with_the_credential_that_opened_them():
    book, _ = logins()
    ops, other = object(), object()
    kept_id, _ = book.open("server token 'other'", Scope.READ, other)
    ops_id, _ = book.open("server token 'ops'", Scope.ADMIN, ops)
    code = book.issue("server token 'ops'", Scope.ADMIN, ops)
    local_id, _ = book.open("local", Scope.ADMIN)  # no holder: nothing revokes it
    asked = []

    def still_valid(holder):
        asked.append(holder)
        return holder is not ops

    book.end_revoked(still_valid)
    assert book.session(ops_id) is None
    with pytest.raises(Unauthorized):
        book.redeem(code)
    assert book.session(kept_id) is not None and book.session(local_id) is not None
    assert sorted(map(id, asked)) == sorted(map(id, [ops, other]))  # one question a holder


def test_one_credential_opening_sessions_by_the_hundred_never_ends_anothers():
    """Found in review: 256 logins with a read token ended an admin's session (the oldest
    went, whoever's it was). Now a credential's own oldest goes first."""
    book, _ = logins(max_sessions=8, max_each=3)
    admin_id, _ = book.open("local", Scope.ADMIN)
    flood = [book.open("server token 'look'", Scope.READ)[0] for _ in range(300)]
    assert book.session(admin_id) is not None
    assert [book.session(i) is not None for i in flood[-4:]] == [False, True, True, True]
    others = [book.open(f"server token 't{n}'", Scope.READ)[0] for n in range(6)]
    # past the cap in all, the oldest of whoever holds the most goes: never the admin's one
    assert book.session(admin_id) is not None and book.session(others[-1]) is not None


def test_codes_are_bounded():
    held, _ = logins(max_codes=2)
    codes = [held.issue("local", Scope.ADMIN) for _ in range(3)]
    with pytest.raises(Unauthorized):
        held.redeem(codes[0])
    held.redeem(codes[2])


def test_a_metrics_scope_gets_no_session():
    held, _ = logins()
    with pytest.raises(Unauthorized):
        held.issue("server token 'scraper'", Scope.METRICS)
    with pytest.raises(Unauthorized):
        held.open("server token 'scraper'", Scope.METRICS)


def test_csrf_is_compared_whole():
    held, _ = logins()
    _, session = held.open("local", Scope.ADMIN)
    assert session.csrf_ok(session.csrf)
    assert (
        not session.csrf_ok(None)
        and not session.csrf_ok(session.csrf[:-1])
        and not (session.csrf_ok(""))
    )


POLICY = RequestPolicy.build(loopback=True, bind_host="127.0.0.1")


def test_only_the_ui_prefix_is_pages():
    assert is_page("/ui") and is_page("/ui/") and is_page("/ui/queue")
    assert not is_page("/uix") and not is_page("/metrics") and not is_page("/")


@pytest.mark.parametrize(
    "origin, refused",
    [
        (None, False),
        ("http://127.0.0.1:7420", False),
        ("https://127.0.0.1:7420", False),  # the port's one scheme, whichever it is
        ("http://127.0.0.1:7421", True),
        ("http://evil.example", True),
        ("null", True),
    ],
)
def test_a_page_answers_its_own_origin_only(origin, refused):
    headers = {"host": "127.0.0.1:7420", **({"origin": origin} if origin else {})}
    assert (POLICY.page_refusal(headers) is not None) is refused
    # the websocket and every other route: any Origin is refused, as before
    assert (POLICY.refusal(headers) is not None) is (origin is not None)


def test_a_page_keeps_the_dns_rebinding_guard():
    assert POLICY.page_refusal({"host": "evil.example:7420"}) is not None


@pytest.mark.parametrize(
    "headers, same",
    [
        ({"origin": "http://127.0.0.1:7420"}, True),
        ({"referer": "http://127.0.0.1:7420/ui/runs/x"}, True),
        ({"origin": "http://evil.example"}, False),
        ({"origin": "null", "referer": "http://127.0.0.1:7420/ui/"}, False),
        ({"referer": "http://evil.example/ui/"}, False),
        ({}, False),
    ],
)
def test_a_post_must_come_from_the_pages(headers, same):
    assert POLICY.same_origin({"host": "127.0.0.1:7420", **headers}) is same


def test_a_session_ended_early_is_told_and_peeking_at_a_code_keeps_it_good():
    ended: list[str] = []
    now = [0.0]
    counter = itertools.count()
    held = Logins(
        clock=lambda: now[0],
        secret=lambda: f"s{next(counter)}",
        max_each=2,
        on_end=lambda: ended.append("ended"),
    )
    code = held.issue("local", Scope.ADMIN, holder="token-a")
    assert held.peek(code) == ("local", Scope.ADMIN) and held.peek("wrong") is None
    first, _ = held.redeem(code)  # peeking did not use it up
    assert held.peek(code) is None
    held.end("not-a-session")
    assert ended == []  # nothing ended: nobody is woken
    held.end(first)
    assert ended == ["ended"]
    held.open("local", Scope.ADMIN, holder="token-a")
    held.open("local", Scope.ADMIN, holder="token-a")
    held.open("local", Scope.ADMIN, holder="token-a")  # past max_each: its oldest goes
    assert ended == ["ended", "ended"]
    held.end_revoked(lambda holder: holder != "token-a")
    assert ended == ["ended"] * 3
    held.end_revoked(lambda holder: False)  # none left to end
    assert ended == ["ended"] * 3
