"""URLs as they may be shown: never with credentials in them."""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit, urlunsplit

from swamp.errors import UserError

MAX_ORCHESTRATORS = 16  # URLs in one list
_SEPARATOR = re.compile(r",\s*(?=[a-z][a-z0-9+.-]*://)", re.IGNORECASE)  # before a URL


def url_list(text: str, *, source: str) -> tuple[str, ...]:
    """One URL, or several separated by commas (orchestrators sharing one database: tried in
    turn). A comma separates only before the next URL's ``scheme://`` — one inside a URL (a
    query, a password) stays in it; blanks and stray commas around are ignored, a repeat
    counts once. ``source`` names where the list came from, for the error."""
    parts = _SEPARATOR.split(text)
    urls = tuple(dict.fromkeys(part.strip(" \t,") for part in parts if part.strip(" \t,")))
    if len(urls) > MAX_ORCHESTRATORS:
        raise UserError(f"{source} has {len(urls)} URLs: at most {MAX_ORCHESTRATORS}")
    return urls


def redact(url: str) -> str:
    """``wss://user:secret@host/x?token=…`` → ``wss://host/x`` (user info and query dropped)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    netloc = f"{host}:{port}" if port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address (``127.0.0.0/8``, ``::1``)."""
    host = (host or "").strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def sends_in_clear(url: str) -> bool:
    """Would a secret sent to ``url`` cross a network unencrypted (plain ws/http, not loopback)?"""
    try:
        parts = urlsplit(url)
    except ValueError:
        return True
    return parts.scheme in ("ws", "http") and not is_loopback(parts.hostname or "")


def page_url(server: str, path: str) -> str:
    """The web page at ``path`` (``/ui/…``, with its query) of the orchestrator reached at
    ``server`` (``ws://host:port``, ``wss://…``, or ``http(s)://``): the same host and port,
    the HTTP scheme of the websocket's."""
    parts = urlsplit(server)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port else host
    return f"{scheme}://{netloc}{path}"
