"""PostgreSQL from trio: psycopg's libpq wrapper, driven by trio's waits on the socket.

psycopg's own async API runs on asyncio only. Its documented low-level module, ``psycopg.pq``,
wraps libpq's non-blocking calls one for one; this module drives them from trio, so the event
loop only ever waits in ``trio.lowlevel.wait_readable``/``wait_writable``, never in libpq.

**One statement, one exchange.** ``send_query_params`` (the extended protocol: one statement,
its parameters apart from the SQL, nothing spliced in), ``flush`` until libpq's buffer is on
the wire, ``consume_input`` whenever the socket is readable until ``is_busy`` is false, then
``get_result`` until None. In between, the connection is idle. Notifications that arrived with
a result are taken from libpq after every exchange, so a query in flight loses none.

**Values.** Parameters go as text with the type psycopg would pick (an int as the smallest of
int2/int4/int8, so ``repeat('x', $1)`` still resolves — and so ``$1 * $2`` of two small ones
is smallint arithmetic, which overflows: cast such a parameter, ``$1::bigint``; a str as
``unknown``, so the server casts it to the column's type), bytes as binary ``bytea``. A value
that cannot be sent (past 64 bits, a NUL or a lone surrogate in text, too many parameters) is
refused before anything is sent, and the connection goes on. Results come back as text and are
converted by the column's type OID (:data:`LOADERS`): numeric → ``Decimal`` (exact), json and
jsonb → ``str`` (parsing is the caller's business), any type not in the table → ``str``.

**Cancellation.** When the caller's cancel scope fires while a statement is in flight, the
protocol is mid-stream: the connection cannot take another statement before it is read back to
idle. Closing it is simplest, but the statement then runs on in its backend until the server
next writes to the socket (a ``pg_sleep(10)`` or a lock wait keeps its backend, its locks and
a slot of ``max_connections`` for its whole course), and every cancel costs a reconnect. So,
under a shield with a deadline of ``cancel_grace`` seconds: finish sending, send a cancel
request (libpq's non-blocking cancel connection) if the statement still runs, read the results
back to idle (a few ms on loopback). A connection not back within the grace, or whose libpq
is older than 17 (no non-blocking cancel), is closed (``conn.closed``). The cancel goes out
only while the statement runs, and the results are read only after the server took it, so it
cannot hit the next statement. Inside :meth:`Connection.transaction` the cancelled statement
aborts the transaction, which is rolled back. A cancelled write (or COMMIT) may or may not
have taken effect, as always. No task or thread is started, but for name resolution (trio's
``getaddrinfo`` thread, which ends with the system resolver's own timeout if abandoned). A
statement called in a scope already cancelled sends nothing. The host to resolve comes from
the URL, else from ``PGHOST``/``PGHOSTADDR`` (which libpq would resolve on the loop); a
``service=`` URL is refused for the same reason.

**Bounds.** Notifications wait in a queue of ``max_pending``; past it, new ones are dropped and
``missed`` is set: NOTIFY is a wake-up hint, the tables are the truth, a caller that missed
some rescans. A pool waits ``wait`` seconds at most for a free connection. A result is held
whole in memory, as libpq reads it, and its rows are converted in one go (half a million rows:
about a second without a checkpoint): a query that may match many rows says LIMIT.
"""

from __future__ import annotations

import binascii
import collections
import ipaddress
import os
import re
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from decimal import Decimal
from types import TracebackType
from typing import Any

import psycopg
import trio
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from swamp.errors import (
    ConnectionLost,
    DatabaseUnavailable,
    PoolTimeout,
    SqlError,
    SwampError,
    UserError,
)

CONNECT_TIMEOUT = 10.0  # seconds for name resolution, TCP, TLS and authentication together
CANCEL_GRACE = 1.0  # seconds to bring a cancelled statement's connection back to idle
MAX_PENDING = 1000  # notifications waiting to be read (8,000 bytes of payload at most each)
POOL_WAIT = 30.0  # seconds a task waits for a free connection of a pool
MAX_IDENTIFIER = 63  # bytes of a channel name (PostgreSQL's NAMEDATALEN - 1)

# SQLSTATEs a caller may want to tell apart (SqlError.sqlstate)
UNIQUE_VIOLATION = "23505"
SERIALIZATION_FAILURE = "40001"
DEADLOCK_DETECTED = "40P01"
UNDEFINED_TABLE = "42P01"
QUERY_CANCELED = "57014"
IN_FAILED_TRANSACTION = "25P02"
MAX_PARAMETERS = 65535  # the protocol's count of a statement's parameters

# type OIDs (pg_type.oid; fixed for the built-in types)
BOOL, BYTEA, NAME, INT8, INT2, INT4, TEXT, JSON = 16, 17, 19, 20, 21, 23, 25, 114
FLOAT4, FLOAT8, VARCHAR, NUMERIC, JSONB, UNKNOWN = 700, 701, 1043, 1700, 3802, 0

_ESCAPED = re.compile(rb"\\(\\|[0-7]{3})")


def _bytea(raw: bytes) -> bytes:
    if raw.startswith(b"\\x"):  # bytea_output = hex, the default
        return binascii.a2b_hex(memoryview(raw)[2:])
    return _ESCAPED.sub(lambda m: b"\\" if m[1] == b"\\" else bytes([int(m[1], 8)]), raw)


def _text(raw: bytes) -> str:
    return raw.decode()  # the connection's client_encoding is UTF8


#: a result column's type OID → its Python value, from the text the server sent
LOADERS: dict[int, Callable[[bytes], Any]] = {
    BOOL: lambda raw: raw == b"t",
    BYTEA: _bytea,
    INT2: int,
    INT4: int,
    INT8: int,
    FLOAT4: float,
    FLOAT8: float,
    NUMERIC: lambda raw: Decimal(raw.decode()),
}


def _dump(value: object) -> tuple[bytes | None, int, int]:
    """One parameter as (text or binary, type OID, format)."""
    if value is None:
        return None, UNKNOWN, 0
    if isinstance(value, bool):
        return (b"t" if value else b"f"), BOOL, 0
    if isinstance(value, int):
        if -(2**15) <= value < 2**15:
            oid = INT2
        elif -(2**31) <= value < 2**31:
            oid = INT4
        elif -(2**63) <= value < 2**63:
            oid = INT8
        else:
            raise UserError(f"the integer {value} does not fit PostgreSQL's bigint (64 bits)")
        return b"%d" % value, oid, 0
    if isinstance(value, float):
        if value != value:
            return b"NaN", FLOAT8, 0
        if value in (float("inf"), float("-inf")):
            return (b"Infinity" if value > 0 else b"-Infinity"), FLOAT8, 0
        return repr(value).encode(), FLOAT8, 0
    if isinstance(value, Decimal):
        return str(value).encode(), NUMERIC, 0
    if isinstance(value, str):
        if "\x00" in value:
            raise UserError("PostgreSQL text cannot hold a NUL character (\\x00); send bytes")
        try:
            return value.encode(), UNKNOWN, 0
        except UnicodeEncodeError:
            raise UserError("a text parameter holds a lone surrogate, not a character") from None
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value), BYTEA, 1
    raise UserError(
        f"a parameter of type {type(value).__name__} cannot be sent to PostgreSQL "
        "(None, bool, int, float, Decimal, str or bytes)"
    )


def _rows(res: pq.abc.PGresult) -> list[tuple[Any, ...]]:
    columns = range(res.nfields)
    loads = [LOADERS.get(res.ftype(c), _text) for c in columns]
    get = res.get_value
    return [
        tuple(None if (v := get(r, c)) is None else loads[c](v) for c in columns)
        for r in range(res.ntuples)
    ]


def _field(res: pq.abc.PGresult, field: pq.DiagnosticField) -> str:
    value = res.error_field(field)
    return value.decode(errors="replace") if value else ""


@dataclass(frozen=True, slots=True)
class Result:
    """What a statement gave back: its rows, the rows it touched or returned (0 when the
    statement has no count), and the server's command tag (``"UPDATE 3"``)."""

    rows: list[tuple[Any, ...]]
    rowcount: int
    status: str


@dataclass(frozen=True, slots=True)
class Notification:
    channel: str
    payload: str
    pid: int  # the notifying backend's process id


@dataclass(frozen=True, slots=True)
class Notifications:
    """What arrived since the last read; ``missed``: some were dropped, the queue being full
    (rescan instead of trusting the list)."""

    received: tuple[Notification, ...]
    missed: bool


class Connection:
    """One PostgreSQL session, built by :func:`connect`. Statements from several tasks take
    turns (a fair lock), but nothing keeps one task's statement out of another's transaction:
    each task its own connection (a :class:`Pool`)."""

    def __init__(self, pgconn: pq.abc.PGconn, *, cancel_grace: float, max_pending: int) -> None:
        self._pg = pgconn
        self._fd = pgconn.socket
        self._pid = pgconn.backend_pid
        self._grace = cancel_grace
        self._max_pending = max_pending
        self._busy = trio.Lock()  # an exchange, or the idle wait for notifications, holds it
        self._reader: trio.CancelScope | None = None  # the idle wait for notifications
        self._notes: collections.deque[Notification] = collections.deque()
        self._missed = False
        self._woken = trio.Event()  # set (and replaced) when notifications or the lock move
        self._fatal: str | None = None  # the server said it ends the session
        self._closed = False
        self._why = "the connection is closed"
        pgconn.nonblocking = 1
        pgconn.notice_handler = self._on_notice

    # -- state ---------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pid(self) -> int:
        """The server process serving this connection (for ``pg_terminate_backend``)."""
        return self._pid

    @property
    def in_transaction(self) -> bool:
        return not self._closed and self._pg.transaction_status != pq.TransactionStatus.IDLE

    def alive(self) -> bool:
        """Without waiting: read what the server sent while the connection sat idle; False if
        it is closed or the server has ended it (a pool checks before handing it out)."""
        if not self._closed and not self._busy.locked():
            try:
                self._pg.consume_input()
            except psycopg.Error as exc:
                self._lose(exc)
            self._collect()
        return not self._closed

    def __repr__(self) -> str:
        if self._closed:
            state = "closed"
        elif self._busy.locked():
            state = "busy"
        else:
            state = "in transaction" if self.in_transaction else "idle"
        return f"<Connection pid={self._pid} {state} notifications={len(self._notes)}>"

    # -- statements ----------------------------------------------------------------------

    async def execute(self, sql: str, params: Sequence[object] = ()) -> Result:
        """Run one statement; ``$1, $2…`` in ``sql`` are ``params``. A refusal raises
        :class:`SqlError`, a broken connection :class:`ConnectionLost`."""
        # already cancelled: nothing is sent (trio's rule: a cancelled call does nothing)
        await trio.lowlevel.checkpoint_if_cancelled()
        if "\x00" in sql:
            raise UserError("an SQL statement cannot hold a NUL character (\\x00)")
        if len(params) > MAX_PARAMETERS:
            raise UserError(
                f"a statement takes at most {MAX_PARAMETERS} parameters, got {len(params)}"
            )
        try:
            encoded = sql.encode()
        except UnicodeEncodeError:
            raise UserError(
                "an SQL statement must be valid text (it holds a lone surrogate)"
            ) from None
        dumped = [_dump(value) for value in params]  # a bad value changes nothing
        values = [d[0] for d in dumped] or None
        types = [d[1] for d in dumped] or None
        formats = [d[2] for d in dumped] or None
        if self._reader is not None:
            self._reader.cancel()  # the idle wait for notifications yields the socket
        try:
            self._busy.acquire_nowait()  # most often free: no trip through the scheduler
        except trio.WouldBlock:
            await self._busy.acquire()
        try:
            self._check_open()
            res = await self._exchange(encoded, values, types, formats)
        finally:
            self._collect()
            self._busy.release()
            self._wake()
        if res.status == pq.ExecStatus.FATAL_ERROR:
            raise SqlError(
                _field(res, pq.DiagnosticField.MESSAGE_PRIMARY) or "the statement failed",
                sqlstate=_field(res, pq.DiagnosticField.SQLSTATE),
                detail=_field(res, pq.DiagnosticField.MESSAGE_DETAIL),
            )
        return Result(_rows(res), res.command_tuples or 0, _text(res.command_status or b""))

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Connection]:
        """BEGIN; COMMIT when the block ends; ROLLBACK if it raises (or is cancelled), or if a
        statement in it failed (then :class:`SqlError` 25P02). Transactions do not nest."""
        if self.in_transaction:
            raise UserError("a transaction is already open on this connection (they do not nest)")
        try:
            await self.execute("BEGIN")
        except BaseException:
            if self.in_transaction:  # BEGIN landed, and then the caller was cancelled
                await self._rollback()
            raise
        try:
            yield self
        except BaseException:
            await self._rollback()
            raise
        if not self._closed and self._pg.transaction_status == pq.TransactionStatus.INERROR:
            await self._rollback()
            raise SqlError(
                "the transaction was rolled back: a statement in it failed",
                sqlstate=IN_FAILED_TRANSACTION,
            )
        await self.execute("COMMIT")

    async def _rollback(self) -> None:
        """ROLLBACK even from a cancelled scope: shielded and bounded; a connection whose
        transaction cannot be ended is closed, never handed on half-way."""
        if not self.in_transaction:
            return
        with trio.CancelScope(shield=True, deadline=trio.current_time() + self._grace):
            try:
                await self.execute("ROLLBACK")
                return
            except SwampError:
                pass
        self.close()

    # -- notifications -------------------------------------------------------------------

    async def listen(self, channel: str) -> None:
        """LISTEN on ``channel``; read with :meth:`wait_notifications`. Use a connection of its
        own (not a pool's): a dropped connection forgets its LISTENs."""
        name = channel.encode()
        if not name or len(name) > MAX_IDENTIFIER or b"\x00" in name:
            raise UserError(f"a channel name is 1 to {MAX_IDENTIFIER} bytes, without NUL")
        await self.execute('LISTEN "' + channel.replace('"', '""') + '"')

    async def wait_notifications(self) -> Notifications:
        """Every notification received so far, waiting (without polling) for the first.
        Raises :class:`ConnectionLost` once the connection is gone and the queue empty."""
        while not (self._notes or self._missed):
            self._check_open()
            if self._busy.locked():  # a statement is in flight: it collects what arrives
                await self._woken.wait()
            else:
                await self._read_idle()
        batch = Notifications(tuple(self._notes), self._missed)
        self._notes.clear()
        self._missed = False
        return batch

    async def _read_idle(self) -> None:
        self._busy.acquire_nowait()
        try:
            with trio.CancelScope() as self._reader:  # cancelled when a statement comes
                try:
                    await trio.lowlevel.wait_readable(self._fd)
                except trio.ClosedResourceError:
                    raise ConnectionLost(self._why) from None
                try:
                    self._pg.consume_input()
                except psycopg.Error as exc:
                    raise self._lose(exc) from None
                self._collect()
        finally:
            self._reader = None
            self._busy.release()

    def _collect(self) -> None:
        """Move the notifications libpq has parsed into the bounded queue."""
        if self._closed:
            return
        arrived = False
        while (note := self._pg.notifies()) is not None:
            arrived = True
            if len(self._notes) < self._max_pending:
                payload = note.extra.decode(errors="replace")
                self._notes.append(Notification(_text(note.relname), payload, note.be_pid))
            else:
                self._missed = True
        if self._fatal is not None:
            self._why = f"the server ended the connection: {self._fatal}"
            self.close()
        if arrived:
            self._wake()

    def _wake(self) -> None:
        self._woken.set()
        self._woken = trio.Event()

    def _on_notice(self, res: pq.abc.PGresult) -> None:
        """libpq's notices, errors that came while idle among them: a FATAL one means the
        server is ending the session (terminated, shutting down)."""
        severity = res.error_field(pq.DiagnosticField.SEVERITY_NONLOCALIZED)
        if severity in (b"FATAL", b"PANIC"):
            self._fatal = _field(res, pq.DiagnosticField.MESSAGE_PRIMARY)

    # -- the exchange ----------------------------------------------------------------------

    async def _exchange(
        self,
        sql: bytes,
        values: list[bytes | None] | None,
        types: list[int] | None,
        formats: list[int] | None,
    ) -> pq.abc.PGresult:
        pg = self._pg
        try:
            pg.send_query_params(sql, values, types, formats)
        except psycopg.Error as exc:
            raise self._lose(exc) from None
        try:
            while pg.flush():
                await trio.lowlevel.wait_writable(self._fd)
            return await self._results()
        except psycopg.Error as exc:
            raise self._lose(exc) from None
        except trio.ClosedResourceError:
            raise ConnectionLost(self._why) from None
        except BaseException:
            if not self._closed:
                await self._interrupt()  # cancelled mid-exchange
            raise

    async def _results(self) -> pq.abc.PGresult:
        """Read the statement's results back to idle: the error if there was one, else the
        last result."""
        pg = self._pg
        kept: pq.abc.PGresult | None = None
        while True:
            while pg.is_busy():
                await trio.lowlevel.wait_readable(self._fd)
                pg.consume_input()
            res = pg.get_result()
            if res is None:
                break
            if res.status in (
                pq.ExecStatus.COPY_IN,
                pq.ExecStatus.COPY_OUT,
                pq.ExecStatus.COPY_BOTH,
            ):
                self._why = "COPY is not spoken here: the connection was closed"
                self.close()
                raise UserError(self._why)
            if res.status == pq.ExecStatus.FATAL_ERROR:
                severity = res.error_field(pq.DiagnosticField.SEVERITY_NONLOCALIZED)
                if severity in (b"FATAL", b"PANIC"):  # the server ends the session
                    self._fatal = _field(res, pq.DiagnosticField.MESSAGE_PRIMARY)
            if kept is None or kept.status != pq.ExecStatus.FATAL_ERROR:
                kept = res
        if pg.status != pq.ConnStatus.OK or kept is None:
            message = _field(kept, pq.DiagnosticField.MESSAGE_PRIMARY) if kept else ""
            raise self._lose(message or "the server closed the connection")
        return kept

    async def _interrupt(self) -> None:
        """Bring a connection cancelled mid-exchange back to idle, or close it."""
        with trio.CancelScope(shield=True, deadline=trio.current_time() + self._grace):
            try:
                if await self._cancel_and_drain():
                    return
            except (psycopg.Error, trio.ClosedResourceError):
                pass
        self._why = "the connection was closed: a statement cancelled in flight"
        self.close()

    async def _cancel_and_drain(self) -> bool:
        pg = self._pg
        while pg.flush():  # a message sent in part would desynchronise the stream
            await trio.lowlevel.wait_writable(self._fd)
        if pg.is_busy() and not await self._send_cancel():
            return False
        while True:
            while pg.is_busy():
                await trio.lowlevel.wait_readable(self._fd)
                pg.consume_input()
            res = pg.get_result()
            if res is None:
                return pg.status == pq.ConnStatus.OK
            if res.status in (pq.ExecStatus.COPY_IN, pq.ExecStatus.COPY_OUT):
                return False

    async def _send_cancel(self) -> bool:
        """Ask the server to cancel the running statement; True once it has taken the
        request (it has signalled the backend)."""
        cancel = self._pg.cancel_conn()
        try:
            cancel.start()
            while (status := cancel.poll()) not in (pq.PollingStatus.OK, pq.PollingStatus.FAILED):
                if status == pq.PollingStatus.READING:
                    await trio.lowlevel.wait_readable(cancel.socket)
                else:
                    await trio.lowlevel.wait_writable(cancel.socket)
            return status == pq.PollingStatus.OK
        finally:
            cancel.finish()

    # -- closing ---------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._fatal is not None and not self._closed:
            self._collect()  # closes it, with the server's reason
        if self._closed:
            raise ConnectionLost(self._why)

    def _lose(self, why: psycopg.Error | str) -> ConnectionLost:
        """Close a connection found broken; the exception to raise."""
        reason = self._fatal or (str(why).strip().splitlines() or ["no reason given"])[0]
        self._why = f"the connection to PostgreSQL was lost: {reason}"
        self.close()
        return ConnectionLost(self._why)

    def close(self) -> None:
        """Close now (libpq's goodbye is one small non-blocking write)."""
        if self._closed:
            return
        self._closed = True
        if self._pg.status == pq.ConnStatus.OK:  # else libpq has closed the socket itself
            try:
                trio.lowlevel.notify_closing(self._fd)  # wake a task waiting on it
            except RuntimeError:
                pass  # outside trio: nobody can be waiting
        self._pg.notice_handler = None
        self._pg.finish()
        self._wake()

    async def aclose(self) -> None:
        self.close()
        await trio.lowlevel.checkpoint()

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


# -- connecting ----------------------------------------------------------------------------


async def connect(
    url: str,
    *,
    timeout: float = CONNECT_TIMEOUT,  # noqa: ASYNC109 - the connection's own bound
    cancel_grace: float = CANCEL_GRACE,
    max_pending: int = MAX_PENDING,
) -> Connection:
    """Open a connection: ``postgresql://user[:password]@host[:port]/dbname?…`` or a
    ``key=value`` string, anything libpq takes. Host names are resolved by trio (libpq would
    block the loop) and handed to libpq as ``hostaddr``, each address in turn, with ``host``
    kept for TLS verification. Failing: :class:`DatabaseUnavailable`, saying where and why."""
    try:
        params: dict[str, Any] = conninfo_to_dict(url)
    except psycopg.Error:
        raise UserError(
            "not a PostgreSQL URL or connection string (postgresql://user@host:5432/dbname)"
        ) from None
    params["client_encoding"] = "UTF8"
    where = _where(params)
    try:
        with trio.fail_after(timeout):
            params = await _resolved(params, where)
            pgconn = await _handshake(make_conninfo("", **params).encode(), where)
    except trio.TooSlowError:
        raise DatabaseUnavailable(
            f"cannot connect to {where}: no answer within {timeout:g}s"
        ) from None
    return Connection(pgconn, cancel_grace=cancel_grace, max_pending=max_pending)


def _where(params: dict[str, Any]) -> str:
    """``user@host:port/dbname`` for messages (never the password)."""
    user = params.get("user") or "(default user)"
    host = params.get("host") or params.get("hostaddr") or "(local socket)"
    port = f":{params['port']}" if params.get("port") else ""
    return f"PostgreSQL {user}@{host}{port}/{params.get('dbname') or user}"


async def _resolved(params: dict[str, Any], where: str) -> dict[str, Any]:
    """``params`` with every host name resolved: one ``host``/``hostaddr``/``port`` entry per
    address, which libpq tries in order."""
    if params.get("service"):  # a service file's host would be resolved inside libpq
        raise UserError(f"{where}: a service= URL is not taken; give the host in the URL")
    if not params.get("host") and not params.get("hostaddr"):
        # libpq would take PGHOST (or PGHOSTADDR) itself, and resolve it on the event loop
        for name, variable in (("host", "PGHOST"), ("hostaddr", "PGHOSTADDR")):
            if os.environ.get(variable):
                params = {**params, name: os.environ[variable]}
    if params.get("hostaddr") or not params.get("host"):
        return params
    hosts = str(params["host"]).split(",")
    ports = str(params.get("port") or "").split(",")
    if len(ports) == 1:
        ports *= len(hosts)
    if len(ports) != len(hosts):
        raise UserError(f"{where}: as many ports as hosts, or one port for all")
    host_list, addr_list, port_list, failures = [], [], [], []
    for host, port in zip(hosts, ports, strict=True):
        if host.startswith(("/", "@")):  # a Unix socket's directory: nothing to resolve
            found = [""]
        else:
            try:
                found = [str(ipaddress.ip_address(host))]
            except ValueError:
                try:
                    infos = await trio.socket.getaddrinfo(host, None, type=trio.socket.SOCK_STREAM)
                except OSError as exc:
                    failures.append(f"cannot resolve {host!r}: {exc}")
                    continue
                found = list(dict.fromkeys(str(info[4][0]) for info in infos))
        for address in found:
            host_list.append(host)
            addr_list.append(address)
            port_list.append(port)
    if not host_list:
        raise DatabaseUnavailable(f"cannot connect to {where}: {'; '.join(failures)}")
    return {
        **params,
        "host": ",".join(host_list),
        "hostaddr": ",".join(addr_list),
        "port": ",".join(port_list),
    }


async def _handshake(conninfo: bytes, where: str) -> pq.abc.PGconn:
    pgconn = pq.PGconn.connect_start(conninfo)
    try:
        while (status := pgconn.connect_poll()) != pq.PollingStatus.OK:
            if status == pq.PollingStatus.FAILED:
                # libpq's lines (the second indented by a tab) as one line
                reason = "; ".join(
                    line.strip() for line in pgconn.get_error_message().splitlines() if line.strip()
                )
                raise DatabaseUnavailable(f"cannot connect to {where}: {reason}")
            if status == pq.PollingStatus.READING:
                await trio.lowlevel.wait_readable(pgconn.socket)
            else:
                await trio.lowlevel.wait_writable(pgconn.socket)
    except BaseException:
        pgconn.finish()
        raise
    return pgconn


# -- the pool ------------------------------------------------------------------------------


SCHEMA_LOCK = 0x5357414D  # 'SWAM': one process makes swamp's tables at a time


async def make_schema(pool: Pool, schema: str) -> None:
    """Run ``schema``'s statements (``;``-separated, each ``IF NOT EXISTS``) in one
    transaction, one process at a time: several orchestrators starting at once on one
    database would race ``CREATE … IF NOT EXISTS`` (it is not safe against itself)."""
    async with pool.connection() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", (SCHEMA_LOCK,))
        for statement in filter(str.strip, schema.split(";")):
            await conn.execute(statement)


_HAS_COLUMN = (
    "SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema() "
    "AND table_name = $1 AND column_name = $2"
)


async def add_column(pool: Pool, table: str, column: str, *statements: str) -> None:
    """Run ``statements`` (the ``ALTER TABLE`` adding ``table.column``, and what goes with it)
    only where the column is missing, one process at a time: ``ALTER TABLE … ADD COLUMN IF NOT
    EXISTS`` takes the table's exclusive lock even when it changes nothing, so every start
    would wait behind any reader and hold up every writer meanwhile."""
    async with pool.connection() as conn:
        if (await conn.execute(_HAS_COLUMN, (table, column))).rows:
            return
    async with pool.connection() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", (SCHEMA_LOCK,))
        if (await conn.execute(_HAS_COLUMN, (table, column))).rows:
            return  # another start added it meanwhile
        for statement in statements:
            await conn.execute(statement)


class Pool:
    """At most ``size`` connections to ``url``, opened when first needed. Tasks waiting for
    one are served first come, first served (``trio.Semaphore`` hands a freed place to the
    longest waiter), for ``wait`` seconds at most. A connection comes back closed, broken, or
    inside a transaction: it is dropped, and replaced when next needed."""

    def __init__(self, url: str, *, size: int = 4, wait: float = POOL_WAIT) -> None:
        if size < 1:
            raise UserError("a pool holds at least one connection")
        self._url = url
        self._size = size
        self._wait = wait
        self._places = trio.Semaphore(size)
        self._idle: list[Connection] = []  # the most recently used last: warm, reused first
        self._closed = False

    @asynccontextmanager
    async def connection(self, *, wait: float | None = None) -> AsyncIterator[Connection]:
        """A connection for the block: waits up to ``wait`` seconds (the pool's by default)
        for a free one, then :class:`PoolTimeout`."""
        conn = await self._acquire(self._wait if wait is None else wait)
        try:
            yield conn
        finally:
            self._release(conn)

    async def _acquire(self, wait: float) -> Connection:
        if self._closed:
            raise ConnectionLost("the pool is closed")
        placed = False
        try:  # a free place is taken at once, whatever the wait (wait=0: no wait at all)
            self._places.acquire_nowait()
            placed = True
        except trio.WouldBlock:
            with trio.move_on_after(max(wait, 0)):
                await self._places.acquire()
                placed = True
        if not placed:
            raise PoolTimeout(
                f"no connection of the pool ({self._size}) came free within {wait:g}s: "
                "statements run long, or too many tasks want one at once"
            )
        try:
            if self._closed:
                raise ConnectionLost("the pool is closed")
            while self._idle:
                conn = self._idle.pop()
                if conn.alive() and not conn.in_transaction:
                    return conn
                conn.close()
            return await connect(self._url)
        except BaseException:
            self._places.release()
            raise

    def _release(self, conn: Connection) -> None:
        if self._closed or conn.closed or conn.in_transaction:
            conn.close()
        else:
            self._idle.append(conn)
        self._places.release()

    async def aclose(self) -> None:
        """Close the idle connections now, the ones in use as they come back."""
        self._closed = True
        while self._idle:
            self._idle.pop().close()
        await trio.lowlevel.checkpoint()

    def statistics(self) -> dict[str, int]:
        in_use = self._size - self._places.value
        waiting = self._places.statistics().tasks_waiting
        return {"size": self._size, "in_use": in_use, "idle": len(self._idle), "waiting": waiting}

    def __repr__(self) -> str:
        s = self.statistics()
        state = " closed" if self._closed else ""
        return (
            f"<Pool{state} size={s['size']} in_use={s['in_use']} idle={s['idle']} "
            f"waiting={s['waiting']}>"
        )

    async def __aenter__(self) -> Pool:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
