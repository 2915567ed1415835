"""``swamp serve --tls auto``: the orchestrator's own CA and server certificate, kept under
``.swamp/tls/``.

The CA is made once and kept (its pin is what workers and provisioning files carry, so it
must not change under them); its key is written mode 0600 and never leaves the directory.
The server certificate is issued again when the names asked for change or its end is near,
at start — it costs about 0.1 s. Files are written to a temporary name and renamed, so a crash
leaves either the old set or the new one.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from swamp.errors import UserError
from swamp.tls import certificates, p256
from swamp.tls.certificates import CertificateError, Issued

CA_NAME = "swamp orchestrator CA"
RENEW_BEFORE = timedelta(days=30)


@dataclass(frozen=True)
class ServerTls:
    """What serve needs to speak TLS with its own CA, and what it announces."""

    cert_file: Path
    key_file: Path
    ca_file: Path
    ca_pem: str
    pin: str
    names: tuple[str, ...]
    issued: bool  # a new server certificate was issued at this start


def directory(state_dir: Path) -> Path:
    return Path(state_dir) / "tls"


def host_names() -> list[str]:
    """This machine's names, as far as it knows them without asking a network."""
    names = [socket.gethostname()]
    try:
        fqdn = socket.getfqdn()
    except OSError:
        fqdn = ""
    if fqdn and fqdn not in names and "." in fqdn:
        names.append(fqdn)
    return [n for n in names if n]


def _write_private(path: Path, text: str, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "w") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    os.chmod(tmp, mode)
    tmp.replace(path)


def _check_owner(folder: Path) -> None:
    """The directory must be ours: its owner could put another CA in it (root's chmod would
    not stop them, as it stops any other user's serve)."""
    uid = getattr(os, "geteuid", None)
    owner = folder.stat().st_uid
    if uid is not None and owner != uid():
        raise UserError(
            f"{folder} belongs to another user (uid {owner}), who could replace the CA in it: "
            "serve as that user, or remove the directory to make a new CA (every worker's "
            "--ca-pin then changes)"
        )


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")  # not text at all: no PEM in it, refused below
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror}") from None


def _load_ca(folder: Path) -> Issued | None:
    cert_text, key_text = _read(folder / "ca.pem"), _read(folder / "ca.key")
    if cert_text is None and key_text is None:
        return None
    if cert_text is None or key_text is None:
        missing = "ca.pem" if cert_text is None else "ca.key"
        raise UserError(
            f"{folder} holds half a CA ({missing} is missing): restore it, or remove the "
            "directory to make a new CA (every worker's --ca-pin then changes)"
        )
    try:
        blocks = certificates.pem_blocks(cert_text, "CERTIFICATE")
        if len(blocks) != 1:
            raise CertificateError("expected one CERTIFICATE block")
        ca = Issued(blocks[0], certificates.read_private_key(key_text))
        public = certificates.subject_public_key_info(p256.public_key(ca.private_key))
        if certificates.spki(ca.certificate) != public:
            raise CertificateError("ca.key is not the key of ca.pem")
    except CertificateError as exc:
        raise UserError(f"the CA in {folder} cannot be used: {exc}") from None
    return ca


def ca_pin(state_dir: Path) -> str | None:
    """The pin of the repo's CA, if it has one (made by an earlier ``serve --tls auto``)."""
    text = _read(directory(state_dir) / "ca.pem")
    if text is None:
        return None
    try:
        blocks = certificates.pem_blocks(text, "CERTIFICATE")
        return certificates.pin(blocks[0]) if len(blocks) == 1 else None
    except CertificateError:
        return None


def _current_server(folder: Path, ca: Issued, names: list[str], now: datetime) -> bool:
    """Is the server certificate on disk one this CA signed, for exactly ``names``, with
    more than :data:`RENEW_BEFORE` to run?"""
    cert_text, key_text = _read(folder / "server.pem"), _read(folder / "server.key")
    if cert_text is None or key_text is None:
        return False
    try:
        blocks = certificates.pem_blocks(cert_text, "CERTIFICATE")
        if len(blocks) != 1:
            return False
        certificate = blocks[0]
        key = certificates.read_private_key(key_text)
        return (
            # the pair a crash between the two renames (or a restored half) would split
            certificates.public_point(certificate) == p256.public_key(key)
            and certificates.signed_by(certificate, ca.certificate)
            and set(certificates.alt_names(certificate)) == set(names)
            and certificates.not_after(certificate) - now > RENEW_BEFORE
        )
    except CertificateError:
        return False


def ensure(state_dir: Path, names: list[str], *, now: datetime | None = None) -> ServerTls:
    """The CA (made if missing) and a server certificate for ``names`` (issued if the one on
    disk does not fit)."""
    now = now or datetime.now(timezone.utc)
    folder = directory(state_dir)
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        _check_owner(folder)
        os.chmod(folder, 0o700)
        ca = _load_ca(folder)
        if ca is None:
            ca = certificates.authority(name=CA_NAME, now=now)
            _write_private(folder / "ca.key", ca.key_pem(), 0o600)
            _write_private(folder / "ca.pem", ca.certificate_pem(), 0o644)
        issued = not _current_server(folder, ca, names, now)
        if issued:
            server = certificates.server(ca=ca, ca_name=CA_NAME, names=names, now=now)
            _write_private(folder / "server.key", server.key_pem(), 0o600)
            _write_private(folder / "server.pem", server.certificate_pem(), 0o644)
    except OSError as exc:
        raise UserError(f"cannot keep the TLS files in {folder}: {exc.strerror or exc}") from None
    return ServerTls(
        cert_file=folder / "server.pem",
        key_file=folder / "server.key",
        ca_file=folder / "ca.pem",
        ca_pem=ca.certificate_pem(),
        pin=certificates.pin(ca.certificate),
        names=tuple(names),
        issued=issued,
    )
