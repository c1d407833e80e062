"""The egress proxy's ClientHello reader: the server name of real hellos, and what it refuses to judge."""

from __future__ import annotations

import asyncio
import ssl

import pytest

from gateway.egress.tls import MAX_HELLO_BYTES, ClientHello, HelloError, read_client_hello


def client_hello(server_name: str | None) -> bytes:
    """The ClientHello Python's ssl module sends for ``server_name`` (None sends no SNI)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = server_name is not None
    tls = context.wrap_bio(ssl.MemoryBIO(), outgoing := ssl.MemoryBIO(), server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def read(data: bytes) -> ClientHello:
    async def scenario() -> ClientHello:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        return await read_client_hello(reader)

    return asyncio.run(scenario())


def test_a_real_hello_yields_its_server_name_and_its_exact_bytes() -> None:
    raw = client_hello("mirror.internal")
    hello = read(raw + b"application data after the hello")
    assert hello.server_name == "mirror.internal"
    assert hello.raw == raw


def test_a_hello_without_sni_yields_none() -> None:
    assert read(client_hello(None)).server_name is None


def test_a_hello_split_over_two_records_is_reassembled() -> None:
    raw = client_hello("mirror.internal")
    body = raw[5:]
    first, second = body[:40], body[40:]
    split = b"\x16\x03\x01" + len(first).to_bytes(2, "big") + first + b"\x16\x03\x01" + len(second).to_bytes(2, "big")
    assert read(split + second).server_name == "mirror.internal"


def with_extension(raw: bytes, kind: int, data: bytes) -> bytes:
    """The hello with one more extension appended (record, handshake and extension lengths fixed up)."""
    body = bytearray(raw[9:])
    at = 2 + 32
    at += 1 + body[at]
    at += 2 + int.from_bytes(body[at : at + 2], "big")
    at += 1 + body[at]
    extensions_length = int.from_bytes(body[at : at + 2], "big")
    extra = kind.to_bytes(2, "big") + len(data).to_bytes(2, "big") + data
    body[at : at + 2] = (extensions_length + len(extra)).to_bytes(2, "big")
    body += extra
    handshake = b"\x01" + len(body).to_bytes(3, "big") + body
    return raw[:3] + len(handshake).to_bytes(2, "big") + handshake


def test_encrypted_client_hello_is_refused() -> None:
    with pytest.raises(HelloError, match="Encrypted Client Hello"):
        read(with_extension(client_hello("mirror.internal"), 0xFE0D, b"\x00"))


def test_a_second_server_name_extension_is_refused() -> None:
    name = b"evil.example"
    sni = (len(name) + 3).to_bytes(2, "big") + b"\x00" + len(name).to_bytes(2, "big") + name
    with pytest.raises(HelloError, match="repeats"):
        read(with_extension(client_hello("mirror.internal"), 0x0000, sni))


@pytest.mark.parametrize(
    "data",
    [
        b"GET / HTTP/1.1\r\nHost: mirror.internal\r\n\r\n",  # plain HTTP through a tunnel
        b"SSH-2.0-OpenSSH_9.6\r\n",
        b"\x16\x03\x01\x00",  # truncated record header
        b"\x16\x03\x01\xff\xff" + b"\x01" * 10,  # the client closes before the record is whole
        b"\x16\x03\x01\x00\x04\x02\x00\x00\x00",  # a handshake that is not a ClientHello
        b"\x16\x03\x01\x00\x04\x01\xff\xff\xff",  # a ClientHello announcing 16 MB
    ],
)
def test_what_is_not_a_whole_client_hello_is_refused(data: bytes) -> None:
    with pytest.raises(HelloError):
        read(data)


def test_the_hello_is_bounded_in_size() -> None:
    record = b"\x16\x03\x01" + (16 * 1024).to_bytes(2, "big")
    handshake_header = b"\x01" + (MAX_HELLO_BYTES - 4).to_bytes(3, "big")
    data = record + handshake_header + bytes(16 * 1024 - 4)
    data += (record + bytes(16 * 1024)) * 4
    with pytest.raises(HelloError, match="over"):
        read(data)
