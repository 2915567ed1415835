import pytest
from hypothesis import given
from hypothesis import strategies as st

from swamp.domain.durations import parse_duration
from swamp.domain.labels import check_labels, format_labels, parse_label, parse_labels
from swamp.domain.names import check_data_name, check_name
from swamp.errors import UserError


@pytest.mark.parametrize(
    "text,seconds",
    [("30s", 30), ("15m", 900), ("2h", 7200), ("7d", 604800), ("1w", 604800), (" 5m ", 300)],
)
def test_durations_parse(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["0s", "0h", "-5m", "5", "5x", "m", "", "1.5h", "1mo", "5 m"])
def test_bad_durations_are_rejected_with_a_hint(text):
    with pytest.raises(UserError) as info:
        parse_duration(text, what="--duration")
    assert "--duration" in info.value.message
    assert "30s, 15m, 2h, 7d, 1w" in info.value.message


def test_labels_parse_and_later_entries_win():
    assert parse_label("gpu=true") == ("gpu", "true")
    assert parse_labels(["a=1", "b=2", "a=3"]) == {"a": "3", "b": "2"}
    assert format_labels({"b": "2", "a": "1"}) == "a=1,b=2"
    assert format_labels({}) == "-"


@pytest.mark.parametrize("text", ["gpu", "=x", "x=", "a b=c", "k=v v", "k=" + "v" * 200])
def test_bad_labels_name_the_entry_and_source(text):
    with pytest.raises(UserError) as info:
        parse_label(text, source="SWAMP_WORKER_LABELS")
    assert repr(text if len(text) <= 80 else text[:80] + "…") in info.value.message
    assert "SWAMP_WORKER_LABELS" in info.value.message


@pytest.mark.parametrize("text", ["k=v\n", "k\n=v", "k=v\x1b[2J", "k=\u202ev", "k=v\r"])
def test_labels_with_control_characters_or_a_trailing_newline_are_refused(text):
    with pytest.raises(UserError):
        parse_label(text)
    key, _, value = text.partition("=")
    with pytest.raises(UserError):
        check_labels({key: value})


def test_the_number_of_labels_is_bounded():
    from swamp.domain.labels import MAX_LABELS

    many = {f"k{i}": "v" for i in range(MAX_LABELS + 1)}
    with pytest.raises(UserError, match="too many labels"):
        check_labels(many)
    with pytest.raises(UserError, match="too many labels"):
        parse_labels([f"{k}={v}" for k, v in many.items()])
    assert len(check_labels(dict(list(many.items())[:MAX_LABELS]))) == MAX_LABELS


@pytest.mark.parametrize("name", ["result\n", "ok\n", "a\x00", "x" * 65])
def test_names_are_full_matches(name):
    with pytest.raises(UserError):
        check_name(name)


def test_data_names_are_full_matches():
    with pytest.raises(UserError):
        check_data_name("result\n")
    assert check_data_name("result") == "result"


def test_labels_from_the_network_are_checked():
    assert check_labels({"a": "b"}) == {"a": "b"}
    for bad in (["a=b"], {"a": 1}, {"": "x"}, "a=b"):
        with pytest.raises(UserError):
            check_labels(bad)


@pytest.mark.parametrize("name", ["a", "pool", "w-1_x", "0" * 64])
def test_good_names(name):
    assert check_name(name) == name


@pytest.mark.parametrize("name", ["", "A", "-a", "a.b", "a/b", "..", "0" * 65, "a b"])
def test_bad_names(name):
    with pytest.raises(UserError):
        check_name(name)


@pytest.mark.parametrize("name", ["../x", "a/b", ".hidden", "a..b", ""])
def test_data_names_cannot_escape(name):
    with pytest.raises(UserError):
        check_data_name(name)


@given(st.integers(min_value=1, max_value=10**6), st.sampled_from("smhdw"))
def test_every_positive_amount_and_unit_parses(amount, unit):
    factor = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[unit]
    assert parse_duration(f"{amount}{unit}") == amount * factor
