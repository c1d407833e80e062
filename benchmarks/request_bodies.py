"""Request bodies as an attack: how much of a ``gateway serve`` process's memory many large bodies at once take.

``--clients`` clients of one principal (its quotas well above the load) each announce a body of ``--mib`` MiB
(``max_body_bytes``) and send all of it but its last byte, so that the service holds what it reads of them; the
server's resident memory (``VmRSS`` of its process) is read before, while they are held (one second after the
last one was sent), and one second after the clients have left; and what each client got back. Run it with
``--max-body-bytes-in-flight 68719476736`` for a budget as good as unbounded at this size (the service before
the bound), and without it for the default budget (``2 x max_concurrent_executions x max_body_bytes``, one
principal at most half). Only loopback is contacted.

Usage: ``PYTHONPATH=. .venv/bin/python benchmarks/request_bodies.py [--clients 24] [--mib 4]
[--max-body-bytes-in-flight N]``
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from service import gateway_serve_with, rss_mib  # the benchmark's own server helpers, next to this file


class Client:
    """One connection sending a body of ``size`` bytes but its last byte (in a thread: the server may stop
    reading it), then waiting for an answer."""

    def __init__(self, port: int, token: str, size: int) -> None:
        body = json.dumps({"code": "#" * (size - len('{"code": ""}'))}).encode()
        head = (
            f"POST /v1/executions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=120)
        self.answer = b""
        self.sent = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(head + body[:-1],), daemon=True)
        self.thread.start()

    def _run(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
            self.sent.set()
            self.answer = self.sock.recv(65536)
        except OSError:
            self.sent.set()

    def status(self) -> str:
        return self.answer.partition(b"\r\n")[0].decode() or "(none: held)"

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.thread.join(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=24)
    parser.add_argument("--mib", type=int, default=4)
    parser.add_argument("--max-body-bytes-in-flight", type=int)
    args = parser.parse_args()
    size = args.mib * 1024 * 1024
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        settings: dict[str, object] = {"max_body_bytes": size, "body_read_s": 120}
        if args.max_body_bytes_in_flight is not None:
            settings["max_body_bytes_in_flight"] = args.max_body_bytes_in_flight
        with gateway_serve_with(work, settings) as (base, token, pid):
            port = int(base.rsplit(":", 1)[1])
            before = rss_mib(pid)
            clients = [Client(port, token, size) for _ in range(args.clients)]
            for client in clients:
                client.sent.wait(120)
            time.sleep(1)  # let the server take in what the kernel still buffers
            held = rss_mib(pid)
            answers = collections.Counter(client.status() for client in clients)
            for client in clients:
                client.close()
            time.sleep(1)
            after = rss_mib(pid)
            for status, count in sorted(answers.items()):
                print(f"{count} x {status}")
            print(
                f"server RSS: {before:.0f} MiB before, {held:.0f} MiB while held ({held - before:+.0f} MiB), "
                f"{after:.0f} MiB after the clients left ({after - before:+.0f} MiB)"
            )


if __name__ == "__main__":
    main()
