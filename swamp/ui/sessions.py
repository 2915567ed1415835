"""Login codes and sessions of the web pages: in memory, hashed, bounded, short-lived.

``swamp ui`` asks the running orchestrator for a *login code* (an admin verb: the caller is
already authenticated, and its scope becomes the session's). The code is random, kept only as
its SHA-256, valid for :data:`CODE_SECONDS` and good once: opening the link trades it for a
*session* (a random id in an HttpOnly cookie, also kept only as a hash) with a CSRF token of
its own. A server token typed into the login form opens a session the same way. Sessions end
after :data:`SESSION_SECONDS`, when logged out, when the server token that opened them is
revoked (:meth:`Logins.end_revoked`, as its admin sockets are closed), or with the orchestrator
(nothing is written); past :data:`MAX_SESSIONS` the oldest goes. A session ended before its
time calls ``on_end`` (the live pages end its event streams). Nothing here logs a code, an
id or a token.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from swamp.domain.scopes import Scope
from swamp.errors import Unauthorized

log = logging.getLogger("swamp.ui")
CODE_SECONDS = 60.0  # a login link is good for about a minute
SESSION_SECONDS = 12 * 3600.0  # a working day; then 'swamp ui' again
MAX_CODES = 32  # links issued and not yet used (more: the oldest goes)
MAX_SESSIONS = 256  # sessions at once (more: the oldest of whoever holds the most goes)
MAX_EACH = 16  # sessions, and codes, of one credential (more: its own oldest goes)


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "replace")).digest()


@dataclass(frozen=True)
class Session:
    """Who a browser acts for: the scope and the description of the credential that opened
    it, its CSRF token, and when it ends (the clock's time)."""

    who: str
    scope: Scope
    csrf: str
    expires: float
    # the credential that opened it (an admin principal): revoked, the session ends with it
    holder: Any = field(default=None, compare=False, repr=False)

    @property
    def may_act(self) -> bool:
        return self.scope is Scope.ADMIN

    def csrf_ok(self, token: str | None) -> bool:
        return token is not None and secrets.compare_digest(token.encode(), self.csrf.encode())


@dataclass(frozen=True)
class _Code:
    who: str
    scope: Scope
    expires: float
    holder: Any = None


class Logins:
    """The codes not yet used and the open sessions, by the hashes of their secrets."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        secret: Callable[[], str] = lambda: secrets.token_urlsafe(32),
        code_seconds: float = CODE_SECONDS,
        session_seconds: float = SESSION_SECONDS,
        max_codes: int = MAX_CODES,
        max_sessions: int = MAX_SESSIONS,
        max_each: int = MAX_EACH,
        on_end: Callable[[], None] = lambda: None,
    ) -> None:
        self.clock = clock
        self.on_end = on_end  # sessions ended before their time (their streams end too)
        self.secret = secret
        self.code_seconds = code_seconds
        self.session_seconds = session_seconds
        self.max_codes = max_codes
        self.max_sessions = max_sessions
        self.max_each = max_each
        self._codes: OrderedDict[bytes, _Code] = OrderedDict()
        self._sessions: OrderedDict[bytes, Session] = OrderedDict()

    def __repr__(self) -> str:
        return f"<Logins codes={len(self._codes)} sessions={len(self._sessions)}>"

    def issue(self, who: str, scope: Scope, holder: Any = None) -> str:
        """A new login code for ``who`` (its scope becomes the session's; ``holder``, the
        credential it acts for, ends it and its session when revoked)."""
        if not scope.covers(Scope.READ):
            raise Unauthorized(f"{who} has the {scope.value} scope: the pages need read or admin")
        self._prune()
        self._make_room(self._codes, who, self.max_codes, "login link")
        code = self.secret()
        self._codes[_digest(code)] = _Code(who, scope, self.clock() + self.code_seconds, holder)
        return code

    def peek(self, code: str) -> tuple[str, Scope] | None:
        """Whom a login code would log in, and with which scope (``None``: not valid); the
        code stays good — the confirmation page says who before the browser trades it."""
        held = self._codes.get(_digest(code))
        if held is None or held.expires <= self.clock():
            return None
        return held.who, held.scope

    def redeem(self, code: str) -> tuple[str, Session]:
        """Trade a login code for a session: (its id, the session). A code is good once and
        for :data:`CODE_SECONDS`; a wrong, used or expired one is told the same words."""
        held = self._codes.pop(_digest(code), None)
        if held is None or held.expires <= self.clock():
            raise Unauthorized(
                "this login link is not valid (used already, expired or wrong): run "
                "'swamp ui' for a new one"
            )
        return self.open(held.who, held.scope, held.holder)

    def open(self, who: str, scope: Scope, holder: Any = None) -> tuple[str, Session]:
        """A session for ``who`` (the login form, after its token was accepted)."""
        if not scope.covers(Scope.READ):
            raise Unauthorized(f"{who} has the {scope.value} scope: the pages need read or admin")
        self._prune()
        self._make_room(self._sessions, who, self.max_sessions, "session")
        session_id = self.secret()
        session = Session(
            who, scope, self.secret(), self.clock() + self.session_seconds, holder=holder
        )
        self._sessions[_digest(session_id)] = session
        return session_id, session

    def session(self, session_id: str | None) -> Session | None:
        """The open session of this id (``None``: none, ended or expired)."""
        if not session_id:
            return None
        key = _digest(session_id)
        session = self._sessions.get(key)
        if session is None:
            return None
        if session.expires <= self.clock():
            del self._sessions[key]
            return None
        return session

    def end(self, session_id: str | None) -> None:
        if session_id and self._sessions.pop(_digest(session_id), None) is not None:
            self.on_end()

    def end_revoked(self, still_valid: Callable[[Any], bool]) -> None:
        """End every code and session whose holder ``still_valid`` no longer accepts (a
        server token revoked, or minted again with another secret or scope)."""
        verdicts: dict[int, bool] = {}  # one question per holder, however many sessions
        tables: list[OrderedDict[bytes, Any]] = [self._codes, self._sessions]
        ended = 0
        for table in tables:
            for key, held in list(table.items()):
                if held.holder is None:
                    continue
                valid = verdicts.get(id(held.holder))
                if valid is None:
                    valid = verdicts[id(held.holder)] = still_valid(held.holder)
                if not valid:
                    del table[key]
                    ended += table is self._sessions
        if ended:
            self.on_end()

    def _make_room(self, table: OrderedDict[bytes, Any], who: str, most: int, what: str) -> None:
        """Room for one more of ``who``'s: past :data:`MAX_EACH` its own oldest goes; past
        ``most`` in all, the oldest of whoever holds the most — so one credential opening
        sessions by the hundred never ends another's (a read token once ended an admin's)."""
        mine = [key for key, held in table.items() if held.who == who]
        if len(mine) >= self.max_each:
            del table[mine[0]]
            log.info("the oldest web %s of %s ended: it has %d", what, who, self.max_each)
            if table is self._sessions:
                self.on_end()
        if len(table) >= most:
            counts = Counter(held.who for held in table.values())
            greediest = max(counts, key=lambda name: counts[name])
            del table[next(key for key, held in table.items() if held.who == greediest)]
            log.info("the oldest web %s of %s ended: %d are open in all", what, greediest, most)
            if table is self._sessions:
                self.on_end()

    def _prune(self) -> None:
        now = self.clock()
        for table in (self._codes, self._sessions):
            for key in [k for k, v in table.items() if v.expires <= now]:
                del table[key]
