from dataclasses import replace

import pytest

from swamp.domain.labels import merge_labels
from swamp.domain.urls import redact
from swamp.errors import UserError
from swamp.worker.config import WorkerConfig, read_token


def test_env_labels_merge_under_flags():
    assert merge_labels("zone=a,gpu=true", ["zone=b"]) == {"zone": "b", "gpu": "true"}
    assert merge_labels(" zone=a , ,gpu=true,", []) == {"zone": "a", "gpu": "true"}
    assert merge_labels(None, ["x=1"]) == {"x": "1"}
    assert merge_labels("", []) == {}


@pytest.mark.parametrize(
    "env,flags,source,entry",
    [
        ("zone=a,oops", [], "SWAMP_WORKER_LABELS", "oops"),
        ("zone=a", ["bad"], "--label", "bad"),
        ("=x", [], "SWAMP_WORKER_LABELS", "=x"),
    ],
)
def test_a_bad_label_names_its_entry_and_source(env, flags, source, entry):
    with pytest.raises(UserError) as info:
        merge_labels(env, flags)
    assert repr(entry) in info.value.message and source in info.value.message


def test_token_from_a_file_trims_one_trailing_newline(tmp_path):
    secret = tmp_path / "token"
    secret.write_text("pool.abc\n")
    assert read_token(None, secret) == "pool.abc"
    secret.write_text("pool.abc\r\n")
    assert read_token(None, secret) == "pool.abc"
    assert read_token(" pool.xyz ", None) == "pool.xyz"


def test_token_file_errors_never_echo_the_token(tmp_path):
    with pytest.raises(UserError, match="not both"):
        read_token("pool.secret", tmp_path / "t")
    with pytest.raises(UserError, match="cannot read the token file"):
        read_token(None, tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(UserError, match="is empty"):
        read_token(None, empty)


def test_missing_url_or_token_names_the_flag_and_the_variable():
    with pytest.raises(UserError) as info:
        WorkerConfig(url="", token="t.s")
    assert "SWAMP_ORCHESTRATOR_URL" in info.value.message and "argument" in info.value.message
    with pytest.raises(UserError) as info:
        WorkerConfig(url="ws://h:1", token="")
    for name in ("--token", "SWAMP_WORKER_TOKEN", "--token-file", "SWAMP_WORKER_TOKEN_FILE"):
        assert name in info.value.message


def test_urls_with_credentials_are_redacted_in_errors():
    with pytest.raises(UserError) as info:
        WorkerConfig(url="http://user:hunter2@host:9/x?token=abc", token="t.s")
    assert "hunter2" not in info.value.message and "abc" not in info.value.message
    assert redact("wss://u:p@h:7420/p?q=1") == "wss://h:7420/p"
    assert redact("ws://[::1]:80/") == "ws://[::1]:80/"


def test_the_data_plane_is_derived_or_explicit():
    assert WorkerConfig(url="wss://h:7420", token="t.s").data_plane() == "https://h:7420"
    assert (
        WorkerConfig(url="ws://h:7420/x", token="t.s", insecure=True).data_plane()
        == "http://h:7420"
    )
    assert (
        WorkerConfig(url="ws://127.0.0.1:7420", token="t.s").data_plane() == "http://127.0.0.1:7420"
    )
    assert (
        WorkerConfig(
            url="ws://h", token="t.s", insecure=True, data_plane_url="http://other:1/"
        ).data_plane()
        == "http://other:1"
    )
    with pytest.raises(UserError, match="SWAMP_DATA_PLANE_URL"):
        WorkerConfig(url="ws://h", token="t.s", data_plane_url="ftp://x")


@pytest.mark.parametrize(
    "url,data_plane",
    [
        ("ws://10.0.0.5:7420", None),
        ("ws://orchestrator.internal:7420", None),
        ("wss://orchestrator.internal:7420", "http://10.0.0.5:7420"),
    ],
)
def test_secrets_never_cross_a_network_in_clear_without_insecure(url, data_plane):
    with pytest.raises(UserError, match="in clear text") as info:
        WorkerConfig(url=url, token="t.s", data_plane_url=data_plane)
    assert "--insecure" in info.value.message and "t.s" not in info.value.message
    assert WorkerConfig(url=url, token="t.s", data_plane_url=data_plane, insecure=True)


def test_loopback_needs_no_tls():
    for url in ("ws://127.0.0.1:1", "ws://localhost:1", "ws://[::1]:1", "ws://127.0.0.2:1"):
        assert WorkerConfig(url=url, token="t.s")


def test_concurrency_is_a_number_or_auto_for_the_cpu_count():
    import os

    from swamp.worker.config import parse_concurrency

    assert parse_concurrency("4") == 4
    assert parse_concurrency(" AUTO ") == parse_concurrency("auto") == max(1, os.cpu_count() or 1)
    with pytest.raises(UserError, match="SWAMP_WORKER_CONCURRENCY"):
        parse_concurrency("lots")


def test_several_orchestrators_are_tried_in_turn():
    """A comma-separated list: the first is connected to first, then each in turn (the
    first after the last); blanks and repeats are dropped; one URL is itself again."""
    config = WorkerConfig(
        url=" wss://a.example:7420 ,wss://b.example:7420,, wss://a.example:7420", token="t.s"
    )
    assert config.urls == ("wss://a.example:7420", "wss://b.example:7420")
    assert config.url == "wss://a.example:7420"
    assert config.data_plane() == "https://a.example:7420"
    second = config.next_orchestrator()
    assert second.url == "wss://b.example:7420" and second.urls == config.urls
    assert second.data_plane() == "https://b.example:7420"  # the data plane follows it
    assert second.next_orchestrator().url == "wss://a.example:7420"
    one = WorkerConfig(url="wss://a.example:7420", token="t.s")
    assert one.next_orchestrator() is one


@pytest.mark.parametrize(
    "url,said",
    [
        ("wss://a.example:7420,http://b.example", "must start with ws:// or wss://"),
        ("wss://a.example:7420,ws://b.example:7420", "clear text to ws://b.example:7420"),
        (",".join(f"wss://h{i}.example" for i in range(17)), "at most 16"),
        (" , ", "missing orchestrator URL"),
    ],
)
def test_every_orchestrator_of_a_list_is_checked(url, said):
    with pytest.raises(UserError) as info:
        WorkerConfig(url=url, token="t.s")
    assert said in info.value.message


@pytest.mark.parametrize(
    "url,secret",
    [
        ("wss://orch.example:7420/?key=s3cr3t,t0p", "t0p"),  # a secret in the query
        ("wss://bob:pa55,w0rd@orch.example:7420", "w0rd"),  # a password with a comma
    ],
)
def test_a_comma_inside_a_url_keeps_it_whole_and_a_refusal_never_shows_its_secret(url, secret):
    """A comma inside one URL (a query, a password) does not split it: it is one URL, and
    when it is refused it is shown redacted, whole."""
    assert WorkerConfig(url=url, token="t.s").urls == (url,)
    clear = url.replace("wss://", "ws://")  # refused: the token in clear to another host
    with pytest.raises(UserError) as info:
        WorkerConfig(url=f"wss://a.example:7420,{clear}", token="t.s")
    assert "clear text" in info.value.message and secret not in info.value.message


def test_replacing_the_url_is_checked_like_the_first():
    """replace(config, url=…) points it at a URL outside its list: checked as the list's."""
    config = WorkerConfig(url="wss://a.example:7420", token="t.s")
    with pytest.raises(UserError):
        replace(config, url="ws://plain.example:7420")  # clear text to another host
