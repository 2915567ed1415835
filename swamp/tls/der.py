"""Just enough DER (X.690) to write an X.509 certificate and read one apart.

Writing: each function returns one encoded element (tag, length, content). Reading:
:func:`elements` splits a run of encoded elements, refusing anything malformed with
:class:`DerError`, never reading past its input.
"""

from __future__ import annotations

from datetime import datetime, timezone


class DerError(ValueError):
    """Bytes that are not the DER they should be."""


def _length(size: int) -> bytes:
    if size < 0x80:
        return bytes([size])
    raw = size.to_bytes((size.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(raw)]) + raw


def element(tag: int, content: bytes) -> bytes:
    return bytes([tag]) + _length(len(content)) + content


def sequence(*items: bytes) -> bytes:
    return element(0x30, b"".join(items))


def set_of(*items: bytes) -> bytes:
    return element(0x31, b"".join(sorted(items)))  # DER: a SET OF is sorted


def integer(value: int) -> bytes:
    if value < 0:
        raise ValueError("negative integers are not needed here")
    raw = value.to_bytes(value.bit_length() // 8 + 1, "big")  # one leading 0 keeps it positive
    return element(0x02, raw)


def boolean(value: bool) -> bytes:
    return element(0x01, b"\xff" if value else b"\x00")


def null() -> bytes:
    return b"\x05\x00"


def octet_string(data: bytes) -> bytes:
    return element(0x04, data)


def bit_string(data: bytes, unused_bits: int = 0) -> bytes:
    return element(0x03, bytes([unused_bits]) + data)


def utf8_string(text: str) -> bytes:
    return element(0x0C, text.encode())


def oid(dotted: str) -> bytes:
    parts = [int(p) for p in dotted.split(".")]
    body = bytearray([40 * parts[0] + parts[1]])
    for part in parts[2:]:
        chunk = [part & 0x7F]
        part >>= 7
        while part:
            chunk.append(0x80 | (part & 0x7F))
            part >>= 7
        body.extend(reversed(chunk))
    return element(0x06, bytes(body))


def time(moment: datetime) -> bytes:
    """UTCTime before 2050, GeneralizedTime from then on (RFC 5280, 4.1.2.5)."""
    moment = moment.astimezone(timezone.utc)
    if moment.year < 2050:
        return element(0x17, moment.strftime("%y%m%d%H%M%SZ").encode())
    return element(0x18, moment.strftime("%Y%m%d%H%M%SZ").encode())


def explicit(number: int, inner: bytes) -> bytes:
    """A context-specific, constructed tag ``[number] EXPLICIT``."""
    return element(0xA0 | number, inner)


def implicit(number: int, content: bytes, *, constructed: bool = False) -> bytes:
    """A context-specific tag ``[number] IMPLICIT`` over raw content."""
    return element((0xA0 if constructed else 0x80) | number, content)


def elements(data: bytes) -> list[tuple[int, bytes, bytes]]:
    """The elements one after another in ``data``: ``(tag, content, whole encoding)``."""
    found = []
    at = 0
    while at < len(data):
        if at + 2 > len(data):
            raise DerError("truncated element")
        tag, first = data[at], data[at + 1]
        if tag & 0x1F == 0x1F:
            raise DerError("multi-byte tags are not expected here")
        head = 2
        if first < 0x80:
            size = first
        else:
            count = first & 0x7F
            if count == 0 or count > 4 or at + 2 + count > len(data):
                raise DerError("bad length")
            size = int.from_bytes(data[at + 2 : at + 2 + count], "big")
            head += count
        end = at + head + size
        if end > len(data):
            raise DerError("element longer than its input")
        found.append((tag, data[at + head : end], data[at:end]))
        at = end
    return found


def only(data: bytes, tag: int) -> bytes:
    """The content of ``data``, which must be exactly one element with ``tag``."""
    items = elements(data)
    if len(items) != 1 or items[0][0] != tag:
        raise DerError(f"expected one element with tag {tag:#x}")
    return items[0][1]
