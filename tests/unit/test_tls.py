"""The orchestrator's own CA: ECDSA P-256 against RFC 6979's vector, certificates that
OpenSSL verifies strictly (the command and Python's ssl, both), pins as OpenSSL computes them,
and the rule that decides when serve speaks TLS."""

from __future__ import annotations

import hashlib
import os
import socket
import ssl
import subprocess
import tempfile
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from swamp.domain import tls_mode
from swamp.errors import PinMismatch, UserError
from swamp.tls import authority, certificates, der, p256
from swamp.tls.trust import check_pin, client_context, pem_pin, pinned_file
from tests.external import command

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


def test_signatures_match_rfc6979_p256_sha256_vector():
    private = 0xC9AFA9D845BA75166B5C215767B1D6934E50C3DB36E89B127B8A622B120F6721
    public = p256.public_key(private)
    assert public[0] == 0x60FED4BA255A9D31C961EB74C6356D68C049B8923B61FA6CE669622E60F29FB6
    assert public[1] == 0x7903FE1008B8BC99A41AE9E95628BC64F2F1B20C2D7E9F5177A3C294D4462299
    r, s = p256.sign(private, b"sample")
    assert r == 0xEFD48B2AACB6A8FD1140DD9CD45E81D69D2C877B56AAF991C34D0EA84EAF3716
    assert s == 0xF7CB1C942D657C41D436C7A1B6E29F65F3E900DBB9AFF4064DC4AB2F843ACDA8
    assert p256.verify(public, b"sample", (r, s))
    assert not p256.verify(public, b"sampla", (r, s))
    assert not p256.verify(public, b"sample", (r, (s + 1) % p256.N))


def _issue(names=("orchestrator.example", "10.0.0.5", "::1")):
    ca = certificates.authority(name="test CA", now=NOW)
    server = certificates.server(ca=ca, ca_name="test CA", names=list(names), now=NOW)
    return ca, server


def test_server_certificate_names_dates_and_signature_read_back():
    ca, server = _issue()
    assert certificates.alt_names(server.certificate) == ["orchestrator.example", "10.0.0.5", "::1"]
    assert certificates.not_after(server.certificate) == NOW + certificates.SERVER_LIFETIME
    assert certificates.signed_by(server.certificate, ca.certificate)
    assert certificates.signed_by(ca.certificate, ca.certificate)
    other, _ = _issue()
    assert not certificates.signed_by(server.certificate, other.certificate)
    tampered = server.certificate.replace(b"orchestrator.example", b"orchestrator.exampl3")
    assert not certificates.signed_by(tampered, ca.certificate)
    assert certificates.read_private_key(server.key_pem()) == server.private_key


def test_generalized_time_from_2050():
    assert der.time(datetime(2049, 12, 31, tzinfo=timezone.utc))[0] == 0x17
    assert der.time(datetime(2050, 1, 1, tzinfo=timezone.utc))[0] == 0x18
    ca = certificates.authority(name="late", now=datetime(2045, 1, 1, tzinfo=timezone.utc))
    assert certificates.not_after(ca.certificate).year == 2054


@pytest.mark.parametrize("junk", [b"", b"\x30", b"\x30\x85\xff\xff\xff\xff\xff", b"\x04\x01x"])
def test_unreadable_der_is_an_error_not_a_crash(junk):
    with pytest.raises(certificates.CertificateError):
        certificates.pin(junk)


def test_openssl_verifies_the_chain_strictly_and_computes_the_same_pin(tmp_path):
    openssl = command("openssl")
    ca, server = _issue(["localhost", "127.0.0.1"])
    (tmp_path / "ca.pem").write_text(ca.certificate_pem())
    (tmp_path / "server.pem").write_text(server.certificate_pem())
    at = str(int((NOW + timedelta(days=1)).timestamp()))
    checked = subprocess.run(
        [openssl, "verify", "-x509_strict", "-attime", at,
         "-CAfile", str(tmp_path / "ca.pem"), str(tmp_path / "server.pem")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stderr
    spki = subprocess.run(
        [openssl, "x509", "-in", str(tmp_path / "ca.pem"), "-pubkey", "-noout"],
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    der_key = subprocess.run(
        [openssl, "pkey", "-pubin", "-outform", "der"], input=spki, capture_output=True, check=True
    ).stdout
    assert certificates.pin(ca.certificate) == "sha256:" + hashlib.sha256(der_key).hexdigest()


def _handshake(server_context: ssl.SSLContext, client: ssl.SSLContext, name: str) -> str:
    listener = socket.create_server(("127.0.0.1", 0))
    errors = []

    def serve():
        conn, _ = listener.accept()
        try:
            with server_context.wrap_socket(conn, server_side=True) as tls:
                tls.sendall(b"ok")
        except (ssl.SSLError, OSError) as exc:
            errors.append(exc)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with (
            socket.create_connection(listener.getsockname(), timeout=30) as raw,
            client.wrap_socket(raw, server_hostname=name) as tls,
        ):
            return tls.recv(2).decode()
    finally:
        listener.close()
        thread.join(30)


def test_a_pinned_context_accepts_its_chain_under_any_name_and_refuses_another_ca(tmp_path):
    ca = certificates.authority(name="test CA", now=datetime.now(timezone.utc))
    server = certificates.server(
        ca=ca, ca_name="test CA", names=["localhost"], now=datetime.now(timezone.utc)
    )
    (tmp_path / "s.pem").write_text(server.certificate_pem())
    (tmp_path / "s.key").write_text(server.key_pem())
    serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    serving.load_cert_chain(tmp_path / "s.pem", tmp_path / "s.key")
    pinned = client_context(ca_pem=ca.certificate_pem())
    assert _handshake(serving, pinned, "an-address-it-does-not-name") == "ok"
    (tmp_path / "ca.pem").write_text(ca.certificate_pem())
    named = client_context(ca_file=tmp_path / "ca.pem")  # --ca-cert: names are checked
    with pytest.raises(ssl.SSLCertVerificationError, match="mismatch|not valid"):
        _handshake(serving, named, "an-address-it-does-not-name")
    assert _handshake(serving, named, "localhost") == "ok"
    stranger = certificates.authority(name="test CA", now=datetime.now(timezone.utc))
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(serving, client_context(ca_pem=stranger.certificate_pem()), "localhost")


def test_pins_are_checked_for_shape_and_against_a_ca_file(tmp_path):
    ca, _ = _issue()
    pin = certificates.pin(ca.certificate)
    assert check_pin(f" {pin}\n") == pin
    for bad in ("", "sha256:", pin.upper(), pin[:-1], "sha1:" + pin[7:]):
        with pytest.raises(UserError, match="invalid --ca-pin"):
            check_pin(bad)
    path = tmp_path / "ca.pem"
    path.write_text(ca.certificate_pem())
    assert pem_pin(path.read_text()) == pin
    assert pinned_file(path, pin) == ca.certificate_pem()
    other, _ = _issue()
    with pytest.raises(PinMismatch, match="is not the CA --ca-pin names"):
        pinned_file(path, certificates.pin(other.certificate))


def test_the_ca_is_kept_and_the_server_certificate_follows_the_names(tmp_path):
    first = authority.ensure(tmp_path, ["a.example", "127.0.0.1"], now=NOW)
    assert first.issued and first.pin.startswith("sha256:")
    assert (tmp_path / "tls" / "ca.key").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "tls" / "server.key").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "tls").stat().st_mode & 0o777 == 0o700
    again = authority.ensure(tmp_path, ["127.0.0.1", "a.example"], now=NOW)
    assert not again.issued and again.pin == first.pin  # same names, any order: kept
    renamed = authority.ensure(tmp_path, ["b.example"], now=NOW)
    assert renamed.issued and renamed.pin == first.pin  # new names: a new certificate, same CA
    late = NOW + certificates.SERVER_LIFETIME - authority.RENEW_BEFORE + timedelta(days=1)
    assert authority.ensure(tmp_path, ["b.example"], now=late).issued  # near its end: renewed
    assert authority.ca_pin(tmp_path) == first.pin


def test_half_a_ca_or_a_foreign_key_is_refused_not_replaced(tmp_path):
    authority.ensure(tmp_path, ["a.example"], now=NOW)
    key = tmp_path / "tls" / "ca.key"
    key.write_text(certificates.authority(name="x", now=NOW).key_pem())
    with pytest.raises(UserError, match="ca.key is not the key of ca.pem"):
        authority.ensure(tmp_path, ["a.example"], now=NOW)
    key.unlink()
    with pytest.raises(UserError, match="half a CA"):
        authority.ensure(tmp_path, ["a.example"], now=NOW)


def test_a_server_key_that_is_not_the_certificates_is_issued_again(tmp_path):
    """A crash between the renames of server.key and server.pem leaves a new key beside the
    old certificate: serve issues both again rather than fail to listen at every start."""
    authority.ensure(tmp_path, ["a.example"], now=NOW)
    (tmp_path / "tls" / "server.key").write_text(
        certificates.authority(name="x", now=NOW).key_pem()
    )
    again = authority.ensure(tmp_path, ["a.example"], now=NOW)
    assert again.issued
    ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
        again.cert_file, again.key_file
    )


def test_files_that_are_not_text_are_refused_or_replaced_not_a_crash(tmp_path):
    authority.ensure(tmp_path, ["a.example"], now=NOW)
    (tmp_path / "tls" / "server.pem").write_bytes(b"\xff\xfe\x00junk")
    assert authority.ensure(tmp_path, ["a.example"], now=NOW).issued
    (tmp_path / "tls" / "ca.pem").write_bytes(b"\xff\xfe\x00junk")
    with pytest.raises(UserError, match="cannot be used"):
        authority.ensure(tmp_path, ["a.example"], now=NOW)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root")
def test_a_tls_directory_another_user_owns_is_refused_even_by_root(tmp_path):
    """Root's chmod succeeds on another user's directory, which keeps it theirs: they could
    have put their own CA there (as links, or files)."""
    folder = tmp_path / "tls"
    folder.mkdir()
    os.chown(folder, 65534, 65534)
    with pytest.raises(UserError, match="belongs to another user"):
        authority.ensure(tmp_path, ["a.example"], now=NOW)
    assert not (folder / "ca.key").exists()


@pytest.mark.parametrize(
    ("host", "tls", "has_cert", "mode"),
    [
        ("127.0.0.1", None, False, "off"),
        ("::1", None, False, "off"),
        ("0.0.0.0", None, False, "auto"),
        ("10.0.0.5", None, False, "auto"),
        ("10.0.0.5", "off", False, "off"),
        ("127.0.0.1", "auto", False, "auto"),
        ("10.0.0.5", None, True, "cert"),
    ],
)
def test_tls_mode_rule(host, tls, has_cert, mode):
    assert tls_mode.decide(host=host, tls=tls, has_cert=has_cert) == mode


def test_tls_mode_refuses_two_choices_and_unknown_modes():
    with pytest.raises(UserError, match="two choices"):
        tls_mode.decide(host="10.0.0.5", tls="auto", has_cert=True)
    with pytest.raises(UserError, match="expected auto or off"):
        tls_mode.decide(host="10.0.0.5", tls="on", has_cert=False)


def test_certificate_names():
    names = tls_mode.certificate_names(
        host="0.0.0.0", hostnames=["vm", "vm.lan"], extra=["orch.example", "VM"]
    )
    assert names == ["orch.example", "vm", "vm.lan", "localhost", "127.0.0.1", "::1"]
    assert tls_mode.check_name("[::1]") == "::1"
    assert tls_mode.check_name("*.example") == "*.example"
    for bad in ("a b", "a/b", "ex*ample", "-a", "a..b", ""):
        with pytest.raises(UserError, match="invalid --tls-name"):
            tls_mode.check_name(bad)


def _smuggled(real: certificates.Issued, label: str) -> tuple[str, ssl.SSLContext]:
    """What an impostor on the port can send for /tls/ca.pem knowing only the real CA (it is
    public): the real certificate, whose pin is right, and its own CA in a block OpenSSL also
    reads; and the impostor's server context, a chain rooted in its own CA."""
    now = datetime.now(timezone.utc)
    evil = certificates.authority(name="evil", now=now)
    server = certificates.server(ca=evil, ca_name="evil", names=["impostor"], now=now)
    serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "s.pem").write_text(server.certificate_pem())
        (Path(folder) / "s.key").write_text(server.key_pem())
        serving.load_cert_chain(Path(folder) / "s.pem", Path(folder) / "s.key")
    return real.certificate_pem() + certificates.pem(label, evil.certificate), serving


@pytest.mark.parametrize("label", ["X509 CERTIFICATE", "TRUSTED CERTIFICATE"])
def test_a_pinned_context_trusts_the_pinned_certificate_alone(label):
    real = certificates.authority(name="swamp orchestrator CA", now=datetime.now(timezone.utc))
    body, impostor = _smuggled(real, label)
    assert pem_pin(body) == certificates.pin(real.certificate)  # the pin alone cannot tell
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(impostor, client_context(ca_pem=body), "orchestrator")


async def test_a_worker_with_a_pin_sends_nothing_to_an_impostor_that_smuggles_its_ca():
    import trio

    from swamp.worker.config import WorkerConfig

    real = certificates.authority(name="swamp orchestrator CA", now=datetime.now(timezone.utc))
    body, impostor = _smuggled(real, "X509 CERTIFICATE")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer_ca():
        conn, _ = listener.accept()
        with impostor.wrap_socket(conn, server_side=True) as tls:
            tls.recv(4096)
            payload = body.encode()
            tls.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(payload)
                + payload
            )

    thread = threading.Thread(target=answer_ca, daemon=True)
    thread.start()
    try:
        config = WorkerConfig(
            url=f"wss://127.0.0.1:{port}", token="a.b", ca_pin=certificates.pin(real.certificate)
        )
        context = await config.ssl_context()
    finally:
        await trio.to_thread.run_sync(thread.join, 30)
        listener.close()
    with pytest.raises(ssl.SSLCertVerificationError):
        await trio.to_thread.run_sync(_handshake, impostor, context, "orchestrator")


def test_a_pinned_ca_file_is_carried_as_its_one_certificate(tmp_path):
    real = certificates.authority(name="swamp orchestrator CA", now=datetime.now(timezone.utc))
    body, _ = _smuggled(real, "X509 CERTIFICATE")
    path = tmp_path / "ca.pem"
    path.write_text(body)
    assert pinned_file(path, certificates.pin(real.certificate)) == real.certificate_pem()
