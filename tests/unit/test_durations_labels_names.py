import pytest
from hypothesis import given, strategies as st

from swamp.domain.durations import format_duration, parse_duration
from swamp.domain.labels import check_labels, format_labels, parse_label, parse_labels
from swamp.domain.names import check_data_name, check_name
from swamp.errors import UserError


@pytest.mark.parametrize("text,seconds", [("30s", 30), ("15m", 900), ("2h", 7200),
                                          ("7d", 604800), ("1w", 604800), (" 5m ", 300)])
def test_durations_parse(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["0s", "0h", "-5m", "5", "5x", "m", "", "1.5h", "1mo", "5 m"])
def test_bad_durations_are_rejected_with_a_hint(text):
    with pytest.raises(UserError) as info:
        parse_duration(text, what="--duration")
    assert "--duration" in info.value.message
    assert "30s, 15m, 2h, 7d, 1w" in info.value.message


@given(st.integers(min_value=1, max_value=10**6), st.sampled_from("smhdw"))
def test_duration_round_trip(amount, unit):
    seconds = parse_duration(f"{amount}{unit}")
    assert parse_duration(format_duration(seconds)) == seconds


def test_labels_parse_and_later_entries_win():
    assert parse_label("gpu=true") == ("gpu", "true")
    assert parse_labels(["a=1", "b=2", "a=3"]) == {"a": "3", "b": "2"}
    assert format_labels({"b": "2", "a": "1"}) == "a=1,b=2"
    assert format_labels({}) == "-"


@pytest.mark.parametrize("text", ["gpu", "=x", "x=", "a b=c", "k=v v", "k=" + "v" * 200])
def test_bad_labels_name_the_entry_and_source(text):
    with pytest.raises(UserError) as info:
        parse_label(text, source="SWAMP_WORKER_LABELS")
    assert repr(text) in info.value.message
    assert "SWAMP_WORKER_LABELS" in info.value.message


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
