"""Every message round-trips, and any payload at all decodes or fails with one coded error."""

import dataclasses
import json
import types
import typing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swamp.domain import environment
from swamp.errors import MalformedFrame
from swamp.protocol import messages
from swamp.protocol.messages import (
    DispatchRequest,
    LogLine,
    Message,
    MethodRunRequest,
    decode_event,
)
from tests.profiles import examples

MESSAGES = sorted(
    (
        cls
        for cls in vars(messages).values()
        if isinstance(cls, type) and issubclass(cls, Message) and cls is not Message
    ),
    key=lambda cls: cls.__name__,
)
# Each class writes out its codec the first time it is used; here that is before the first
# example, as a long-running process does at boot, so every example does the same work (a
# first one that also wrote the codec is what a wall-clock deadline catches, then calls flaky).
messages.prepare()

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def strategy_for(hint):
    """Values of the shape a message field declares (its type hint)."""
    origin = typing.get_origin(hint)
    if hint is typing.Any:
        return json_values
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(strategy_for(a) for a in typing.get_args(hint)))
    if hint is type(None):
        return st.none()
    if origin is typing.Literal:
        return st.sampled_from(typing.get_args(hint))
    if hint is str:
        return st.text(max_size=20)
    if hint is bool:
        return st.booleans()
    if hint is int:
        return st.integers(-(2**40), 2**40)
    if hint is float:
        return st.floats(allow_nan=False, allow_infinity=False)
    if hint is dict:
        return st.dictionaries(st.text(max_size=8), json_values, max_size=3)
    if origin is dict:
        return st.dictionaries(
            st.text(max_size=8), strategy_for(typing.get_args(hint)[1]), max_size=3
        )
    if origin is list:
        return st.lists(strategy_for(typing.get_args(hint)[0]), max_size=3)
    if isinstance(hint, type) and issubclass(hint, Message):
        return instances(hint)
    raise AssertionError(f"no strategy for {hint}")


def instances(cls):
    hints = typing.get_type_hints(cls, globalns=vars(messages))
    return st.builds(cls, **{f.name: strategy_for(hints[f.name]) for f in dataclasses.fields(cls)})


def test_there_is_a_message_per_payload():
    names = {cls.__name__ for cls in MESSAGES}
    assert {
        "EnrollRequest",
        "EnrollReply",
        "DispatchRequest",
        "DispatchResult",
        "LogLine",
        "QueryDataRequest",
        "QueryDataReply",
        "RunResult",
        "TokenItem",
        "WorkerListReply",
        "VerifyReport",
    } <= names
    assert set(messages.REQUESTS.values()) <= set(MESSAGES)


@pytest.mark.parametrize("cls", MESSAGES, ids=lambda cls: cls.__name__)
@settings(max_examples=examples(40))
@given(data=st.data())
def test_every_message_round_trips_through_json(cls, data):
    value = data.draw(instances(cls))
    wire = json.loads(json.dumps(value.to_json()))
    assert cls.decode(wire) == value


@pytest.mark.parametrize("cls", MESSAGES, ids=lambda cls: cls.__name__)
@settings(max_examples=examples(60))
@given(payload=json_values)
def test_any_payload_decodes_or_is_one_coded_error(cls, payload):
    try:
        cls.decode(payload)
    except MalformedFrame as exc:
        assert exc.code == "malformed_frame" and exc.message.startswith(cls.__name__)


@pytest.mark.parametrize("cls", MESSAGES, ids=lambda cls: cls.__name__)
@settings(max_examples=examples(60))
@given(data=st.data())
def test_a_valid_payload_with_one_field_broken_names_that_field(cls, data):
    wire = data.draw(instances(cls)).to_json()
    if not wire:
        return
    key = data.draw(st.sampled_from(sorted(wire)))
    broken = dict(wire, **{key: data.draw(json_values)})
    try:
        cls.decode(broken)
    except MalformedFrame as exc:
        assert key in exc.message


def test_errors_name_the_message_and_the_field():
    with pytest.raises(MalformedFrame, match=r"DispatchRequest: 'credential' is missing"):
        DispatchRequest.decode(
            {"dispatchId": "d", "modelType": "t", "modelName": "n", "method": "m"}
        )
    with pytest.raises(
        MalformedFrame,
        match=r"MethodRunRequest.placement.labels.a: expected "
        r"a string",
    ):
        MethodRunRequest.decode({"model": "m", "method": "x", "placement": {"labels": {"a": 1}}})
    with pytest.raises(MalformedFrame, match="takesSlot: expected true or false"):
        DispatchRequest.decode(
            {
                "dispatchId": "d",
                "modelType": "t",
                "modelName": "n",
                "method": "m",
                "credential": "c",
                "takesSlot": "no",
            }
        )


def test_a_dispatch_says_whether_it_takes_a_slot():
    probe = DispatchRequest("d", "swamp/fleet-probe", "probe", "verify", "c", takes_slot=False)
    assert probe.to_json()["takesSlot"] is False
    assert (
        DispatchRequest.decode(
            {
                "dispatchId": "d",
                "modelType": "t",
                "modelName": "n",
                "method": "m",
                "credential": "c",
            }
        ).takes_slot
        is True
    )


def test_a_dispatch_names_its_step_and_attempt_and_an_older_peer_still_decodes():
    again = DispatchRequest("d", "t", "n", "m", "c", step_id="s1", attempt=2)
    wire = again.to_json()
    assert (wire["stepId"], wire["attempt"]) == ("s1", 2)
    assert DispatchRequest.decode(wire) == again
    older = {"dispatchId": "d", "modelType": "t", "modelName": "n", "method": "m"}
    older["credential"] = "c"
    assert DispatchRequest.decode(older).attempt == 1
    assert environment.step_identity("s1", 2) == {"SWAMP_STEP_ID": "s1", "SWAMP_ATTEMPT": "2"}


def test_events_decode_by_kind():
    assert decode_event({"kind": "log", "line": "hi"}) == LogLine("hi")
    for bad in ({"kind": "nope"}, {"line": "x"}, [], {"kind": "log"}, {"kind": "log", "line": 5}):
        with pytest.raises(MalformedFrame):
            decode_event(bad)
