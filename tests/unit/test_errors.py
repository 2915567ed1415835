"""One class per code: every code survives the wire as its class and its exit status."""

import json

import pytest
import trio

# importing the whole package makes sure no module defines a stray code of its own
import swamp.cli
import swamp.errors as errors
import swamp.orchestrator.server
import swamp.worker.agent  # noqa: F401
from swamp.errors import (
    BY_CODE,
    PeerError,
    Rejected,
    SwampError,
    UserError,
    from_wire,
)
from swamp.protocol.rpc import RpcChannel
from tests.unit.test_rpc import pair

CODES = sorted(BY_CODE)


def test_the_table_is_the_classes():
    classes = [
        v for v in vars(errors).values() if isinstance(v, type) and issubclass(v, SwampError)
    ]
    assert {cls.code for cls in classes} == set(BY_CODE)
    assert all(BY_CODE[cls.code] is cls for cls in classes)
    assert len(CODES) > 30


def test_a_second_class_cannot_take_a_code():
    with pytest.raises(TypeError, match="taken"):
        type("Another", (UserError,), {"code": "invalid_input"})


@pytest.mark.parametrize("code", CODES)
def test_every_code_round_trips_with_its_class_and_exit_status(code):
    cls = BY_CODE[code]
    original = cls("something went wrong")
    back = from_wire(json.loads(json.dumps(original.to_wire())))
    assert type(back) is cls
    assert back.code == code and back.message == "something went wrong"
    assert back.exit_status == original.exit_status == (2 if issubclass(cls, UserError) else 1)


@pytest.mark.parametrize("code", CODES)
async def test_every_code_crosses_a_real_channel(code, nursery):
    async def handler(call):
        raise BY_CODE[call.params["code"]]("from the peer")

    a, b = pair()
    client, server = RpcChannel(a, handler), RpcChannel(b, handler)
    await nursery.start(client.serve)
    await nursery.start(server.serve)
    with pytest.raises(SwampError) as info:
        with trio.fail_after(5):
            await client.call("fail", {"code": code})
    assert type(info.value) is BY_CODE[code] and info.value.message == "from the peer"


def test_unknown_codes_and_malformed_errors_stay_readable():
    newer = from_wire({"code": "from_the_future", "message": "m"})
    assert isinstance(newer, PeerError) and newer.code == "from_the_future"
    for bad in (None, "x", {"code": 5}, {}, {"message": None}):
        assert isinstance(from_wire(bad), SwampError)


def test_what_stops_a_worker_is_the_rejected_branch():
    stops = {c for c, cls in BY_CODE.items() if issubclass(cls, Rejected)}
    assert {
        "token_invalid",
        "token_revoked",
        "label_pinned",
        "protocol_mismatch",
        "allowance_exhausted",
        "malformed_token",
    } <= stops
    assert "already_connected" not in stops and "busy" not in stops
