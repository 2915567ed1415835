"""The wire: JSON frames on a websocket, an RPC channel over them, the protocol version."""

from swamp.protocol.frames import MAX_FRAME_BYTES, PROTOCOL_VERSION

__all__ = ["MAX_FRAME_BYTES", "PROTOCOL_VERSION"]
