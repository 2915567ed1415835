"""Enrollment: a worker's hello turned into a member of the pool, or a refusal.

Validate the handshake (the protocol version first), redeem the token (a compare-and-swap
transition in the store: it names the worker and grants the labels and slots the token allows),
let :func:`swamp.domain.enrollment.admit` decide from the hello, the token's answer and what the
pool holds; then perform the decision: persist the worker's record, hand the member to
``Membership``, arm its token's deadline, reply.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from swamp import __version__
from swamp.bookkeeping.tokens import TokenBook
from swamp.domain.carrying import MAX_CARRY, MAX_LISTED
from swamp.domain.claims import FLEET_LABEL, MAX_CAPACITY
from swamp.domain.enrollment import Admit, Present, admit, instance_clash
from swamp.domain.labels import check_labels
from swamp.domain.leases import LEASE_ID
from swamp.domain.text import is_printable
from swamp.domain.tokens import Redeemed
from swamp.domain.workers import (
    WorkerStatus,
    check_instance_id,
    check_machine_id,
    check_platform_word,
    check_version,
)
from swamp.errors import (
    DatabaseUnavailable,
    ProtocolMismatch,
    SwampError,
    TokenInvalid,
    UserError,
)
from swamp.orchestrator.live_tokens import LiveTokens
from swamp.orchestrator.membership import HOLD_BACK, Membership
from swamp.orchestrator.pool import Member, Pool
from swamp.orchestrator.records import WorkerRecords
from swamp.protocol.frames import PROTOCOL_VERSION
from swamp.protocol.messages import EnrollReply, EnrollRequest
from swamp.protocol.rpc import RpcChannel
from swamp.store.retry import retry_busy

if TYPE_CHECKING:
    from swamp.orchestrator.adoption import Adoptions

log = logging.getLogger("swamp.gateway")

CLOSE_REPLACED = 4003


def check_enrollment(raw: dict) -> EnrollRequest:
    """Decode the handshake, then check every value with full matches: all of it ends up in the
    pool, in records, in terminals and in logs. The protocol version is checked first, so a
    worker of another version is told that, whatever else changed in its handshake."""
    version = raw.get("protocolVersion") if isinstance(raw, dict) else None
    if isinstance(version, int) and not isinstance(version, bool) and version != PROTOCOL_VERSION:
        raise ProtocolMismatch(
            f"the worker speaks protocol {version} but this orchestrator speaks "
            f"{PROTOCOL_VERSION}: run the same swamp version on both"
        )
    request = EnrollRequest.decode(raw)
    if not 0 < len(request.token) <= 512 or not is_printable(request.token):
        raise UserError("enrollment needs 'token': <name>.<secret>, at most 512 characters")
    if not 1 <= request.capacity <= MAX_CAPACITY:
        raise UserError(f"enrollment 'capacity' must be an integer from 1 to {MAX_CAPACITY}")
    check_instance_id(request.instance_id)
    check_machine_id(request.machine_id)
    check_version(request.version)
    check_platform_word(request.platform, "platform")
    check_platform_word(request.arch, "arch")
    check_labels(request.labels, source="enrollment labels")
    if len(request.carried) > MAX_LISTED:
        raise UserError(f"enrollment lists at most {MAX_LISTED} carried dispatches")
    for run in request.carried:
        if not LEASE_ID.fullmatch(run.dispatch_id) or not 0 <= run.seconds <= MAX_CARRY:
            raise UserError(
                "enrollment 'carried' holds dispatch ids (32 hex digits) and the seconds each "
                f"is carried for (0 to {MAX_CARRY:g})"
            )
    return request


def _present(member: Member | None) -> Present | None:
    if member is None:
        return None
    return Present(member.name, member.instance_id, member.machine_id, member.connected)


class Enrollment:
    def __init__(
        self,
        pool: Pool,
        tokens: TokenBook,
        records: WorkerRecords,
        membership: Membership,
        live_tokens: LiveTokens,
        *,
        on_rejection: Callable[[str], None] = lambda code: None,
    ) -> None:
        self.pool = pool
        self.tokens = tokens
        self.records = records
        self.workers = records.workers
        self.membership = membership
        self.live_tokens = live_tokens
        self.on_rejection = on_rejection  # told the error code of every refused enrollment
        # the runs a worker carries here from a dead orchestrator (a shared database; None:
        # this one adopts none, and tells its workers so)
        self.adoptions: Adoptions | None = None

    def __repr__(self) -> str:
        return f"<Enrollment {self.pool!r}>"

    async def enroll(self, channel: RpcChannel, raw: dict) -> tuple[EnrollReply, Member]:
        """The reply and the member; raises the refusal (its code counted) otherwise."""
        try:
            return await self._enroll(channel, raw)
        except SwampError as exc:
            self.on_rejection(exc.code)
            raise

    async def _enroll(self, channel: RpcChannel, raw: dict) -> tuple[EnrollReply, Member]:
        params = check_enrollment(raw)
        self._refuse_while_letting_go()
        twin = _present(self.pool.by_instance_id(params.instance_id))
        clash = instance_clash(params, twin)
        if clash is not None:
            raise clash.error  # before anything is bound
        redeemed = await self._redeem(params)
        existing = (
            self.pool.get(redeemed.binding.worker_name) if isinstance(redeemed, Redeemed) else None
        )
        decision = admit(
            params,
            token=redeemed.binding.worker_name if isinstance(redeemed, Redeemed) else redeemed,
            twin=twin,
            existing=_present(existing),
            verify_on_enroll=self.membership.verify_on_enroll,
            held_back=self.membership.held_back_reason(params.machine_id),
            hold_back_seconds=HOLD_BACK,
        )
        if not isinstance(decision, Admit):
            raise decision.error  # a refusal, or a full fleet: the worker waits and asks again
        assert isinstance(redeemed, Redeemed)  # only a redeemed token admits
        self._refuse_while_letting_go()  # (it may have begun while the token was redeemed)
        if decision.replaces and existing is not None and existing.channel is not None:
            existing.channel.abort(CLOSE_REPLACED, "replaced by a newer connection")
        return await self._join(channel, params, redeemed, decision)

    def _refuse_while_letting_go(self) -> None:
        """A worker is refused, as by an orchestrator away, while this one lets its workers
        go (it lost its hold on the database): it tries the next orchestrator it knows."""
        if self.membership.letting_go is not None:
            raise DatabaseUnavailable(self.membership.letting_go)

    async def _redeem(self, params: EnrollRequest) -> Redeemed | SwampError:
        """The token's answer: its redemption (the worker's name and grant), or its refusal."""
        try:
            redeemed = await retry_busy(
                lambda: self.tokens.redeem(
                    params.token,
                    machine_id=params.machine_id,
                    labels=params.labels,
                    capacity=params.capacity,
                )
            )
        except TokenInvalid as exc:
            log.warning("refused an enrollment with token %r: %s", exc.name, exc.detail)
            return exc
        except SwampError as exc:
            return exc
        token, name, granted = redeemed.token, redeemed.binding.worker_name, redeemed.granted
        if granted.kept_own_fleet:
            log.warning(
                "worker %s supplies its own fleet label %r; keeping it instead of fleet=%s",
                name,
                params.labels["fleet"],
                token.name,
            )
        if granted.capacity_capped:
            log.info(
                "worker %s asked for %d slots; token %s allows %d",
                name,
                params.capacity,
                token.name,
                granted.capacity,
            )
        return redeemed

    async def _join(
        self, channel: RpcChannel, params: EnrollRequest, redeemed: Redeemed, decision: Admit
    ) -> tuple[EnrollReply, Member]:
        token, name, granted = redeemed.token, decision.name, redeemed.granted
        status = decision.status.value
        await self.records.settled()  # the previous connection's last status goes first
        record = await retry_busy(
            lambda: self.workers.enrolled(
                name=name,
                instance_id=params.instance_id,
                machine_id=params.machine_id,
                token=token.name,
                labels=granted.labels,
                platform=params.platform,
                arch=params.arch,
                capacity=granted.capacity,
                version=params.version,
                status=status,
                reason=decision.reason,
            )
        )
        member = Member(
            name=name,
            instance_id=params.instance_id,
            machine_id=params.machine_id,
            token_name=token.name,
            labels=granted.labels,
            platform=params.platform,
            arch=params.arch,
            capacity=granted.capacity,
            version=params.version,
            channel=channel,
            enrolled_at=record.attributes["enrolledAt"],
            last_seen_at=record.attributes["lastSeenAt"],
            record=record,
            status=status,
            verify_failure_reason=(
                decision.reason if decision.status is WorkerStatus.UNVERIFIED else None
            ),
            unresponsive_reason=(
                decision.reason if decision.status is WorkerStatus.UNRESPONSIVE else None
            ),
            fleet=token.claims.pinned.get(FLEET_LABEL, token.name),
        )
        # as the queue will ask of this member (the others need not hear of each enrollment:
        # its token's liveness did not change)
        await self.live_tokens.reread(token.name, tell=False)
        self.live_tokens.arm_token_deadline(token)
        # the interval this worker is told (and held to) grows with the pool: at enrollment,
        # and later in the answer to a ping, for the members that enrolled while it was smaller
        channel.heartbeat = self.membership.channel_heartbeat()
        if self.membership.telling is not None:
            await self.membership.telling(channel.heartbeat)
        channel.heartbeat_source = self.membership.pool_heartbeat
        carried: dict[str, str] = {}
        if self.adoptions is not None and params.carried:
            carried = await self.adoptions.listed(member, params.carried)
        self.membership.joined(member, verify=decision.verify)
        if params.version and params.version != __version__:
            log.warning(
                "worker %s runs swamp %s, this orchestrator %s: it can download this build "
                "from /swamp.pyz",
                name,
                params.version,
                __version__,
            )
        log.info(
            "worker %s enrolled (%s) platform=%s/%s capacity=%d",
            name,
            "reconnect" if decision.reconnect else "first connect",
            params.platform,
            params.arch,
            granted.capacity,
        )
        reply = EnrollReply(
            worker_name=name,
            capacity=granted.capacity,
            labels=granted.labels,
            token_expires_at=token.expires_at,
            token_expires_at_epoch=token.expires_at_epoch,
            reconnect=decision.reconnect,
            heartbeat_seconds=channel.heartbeat,
            protocol_version=PROTOCOL_VERSION,
            orchestrator_version=__version__,
            carry=self.adoptions is not None,
            carried=carried,
        )
        return reply, member
