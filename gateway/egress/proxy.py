"""The egress proxy of one run: CONNECT and plain-HTTP forwarding on a unix socket, both under the same checks.

Every connection is checked the same way whichever method carries it: the host and port against the run's
`EgressRules`, the limits of the run, then the proxy resolves the name itself, checks every address and connects to the
address it checked (no second lookup, so a rebinding resolver gains nothing). CONNECT tunnels carry TLS only, and the
ClientHello's server name must be the CONNECT host (no domain fronting). Plain HTTP is forwarded one request per
connection (``Connection: close``), with the Host header equal to the absolute URI's authority. Once a tunnel's
ClientHello passed, its bytes are opaque: on Linux the kernel copies them (`gateway.egress.splice`).

Each connection yields one `ConnectionRecord` through the ``on_record`` callback; a later piece writes them to the
audit trail. A denial before the tunnel opens answers 403 (502 when the name does not resolve or the upstream does not
answer) with the rule id on the body's first line.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections import deque
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from gateway.egress import splice
from gateway.egress.addresses import (
    Destination,
    EgressRules,
    IPAddress,
    Match,
    Verdict,
    normalise_name,
    parse_ip_literal,
)
from gateway.egress.secrets import Injection, Redaction, SecretRule
from gateway.egress.tls import HelloError, read_client_hello

__all__ = [
    "ConnectionRecord",
    "EgressLimits",
    "EgressPlan",
    "EgressProxy",
    "EgressReport",
    "EgressStats",
    "Resolver",
    "SystemResolver",
]

MAX_HEAD_BYTES = 16 * 1024
"""The largest request head (request line and headers) the proxy reads."""
COPY_BYTES = 256 * 1024
"""The most one read takes from either side of a connection: the upstream's read buffer is sized to it (a 16 KiB
buffer paused the upstream every 32 KiB and cost the proxy three times the CPU per GB), which bounds what one slow
client can make the proxy hold for it (twice this, plus the writer's buffer)."""

RULE_MALFORMED = "network.egress.request"
RULE_HOST_MISMATCH = "network.egress.host-mismatch"
RULE_SNI = "network.egress.sni"
RULE_RESOLVE = "network.egress.resolve"
RULE_UPSTREAM = "network.egress.upstream"
RULE_CONNECTIONS = "network.egress.limit.connections"
RULE_RATE = "network.egress.limit.rate"
RULE_BYTES_OUT = "network.egress.limit.bytes-out"
RULE_BYTES_IN = "network.egress.limit.bytes-in"
RULE_RUN_ENDED = "network.egress.run-ended"

_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authorization", "proxy-authenticate", "proxy-connection", "te", "trailer"}
    | {"transfer-encoding", "upgrade"}
)


class Resolver(Protocol):
    """Resolves a host name to its addresses; tests pass a fake one, the gateway the system resolver."""

    async def resolve(self, host: str, port: int) -> Sequence[IPAddress]: ...


class SystemResolver:
    """The host's resolver (``getaddrinfo``) through the running event loop."""

    async def resolve(self, host: str, port: int) -> Sequence[IPAddress]:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        found: list[IPAddress] = []
        for _family, _type, _proto, _name, sockaddr in infos:
            address = parse_ip_literal(str(sockaddr[0]))
            if address is not None and address not in found:
                found.append(address)
        return found


@dataclass(frozen=True)
class EgressLimits:
    """The limits of one run's egress; the proxy refuses (or ends) what goes past them."""

    connections: int = 256
    """Connections the run may open in all."""
    bytes_out: int = 256 * 1024 * 1024
    """Bytes the run may send upstream in all (request heads and bodies, tunnelled bytes)."""
    bytes_in: int = 1024 * 1024 * 1024
    """Bytes the run may receive from upstreams in all."""
    rate: int = 32
    """Connection attempts allowed within any ``rate_window`` seconds."""
    rate_window: float = 1.0
    head_timeout: float = 10.0
    """Seconds the client has to send its request head, and its ClientHello through a tunnel."""
    connect_timeout: float = 10.0
    """Seconds to resolve a name and to connect to the upstream."""


@dataclass(frozen=True)
class ConnectionRecord:
    """What one connection through the proxy did: the audit trail writes one ``network.connection`` per record."""

    method: str
    """``CONNECT`` or the plain-HTTP method; empty when the request could not be read."""
    host: str
    port: int
    address: str | None
    """The address connected to (the one checked), or None when none was."""
    allowed: bool
    rule: str
    """The rule id that decided the connection (allowing entry or denying check)."""
    message: str
    bytes_out: int
    bytes_in: int
    duration: float
    """Seconds from accepting the connection to its end, on the proxy's clock."""
    ended: str
    """How it ended: ``denied``, ``closed`` (the upstream finished), ``limit``, ``run-ended``, ``error``."""
    secret: str | None = None
    """The name of the secret the proxy set on the request (its value never), or None."""


@dataclass
class EgressStats:
    """Totals of one run's egress, reported with its result."""

    connections: int = 0
    """Connections the proxy opened upstream."""
    denied: int = 0
    bytes_out: int = 0
    bytes_in: int = 0
    limited: int = 0
    """Connections refused or ended by a limit."""


@dataclass(frozen=True)
class EgressPlan:
    """What the decision allows one run to reach, as the runner hands it to the run's proxy (``RunSpec.egress``)."""

    destinations: tuple[Destination, ...]
    limits: EgressLimits
    secrets: tuple[SecretRule, ...] = ()
    """The secret rules the proxy injects (names, hosts, header templates; the runner looks the values up)."""
    values: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)
    """The values of ``secrets`` by name, set by the runner just before the proxy starts: they exist only in the
    gateway process (no record serialises an ``EgressPlan``; the decision's plan names the secrets only)."""


@dataclass(frozen=True)
class EgressReport:
    """One run's egress as the runner returns it (``Outcome.egress``): its connection records and totals.

    ``records`` keeps at most a bounded number of records (the runner's cap); ``dropped`` counts the ones left out,
    which the totals still count."""

    records: tuple[ConnectionRecord, ...]
    connections: int
    """Connections the proxy opened upstream."""
    denied: int
    """Connection attempts refused (by a rule or a limit)."""
    bytes_out: int
    bytes_in: int
    dropped: int = 0
    redactions: tuple[Redaction, ...] = ()
    """Where the values of the run's secrets were found in its output and erased (the runner fills it)."""


class _Denied(Exception):  # noqa: N818 -- a control-flow signal carrying the verdict, not an error to report
    def __init__(self, rule: str, message: str, status: int = 403) -> None:
        super().__init__(message)
        self.rule, self.message, self.status = rule, message, status


class _Ended(Exception):  # noqa: N818 -- ends a forwarding connection with a reason
    def __init__(self, ended: str, rule: str = "", message: str = "") -> None:
        super().__init__(ended)
        self.ended, self.rule, self.message = ended, rule, message


@dataclass
class _Connection:
    started: float
    method: str = ""
    host: str = ""
    port: int = 0
    address: str | None = None
    allowed: bool = False
    rule: str = RULE_MALFORMED
    message: str = ""
    bytes_out: int = 0
    bytes_in: int = 0
    ended: str = "error"
    secret: str | None = None


class EgressProxy:
    """One run's egress proxy: `start` listens on the run's unix socket, `close` ends every connection.

    ``clock`` measures durations and the connection rate (tests pass a fixed one); ``on_record`` receives one
    `ConnectionRecord` per connection, called on the event loop, and must not block.
    ``injections`` maps a host name to the header the proxy sets on each plain-HTTP request to it (a header of
    that name the client sent is dropped); the proxy never follows a redirect, so the header goes to that host only.
    """

    def __init__(
        self,
        rules: EgressRules,
        *,
        on_record: Callable[[ConnectionRecord], None],
        limits: EgressLimits | None = None,
        resolver: Resolver | None = None,
        clock: Callable[[], float] = time.monotonic,
        injections: Mapping[str, Injection] | None = None,
    ) -> None:
        self.rules = rules
        self._injections = dict(injections or {})
        self.limits = limits or EgressLimits()
        self.stats = EgressStats()
        self._on_record = on_record
        self._resolver: Resolver = resolver or SystemResolver()
        self._clock = clock
        self._attempts: deque[float] = deque()
        self._listener: socket.socket | None = None
        self._path: Path | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._paused = False

    async def start(self, path: Path) -> None:
        """Listens on ``path`` (a unix socket the caller chose for this run; an existing file there is an error)."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.setblocking(False)
            listener.bind(str(path))
            listener.listen(128)
        except OSError:
            listener.close()
            raise
        self._listener, self._path = listener, path
        asyncio.get_running_loop().add_reader(listener.fileno(), self._accept, listener)

    async def close(self) -> None:
        """The run ended: stop listening and end every open connection (each records ``run-ended``)."""
        if self._listener is not None:
            asyncio.get_running_loop().remove_reader(self._listener.fileno())
            self._listener.close()  # the kernel resets connections still waiting in the backlog
            assert self._path is not None  # noqa: S101 -- set with the listener
            self._path.unlink(missing_ok=True)
            self._listener = None
        # Connections accepted just now take their first step, so that cancelling them runs their clean-up.
        await asyncio.sleep(0)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _accept(self, listener: socket.socket) -> None:
        """Accepts waiting connections, each into a task of its own, synchronously: no accepted socket is ever lost.

        (asyncio's servers, and an awaited ``sock_accept``, can drop a socket accepted just as the run ends, leaving
        that connection open.)
        """
        while True:
            try:
                client, _address = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                # Out of descriptors: stop watching the listener (it would wake the loop at once, forever) until one
                # of this run's connections ends; meanwhile connections wait in the backlog.
                asyncio.get_running_loop().remove_reader(listener.fileno())
                self._paused = True
                return
            client.setblocking(False)
            task = asyncio.ensure_future(self._serve(client))
            self._tasks.add(task)
            task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if self._paused and self._listener is not None:
            self._paused = False
            asyncio.get_running_loop().add_reader(self._listener.fileno(), self._accept, self._listener)

    async def _serve(self, client: socket.socket) -> None:
        conn = _Connection(started=self._clock())
        writer: asyncio.StreamWriter | None = None
        try:
            reader, writer = await asyncio.open_unix_connection(sock=client, limit=MAX_HEAD_BYTES)
            await self._handle(conn, reader, writer)
        except _Denied as denial:
            conn.rule, conn.message, conn.ended = denial.rule, denial.message, "denied"
            assert writer is not None  # noqa: S101 -- denials come from _handle, which has the streams
            with contextlib.suppress(OSError):
                body = f"{denial.rule}\n{denial.message}\n".encode()
                reason = "Forbidden" if denial.status == 403 else "Bad Gateway"
                writer.write(
                    f"HTTP/1.1 {denial.status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
        except _Ended as end:
            conn.ended, conn.rule, conn.message = end.ended, end.rule, end.message
            if end.ended == "denied":
                conn.allowed = False
        except asyncio.CancelledError:
            conn.ended = "run-ended"
            if not conn.allowed:
                conn.rule, conn.message = RULE_RUN_ENDED, "the run ended before the connection was allowed"
        except (OSError, asyncio.IncompleteReadError) as exc:
            conn.ended, conn.message = "error", conn.message or f"connection failed: {exc}"
        finally:
            if writer is not None:
                writer.close()
            else:
                client.close()
            if conn.ended == "denied":
                self.stats.denied += 1
            self._on_record(
                ConnectionRecord(
                    method=conn.method,
                    host=conn.host,
                    port=conn.port,
                    address=conn.address,
                    allowed=conn.allowed,
                    rule=conn.rule,
                    message=conn.message,
                    bytes_out=conn.bytes_out,
                    bytes_in=conn.bytes_in,
                    duration=self._clock() - conn.started,
                    ended=conn.ended,
                    secret=conn.secret,
                )
            )

    async def _handle(self, conn: _Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.limits.head_timeout)
        except TimeoutError as exc:
            raise _Denied(RULE_MALFORMED, "the client sent no request head in time") from exc
        except (asyncio.LimitOverrunError, asyncio.IncompleteReadError) as exc:
            raise _Denied(RULE_MALFORMED, f"the request head is incomplete or over {MAX_HEAD_BYTES} bytes") from exc
        self._count_attempt()
        method, target, headers = _parse_head(head)
        conn.method = method
        body_length = None
        if method == "CONNECT":
            host, port = _split_authority(target, default_port=None)
        else:
            host, port, path = _absolute_http_target(target)
            body_length = _request_body_length(headers)
        conn.host, conn.port = host, port
        _check_host_header(headers, host, port, method)
        match = self.rules.match(host, port)
        if isinstance(match, Verdict):
            raise _Denied(match.rule, match.message)
        conn.host = match.host
        address = await self._resolve_checked(match)
        self._count_connection()
        conn.address = str(address)
        upstream = await self._connect(address, port)
        conn.allowed, conn.rule, conn.message = True, match.destination.rule_id, f"{match.host}:{port} allowed"
        self.stats.connections += 1
        if method == "CONNECT" and splice.AVAILABLE:
            with upstream:
                first = await self._open_tunnel(conn, match, reader, writer)
                await self._splice_tunnel(conn, reader, writer, upstream, first)
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(sock=upstream, limit=COPY_BYTES)
        except BaseException:
            upstream.close()
            raise
        try:  # the streams own the upstream socket now
            if method == "CONNECT":
                first = await self._open_tunnel(conn, match, reader, writer)
            else:
                injection = self._injections.get(match.host) if match.literal is None else None
                first = _origin_request(method, path, headers, match.host, port, injection=injection)
                conn.secret = injection.name if injection is not None else None
                self._count(conn, "out", len(first))
            upstream_writer.write(first)
            await self._pump(conn, reader, upstream_reader, writer, upstream_writer, request_body=body_length)
        finally:
            upstream_writer.close()

    async def _open_tunnel(
        self, conn: _Connection, match: Match, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bytes:
        """Answers the CONNECT and returns the client's ClientHello once it passed the checks, counted out."""
        writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        await writer.drain()
        first = await self._checked_hello(conn, match, reader)
        self._count(conn, "out", len(first))
        return first

    def _count_attempt(self) -> None:
        now = self._clock()
        window = self._attempts
        while window and window[0] <= now - self.limits.rate_window:
            window.popleft()
        if len(window) >= self.limits.rate:
            self.stats.limited += 1
            raise _Denied(
                RULE_RATE,
                f"more than {self.limits.rate} connections within {self.limits.rate_window} s; the run's rate limit",
            )
        window.append(now)

    def _count_connection(self) -> None:
        if self.stats.connections >= self.limits.connections:
            self.stats.limited += 1
            raise _Denied(RULE_CONNECTIONS, f"the run has opened its {self.limits.connections} connections")

    async def _resolve_checked(self, match: Match) -> IPAddress:
        if match.literal is not None:
            addresses: Sequence[IPAddress] = [match.literal]
        else:
            try:
                addresses = await asyncio.wait_for(
                    self._resolver.resolve(match.host, match.port), self.limits.connect_timeout
                )
            except (OSError, TimeoutError, ValueError) as exc:
                raise _Denied(RULE_RESOLVE, f"host {match.host!r} did not resolve: {exc}", status=502) from exc
        verdict = self.rules.check_addresses(match, addresses)
        if not verdict.allowed:
            raise _Denied(verdict.rule, verdict.message)
        return addresses[0]

    async def _connect(self, address: IPAddress, port: int) -> socket.socket:
        """A non-blocking socket connected to ``address`` (the one checked), without Nagle's delay like asyncio's."""
        upstream = socket.socket(socket.AF_INET6 if address.version == 6 else socket.AF_INET, socket.SOCK_STREAM)
        try:
            upstream.setblocking(False)
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connecting = asyncio.get_running_loop().sock_connect(upstream, (str(address), port))
            await asyncio.wait_for(connecting, self.limits.connect_timeout)
        except (OSError, TimeoutError) as exc:
            upstream.close()
            raise _Denied(RULE_UPSTREAM, f"{address} port {port} did not accept the connection: {exc}", 502) from exc
        except BaseException:
            upstream.close()
            raise
        return upstream

    async def _checked_hello(self, conn: _Connection, match: Match, reader: asyncio.StreamReader) -> bytes:
        try:
            hello = await asyncio.wait_for(read_client_hello(reader), self.limits.head_timeout)
        except TimeoutError as exc:
            raise self._tunnel_denied(conn, "the client sent no TLS ClientHello in time") from exc
        except HelloError as exc:
            raise self._tunnel_denied(conn, str(exc)) from exc
        if hello.server_name is None:
            if match.literal is None:
                raise self._tunnel_denied(conn, f"the ClientHello names no server; it must name {match.host!r}")
            return hello.raw
        try:
            sni = normalise_name(hello.server_name)
        except ValueError:
            sni = hello.server_name
        if sni != match.host:
            raise self._tunnel_denied(conn, f"the ClientHello names {sni!r}, the CONNECT asked for {match.host!r}")
        return hello.raw

    def _tunnel_denied(self, conn: _Connection, message: str) -> _Ended:
        """A denial after the tunnel opened: no 403 can reach a client speaking TLS, so the tunnel just closes."""
        conn.allowed = False
        return _Ended("denied", RULE_SNI, message)

    def _budget(self, direction: str) -> int:
        """The bytes the run may still move ``out`` (upstream) or ``in``."""
        if direction == "out":
            return self.limits.bytes_out - self.stats.bytes_out
        return self.limits.bytes_in - self.stats.bytes_in

    def _count(self, conn: _Connection, direction: str, size: int) -> None:
        if size > self._budget(direction):
            raise self._limit_reached(direction)
        if direction == "out":
            self.stats.bytes_out += size
            conn.bytes_out += size
        else:
            self.stats.bytes_in += size
            conn.bytes_in += size

    def _limit_reached(self, direction: str) -> _Ended:
        self.stats.limited += 1
        if direction == "out":
            return _Ended("limit", RULE_BYTES_OUT, f"the run reached its {self.limits.bytes_out} bytes out")
        return _Ended("limit", RULE_BYTES_IN, f"the run reached its {self.limits.bytes_in} bytes in")

    async def _pump(
        self,
        conn: _Connection,
        client_reader: asyncio.StreamReader,
        upstream_reader: asyncio.StreamReader,
        client: asyncio.StreamWriter,
        upstream: asyncio.StreamWriter,
        *,
        request_body: int | None,
    ) -> None:
        """Copies both ways until the upstream closes or a check ends it; ``request_body`` bounds plain HTTP."""

        async def outward() -> None:
            remaining = request_body
            while remaining is None or remaining > 0:
                data = await client_reader.read(COPY_BYTES if remaining is None else min(COPY_BYTES, remaining))
                if not data and remaining is not None:
                    return  # the client gave up in the middle of its request body
                if not data:
                    if upstream.can_write_eof():
                        upstream.write_eof()  # a tunnel's client finished sending; the upstream may still answer
                    await asyncio.Event().wait()
                self._count(conn, "out", len(data))
                upstream.write(data)
                await upstream.drain()
                if remaining is not None:
                    remaining -= len(data)
            # Plain HTTP: one request per connection. Anything more would be a second request the checks never saw.
            if await client_reader.read(1):
                raise _Ended("denied", RULE_MALFORMED, "the client sent more than one request on a proxied connection")
            await asyncio.Event().wait()  # the client waits for the response; the inward copy ends the connection

        async def inward() -> None:
            while data := await upstream_reader.read(COPY_BYTES):
                self._count(conn, "in", len(data))
                client.write(data)
                await client.drain()

        await _both_ways(outward(), inward())
        conn.ended = "closed"

    async def _splice_tunnel(
        self,
        conn: _Connection,
        client_reader: asyncio.StreamReader,
        client: asyncio.StreamWriter,
        upstream: socket.socket,
        first: bytes,
    ) -> None:
        """Copies a checked tunnel both ways in the kernel (`splice`) until the upstream closes or a limit ends it.

        ``first`` (the ClientHello) and what the client's reader already holds go upstream first; then the copies
        run on a duplicate of the client's socket, while its stream stays paused until `_serve` closes it.
        """
        held = await _take_held_bytes(client_reader, client)
        self._count(conn, "out", len(held))
        await asyncio.get_running_loop().sock_sendall(upstream, first + held)
        client.transport.set_write_buffer_limits(high=0)
        await client.drain()  # with no buffer allowed, drain() returns once the stream's writes have all left
        with _socket_of(client) as client_socket:

            async def one_way(source: socket.socket, sink: socket.socket, direction: str) -> None:
                if not await splice.copy(
                    source,
                    sink,
                    budget=lambda: self._budget(direction),
                    moved=lambda size: self._count(conn, direction, size),
                ):
                    raise self._limit_reached(direction)

            async def outward() -> None:
                await one_way(client_socket, upstream, "out")
                upstream.shutdown(socket.SHUT_WR)  # the client finished sending; the upstream may still answer
                await asyncio.Event().wait()

            await _both_ways(outward(), one_way(upstream, client_socket, "in"))
        conn.ended = "closed"


async def _both_ways(outward: Coroutine[None, None, None], inward: Coroutine[None, None, None]) -> None:
    """Runs both copies of a connection until the inward one ends (the upstream closed) or either fails."""
    tasks = [asyncio.ensure_future(outward), asyncio.ensure_future(inward)]
    try:
        done, _pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in done:
        error = task.exception()
        if error is not None:
            raise error


async def _take_held_bytes(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    """Stops the stream from reading its socket and returns the bytes its reader already holds."""
    transport = writer.transport
    assert isinstance(transport, asyncio.Transport)  # noqa: S101 -- a socket's transport reads and writes
    transport.pause_reading()
    reader.feed_eof()  # nothing more arrives through the reader, so read() returns just what it holds
    held = await reader.read()
    transport.pause_reading()  # read() resumes a transport that the reader itself paused (its buffer full)
    return held


def _socket_of(writer: asyncio.StreamWriter) -> socket.socket:
    """A duplicate of the stream's socket, non-blocking like it (the transport keeps, and later closes, its own)."""
    duplicate: socket.socket = writer.get_extra_info("socket").dup()
    return duplicate


def _parse_head(head: bytes) -> tuple[str, str, list[tuple[str, str]]]:
    try:
        text = head.decode("ascii")
    except UnicodeDecodeError as exc:
        raise _Denied(RULE_MALFORMED, "the request head is not ASCII") from exc
    lines = text[:-4].split("\r\n")
    if any(char in line for line in lines for char in "\r\n\x00"):
        # A bare CR or LF would be a line break to some upstreams: a header (a second Host) the checks never saw.
        raise _Denied(RULE_MALFORMED, "the request head holds a bare CR, LF or NUL; end every line with CRLF")
    parts = lines[0].split(" ")
    if len(parts) != 3 or parts[2] not in ("HTTP/1.1", "HTTP/1.0") or not parts[0].isalpha():
        raise _Denied(RULE_MALFORMED, f"the request line {lines[0][:200]!r} is not 'METHOD target HTTP/1.x'")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or line[:1] in (" ", "\t"):
            raise _Denied(RULE_MALFORMED, f"the header line {line[:200]!r} is malformed")
        headers.append((name, value.strip()))
    return parts[0].upper(), parts[1], headers


def _split_authority(authority: str, *, default_port: int | None) -> tuple[str, int]:
    if authority.startswith("["):
        host, sep, rest = authority.partition("]")
        host += sep
        port_text = rest.removeprefix(":") if rest.startswith(":") else ("" if not rest else None)
    else:
        host, sep, port_text = authority.rpartition(":") if ":" in authority else (authority, "", "")
        if host.count(":") > 0:
            raise _Denied(RULE_MALFORMED, f"the authority {authority!r} holds an IPv6 literal without brackets")
    if port_text is None or (port_text and not port_text.isdigit()):
        raise _Denied(RULE_MALFORMED, f"the authority {authority!r} has no valid port")
    if not port_text:
        if default_port is None:
            raise _Denied(RULE_MALFORMED, f"CONNECT {authority!r} names no port; write host:port")
        return host, default_port
    port = int(port_text)
    if not 0 < port < 65536 or not host:
        raise _Denied(RULE_MALFORMED, f"the authority {authority!r} has no host or a port outside 1-65535")
    return host, port


def _absolute_http_target(target: str) -> tuple[str, int, str]:
    parts = urlsplit(target)
    if parts.scheme.lower() != "http" or not parts.netloc:
        raise _Denied(
            RULE_MALFORMED,
            f"the request target {target[:200]!r} is not an absolute http:// URI; use CONNECT for https",
        )
    if "@" in parts.netloc:
        raise _Denied(RULE_MALFORMED, "the request target carries user information; the proxy forwards none")
    host, port = _split_authority(parts.netloc, default_port=80)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return host, port, path


def _same_host(left: str, right: str) -> bool:
    try:
        left_literal, right_literal = parse_ip_literal(left), parse_ip_literal(right)
        if left_literal is not None or right_literal is not None:
            return left_literal == right_literal
        return normalise_name(left) == normalise_name(right)
    except ValueError:
        return False


def _check_host_header(headers: list[tuple[str, str]], host: str, port: int, method: str) -> None:
    values = [value for name, value in headers if name.lower() == "host"]
    if len(values) > 1:
        raise _Denied(RULE_HOST_MISMATCH, "the request carries several Host headers")
    if not values:
        if method == "CONNECT":
            return
        raise _Denied(RULE_HOST_MISMATCH, "the request carries no Host header; HTTP/1.1 requires one")
    header_host, header_port = _split_authority(values[0], default_port=443 if method == "CONNECT" else 80)
    if not _same_host(header_host, host) or header_port != port:
        raise _Denied(
            RULE_HOST_MISMATCH,
            f"the Host header {values[0]!r} differs from the request target {host}:{port}; they must name one host",
        )


def _request_body_length(headers: list[tuple[str, str]]) -> int:
    if any(name.lower() == "transfer-encoding" for name, _value in headers):
        raise _Denied(RULE_MALFORMED, "chunked request bodies are not forwarded; send Content-Length")
    lengths = {value for name, value in headers if name.lower() == "content-length"}
    if len(lengths) > 1 or not all(value.isdigit() for value in lengths):
        raise _Denied(RULE_MALFORMED, "the request carries conflicting or invalid Content-Length headers")
    return int(lengths.pop()) if lengths else 0


def _origin_request(
    method: str, path: str, headers: list[tuple[str, str]], host: str, port: int, *, injection: Injection | None
) -> bytes:
    authority = host if port == 80 else f"{host}:{port}"
    if ":" in host:
        authority = f"[{host}]" if port == 80 else f"[{host}]:{port}"
    lines = [f"{method} {path} HTTP/1.1", f"Host: {authority}"]
    dropped = _HOP_BY_HOP | {"host"} | ({injection.header.lower()} if injection is not None else set())
    lines += [f"{name}: {value}" for name, value in headers if name.lower() not in dropped]
    if injection is not None:
        lines.append(f"{injection.header}: {injection.value}")
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")
