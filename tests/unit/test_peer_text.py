"""Text from peers: checked with full matches, escaped when shown; who may knock at all."""

import pytest

from swamp.domain.request_policy import RequestPolicy, host_name, normalize_origin
from swamp.domain.text import printable
from swamp.domain.workers import (
    check_instance_id,
    check_machine_id,
    check_platform_word,
    check_version,
    looks_like_instance_id,
)
from swamp.errors import UserError


def test_printable_escapes_every_control_and_bidi_character():
    assert printable("linux") == "linux"
    assert printable("\x1b[2J\x1b]0;owned\x07") == "\\x1b[2J\\x1b]0;owned\\x07"
    assert printable("a\nb\r\x00") == "a\\x0ab\\x0d\\x00"
    assert printable("abc\u202edef\u2066") == "abc\\u202edef\\u2066"
    assert printable("\x9b") == "\\x9b"  # the 8-bit CSI
    assert printable("tab\there") == "tab\\x09here"
    assert printable("tab\there", keep_tab=True) == "tab\there"
    assert printable("naïve ✓ 日本") == "naïve ✓ 日本"  # ordinary text is untouched


@pytest.mark.parametrize(
    "check,good,bad",
    [
        (
            check_instance_id,
            "0b9a7c1e-1111-4222-8333-444455556666",
            [
                "victim",
                "0B9A7C1E-1111-4222-8333-444455556666",
                "0b9a7c1e-1111-4222-8333-444455556666\n",
                "",
                None,
                5,
            ],
        ),
        (check_machine_id, "racer-0", ["", "a b", "m\n", "x" * 129, "-lead"]),
        (
            lambda v: check_platform_word(v, "platform"),
            "linux",
            ["Linux", "\x1b[2Jlinux", "linux\n", "", "x" * 33, "a b"],
        ),
        (check_version, "0.1.0+dev", ["", "1\n", "\x1b", "x" * 65]),
    ],
)
def test_enrollment_fields_are_full_matches(check, good, bad):
    assert check(good) == good
    for value in bad:
        with pytest.raises(UserError):
            check(value)


def test_names_shaped_like_instance_ids_are_recognised():
    assert looks_like_instance_id("0b9a7c1e-1111-4222-8333-444455556666")
    assert looks_like_instance_id("0b9a7c1e-1111-4222-8333")
    assert not looks_like_instance_id("pool")
    assert not looks_like_instance_id("0b9a7c1e")


# -- the request policy --------------------------------------------------------------------------

LOOPBACK = RequestPolicy.build(loopback=True, bind_host="127.0.0.1")


@pytest.mark.parametrize(
    "origin",
    [
        "https://evil.example",
        "http://127.0.0.1:7420",
        "null",
        "http://localhost:7420",
        "file://",
        "",
    ],
)
def test_any_origin_is_refused_by_default(origin):
    reason = LOOPBACK.refusal({"origin": origin, "host": "127.0.0.1:7420"})
    assert reason and "browsers are not clients" in reason


def test_an_allowed_origin_is_admitted_in_any_spelling():
    policy = RequestPolicy.build(loopback=True, allow_origins=["https://Ops.Example.com:443/"])
    assert policy.refusal({"origin": "https://ops.example.com", "host": "127.0.0.1"}) is None
    assert policy.refusal({"origin": "https://ops.example.com:8443", "host": "127.0.0.1"})
    assert policy.refusal({"origin": "http://ops.example.com", "host": "127.0.0.1"})


@pytest.mark.parametrize(
    "bad", ["ops.example.com", "ftp://x", "https://x/path", "https://u@x", "https://"]
)
def test_bad_allow_origin_values_are_input_errors(bad):
    with pytest.raises(UserError, match="--allow-origin"):
        normalize_origin(bad)


@pytest.mark.parametrize(
    "host,ok",
    [
        ("127.0.0.1:7420", True),
        ("localhost:7420", True),
        ("[::1]:7420", True),
        ("10.0.0.5:7420", True),
        ("evil.example:7420", False),
        ("evil.example", False),
        ("localhost.evil.example", False),
        ("[::1", False),
    ],
)
def test_a_loopback_server_accepts_only_its_own_names(host, ok):
    assert (LOOPBACK.refusal({"host": host}) is None) is ok


def test_trusted_hosts_and_off_loopback_binds():
    trusted = RequestPolicy.build(loopback=True, trusted_hosts=["host.docker.internal"])
    assert trusted.refusal({"host": "host.docker.internal:7420"}) is None
    assert trusted.refusal({"host": "evil.example"})
    anywhere = RequestPolicy.build(loopback=False, bind_host="0.0.0.0")
    assert anywhere.refusal({"host": "orchestrator.internal:7420"}) is None
    assert anywhere.refusal({"origin": "https://x", "host": "orchestrator.internal"})
    listed = RequestPolicy.build(loopback=False, trusted_hosts=["orch.internal"])
    assert listed.refusal({"host": "orch.internal"}) is None
    assert listed.refusal({"host": "other.internal"})
    with pytest.raises(UserError, match="--trusted-host"):
        RequestPolicy.build(loopback=True, trusted_hosts=["a b"])


def test_host_header_parsing():
    assert host_name("Example.COM:80") == "example.com"
    assert host_name("[::1]:7420") == "::1"
    assert host_name("a:b") is None and host_name(":80") is None


def test_the_serve_log_formatter_escapes_what_peers_sent():
    import logging

    from swamp.cli.serve_cmd import EscapingFormatter

    record = logging.LogRecord(
        "swamp.gateway",
        logging.INFO,
        __file__,
        1,
        "worker %s disconnected: %s",
        ("w1", "bye\x1b[2J\nINFO forged"),
        None,
    )
    line = EscapingFormatter("%(levelname)s %(message)s").format(record)
    assert line == "INFO worker w1 disconnected: bye\\x1b[2J\\x0aINFO forged"


def test_an_error_message_cannot_forge_a_line_of_its_own(capsys):
    import typer

    from swamp.cli.common import fail

    with pytest.raises(typer.Exit):
        fail("bad thing\nerror: forged \x1b[2J\n  version ==\n            ^", status=2)
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "error: bad thing",
        "  error: forged \\x1b[2J",
        "  version ==",
        "            ^",
    ]
