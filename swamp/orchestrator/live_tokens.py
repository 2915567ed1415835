"""Live tokens: a token's deadline and revocation enforced while its workers run.

When a token's deadline passes its workers are disconnected and it is stored ``expired``; when
it is revoked (through this server, or by the CLI writing straight to the repo, which the repo
watcher notices) its workers are disconnected at once.

It also keeps every token in memory, as last read: all of them at the start and after each
commit of another process (the repo watcher), one after each write this process makes to it
(:meth:`LiveTokens.reread`: a mint, a redemption, a revocation, an expiry). A decision made
without waiting asks :meth:`LiveTokens.token` — the queue, whether a disconnected target's
token is still live — instead of a read on the store in its middle. What it answers is
whether a token is live (its state and deadline); the count of its machines, which the
garbage collector lowers as it prunes, may be older.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import trio

from swamp.bookkeeping.tokens import TokenBook
from swamp.concurrency import open_unwrapping_nursery
from swamp.domain.tokens import Token, TokenState
from swamp.errors import SwampError
from swamp.orchestrator.pool import Pool
from swamp.orchestrator.timers import Deadlines
from swamp.store.datastore import Datastore
from swamp.store.retry import retry_busy

if TYPE_CHECKING:
    from swamp.orchestrator.peers import Peers

log = logging.getLogger("swamp.gateway")

CLOSE_REVOKED = 4001
CLOSE_EXPIRED = 4002
REPO_WATCH_INTERVAL = 0.25
RETRY = 5.0  # seconds before a token deadline the store could not check is checked again
TOKENS_CHANNEL = "swamp_tokens"  # NOTIFY: tokens changed (a shared database)


class LiveTokens:
    def __init__(
        self,
        store: Datastore | None,
        pool: Pool,
        tokens: TokenBook,
        *,
        on_repo_change: Sequence[Callable[[], Awaitable[None]]] = (),
        clock: Callable[[], float] = time.time,
        peers: Peers | None = None,
    ) -> None:
        # on a database several orchestrators share: a token written here wakes the others
        # (a NOTIFY of its own channel), and theirs wake this one, which reads them again —
        # a revocation through any orchestrator disconnects the token's workers on every one
        self.news = peers.waker_on(TOKENS_CHANNEL) if peers else None
        self.peers = peers
        self._others_wrote = trio.Event()
        self.store = store
        self.pool = pool
        self.tokens = tokens
        # called after another process wrote to the repo (e.g. revoked a server token)
        self.on_repo_change = tuple(on_repo_change)
        self.clock = clock
        self.token_deadlines = Deadlines("token deadlines")
        self.known: dict[str, Token] = {}  # every token, by name, as last read
        # reads are numbered as they start; a token's answer is kept only if no read started
        # after it has answered already (on a server, an older read may answer last)
        self._reads = 0
        self._answered: dict[str, int] = {}  # token → the number of the read kept

    def __repr__(self) -> str:
        return f"<LiveTokens {self.token_deadlines!r}>"

    def _trio_time(self, epoch: float) -> float:
        return trio.current_time() + max(0.0, epoch - self.clock())

    def arm_token_deadline(self, token: Token) -> None:
        """Store the token ``expired`` (and cut off its workers) when its deadline passes."""
        self.token_deadlines.set(token.name, self._trio_time(token.expires_at_epoch))

    def token(self, name: str) -> Token | None:
        """The token as last read (``None``: there was none), for a decision that does not
        wait on the store."""
        return self.known.get(name)

    async def reread(self, name: str, *, tell: bool = True) -> Token | None:
        """Read one token again, after this process wrote it (the repo watcher sees only the
        writes of others); on a shared database the others are told to read the tokens again
        too — unless ``tell`` is false (a read for a change another made: telling them back
        would have them read again, and tell us, for ever)."""
        self._reads += 1
        number = self._reads
        if tell and self.news is not None:
            self.news.wake()
        token = await self.tokens.get(name)
        self._keep(name, token, number)
        return token

    def recheck_soon(self) -> None:
        """Tokens changed here in a way only a full re-read shows (a server token revoked
        through this orchestrator): on a shared database, every orchestrator re-reads them,
        this one too (never waits)."""
        if self.news is not None:
            self.news.wake()
            self._others_wrote.set()

    def _keep(self, name: str, token: Token | None, number: int) -> None:
        if self._answered.get(name, 0) > number:
            return  # a read that started later has answered: this one is older
        self._answered[name] = number
        if token is None:
            self.known.pop(name, None)
        else:
            self.known[name] = token

    async def refresh(self) -> None:
        """Read every token again, and arm the deadline of each live one, so each is stored
        ``expired`` when it lapses, whether or not a worker ever used it (tokens may be
        minted by the CLI on the repo)."""
        self._reads += 1
        number = self._reads
        every = await self.tokens.all()
        found = {token.name: token for token in every}
        for name in set(self.known) | set(found):
            self._keep(name, found.get(name), number)
        for token in every:
            if (
                token.state in (TokenState.UNUSED, TokenState.ENROLLED)
                and token.name not in self.token_deadlines
            ):
                self.arm_token_deadline(token)

    async def _token_deadline(self, name: str) -> None:
        try:
            await self._expire(name)
        except SwampError as exc:  # the database is away: again a little later, not never
            log.warning("token %s: its deadline is checked again in %gs: %s", name, RETRY, exc)
            self.token_deadlines.set(name, trio.current_time() + RETRY)

    async def _expire(self, name: str) -> None:
        token = await self.reread(name, tell=False)
        if token is None:
            return
        if token.expires_at_epoch > self.clock():  # re-minted with a later deadline
            self.arm_token_deadline(token)
            return
        if await retry_busy(lambda: self.tokens.expire(name)):
            log.info("token %s expired", name)
            await self.reread(name)
        await self.disconnect_token(name, CLOSE_EXPIRED, f"token {name!r} has expired")

    async def disconnect_token(self, name: str, code: int, reason: str) -> int:
        members = [m for m in self.pool.of_token(name) if m.connected]
        for member in members:
            log.info("disconnecting %s: %s", member.name, reason)
            if member.channel is not None:  # connected: it has one
                member.channel.abort(code, reason)
        for member in self.pool.of_token(name):  # steps waiting for one learn it cannot return
            self.pool.refresh(member)
        return len(members)

    async def token_changed(self, name: str) -> None:
        """Re-check one token (after a revoke): disconnect its workers if it is no longer live."""
        token = await self.reread(name, tell=False)
        now = self.clock()
        if token is None or not token.live(now):
            state = token.effective_state(now).value if token else "deleted"
            code = CLOSE_EXPIRED if state == "expired" else CLOSE_REVOKED
            await self.disconnect_token(name, code, f"token {name!r} has been {state}")

    async def _watch_repo(self, store: Datastore, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Notice writes by other processes (the CLI on the repo) without a server round trip.

        ``PRAGMA data_version`` only changes when another connection commits, so this costs one
        tiny query per tick and does nothing when the repo is quiet. It is the one periodic
        check in the orchestrator, and it is not on any dispatch path.
        """
        try:  # the baseline is taken before the server listens: no change can slip past
            seen: int | None = store.data_version()
        except SwampError:
            seen = None  # unknown: the first tick re-checks everything
        task_status.started()
        broken = None
        while True:
            await trio.sleep(REPO_WATCH_INTERVAL)
            if broken is None and (broken := store.check_file()):
                log.error("%s", broken)  # said once; every write is refused from now on
            try:
                current = store.data_version()
                if current == seen:
                    continue
                seen = current
                await self._recheck()
            except SwampError as exc:  # e.g. the database is locked: try again next tick
                log.warning("could not re-check the repo after a change: %s", exc)
                seen = None
            except Exception:  # a bug here must not take the orchestrator down with it
                log.exception("the repo watcher failed; it carries on")
                seen = None

    async def _recheck(self) -> None:
        """Another process changed the tokens: every one read again, the workers of those no
        longer live disconnected, and what else watches (revoked server tokens) told."""
        await self.refresh()
        for name in {m.token_name for m in self.pool.members.values() if m.connected}:
            await self.token_changed(name)
        for listener in self.on_repo_change:
            await listener()

    async def _watch_others(self) -> None:
        """On a shared database: each batch of other orchestrators' token writes (and of ours
        that need a full re-read), read again; a failed pass is tried again shortly."""
        while True:
            await self._others_wrote.wait()
            self._others_wrote = trio.Event()
            try:
                await self._recheck()
            except SwampError as exc:
                log.warning("could not re-read the tokens others changed: %s", exc)
                await trio.sleep(RETRY)
                self._others_wrote.set()
            except Exception:  # a bug here must not take the orchestrator down with it
                log.exception("re-reading the tokens others changed failed; it carries on")

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        await self.refresh()  # before anything is asked: every token, before the first worker
        async with open_unwrapping_nursery() as nursery:
            await nursery.start(self.token_deadlines.run, self._token_deadline)
            if self.store is not None:  # the repo's file: another process's commits
                await nursery.start(self._watch_repo, self.store)
            if self.news is not None and self.peers is not None:  # others on the database
                await nursery.start(self.news.run)
                await nursery.start(
                    self.peers.listen, TOKENS_CHANNEL, lambda: self._others_wrote.set()
                )
                nursery.start_soon(self._watch_others)
            task_status.started()
