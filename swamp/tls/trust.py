"""What a client trusts for ``wss://`` and ``https://``, and how a worker with only a pin
gets the CA it names.

Three kinds of trust:

- the system's roots (a publicly trusted certificate): names are checked;
- ``--ca-cert FILE``: that CA instead of the system's roots, names checked;
- an orchestrator's own CA (``serve --tls auto``), checked against its pin: any chain rooted
  in it is accepted, whatever name the worker used to reach it. That CA signs for one
  orchestrator only, and machines often reach it by an address it could not know (NAT, a
  load balancer, a changed IP).

With a pin and no CA file, the worker asks the orchestrator for its CA certificate (public,
``GET /tls/ca.pem``) over a connection it does not yet trust, checks that certificate's pin,
and only then connects, verifying the chain against it. A server that is not the orchestrator
can send the real CA certificate but cannot complete a handshake it verifies.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import trio

from swamp.domain.text import printable
from swamp.errors import PeerError, PinMismatch, UserError
from swamp.tls.certificates import CertificateError, is_pin, pem, pem_blocks, pin

CA_PATH = "/tls/ca.pem"
MAX_CA_BYTES = 64 * 1024
FETCH_TIMEOUT = 10.0


def check_pin(text: str, *, what: str = "--ca-pin (SWAMP_CA_PIN)") -> str:
    text = text.strip()
    if not is_pin(text):
        raise UserError(
            f"invalid {what} {printable(text[:80])!r}: expected sha256: and 64 lowercase hex "
            "digits, as 'swamp serve --tls auto' and 'swamp worker token create' print it"
        )
    return text


def _one_certificate(text: str) -> bytes:
    """The DER of the one ``BEGIN CERTIFICATE`` block in a PEM text (well formed, or
    CertificateError)."""
    blocks = pem_blocks(text, "CERTIFICATE")
    if len(blocks) != 1:
        raise CertificateError(f"expected one certificate, found {len(blocks)}")
    pin(blocks[0])  # one well-formed DER element, or CertificateError
    return blocks[0]


def only_certificate(text: str) -> str:
    """The one certificate in a PEM text, written again as exactly that certificate.

    What a pin proved is what a context trusts: OpenSSL reads more than ``BEGIN CERTIFICATE``
    blocks (``BEGIN X509 CERTIFICATE`` too, and text around them), so the text a pin was
    checked against is never handed to it as it came, only the one certificate in it."""
    return pem("CERTIFICATE", _one_certificate(text))


def pem_pin(text: str) -> str:
    """The pin of the one certificate in a PEM text."""
    return pin(_one_certificate(text))


def pinned_file(path: Path, expected: str) -> str:
    """The CA certificate in ``path`` (``--ca-cert``), if its pin is ``expected``."""
    try:
        certificate = _one_certificate(Path(path).read_text())
        found = pin(certificate)
    except OSError as exc:
        raise UserError(f"cannot read --ca-cert {path}: {exc.strerror}") from None
    except (CertificateError, ValueError) as exc:
        raise UserError(f"--ca-cert {path} is not a CA certificate: {exc}") from None
    if found != expected:
        raise PinMismatch(
            f"--ca-cert {path} is not the CA --ca-pin names (it is {found}, the pin says "
            f"{expected})"
        )
    return pem("CERTIFICATE", certificate)


def client_context(*, ca_file: Path | None = None, ca_pem: str | None = None) -> ssl.SSLContext:
    """A client context: the orchestrator's own CA (``ca_pem``, pinned: names unchecked), a CA
    file (names checked), or the system's roots."""
    try:
        if ca_pem is not None:
            # exactly the one certificate a pin proved, never what else the text holds
            context = ssl.create_default_context(cadata=only_certificate(ca_pem))
            context.check_hostname = False  # the pin, not a name, says who it is
            context.verify_mode = ssl.CERT_REQUIRED
            return context
        return ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    except (ssl.SSLError, OSError, CertificateError) as exc:
        raise UserError(f"cannot load --ca-cert {ca_file or 'CA'}: {exc}") from None


def _unverified() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


async def fetch_ca(host: str, port: int) -> str:
    """``GET /tls/ca.pem`` from the orchestrator at ``host:port``, not yet trusting it: the
    answer is only a candidate, bounded and checked against a pin by the caller."""
    where = f"{host}:{port}"
    try:
        with trio.fail_after(FETCH_TIMEOUT):
            stream = await trio.open_tcp_stream(host, port)
            tls = trio.SSLStream(stream, _unverified(), server_hostname=host, https_compatible=True)
            async with tls:
                name = f"[{host}]" if ":" in host else host
                request = (
                    f"GET {CA_PATH} HTTP/1.1\r\nHost: {name}:{port}\r\nConnection: close\r\n\r\n"
                )
                await tls.send_all(request.encode("ascii"))
                received = bytearray()
                while len(received) <= MAX_CA_BYTES:
                    chunk = await tls.receive_some(16384)
                    if not chunk:
                        break
                    received += chunk
    except trio.TooSlowError:
        raise PeerError(f"asking {where} for its CA timed out") from None
    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        raise PeerError(f"cannot ask {where} for its CA: {exc.__cause__ or exc}") from None
    if len(received) > MAX_CA_BYTES:
        raise PeerError(f"{where} answered {CA_PATH} with more than {MAX_CA_BYTES} bytes")
    head, _, body = bytes(received).partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split()
    code = printable(status[1].decode("latin-1")) if len(status) > 1 else "no status"
    if code not in ("200", "404"):  # busy, or a proxy in the way: ask again later
        raise PeerError(f"{where} answered {CA_PATH} with HTTP {code}")
    if code == "404":
        raise PinMismatch(
            f"{where} has no CA of its own to check --ca-pin against ({CA_PATH}: {code}): "
            "is it 'swamp serve --tls auto'?"
        )
    return body.decode("ascii", "replace")


async def pinned_ca(host: str, port: int, expected: str) -> str:
    """The orchestrator's CA certificate (PEM), proven by ``expected``, its pin."""
    text = await fetch_ca(host, port)
    try:
        certificate = _one_certificate(text)
        found = pin(certificate)
    except (CertificateError, ValueError) as exc:
        raise PinMismatch(f"{host}:{port} sent no usable CA certificate ({exc})") from None
    if found != expected:
        raise PinMismatch(
            f"the orchestrator at {host}:{port} presents a CA whose pin is {found}, not "
            f"{expected} (--ca-pin / SWAMP_CA_PIN): refusing to connect"
        )
    return pem("CERTIFICATE", certificate)
