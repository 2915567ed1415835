"""Who may send admin frames: the local credential, a server token, or (``--auth none``) anyone.

``swamp serve`` makes a fresh *local credential* each time it starts and writes it to the repo's
``.swamp/serve.json`` (mode 0600, in a 0700 directory): the CLI, run by the repo's owner, picks it
up there, so the operator needs nothing while another local user — or a web page — gets nothing.
Operators elsewhere present a *server token* (``swamp server token create``), stored only as a
hash. Only the hash of the local credential is kept in memory.

Answers are deliberately plain: a missing credential is told it is missing, a wrong one that it
was not accepted — the same words for an unknown name and a wrong secret, so nobody learns which
server tokens exist. Only the holder of the secret learns that it was revoked.

An accepted credential has a scope (``swamp.domain.scopes``): the local credential and
``--auth none`` are ``admin``, a server token has the scope it was minted with. :meth:`authorize`
is the one check of a principal against a verb, for admin frames and HTTP routes alike.

A credential is checked as it comes, awaited (a server token is read from the store; every
caller is a request's or a socket's task). After another process changed the repo, the
principals already admitted are judged all at once, in plain calls over the sockets and
sessions they hold: :meth:`AdminAuth.validity` reads the server tokens once and answers each
from that read.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from swamp.bookkeeping.server_tokens import ServerToken, ServerTokenBook
from swamp.domain.peers import is_peer_credential
from swamp.domain.scopes import Scope, refusal
from swamp.errors import Forbidden, ScopeTooNarrow, SwampError, Unauthorized
from swamp.orchestrator.peers import PEER, Peers

LOCAL = "local"


@dataclass(frozen=True)
class Principal:
    """Who an admin socket acts for: ``local``, ``server-token`` (with its name) or ``anyone``,
    and what it may do. ``minted`` tells one minting of a token name from the next (the
    stored secret's hash), so a name revoked and minted again is another principal."""

    kind: str
    name: str
    scope: Scope = Scope.ADMIN
    minted: str = ""

    def describe(self) -> str:
        return f"server token {self.name!r}" if self.kind == "server-token" else self.kind

    def submitter(self) -> str:
        """Who the queue shares slots between: ``local``, ``token:NAME`` or ``anyone`` (a
        token's name, never its secret)."""
        return f"token:{self.name}" if self.kind == "server-token" else self.kind


def authorize(principal: Principal, verb: str) -> None:
    """Raise ``ScopeTooNarrow`` (naming both scopes) unless ``principal`` may call ``verb``."""
    if principal.scope is Scope.ADMIN:  # every call of an admin socket: nothing to say
        return
    reason = refusal(verb, principal.scope, who=principal.describe())
    if reason is not None:
        raise ScopeTooNarrow(reason)


def new_local_credential() -> str:
    return f"{LOCAL}.{secrets.token_hex(32)}"


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "replace")).digest()


class AdminAuth:
    def __init__(
        self,
        *,
        mode: str,
        server_tokens: ServerTokenBook,
        local_credential: str | None,
        peers: Peers | None = None,
    ) -> None:
        self.mode = mode  # token | none
        self.server_tokens = server_tokens
        self._local = _digest(local_credential) if local_credential else None
        self.peers = peers  # other orchestrators on a shared database present their own

    async def identify(self, authorization: str | None) -> Principal | Unauthorized:
        """The principal of an ``Authorization`` header, or why it is not one (never raises)."""
        scheme, _, presented = (authorization or "").partition(" ")
        presented = presented.strip()
        if scheme.lower() == "bearer" and is_peer_credential(presented):
            if self.peers is None:
                return Unauthorized("the credential was not accepted")
            peer = await self.peers.identify(presented)
            # another orchestrator: it may send the steps it claimed and nothing else (the
            # connection's rule); the narrowest scope besides
            return peer if isinstance(peer, Unauthorized) else Principal(PEER, peer, Scope.METRICS)
        if self.mode == "none":
            return Principal("anyone", "anyone")
        if not authorization:
            return Unauthorized(
                "admin frames need a credential: run the command in the orchestrator's repo "
                "(or pass --repo-dir / set SWAMP_REPO_DIR; its .swamp/ holds the local "
                "credential), or pass a server token with --server-token / SWAMP_SERVER_TOKEN"
            )
        scheme, _, credential = authorization.partition(" ")
        credential = credential.strip()
        if scheme.lower() != "bearer" or not credential:
            return Unauthorized("the Authorization header must be 'Bearer <credential>'")
        if self._local is not None and secrets.compare_digest(_digest(credential), self._local):
            return Principal("local", LOCAL)
        try:
            token = await self.server_tokens.authenticate(credential)
        except SwampError as exc:
            return Unauthorized(exc.message)
        return Principal("server-token", token.name, token.scope, token.secret_hash)

    async def admit(self, scope: dict, verb: str) -> None:
        """Raise unless the HTTP request's credential may call ``verb``: ``Unauthorized``
        (missing or not accepted) or ``ScopeTooNarrow`` — the same check and words as an admin
        frame's (the data plane asks this of its admin routes)."""
        identity = await self.identify(_authorization(scope))
        if isinstance(identity, Unauthorized):
            raise identity
        if identity.kind == PEER:
            raise Forbidden(f"an orchestrator's peer credential cannot call {verb}")
        authorize(identity, verb)

    async def validity(self) -> Callable[[Principal], bool]:
        """The server tokens as they are now (one read), as a check of a principal: is it still
        valid? For the plain calls that close what revoked tokens opened, after the repo
        changed."""
        tokens = {token.name: token for token in await self.server_tokens.all()}
        return lambda principal: still_valid(principal, tokens.get(principal.name))


def still_valid(principal: Principal, token: ServerToken | None) -> bool:
    """Is ``principal`` still accepted, ``token`` being its server token as stored now? One
    revoked (or revoked and minted again under its name, perhaps with another scope) closes
    what it opened; the local credential and ``--auth none`` always hold."""
    if principal.kind != "server-token":
        return True
    return (
        token is not None
        and token.active
        and token.secret_hash == principal.minted
        and token.scope == principal.scope
    )


def _authorization(scope: dict) -> str | None:
    """The request's first ``Authorization`` header (latin-1, as HTTP defines headers)."""
    for name, value in scope.get("headers") or []:
        if name.decode("latin-1").lower() == "authorization":
            return value.decode("latin-1")
    return None
