"""One depth limit for JSON, read and written: the rule, and where frames apply it."""

import json

import pytest

from swamp.errors import MalformedFrame
from swamp.protocol import frames
from swamp.protocol.frames import MAX_JSON_DEPTH, load_json, nested_deeper_than
from swamp.protocol.messages import RunResult


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("value", "depth"),
    [(None, 0), ("[[[", 0), ([], 1), ({}, 1), ([1, {"a": []}], 3), ({"a": {"b": [[]]}}, 4)],
)
def test_depth_is_counted_in_containers(value, depth):
    assert not nested_deeper_than(value, depth)
    assert depth == 0 or nested_deeper_than(value, depth - 1)


def test_any_depth_is_answered_without_recursion():
    assert nested_deeper_than(nested(200_000), MAX_JSON_DEPTH)


def test_reading_takes_the_limit_and_refuses_one_more():
    assert load_json("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH) == nested(MAX_JSON_DEPTH)
    deeper = "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1)
    for text in (deeper, deeper.encode()):
        with pytest.raises(MalformedFrame, match="nested more than 100 levels"):
            load_json(text)
    with pytest.raises(MalformedFrame, match="nested more than 3 levels"):
        load_json('{"a": [[[]]]}', max_depth=3)
    assert load_json('{"a": "[[[[[[[[["}', max_depth=1) == {"a": "[[[[[[[[["}  # text, not depth


def test_a_deep_frame_is_refused_with_its_id_and_type_so_an_answer_can_fail_its_call():
    text = json.dumps({"type": "response", "id": "r7", "result": nested(MAX_JSON_DEPTH)})
    with pytest.raises(MalformedFrame) as info:
        frames.decode(text)
    assert (info.value.frame_id, info.value.frame_type) == ("r7", "response")
    ok = json.dumps({"type": "response", "id": "r7", "result": nested(MAX_JSON_DEPTH - 1)})
    assert frames.decode(ok) == frames.Response("r7", nested(MAX_JSON_DEPTH - 1))


def test_writing_refuses_what_reading_would_and_says_so():
    result = RunResult(status="succeeded", model="m", model_type="t/m", method="x")
    deepest = MAX_JSON_DEPTH - 2  # the frame's object and the message's around the field
    ok = frames.Response(
        "r1", RunResult(**{**result.__dict__, "result": nested(deepest)}).to_json()
    )
    assert frames.decode(frames.encode(ok)) == ok  # as deep as may be read, and read back
    for depth in (deepest + 1, 5000):  # 5000: deeper than the stack would have let it go
        with pytest.raises(MalformedFrame, match="nested more than 100 levels"):
            RunResult(**{**result.__dict__, "result": nested(depth)}).to_json()
    with pytest.raises(MalformedFrame, match="refusing to send") as info:
        frames.encode(frames.Response("r2", nested(5000)))  # built by hand: still no traceback
    assert info.value.frame_id == "r2"
    brackets = frames.encode(frames.Stream("s", {"line": "[" * 10_000}))
    assert frames.decode(brackets) == frames.Stream("s", {"line": "[" * 10_000})
