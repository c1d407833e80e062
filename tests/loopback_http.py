"""An HTTP server on 127.0.0.1 for tests, answering GET requests from a method: what the package index and the npm
registry of the package tests are."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self
from urllib.parse import urlsplit


class LoopbackServer:
    """Serves GET requests with :meth:`answer` on 127.0.0.1 and a random port, in a thread, while entered; each path
    asked (without its query; an absolute URI, as a proxy forwards it, by its path) is appended to ``requests``.
    Subclasses (dataclasses) declare ``requests`` and ``_server`` (None)."""

    requests: list[str]
    _server: ThreadingHTTPServer | None

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.server_address[1])

    def answer(self, path: str) -> tuple[int, str, bytes]:
        """The answer to a GET of ``path``: status, content type, body."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        answer, seen = self.answer, self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = urlsplit(self.path).path
                seen.append(path)
                status, kind, body = answer(path)
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
