"""ECDSA over NIST P-256 with SHA-256: a key pair, and signatures with deterministic nonces
(RFC 6979). Only what the orchestrator's own CA needs, in pure Python.

Why here and not a library: the one-file build is pure Python, and Python's ``ssl`` module
verifies certificates but cannot make one. Signing happens only when ``swamp serve --tls auto``
issues a certificate (at start, on the operator's machine), never in answer to a peer, so the
arithmetic's timing is not observable from the network. Everything signed here is verified by
OpenSSL on the other end (and in the tests), so a mistake fails closed: a refused handshake.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

P = 0xFFFFFFFF00000001000000000000000000000000FFFFFFFFFFFFFFFFFFFFFFFF
A = P - 3
B = 0x5AC635D8AA3A93E7B3EBBD55769886BC651D06B0CC53B0F63BCE3C3E27D2604B
N = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551
G = (
    0x6B17D1F2E12C4247F8BCE6E563A440F277037D812DEB33A0F4A13945D898C296,
    0x4FE342E2FE1A7F9B8EE7EB4A7C0F9E162BCE33576B315ECECBB6406837BF51F5,
)

Point = tuple[int, int] | None  # None is the point at infinity


def on_curve(point: Point) -> bool:
    if point is None:
        return False
    x, y = point
    return 0 <= x < P and 0 <= y < P and (y * y - (x * x * x + A * x + B)) % P == 0


def add(p1: Point, p2: Point) -> Point:
    if p1 is None:
        return p2
    if p2 is None:
        return p1
    (x1, y1), (x2, y2) = p1, p2
    if x1 == x2:
        if (y1 + y2) % P == 0:
            return None
        slope = (3 * x1 * x1 + A) * pow(2 * y1, -1, P) % P
    else:
        slope = (y2 - y1) * pow(x2 - x1, -1, P) % P
    x3 = (slope * slope - x1 - x2) % P
    return x3, (slope * (x1 - x3) - y1) % P


def multiply(k: int, point: Point = G) -> Point:
    result: Point = None
    addend = point
    while k:
        if k & 1:
            result = add(result, addend)
        addend = add(addend, addend)
        k >>= 1
    return result


def new_private_key() -> int:
    return secrets.randbelow(N - 1) + 1


def public_key(private: int) -> tuple[int, int]:
    point = multiply(private)
    assert point is not None
    return point


def encode_point(point: tuple[int, int]) -> bytes:
    """The uncompressed form (``04 || X || Y``) a SubjectPublicKeyInfo carries."""
    return b"\x04" + point[0].to_bytes(32, "big") + point[1].to_bytes(32, "big")


def _nonce(private: int, digest: bytes) -> int:
    """RFC 6979, section 3.2, for a 256-bit order and HMAC-SHA256."""
    x = private.to_bytes(32, "big")
    h1 = (int.from_bytes(digest, "big") % N).to_bytes(32, "big")
    v, k = b"\x01" * 32, b"\x00" * 32
    k = hmac.new(k, v + b"\x00" + x + h1, hashlib.sha256).digest()
    v = hmac.new(k, v, hashlib.sha256).digest()
    k = hmac.new(k, v + b"\x01" + x + h1, hashlib.sha256).digest()
    v = hmac.new(k, v, hashlib.sha256).digest()
    while True:
        v = hmac.new(k, v, hashlib.sha256).digest()
        candidate = int.from_bytes(v, "big")
        if 1 <= candidate < N:
            return candidate
        k = hmac.new(k, v + b"\x00", hashlib.sha256).digest()
        v = hmac.new(k, v, hashlib.sha256).digest()


def sign(private: int, message: bytes) -> tuple[int, int]:
    """``(r, s)`` over SHA-256 of ``message``."""
    digest = hashlib.sha256(message).digest()
    e = int.from_bytes(digest, "big")
    k = _nonce(private, digest)
    point = multiply(k)
    assert point is not None
    r = point[0] % N
    s = pow(k, -1, N) * (e + r * private) % N
    if r == 0 or s == 0:  # probability about 2**-256; RFC 6979 would take the next nonce
        raise ArithmeticError("degenerate signature")
    return r, s


def verify(public: tuple[int, int], message: bytes, signature: tuple[int, int]) -> bool:
    r, s = signature
    if not (1 <= r < N and 1 <= s < N) or not on_curve(public):
        return False
    e = int.from_bytes(hashlib.sha256(message).digest(), "big")
    w = pow(s, -1, N)
    point = add(multiply(e * w % N), multiply(r * w % N, public))
    return point is not None and point[0] % N == r
