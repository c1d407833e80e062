"""Docker's multiplexed attach stream split back into its parts, across chunks cut anywhere (a kernel reads one
stream cell after cell, so the demultiplexer keeps its place between reads)."""

from __future__ import annotations

import struct

from gateway.runner.docker.collect import Demux


def mux(stream: int, data: bytes) -> bytes:
    return struct.pack(">BxxxI", stream, len(data)) + data


def test_parts_come_back_whatever_the_chunking() -> None:
    raw = mux(1, b"frame bytes") + mux(2, b"diag") + mux(1, b"") + mux(1, b"more")
    for step in (1, 2, 5, 8, 9, len(raw)):
        demux = Demux()
        parts: dict[int, bytearray] = {1: bytearray(), 2: bytearray()}
        for i in range(0, len(raw), step):
            for stream, part in demux.feed(raw[i : i + step]):
                parts[stream] += part
        assert parts == {1: bytearray(b"frame bytesmore"), 2: bytearray(b"diag")}
