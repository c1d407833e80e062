"""Reads a TLS ClientHello from a stream and finds its server name (SNI), bounded in size, for the egress proxy.

The proxy reads the ClientHello a client sends through a CONNECT tunnel before it forwards a byte, so it can refuse a
server name other than the CONNECT host (domain fronting). It parses only the framing it needs, and refuses what it
cannot judge: no TLS handshake, several names, or Encrypted Client Hello (whose real name is hidden).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

__all__ = ["MAX_HELLO_BYTES", "ClientHello", "HelloError", "parse_client_hello", "read_client_hello"]

MAX_HELLO_BYTES = 64 * 1024
"""The largest ClientHello read (several records); post-quantum key shares make hellos of a few KB."""

_HANDSHAKE = 0x16
_CLIENT_HELLO = 0x01
_EXT_SERVER_NAME = 0x0000
_EXT_ENCRYPTED_CLIENT_HELLO = 0xFE0D


class HelloError(ValueError):
    """The bytes a client sent through a tunnel are not a ClientHello the proxy can judge."""


@dataclass(frozen=True)
class ClientHello:
    """A ClientHello read from the client: its exact bytes (forwarded unchanged) and its server name."""

    raw: bytes
    server_name: str | None


async def read_client_hello(reader: asyncio.StreamReader) -> ClientHello:
    """Reads TLS records until the ClientHello handshake message is whole (at most MAX_HELLO_BYTES).

    The caller bounds the wait with a timeout; this function bounds the size.
    """
    raw = bytearray()
    handshake = bytearray()
    while True:
        header = await _read_exactly(reader, 5, raw)
        if header[0] != _HANDSHAKE:
            raise HelloError("the client sent no TLS handshake through the tunnel; only TLS is allowed over CONNECT")
        length = int.from_bytes(header[3:5], "big")
        if length == 0 or len(raw) + length > MAX_HELLO_BYTES:
            raise HelloError(f"the TLS record length {length} is empty or makes a hello over {MAX_HELLO_BYTES} bytes")
        handshake += await _read_exactly(reader, length, raw)
        if len(handshake) >= 4:
            if handshake[0] != _CLIENT_HELLO:
                raise HelloError("the first TLS handshake message is not a ClientHello")
            needed = 4 + int.from_bytes(handshake[1:4], "big")
            if needed > MAX_HELLO_BYTES:
                raise HelloError(f"the ClientHello announces {needed} bytes, over {MAX_HELLO_BYTES}")
            if len(handshake) >= needed:
                return ClientHello(bytes(raw), parse_client_hello(bytes(handshake[4:needed])))


async def _read_exactly(reader: asyncio.StreamReader, size: int, raw: bytearray) -> bytes:
    try:
        data = await reader.readexactly(size)
    except asyncio.IncompleteReadError as exc:
        raise HelloError("the client closed the tunnel before its ClientHello was whole") from exc
    raw += data
    return data


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, size: int) -> bytes:
        if self.at + size > len(self.data):
            raise HelloError("the ClientHello is truncated")
        chunk = self.data[self.at : self.at + size]
        self.at += size
        return chunk

    def number(self, size: int) -> int:
        return int.from_bytes(self.take(size), "big")

    def vector(self, length_size: int) -> bytes:
        return self.take(self.number(length_size))


def parse_client_hello(body: bytes) -> str | None:
    """The host name a ClientHello body (after the 4-byte handshake header) carries in SNI, or None without one."""
    cursor = _Cursor(body)
    cursor.take(2 + 32)  # legacy_version, random
    cursor.vector(1)  # legacy_session_id
    cursor.vector(2)  # cipher_suites
    cursor.vector(1)  # legacy_compression_methods
    if cursor.at == len(body):
        return None  # no extensions at all
    extensions = _Cursor(cursor.vector(2))
    seen: set[int] = set()
    name: str | None = None
    while extensions.at < len(extensions.data):
        kind, data = extensions.number(2), extensions.vector(2)
        if kind in seen:
            raise HelloError(f"the ClientHello repeats extension {kind:#06x}")
        seen.add(kind)
        if kind == _EXT_ENCRYPTED_CLIENT_HELLO:
            raise HelloError("the ClientHello uses Encrypted Client Hello, which hides the server name")
        if kind == _EXT_SERVER_NAME:
            name = _server_name(data)
    return name


def _server_name(data: bytes) -> str:
    names = _Cursor(_Cursor(data).vector(2))
    found: list[str] = []
    while names.at < len(names.data):
        kind, value = names.number(1), names.vector(2)
        if kind != 0:
            raise HelloError(f"the ClientHello names a server of unknown type {kind}")
        found.append(value.decode("ascii", "replace"))
    if len(found) != 1:
        raise HelloError(f"the ClientHello names {len(found)} servers; exactly one is allowed")
    return found[0]
