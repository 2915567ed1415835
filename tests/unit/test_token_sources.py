"""Token sources: telling a token from a reference, holding what a source gives to a token's
shape, the built-in ``file:`` and ``env:``, and asking again when a token is refused."""

import io
import json
import secrets
import threading

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from swamp.domain.names import NAME_PATTERN
from swamp.domain.token_sources import (
    another_token_may_help,
    check_resolved,
    is_reference,
    parse_reference,
)
from swamp.errors import BY_CODE, Rejected, TokenSourceFailed, UserError
from swamp.hooks import hookimpl
from swamp.plugins import plugin_manager
from swamp.worker import handoff
from swamp.worker.agent import _another_token
from swamp.worker.config import WorkerConfig
from swamp.worker.events import Reporter
from swamp.worker.token_sources import (
    Supply,
    TokenSource,
    collect,
    from_environment,
    from_file,
    resolve,
    supply,
)

KNOWN = ["env", "exec", "file"]
SECRET = "9f" * 32  # what a minted secret looks like: 64 lowercase hex digits


def minted(name: str = "pool") -> str:
    return f"{name}.{secrets.token_hex(32)}"


# -- a token or a reference ------------------------------------------------------------------


@given(st.from_regex(NAME_PATTERN, fullmatch=True))
def test_a_real_token_is_never_taken_for_a_reference(name):
    token = minted(name)
    assert not is_reference(token)
    assert parse_reference(token, KNOWN) is None


@pytest.mark.parametrize(
    "text,scheme,ref",
    [
        ("file:/run/secrets/swamp", "file", "/run/secrets/swamp"),
        ("env:CI_TOKEN", "env", "CI_TOKEN"),
        ("exec:vault kv get -field=x kv/a.b", "exec", "vault kv get -field=x kv/a.b"),
        (" exec: cat t \n", "exec", "cat t"),
        ("file:./tok.txt", "file", "./tok.txt"),
    ],
)  # fmt: skip
def test_a_colon_before_the_first_dot_is_a_reference(text, scheme, ref):
    reference = parse_reference(text, KNOWN)
    assert (reference.scheme, reference.ref) == (scheme, ref)


def test_an_unknown_scheme_is_one_line_listing_the_known_ones():
    with pytest.raises(UserError) as info:
        parse_reference("vault:secret/swamp-" + SECRET, KNOWN)
    message = info.value.message
    assert message == (
        "unknown token source 'vault' in SWAMP_WORKER_TOKEN/--token (known: env, exec, file)"
    )
    assert not isinstance(info.value, TokenSourceFailed)  # bad input, not a failed source


def test_text_that_is_neither_shows_nothing_of_itself():
    for text in (f"Pool:{SECRET}", f"{SECRET}:x", f"x y:{SECRET}"):
        with pytest.raises(UserError) as info:
            parse_reference(text, KNOWN)
        assert "neither a token" in info.value.message and SECRET not in info.value.message
        assert "\n" not in info.value.message


def test_a_reference_needs_something_after_the_colon():
    with pytest.raises(TokenSourceFailed, match="token source exec: nothing after 'exec:'"):
        parse_reference("exec:  ", KNOWN)


# -- what a source gives back ----------------------------------------------------------------


def test_a_resolved_token_is_trimmed():
    assert check_resolved(f"  pool.{SECRET}\n", "exec") == f"pool.{SECRET}"


@pytest.mark.parametrize(
    "value,why",
    [
        ("", "gave an empty token"),
        (" \n", "gave an empty token"),
        (f"pool.{SECRET}\nmore {SECRET}", "more than one word or line"),
        (f'{{"token": "pool.{SECRET}"}}', "more than one word or line"),
        (f"pool.{SECRET}\x1b[2J", "more than one word or line"),
        ("p." + "a" * 2000, "more than a token has"),
        (f"env:{SECRET}", "another <scheme>:<reference>"),
        (SECRET, "not a token (<name>.<secret>)"),
        (f".{SECRET}", "not a token (<name>.<secret>)"),
        (None, "gave a NoneType, not text"),
        (b"pool.x", "gave a bytes, not text"),
    ],
)
def test_what_is_not_a_token_is_one_line_naming_the_source_and_never_the_value(value, why):
    with pytest.raises(TokenSourceFailed) as info:
        check_resolved(value, "exec")
    message = info.value.message
    assert message.startswith("token source exec: ") and why in message
    assert SECRET not in message and "\n" not in message


def test_which_refusals_another_token_may_cure():
    for code in ("token_invalid", "token_revoked", "token_expired", "allowance_exhausted"):
        assert another_token_may_help(code)
    assert not another_token_may_help("protocol_mismatch")
    assert not another_token_may_help("fleet_full")  # not a refusal: the worker waits
    from swamp.domain.token_sources import CURABLE_BY_ANOTHER_TOKEN

    for code in CURABLE_BY_ANOTHER_TOKEN:  # every one is a real, permanent refusal
        assert issubclass(BY_CODE[code], Rejected), code


# -- the built-in sources ----------------------------------------------------------------------


def test_file_reads_the_token_and_says_why_it_cannot(tmp_path):
    path = tmp_path / "token"
    path.write_text(f"pool.{SECRET}\n")
    assert from_file(str(path)) == f"pool.{SECRET}\n"  # trimmed by check_resolved
    with pytest.raises(TokenSourceFailed, match=f"cannot read {tmp_path}/missing: No such file"):
        from_file(str(tmp_path / "missing"))
    path.write_bytes(b"x" * 20000)
    with pytest.raises(TokenSourceFailed, match="holds more than 16384 bytes"):
        from_file(str(path))
    path.write_bytes(b"pool.\xff\xfe")
    with pytest.raises(TokenSourceFailed, match="is not UTF-8 text"):
        from_file(str(path))


def test_env_reads_another_variable(monkeypatch):
    monkeypatch.setenv("CI_SWAMP_TOKEN", f"pool.{SECRET}")
    assert from_environment("CI_SWAMP_TOKEN") == f"pool.{SECRET}"
    monkeypatch.delenv("CI_SWAMP_TOKEN")
    with pytest.raises(TokenSourceFailed, match="the variable CI_SWAMP_TOKEN is not set"):
        from_environment("CI_SWAMP_TOKEN")
    with pytest.raises(TokenSourceFailed, match="is not a variable name"):
        from_environment("A-B")
    with pytest.raises(TokenSourceFailed, match="cannot name itself"):
        from_environment("SWAMP_WORKER_TOKEN")


def test_the_built_in_sources_register_through_the_hook_and_a_scheme_only_once():
    pm = plugin_manager(load_entry_points=False)
    sources = collect(pm.hook.swamp_token_sources())
    assert {"file", "env"} <= set(sources)
    assert sources["file"].asks_again and not sources["env"].asks_again

    class Impostor:
        @hookimpl
        def swamp_token_sources(self):
            return [TokenSource("file", lambda ref: "x.y")]

    pm.register(Impostor())
    with pytest.raises(TokenSourceFailed, match="token source 'file' is registered twice"):
        collect(pm.hook.swamp_token_sources())


# -- resolving ---------------------------------------------------------------------------------


def _resolve(fn, ref="r", *, timeout=5.0):
    source = TokenSource("vault", fn)
    return resolve(parse_reference(f"vault:{ref}", ["vault"]), source, timeout=timeout)


def test_a_source_failure_is_prefixed_with_its_scheme_and_kept_to_one_line():
    def fails(ref):
        raise TokenSourceFailed("permission denied on secret/swamp\nsecond line")

    with pytest.raises(TokenSourceFailed) as info:
        _resolve(fails)
    assert info.value.message == "token source vault: permission denied on secret/swamp"


def test_any_other_exception_is_shown_by_its_type_alone():
    def leaks(ref):
        return int(f"pool.{SECRET}")  # ValueError: invalid literal … 'pool.<secret>'

    with pytest.raises(TokenSourceFailed) as info:
        _resolve(leaks)
    assert info.value.message == (
        "token source vault: failed with ValueError (a bug in the plugin that provides it)"
    )


def test_a_source_that_does_not_answer_fails_within_its_deadline():
    release = threading.Event()
    with pytest.raises(TokenSourceFailed, match="token source vault: no answer within 0.2s"):
        _resolve(lambda ref: release.wait(30) and "x.y", timeout=0.2)
    release.set()


# -- what connect starts with ------------------------------------------------------------------


def _sources(**extra):
    def load():
        pm = plugin_manager(load_entry_points=False)
        return {**collect(pm.hook.swamp_token_sources()), **extra}

    return load


def test_a_plain_token_works_as_before_and_loads_no_plugin():
    def never():
        raise AssertionError("a plain token needs no source")

    given_ = supply(f"  pool.{SECRET} ", None, sources=never)
    assert (given_.token, given_.again) == (f"pool.{SECRET}", None)


def test_the_token_file_is_read_again_when_asked(tmp_path):
    path = tmp_path / "token"
    path.write_text("a.1\n")
    given_ = supply(None, path, sources=_sources())
    assert (given_.token, given_.source) == ("a.1", "--token-file")
    path.write_text("b.2\n")
    assert given_.again() == "b.2"
    with pytest.raises(UserError, match="not both"):
        supply("file:/x", path, sources=_sources())


def test_a_reference_is_resolved_and_can_be_asked_again(tmp_path, monkeypatch):
    path = tmp_path / "token"
    path.write_text("a.1\n")
    given_ = supply(f"file:{path}", None, sources=_sources())
    assert (given_.token, given_.source) == ("a.1", "file:")
    path.write_text("b.2")
    assert given_.again() == "b.2"
    monkeypatch.setenv("CI_SWAMP_TOKEN", "c.3")
    given_ = supply("env:CI_SWAMP_TOKEN", None, sources=_sources())
    assert (given_.token, given_.again) == ("c.3", None)  # a started process's env is fixed


def test_the_repr_of_what_holds_a_token_does_not_show_it():
    assert SECRET not in repr(Supply(f"p.{SECRET}", "exec:", lambda: "x"))
    assert SECRET not in repr(WorkerConfig(url="ws://127.0.0.1:1", token=f"p.{SECRET}"))


# -- what is in view, and must be hidden -------------------------------------------------------


def test_a_token_from_a_variable_is_in_view_and_its_variable_unset(monkeypatch):
    token = f"pool.{SECRET}"
    monkeypatch.setenv("SWAMP_WORKER_TOKEN", "env:CI_SWAMP_TOKEN")
    monkeypatch.setenv("CI_SWAMP_TOKEN", token)
    assert handoff.exposed(token, "env:CI_SWAMP_TOKEN") == ({token}, {"CI_SWAMP_TOKEN"})
    monkeypatch.delenv("CI_SWAMP_TOKEN")
    # from a file or a command: only the reference is in view, which is no secret
    monkeypatch.setenv("SWAMP_WORKER_TOKEN", "exec:cat /run/token")
    assert handoff.exposed(token, "exec:cat /run/token") == (set(), set())
    # given as it is: as before, the token and the variable
    monkeypatch.setenv("SWAMP_WORKER_TOKEN", f" {token}")
    assert handoff.exposed(token, f" {token}") == ({token, f" {token}"}, {"SWAMP_WORKER_TOKEN"})


# -- asking again, in the agent ----------------------------------------------------------------


def _config(token, again):
    return WorkerConfig(
        url="ws://127.0.0.1:1", token=token, token_again=again, token_source="exec:"
    )


async def test_a_different_token_from_the_source_is_taken_and_said_without_the_token():
    out = io.StringIO()
    reporter = Reporter(json_lines=True, stream=out)
    fresh, why = await _another_token(
        _config(f"a.{SECRET}", lambda: f"b.{SECRET}"), reporter, "revoked", "token_revoked"
    )
    assert (fresh, why) == (f"b.{SECRET}", "revoked")
    event = json.loads(out.getvalue())
    assert (event["event"], event["source"], event["after"]) == (
        "token_renewed",
        "exec:",
        "token_revoked",
    )
    assert SECRET not in out.getvalue()


async def test_the_same_token_or_a_failing_source_stops_the_worker_with_why():
    reporter = Reporter(json_lines=True, stream=io.StringIO())
    same = _config(f"a.{SECRET}", lambda: f"a.{SECRET}")
    assert await _another_token(same, reporter, "revoked", "token_revoked") == (
        None,
        "revoked (exec: still gives the same token)",
    )

    def fails():
        raise TokenSourceFailed("token source exec: vault exited with status 2")

    fresh, why = await _another_token(_config("a.1", fails), reporter, "revoked", "x")
    assert fresh is None
    assert why == (
        "revoked; asking exec: for another failed: token source exec: vault exited with status 2"
    )
    assert await _another_token(_config("a.1", None), reporter, "revoked", "x") == (
        None,
        "revoked",
    )


async def test_asking_again_gives_way_to_cancellation():
    started = threading.Event()
    release = threading.Event()

    def hangs():
        started.set()
        release.wait(30)
        return "x.y"

    reporter = Reporter(json_lines=True, stream=io.StringIO())
    with trio.move_on_after(0.2) as scope:
        await _another_token(_config("a.1", hangs), reporter, "revoked", "x")
    assert scope.cancelled_caught and started.is_set()
    release.set()
