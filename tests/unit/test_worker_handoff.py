"""How a worker starts itself again without its token in view: the command line it execs."""

import os

import pytest

from swamp.errors import UserError
from swamp.worker.handoff import command_line, read_token_fd


@pytest.mark.parametrize(
    ("orig", "argv", "expected"),
    [
        (  # python -m swamp, the token in the environment
            ["python3", "-m", "swamp", "worker", "connect", "ws://h:1", "--json"],
            ["/x/swamp/__main__.py", "worker", "connect", "ws://h:1", "--json"],
            ["python3", "-m", "swamp", "worker", "connect", "--token-fd", "7", "ws://h:1",
             "--json"],
        ),
        (  # the pyz, isolated, with --token VALUE
            ["python3", "-I", "swamp.pyz", "worker", "connect", "--token", "a.b", "ws://h:1"],
            ["swamp.pyz", "worker", "connect", "--token", "a.b", "ws://h:1"],
            ["python3", "-I", "swamp.pyz", "worker", "connect", "--token-fd", "7", "ws://h:1"],
        ),
        (  # a console script, with --token=VALUE; --token-file is another option
            ["/v/bin/python", "/v/bin/swamp", "worker", "connect", "--token=a.b", "--label", "k=v"],
            ["/v/bin/swamp", "worker", "connect", "--token=a.b", "--label", "k=v"],
            ["/v/bin/python", "/v/bin/swamp", "worker", "connect", "--token-fd", "7", "--label",
             "k=v"],
        ),
        (  # after --, everything is an argument, kept as it is
            ["py", "s", "worker", "connect", "--token", "a.b", "--", "--token"],
            ["s", "worker", "connect", "--token", "a.b", "--", "--token"],
            ["py", "s", "worker", "connect", "--token-fd", "7", "--", "--token"],
        ),
    ],
)  # fmt: skip
def test_the_command_line_keeps_everything_but_the_token(orig, argv, expected):
    assert command_line(orig, argv, 7) == expected


def test_a_rewritten_argv_falls_back_to_starting_swamp_as_children_are(monkeypatch):
    monkeypatch.delenv("SWAMP_PYZ", raising=False)
    line = command_line(["python3", "-c", "..."], ["x", "worker", "connect", "--token", "a.b"], 3)
    assert line[-6:] == ["-m", "swamp", "worker", "connect", "--token-fd", "3"]


def test_the_token_is_read_from_its_descriptor_which_is_then_closed():
    read, write = os.pipe()
    os.write(write, b"name.secret\n")
    os.close(write)
    assert read_token_fd(read) == "name.secret"
    with pytest.raises(OSError):
        os.fstat(read)
    empty, write = os.pipe()
    os.close(write)
    with pytest.raises(UserError, match="no token"):
        read_token_fd(empty)
