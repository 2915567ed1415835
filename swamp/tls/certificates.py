"""The orchestrator's own certificate authority, as bytes: a CA certificate, a server
certificate it signs for a list of names, their keys, and the pin that names the CA.

A **pin** is ``sha256:<hex>`` of the CA certificate's SubjectPublicKeyInfo (the idea of
kubeadm's discovery hash): short enough to pass in an environment variable, and enough for a
worker to trust exactly the chains this CA signs, with nothing else to distribute.

Pure functions: keys and times come in as arguments; nothing here touches a file.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from swamp.tls import der, p256

ECDSA_WITH_SHA256 = "1.2.840.10045.4.3.2"
EC_PUBLIC_KEY = "1.2.840.10045.2.1"
PRIME256V1 = "1.2.840.10045.3.1.7"
COMMON_NAME = "2.5.4.3"
ORGANIZATION = "2.5.4.10"
SUBJECT_KEY_ID = "2.5.29.14"
KEY_USAGE = "2.5.29.15"
SUBJECT_ALT_NAME = "2.5.29.17"
BASIC_CONSTRAINTS = "2.5.29.19"
AUTHORITY_KEY_ID = "2.5.29.35"
EXTENDED_KEY_USAGE = "2.5.29.37"
SERVER_AUTH = "1.3.6.1.5.5.7.3.1"

CA_LIFETIME = timedelta(days=3650)
SERVER_LIFETIME = timedelta(days=397)  # the longest a public CA may issue: what clients expect
BACKDATE = timedelta(hours=1)  # a machine whose clock is a little behind still accepts it

_PIN = re.compile(r"sha256:[0-9a-f]{64}")
_PEM = re.compile(
    r"-----BEGIN (?P<label>[A-Z ]+)-----\s*(?P<body>[A-Za-z0-9+/=\s]+?)\s*-----END (?P=label)-----"
)


class CertificateError(ValueError):
    """A certificate or key that cannot be read."""


@dataclass(frozen=True)
class Issued:
    """A certificate and the private key of the public key it certifies."""

    certificate: bytes  # DER
    private_key: int

    def certificate_pem(self) -> str:
        return pem("CERTIFICATE", self.certificate)

    def key_pem(self) -> str:
        return pem("PRIVATE KEY", private_key_info(self.private_key))


def pem(label: str, data: bytes) -> str:
    body = base64.b64encode(data).decode()
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    return f"-----BEGIN {label}-----\n" + "\n".join(lines) + f"\n-----END {label}-----\n"


def pem_blocks(text: str, label: str) -> list[bytes]:
    """Every ``label`` block in ``text``, decoded."""
    try:
        return [
            base64.b64decode(m["body"], validate=False)
            for m in _PEM.finditer(text)
            if m["label"] == label
        ]
    except ValueError as exc:
        raise CertificateError(f"a {label} block is not valid base64") from exc


def is_pin(text: str) -> bool:
    return _PIN.fullmatch(text) is not None


def _algorithm(dotted: str, parameter: bytes = b"") -> bytes:
    return der.sequence(der.oid(dotted), parameter)


def _name(common_name: str) -> bytes:
    return der.sequence(
        der.set_of(der.sequence(der.oid(ORGANIZATION), der.utf8_string("swamp"))),
        der.set_of(der.sequence(der.oid(COMMON_NAME), der.utf8_string(common_name))),
    )


def subject_public_key_info(public: tuple[int, int]) -> bytes:
    return der.sequence(
        _algorithm(EC_PUBLIC_KEY, der.oid(PRIME256V1)), der.bit_string(p256.encode_point(public))
    )


def private_key_info(private: int) -> bytes:
    """PKCS #8 (``BEGIN PRIVATE KEY``), which OpenSSL and so Python's ``ssl`` load."""
    inner = der.sequence(
        der.integer(1),
        der.octet_string(private.to_bytes(32, "big")),
        der.explicit(1, der.bit_string(p256.encode_point(p256.public_key(private)))),
    )
    return der.sequence(
        der.integer(0), _algorithm(EC_PUBLIC_KEY, der.oid(PRIME256V1)), der.octet_string(inner)
    )


def read_private_key(text: str) -> int:
    """The P-256 key in a PEM written by :meth:`Issued.key_pem`."""
    blocks = pem_blocks(text, "PRIVATE KEY")
    if len(blocks) != 1:
        raise CertificateError("expected one PRIVATE KEY block")
    try:
        version, algorithm, inner = der.elements(der.only(blocks[0], 0x30))
        if der.elements(algorithm[1])[1][2] != der.oid(PRIME256V1):
            raise CertificateError("not a P-256 key")
        fields = der.elements(der.only(inner[1], 0x30))
        private = int.from_bytes(fields[1][1], "big")
    except (der.DerError, IndexError, ValueError) as exc:
        raise CertificateError(f"not a private key this CA wrote: {exc}") from None
    if not 1 <= private < p256.N:
        raise CertificateError("the private key is out of range")
    return private


def _key_id(public: tuple[int, int]) -> bytes:
    """RFC 5280's method 1 (SHA-1 of the key's bits): an identifier, not a security measure."""
    return hashlib.sha1(p256.encode_point(public), usedforsecurity=False).digest()


def _extension(dotted: str, value: bytes, *, critical: bool = False) -> bytes:
    flag = der.boolean(True) if critical else b""
    return der.sequence(der.oid(dotted), flag, der.octet_string(value))


def _alt_names(names: list[str]) -> bytes:
    general = []
    for name in names:
        try:
            address = ipaddress.ip_address(name.strip("[]"))
        except ValueError:
            general.append(der.implicit(2, name.encode("ascii")))  # dNSName
        else:
            general.append(der.implicit(7, address.packed))  # iPAddress
    return der.sequence(*general)


def _serial() -> int:
    return secrets.randbits(127) | 1 << 126  # positive, 16 bytes, never zero


def _certificate(
    *,
    subject: str,
    issuer: str,
    public: tuple[int, int],
    signer: int,
    signer_public: tuple[int, int],
    now: datetime,
    lifetime: timedelta,
    extensions: list[bytes],
) -> bytes:
    extensions = [
        *extensions,
        _extension(SUBJECT_KEY_ID, der.octet_string(_key_id(public))),
        _extension(AUTHORITY_KEY_ID, der.sequence(der.implicit(0, _key_id(signer_public)))),
    ]
    tbs = der.sequence(
        der.explicit(0, der.integer(2)),  # v3
        der.integer(_serial()),
        _algorithm(ECDSA_WITH_SHA256),
        _name(issuer),
        der.sequence(der.time(now - BACKDATE), der.time(now + lifetime)),
        _name(subject),
        subject_public_key_info(public),
        der.explicit(3, der.sequence(*extensions)),
    )
    r, s = p256.sign(signer, tbs)
    signature = der.sequence(der.integer(r), der.integer(s))
    return der.sequence(tbs, _algorithm(ECDSA_WITH_SHA256), der.bit_string(signature))


def authority(*, name: str, now: datetime, private_key: int | None = None) -> Issued:
    """A self-signed CA that may sign server certificates (and no further CA)."""
    private = private_key or p256.new_private_key()
    public = p256.public_key(private)
    extensions = [
        _extension(
            BASIC_CONSTRAINTS, der.sequence(der.boolean(True), der.integer(0)), critical=True
        ),
        _extension(KEY_USAGE, der.bit_string(b"\x06", 1), critical=True),  # keyCertSign, cRLSign
    ]
    certificate = _certificate(
        subject=name,
        issuer=name,
        public=public,
        signer=private,
        signer_public=public,
        now=now,
        lifetime=CA_LIFETIME,
        extensions=extensions,
    )
    return Issued(certificate, private)


def server(
    *, ca: Issued, ca_name: str, names: list[str], now: datetime, private_key: int | None = None
) -> Issued:
    """A certificate for a server reachable at ``names`` (host names and addresses)."""
    if not names:
        raise ValueError("a server certificate needs at least one name")
    private = private_key or p256.new_private_key()
    extensions = [
        _extension(BASIC_CONSTRAINTS, der.sequence(), critical=True),  # not a CA
        _extension(KEY_USAGE, der.bit_string(b"\x80", 7), critical=True),  # digitalSignature
        _extension(EXTENDED_KEY_USAGE, der.sequence(der.oid(SERVER_AUTH))),
        _extension(SUBJECT_ALT_NAME, _alt_names(names)),
    ]
    certificate = _certificate(
        subject=names[0],
        issuer=ca_name,
        public=p256.public_key(private),
        signer=ca.private_key,
        signer_public=p256.public_key(ca.private_key),
        now=now,
        lifetime=SERVER_LIFETIME,
        extensions=extensions,
    )
    return Issued(certificate, private)


def _tbs_fields(certificate: bytes) -> list[tuple[int, bytes, bytes]]:
    try:
        tbs = der.elements(der.only(certificate, 0x30))[0]
        fields = der.elements(tbs[1])
    except (der.DerError, IndexError) as exc:
        raise CertificateError(f"not an X.509 certificate: {exc}") from None
    if fields and fields[0][0] == 0xA0:  # the optional [0] version
        fields = fields[1:]
    if len(fields) < 6:
        raise CertificateError("not an X.509 certificate: too few fields")
    return fields


def spki(certificate: bytes) -> bytes:
    """The SubjectPublicKeyInfo of a DER certificate, exactly as encoded in it."""
    return _tbs_fields(certificate)[5][2]


def pin(certificate: bytes) -> str:
    return "sha256:" + hashlib.sha256(spki(certificate)).hexdigest()


def alt_names(certificate: bytes) -> list[str]:
    """The DNS names and addresses of a certificate's subjectAltName, in order."""
    fields = _tbs_fields(certificate)
    extensions = [f for f in fields[6:] if f[0] == 0xA3]
    if not extensions:
        return []
    names: list[str] = []
    try:
        for _, content, _ in der.elements(der.only(extensions[0][1], 0x30)):
            parts = der.elements(content)
            if parts[0][2] != der.oid(SUBJECT_ALT_NAME):
                continue
            for tag, value, _ in der.elements(der.only(parts[-1][1], 0x30)):
                if tag == 0x82:
                    names.append(value.decode("ascii"))
                elif tag == 0x87:
                    names.append(str(ipaddress.ip_address(value)))
    except (der.DerError, IndexError, ValueError) as exc:
        raise CertificateError(f"unreadable subjectAltName: {exc}") from None
    return names


def not_after(certificate: bytes) -> datetime:
    """When a DER certificate expires."""
    validity = _tbs_fields(certificate)[3]
    try:
        tag, text, _ = der.elements(validity[1])[1]
        form = "%y%m%d%H%M%SZ" if tag == 0x17 else "%Y%m%d%H%M%SZ"
        moment = datetime.strptime(text.decode("ascii"), form)
    except (der.DerError, IndexError, ValueError) as exc:
        raise CertificateError(f"unreadable validity: {exc}") from None
    return moment.replace(tzinfo=timezone.utc)


def public_point(certificate: bytes) -> tuple[int, int]:
    """The P-256 public key a DER certificate certifies."""
    try:
        algorithm, key = der.elements(der.only(spki(certificate), 0x30))
        point = key[1][1:]  # past the BIT STRING's unused-bits octet
    except (der.DerError, ValueError) as exc:
        raise CertificateError(f"unreadable public key: {exc}") from None
    if algorithm[2] != _algorithm(EC_PUBLIC_KEY, der.oid(PRIME256V1)) or len(point) != 65:
        raise CertificateError("not a P-256 public key")
    public = int.from_bytes(point[1:33], "big"), int.from_bytes(point[33:], "big")
    if point[0] != 4 or not p256.on_curve(public):
        raise CertificateError("not a P-256 public key")
    return public


def signed_by(certificate: bytes, issuer: bytes) -> bool:
    """Did the key of the certificate ``issuer`` sign ``certificate`` (ECDSA with SHA-256)?"""
    try:
        tbs, algorithm, signature = der.elements(der.only(certificate, 0x30))
        if algorithm[2] != _algorithm(ECDSA_WITH_SHA256) or signature[0] != 0x03:
            return False
        r, s = der.elements(der.only(signature[1][1:], 0x30))
        values = int.from_bytes(r[1], "big"), int.from_bytes(s[1], "big")
    except (der.DerError, ValueError):
        return False
    return p256.verify(public_point(issuer), tbs[2], values)
