"""Whether ``swamp serve`` speaks TLS, and with which certificate: a rule of the bind address
and the flags, decided before anything is opened.

Off loopback a worker token and an admin credential would otherwise cross the network in clear
text, so the default there is the orchestrator's own CA (``auto``); plain text is only ever
what the operator asked for (``--tls off``). On loopback nothing leaves the machine and the
default stays plain, which keeps the local CLI and tests free of certificates.
"""

from __future__ import annotations

import ipaddress
import re

from swamp.domain.text import printable
from swamp.domain.urls import is_loopback
from swamp.errors import UserError

AUTO, CERT, OFF = "auto", "cert", "off"
MODES = (AUTO, OFF)

_DNS_NAME = re.compile(
    r"(?=.{1,253}\Z)[A-Za-z0-9*](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
)


def decide(*, host: str, tls: str | None, has_cert: bool) -> str:
    """``auto`` (our own CA), ``cert`` (``--tls-cert``) or ``off``."""
    if tls is not None and tls not in MODES:
        raise UserError(f"invalid --tls {printable(tls)!r}: expected auto or off")
    if has_cert:
        if tls is not None:
            raise UserError(
                f"--tls {tls} and --tls-cert are two choices of certificate: pass one of them"
            )
        return CERT
    if tls is not None:
        return tls
    return OFF if is_loopback(host) else AUTO


def check_name(name: str) -> str:
    """A ``--tls-name``: a DNS name (a leading ``*.`` allowed) or an IP address."""
    bare = name.strip("[]")
    try:
        return str(ipaddress.ip_address(bare))
    except ValueError:
        pass
    if not _DNS_NAME.fullmatch(name) or "*" in name[1:] or (name[:1] == "*" and name[:2] != "*."):
        raise UserError(
            f"invalid --tls-name {printable(name)!r}: expected a host name "
            "(orchestrator.example, *.example) or an IP address"
        )
    return name.lower()


def certificate_names(*, host: str, hostnames: list[str], extra: list[str]) -> list[str]:
    """What the server certificate names: ``--tls-name`` first (its first is the subject),
    then this host's names, the bind address unless it is a wildcard, and loopback — each once."""
    names: list[str] = []
    for name in [*extra, *hostnames, host, "localhost", "127.0.0.1", "::1"]:
        if not name:
            continue
        try:
            address = ipaddress.ip_address(name.strip("[]"))
        except ValueError:
            name = name.lower()
        else:
            if address.is_unspecified:
                continue
            name = str(address)
        if name not in names:
            names.append(name)
    return names
