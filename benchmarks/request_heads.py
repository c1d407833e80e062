"""A request head as an attack: how much of a ``gateway serve`` process's memory a few huge headers take.

``--connections`` clients each send one header growing in 64 KiB pieces up to ``--mib`` MiB (bounded: the
script stops whatever the server does) and hold their connections open; the server's resident memory
(``VmRSS`` of its process) is read before and after, and what each client got back. Run it with
``--max-header-bytes 16777216`` for a head as good as unbounded at this size (the service before the bound),
and without it for the default bound (64 KiB). Only loopback is contacted.

Usage: ``PYTHONPATH=. .venv/bin/python benchmarks/request_heads.py [--connections 4] [--mib 8]
[--max-header-bytes N]``
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from service import gateway_serve_with, rss_mib  # the benchmark's own server helpers, next to this file

CHUNK = 64 * 1024


def attack(port: int, total: int) -> tuple[socket.socket, int, bytes]:
    """One connection sending a header of up to ``total`` bytes; the socket (left open), bytes sent, answer."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Filler: ")
    sent, piece = 0, b"a" * CHUNK
    while sent < total:
        try:
            sock.sendall(piece)
        except OSError:  # closed by the server
            break
        sent += len(piece)
    sock.settimeout(1)
    try:
        answer = sock.recv(200)
    except OSError:
        answer = b""
    return sock, sent, answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--mib", type=int, default=8)
    parser.add_argument("--max-header-bytes", type=int)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        settings = {} if args.max_header_bytes is None else {"max_header_bytes": args.max_header_bytes}
        with gateway_serve_with(work, settings) as (base, _token, pid):
            port = int(base.rsplit(":", 1)[1])
            before = rss_mib(pid)
            held = [attack(port, args.mib * 1024 * 1024) for _ in range(args.connections)]
            time.sleep(1)  # let the server take in what the kernel still buffers
            after = rss_mib(pid)
            for _sock, sent, answer in held:
                status = answer.partition(b"\r\n")[0].decode() or "(none)"
                print(f"sent {sent >> 10} KiB, answer: {status}")
            print(f"server RSS: {before:.0f} MiB before, {after:.0f} MiB after ({after - before:+.0f} MiB)")
            for sock, _sent, _answer in held:
                sock.close()


if __name__ == "__main__":
    main()
