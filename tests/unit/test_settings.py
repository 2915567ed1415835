"""swamp.toml's [serve] table: which settings apply, and what is refused."""

import pytest

from swamp.domain.settings import Kind, from_file
from swamp.errors import UserError

KNOWN = {
    "host": Kind.TEXT,
    "port": Kind.NUMBER,
    "verify-on-enroll": Kind.FLAG,
    "allow-origin": Kind.TEXTS,
}
WHERE = "swamp.toml [serve]"


def test_the_file_applies_where_nothing_else_was_given():
    table = {"host": "0.0.0.0", "port": 7999, "verify-on-enroll": True, "allow-origin": ["x"]}
    assert from_file(table, KNOWN, given=set(), where=WHERE) == table
    # the command line (or the environment) wins: the file's value is left out
    assert from_file(table, KNOWN, given={"port", "host"}, where=WHERE) == {
        "verify-on-enroll": True,
        "allow-origin": ["x"],
    }
    assert from_file(None, KNOWN, given=set(), where=WHERE) == {}  # no [serve] table


@pytest.mark.parametrize(
    "table,needle",
    [
        ({"prot": 7420}, "swamp.toml [serve]: unknown setting 'prot' (known: allow-origin, "),
        ({"port": "7420"}, "swamp.toml [serve] port: expected a whole number, got '7420'"),
        ({"port": True}, "port: expected a whole number, got True"),
        ({"host": 1}, "host: expected text, got 1"),
        ({"verify-on-enroll": "yes"}, "verify-on-enroll: expected true or false"),
        ({"allow-origin": "https://a"}, "allow-origin: expected a list of text"),
        ("port=1", "swamp.toml [serve] must be a table of settings"),
    ],
)
def test_a_wrong_key_or_value_is_one_line_even_when_the_flag_is_given(table, needle):
    # a typo in the file is refused even if the command line would have won over it
    with pytest.raises(UserError) as info:
        from_file(table, KNOWN, given=set(KNOWN), where=WHERE)
    assert needle in info.value.message and "\n" not in info.value.message
