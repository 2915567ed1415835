"""Who may talk to the orchestrator's port at all: browsers are not clients.

The CLI and workers never send an ``Origin`` header; every browser does, on every websocket
upgrade and on every cross-origin request. So a request that carries one is refused unless
``serve --allow-origin`` names that origin — otherwise any web page the operator visits could
open a websocket to ``ws://127.0.0.1:7420`` and run commands.

The ``Host`` header guards against DNS rebinding: a page at ``evil.example`` whose name is
re-pointed at 127.0.0.1 becomes same-origin with the orchestrator (and same-origin GETs carry no
``Origin``). On a loopback bind — where being reachable only from this machine *is* the
protection — the host must be ``localhost``, an IP literal, or a name from
``serve --trusted-host``. Off loopback every admin frame is authenticated anyway, so any host is
accepted there unless ``--trusted-host`` names the only ones to accept.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from swamp.errors import UserError


def normalize_origin(text: str) -> str:
    """``scheme://host[:port]``, lowercased, default ports dropped; ``UserError`` if it is not."""
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError:
        raise UserError(f"invalid --allow-origin {text!r}: expected scheme://host[:port]") from None
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or parts.username
    ):
        raise UserError(
            f"invalid --allow-origin {text!r}: expected http(s)://host[:port], "
            "e.g. https://ops.example.com"
        )
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    default = {"http": 80, "https": 443}[parts.scheme]
    return f"{parts.scheme}://{host}" + (f":{port}" if port and port != default else "")


PAGES = "/ui"  # the web pages' prefix (swamp.ui): browsers are their clients


def is_page(path: str) -> bool:
    """Whether ``path`` is one of the web pages (``/ui``, ``/ui/…``), which browsers may ask
    for under :meth:`RequestPolicy.page_refusal` rather than :meth:`RequestPolicy.refusal`."""
    return path == PAGES or path.startswith(PAGES + "/")


def host_name(header: str) -> str | None:
    """The host of a ``Host`` header (``name``, ``name:port``, ``[v6]:port``), lowercased."""
    header = header.strip().lower()
    if header.startswith("["):
        end = header.find("]")
        return header[1:end] if end > 0 else None
    name, _, port = header.partition(":")
    if port and not port.isdigit():
        return None
    return name or None


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class RequestPolicy:
    loopback: bool  # the orchestrator is bound to a loopback address
    allowed_origins: frozenset[str] = frozenset()
    trusted_hosts: frozenset[str] = frozenset()
    bind_host: str = ""

    @classmethod
    def build(
        cls,
        *,
        loopback: bool,
        bind_host: str = "",
        allow_origins: Iterable[str] = (),
        trusted_hosts: Iterable[str] = (),
    ) -> RequestPolicy:
        hosts = set()
        for host in trusted_hosts:
            name = host.strip().lower()
            if not name or any(c in name for c in "/ :@") and not _is_ip(name.strip("[]")):
                raise UserError(
                    f"invalid --trusted-host {host!r}: expected a host name such as "
                    "orchestrator.internal"
                )
            hosts.add(name.strip("[]"))
        return cls(
            loopback,
            frozenset(normalize_origin(o) for o in allow_origins),
            frozenset(hosts),
            bind_host.lower().strip("[]"),
        )

    def refusal(self, headers: Mapping[str, str]) -> str | None:
        """Why this request must be refused (a one-line reason), or ``None`` to let it in.

        ``headers`` maps lowercase header names to their (first) values.
        """
        origin = headers.get("origin")
        if origin is not None:
            try:
                normalized = normalize_origin(origin)
            except UserError:
                normalized = None
            if normalized not in self.allowed_origins:
                return (
                    f"requests from web pages (Origin {origin[:100]!r}) are refused: browsers "
                    "are not clients of this orchestrator (serve --allow-origin admits one)"
                )
        return self._host_refusal(headers)

    def page_refusal(self, headers: Mapping[str, str]) -> str | None:
        """Why a request for the web pages (``/ui/``) must be refused, or ``None``.

        Browsers *are* the clients of the pages, so an ``Origin`` is no reason to refuse —
        provided it is the page's own (what the browser sends on a same-origin request) or
        one ``serve --allow-origin`` names: a page elsewhere gets nothing. The Host check
        (DNS rebinding) is the same as for every request. Whether a POST may act is
        :meth:`same_origin`'s question, asked again by the pages with the CSRF token."""
        origin = headers.get("origin")
        if origin is not None and not self._own_origin(origin, headers):
            return (
                f"requests from another web page (Origin {origin[:100]!r}) are refused: the "
                "pages answer only their own origin"
            )
        return self._host_refusal(headers)

    def same_origin(self, headers: Mapping[str, str]) -> bool:
        """Whether a state-changing request (a POST) comes from the pages themselves: its
        ``Origin`` — or, from a browser that sends none, its ``Referer`` — names this
        orchestrator as the request's ``Host`` does. Neither header: not a browser's form,
        refused all the same (the pages' forms always send one)."""
        origin = headers.get("origin")
        if origin is None:
            referer = headers.get("referer")
            if referer is None:
                return False
            try:
                parts = urlsplit(referer)
            except ValueError:
                return False
            origin = f"{parts.scheme}://{parts.netloc}"
        return self._own_origin(origin, headers)

    def _own_origin(self, origin: str, headers: Mapping[str, str]) -> bool:
        """``origin`` is the one the request's ``Host`` names (or an allowed one). Either
        scheme: one port speaks one (the listener turns the other away at its first byte)."""
        try:
            normalized = normalize_origin(origin)
        except UserError:
            return False
        if normalized in self.allowed_origins:
            return True
        host = headers.get("host")
        if host is None:
            return False
        for scheme in ("http", "https"):
            try:
                if normalized == normalize_origin(f"{scheme}://{host.strip()}"):
                    return True
            except UserError:
                return False
        return False

    def _host_refusal(self, headers: Mapping[str, str]) -> str | None:
        host = headers.get("host")
        if host is not None:
            name = host_name(host)
            if name is None:
                return f"malformed Host header {host[:100]!r}"
            if not self._host_allowed(name):
                return (
                    f"Host {name[:100]!r} is not this orchestrator's name (DNS rebinding "
                    "guard): connect by IP or localhost, or start serve with "
                    f"--trusted-host {name[:100]}"
                )
        return None

    def _host_allowed(self, name: str) -> bool:
        if name in self.trusted_hosts or name == "localhost" or _is_ip(name):
            return True
        if name == self.bind_host:
            return True
        # Off loopback, authentication guards every admin frame; the host is only checked when
        # the operator listed the names to accept.
        return not self.loopback and not self.trusted_hosts
