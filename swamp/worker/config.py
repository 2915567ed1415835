"""Everything ``swamp worker connect`` was told, validated once."""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from swamp.domain.urls import redact, sends_in_clear, url_list
from swamp.errors import UserError
from swamp.tls.trust import check_pin, client_context, pinned_ca, pinned_file


def parse_concurrency(text: str | int) -> int:
    """``--concurrency`` / ``SWAMP_WORKER_CONCURRENCY``: a number of slots, or ``auto`` for the
    machine's CPU count (a number out of range is refused later, with the range)."""
    if isinstance(text, int):
        return text
    value = text.strip().lower()
    if value == "auto":
        return max(1, os.cpu_count() or 1)
    try:
        return int(value)
    except ValueError:
        raise UserError(
            f"invalid --concurrency (SWAMP_WORKER_CONCURRENCY) {text!r}: expected a number of "
            "slots from 1 to 1024, or auto (one per CPU)"
        ) from None


def orchestrator_urls(text: str) -> tuple[str, ...]:
    """``SWAMP_ORCHESTRATOR_URL`` / the argument: one URL, or several separated by commas
    (orchestrators sharing one database: the worker connects to one and moves to the next
    when it cannot reach it, or loses it; see :func:`swamp.domain.urls.url_list`)."""
    return url_list(text, source="the orchestrator URL list (argument or SWAMP_ORCHESTRATOR_URL)")


@dataclass(frozen=True)
class WorkerConfig:
    url: str  # the orchestrator connected to now: the first of ``urls``, then each in turn
    token: str = field(repr=False)
    labels: dict[str, str] = field(default_factory=dict)
    cache_dir: Path | None = None
    ca_cert: Path | None = None
    ca_pin: str | None = None  # sha256:<hex> of the orchestrator's own CA (serve --tls auto)
    concurrency: int = 1
    data_plane_url: str | None = None
    connect_timeout: float = 600.0
    json: bool = False
    protocol_version: int | None = None  # None: this build's PROTOCOL_VERSION
    insecure: bool = False  # allow secrets over plain ws:// / http:// to another host
    max_dispatches: int | None = None  # drain after this many dispatches
    idle_timeout: float | None = None  # drain after this long with nothing running
    drain_timeout: float | None = None  # a drain that takes longer is forced
    # asks the token's source for another once the orchestrator refuses this one for good
    # (None: a token given as it is); token_source names it in messages
    token_again: Callable[[], str] | None = field(default=None, repr=False, compare=False)
    token_source: str = "the token"
    # every orchestrator it may connect to, in order (from a comma-separated ``url``)
    urls: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.urls:
            urls = orchestrator_urls(self.url)
            object.__setattr__(self, "urls", urls)
            object.__setattr__(self, "url", urls[0] if urls else "")
        if not self.url:
            raise UserError(
                "missing orchestrator URL: pass it as the first argument or set "
                "SWAMP_ORCHESTRATOR_URL"
            )
        if self.url not in self.urls:  # replace(url=…) by hand: checked as the list's are
            object.__setattr__(self, "urls", (*self.urls, self.url))
        for url in self.urls:
            if not url.startswith(("ws://", "wss://")):
                raise UserError(
                    f"the orchestrator URL (argument or SWAMP_ORCHESTRATOR_URL) must "
                    f"start with ws:// or wss:// (got {redact(url)!r})"
                )
        if not self.token:
            raise UserError(
                "missing enrollment token: pass --token or --token-file, or set "
                "SWAMP_WORKER_TOKEN or SWAMP_WORKER_TOKEN_FILE"
            )
        if not 1 <= self.concurrency <= 1024:
            raise UserError(f"invalid --concurrency {self.concurrency}: expected 1-1024")
        if self.max_dispatches is not None and self.max_dispatches < 1:
            raise UserError(
                f"invalid --max-dispatches (SWAMP_WORKER_MAX_DISPATCHES) {self.max_dispatches}: "
                "expected 1 or more"
            )
        if self.ca_cert and not Path(self.ca_cert).is_file():
            raise UserError(f"--ca-cert {self.ca_cert} does not exist")
        if self.ca_pin is not None:
            check_pin(self.ca_pin)
        if self.data_plane_url and not self.data_plane_url.startswith(("http://", "https://")):
            raise UserError(
                "the data-plane URL (--data-plane-url or SWAMP_DATA_PLANE_URL) must "
                f"start with http:// or https:// (got {redact(self.data_plane_url)!r})"
            )
        for url in self.urls:
            self._check_sends(url)

    def _check_sends(self, url: str) -> None:
        """What goes to ``url``: a pin only over TLS, secrets in clear only when allowed."""
        if self.ca_pin is not None and not url.startswith("wss://"):
            raise UserError(f"--ca-pin (SWAMP_CA_PIN) goes with a wss:// URL (got {redact(url)!r})")
        if not self.insecure:
            for what, where in (
                ("the enrollment token", url),
                ("dispatch credentials", self.data_plane(url)),
            ):
                if sends_in_clear(where):
                    raise UserError(
                        f"refusing to send {what} in clear text to {redact(where)}: use wss:// "
                        "(serve --tls-cert/--tls-key), or pass --insecure (SWAMP_WORKER_INSECURE"
                        "=1) if the network between them is trusted"
                    )

    def next_orchestrator(self) -> WorkerConfig:
        """The same, connecting to the next orchestrator of the list (the first after the
        last); itself with one."""
        if len(self.urls) < 2:
            return self
        at = self.urls.index(self.url) if self.url in self.urls else -1
        return replace(self, url=self.urls[(at + 1) % len(self.urls)])

    def data_plane(self, url: str | None = None) -> str:
        """The HTTP base of the data plane: explicit, or the connect URL's host over HTTP(S)."""
        if self.data_plane_url:
            return self.data_plane_url.rstrip("/")
        parts = urlsplit(url or self.url)
        scheme = "https" if parts.scheme == "wss" else "http"
        return urlunsplit((scheme, parts.netloc, "", "", "")).rstrip("/")

    async def ssl_context(self) -> ssl.SSLContext | None:
        """What this worker trusts for wss:// and https://: with ``--ca-pin``, the
        orchestrator's own CA, proven by its pin (from ``--ca-cert`` if given, else asked of
        the orchestrator at each connect); else ``--ca-cert`` or the system's roots."""
        if not self.url.startswith("wss://"):
            return None
        if self.ca_pin is None:
            return client_context(ca_file=self.ca_cert)
        pin = check_pin(self.ca_pin)
        if self.ca_cert:
            return client_context(ca_pem=pinned_file(self.ca_cert, pin))
        parts = urlsplit(self.url)
        ca_pem = await pinned_ca(parts.hostname or "", parts.port or 443, pin)
        return client_context(ca_pem=ca_pem)


def read_token(token: str | None, token_file: Path | None) -> str:
    """The enrollment token from ``--token`` or from a file (a Kubernetes/Docker secret mount);
    one trailing newline is trimmed. Never echoes the token in an error."""
    if token and token_file:
        raise UserError(
            "pass the token one way: --token/SWAMP_WORKER_TOKEN or "
            "--token-file/SWAMP_WORKER_TOKEN_FILE, not both"
        )
    if token_file is None:
        return (token or "").strip()
    try:
        text = Path(token_file).read_text()
    except OSError as exc:
        raise UserError(
            f"cannot read the token file {token_file} (--token-file or "
            f"SWAMP_WORKER_TOKEN_FILE): {exc.strerror}"
        ) from None
    text = text.removesuffix("\n").removesuffix("\r")
    if not text.strip():
        raise UserError(f"the token file {token_file} is empty")
    return text.strip()
