"""The Kubernetes API calls the backend makes, through the official ``kubernetes`` client, as plain dicts.

Why the official client and not ``lightkube`` (the evidence is in docs/ARCHITECTURE.md): the supervisor is the
container's PID 1 and gets its payload on stdin *after* the Pod started, which is the ``pods/attach``
subresource. The official client speaks it (``kubernetes.stream``, WebSocket ``v5/v4.channel.k8s.io``, binary
frames); lightkube 1.0 has ``exec`` only (a new process, run to completion with stdin given up front), which
would break the protocol (no PID 1, no "stdin closed = the gateway is gone"). Both have watch and logs.

Every call returns the API server's own JSON (``_preload_content=False``, parsed here), so the rest of the
backend reads the field names of the Kubernetes API, not the client's generated models. Calls that may be
repeated safely are retried on 429 / 5xx with a bounded back-off (``Retry-After`` honoured, capped); a create
is retried too, because the Pod's name is the decision's: a create that reached the server before its answer
was lost meets its own Pod as 409, which the runner recognises by its labels.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from gateway.errors import GatewayError, SandboxError
from gateway.runner.kubernetes.errors import RETRYABLE, api_status, map_api_error

__all__ = ["MAX_WATCH_LINE", "Attach", "Gone", "KubeClient", "KubeConfig"]

T = TypeVar("T")

MAX_WATCH_LINE = 4 << 20
"""Largest watch event line accepted (a Pod object is a few KiB)."""
_RETRY_CAP_S = 2.0
_CHANNEL_STDIN = 0
_CHANNEL_CLOSE = 255


class Gone(Exception):  # noqa: N818 - the API's own name for the status (410 Gone)
    """A watch's resourceVersion is too old (410 Gone): list again and watch from the new version."""


@dataclass(frozen=True, slots=True)
class KubeConfig:
    """Where the API server is and how to authenticate (the service config's ``kubernetes:`` section)."""

    namespace: str = "gateway-sandboxes"
    kubeconfig: str | None = None
    """A kubeconfig file; None: ``$KUBECONFIG`` / ``~/.kube/config`` unless ``in_cluster``."""
    context: str | None = None
    in_cluster: bool = False
    """Use the Pod's service account (the gateway running in the cluster, ``gateway kubernetes manifests``)."""
    host: str | None = None
    """An API server URL without credentials (tests: the fake API server on a loopback port)."""


class KubeClient:
    """The handful of API calls the backend makes. ``api`` is injectable (a configured ``ApiClient``)."""

    def __init__(
        self, config: KubeConfig | None = None, *, retries: int = 4, sleep: Callable[[float], None] = time.sleep
    ):
        self.config = config or KubeConfig()
        self.retries = retries
        self._sleep = sleep
        self._api: Any = None
        self._core: Any = None

    # -- connection ------------------------------------------------------------------------------------

    @property
    def core(self) -> Any:
        """``CoreV1Api`` over a client configured from ``config`` (created on first use)."""
        if self._core is None:
            try:
                from kubernetes import client  # noqa: PLC0415 - the client only when the backend runs
                from kubernetes import config as loader  # noqa: PLC0415
            except ImportError as exc:
                raise map_api_error(exc, "loading the Kubernetes client") from exc
            cfg = client.Configuration()
            config: Any = loader  # its loaders are untyped
            try:
                if self.config.host is not None:
                    cfg.host = self.config.host
                elif self.config.in_cluster:
                    config.load_incluster_config(client_configuration=cfg)
                else:
                    config.load_kube_config(
                        config_file=self.config.kubeconfig or os.environ.get("KUBECONFIG") or None,
                        context=self.config.context,
                        client_configuration=cfg,
                    )
            except Exception as exc:
                raise map_api_error(ConnectionError(str(exc)), "loading the Kubernetes configuration") from exc
            cfg.retries = False  # the retries are ours (bounded, visible); urllib3's would hide a dead server
            self._api = client.ApiClient(cfg)
            self._core = client.CoreV1Api(self._api)
        return self._core

    def close(self) -> None:
        if self._api is not None:
            with contextlib.suppress(Exception):
                self._api.close()
        self._api = self._core = None

    # -- plumbing --------------------------------------------------------------------------------------

    def _call(self, action: str, fn: Callable[[], T], *, retry: bool = True) -> T:
        """``fn()`` with 429 / 5xx retried (bounded, ``Retry-After`` honoured up to a cap); failures mapped."""
        attempt = 0
        while True:
            try:
                return fn()
            except GatewayError:
                raise
            except Exception as exc:
                found = api_status(exc)
                if retry and found is not None and found.status in RETRYABLE and attempt < self.retries:
                    attempt += 1
                    pause = found.retry_after if found.retry_after is not None else 0.1 * 2**attempt
                    self._sleep(min(max(pause, 0.0), _RETRY_CAP_S))
                    continue
                raise map_api_error(exc, action) from exc

    @staticmethod
    def _json(response: Any) -> dict[str, Any]:
        data = response.data if hasattr(response, "data") else response
        if isinstance(data, bytes):
            data = data.decode("utf-8")
        parsed = json.loads(data) if isinstance(data, str) else data
        if not isinstance(parsed, dict):
            raise SandboxError(f"the API server answered with {type(parsed).__name__}, not an object")
        return parsed

    # -- the calls -------------------------------------------------------------------------------------

    def create_pod(self, namespace: str, manifest: Mapping[str, Any]) -> dict[str, Any]:
        return self._call(
            "creating the Pod",
            lambda: self._json(self.core.create_namespaced_pod(namespace, dict(manifest), _preload_content=False)),
        )

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Pod, or None when it does not exist (404)."""
        try:
            return self._call(
                "reading the Pod",
                lambda: self._json(self.core.read_namespaced_pod(name, namespace, _preload_content=False)),
            )
        except GatewayError as exc:
            if _status_of(exc) == 404:
                return None
            raise

    def list_pods(self, namespace: str, label_selector: str) -> dict[str, Any]:
        return self._call(
            "listing the gateway's Pods",
            lambda: self._json(
                self.core.list_namespaced_pod(namespace, label_selector=label_selector, _preload_content=False)
            ),
        )

    def delete_pod(self, namespace: str, name: str) -> bool:
        """Delete at once (grace 0, background); False when it was already gone (404)."""
        try:
            self._call(
                "deleting the Pod",
                lambda: self.core.delete_namespaced_pod(
                    name, namespace, grace_period_seconds=0, propagation_policy="Background", _preload_content=False
                ),
            )
        except GatewayError as exc:
            if _status_of(exc) == 404:
                return False
            raise
        return True

    def read_log(self, namespace: str, name: str, *, limit_bytes: int) -> bytes:
        """At most ``limit_bytes`` of the container's log (diagnostics of a Pod that never reported)."""
        response = self._call(
            "reading the Pod's log",
            lambda: self.core.read_namespaced_pod_log(name, namespace, limit_bytes=limit_bytes, _preload_content=False),
        )
        data = response.data if hasattr(response, "data") else response
        return bytes(data[:limit_bytes]) if isinstance(data, bytes | bytearray) else str(data).encode()[:limit_bytes]

    def watch_pod(
        self, namespace: str, name: str, resource_version: str, *, timeout_s: float
    ) -> Iterator[dict[str, Any]]:
        """The watch events of one Pod from ``resource_version`` (``{"type", "object"}``), for at most
        ``timeout_s``. A stale version raises :class:`Gone` (the server's 410, as an HTTP status or as an
        ``ERROR`` event)."""
        seconds = max(int(timeout_s), 1)

        def start() -> Any:
            return self.core.list_namespaced_pod(
                namespace,
                field_selector=f"metadata.name={name}",
                resource_version=resource_version,
                watch=True,
                allow_watch_bookmarks=False,
                timeout_seconds=seconds,
                _preload_content=False,
                _request_timeout=(10, seconds + 5),
            )

        try:
            response = self._call("watching the Pod", start)
        except GatewayError as exc:
            if _status_of(exc) == 410:
                raise Gone(str(exc)) from exc
            raise
        try:
            for line in _lines(response):
                event = _event(line)
                if event is not None:
                    yield event
        except (GatewayError, Gone):
            raise
        except Exception as exc:
            raise map_api_error(exc, "watching the Pod") from exc
        finally:
            # Close, never release: releasing a watch's connection to the pool would read the rest of its
            # stream first (until the server's timeoutSeconds).
            with contextlib.suppress(Exception):
                response.close()

    def attach(self, namespace: str, name: str, container: str) -> Attach:
        """A WebSocket attach session to the container's stdin / stdout / stderr (its PID 1)."""
        try:
            from kubernetes.stream import stream  # noqa: PLC0415
        except ImportError as exc:
            raise map_api_error(exc, "loading the Kubernetes client") from exc
        ws = self._call(
            "attaching to the Pod",
            lambda: stream(
                self.core.connect_get_namespaced_pod_attach,
                name,
                namespace,
                container=container,
                stdin=True,
                stdout=True,
                stderr=True,
                tty=False,
                _preload_content=False,
                binary=True,
            ),
            retry=False,  # a second attach to a stdinOnce container is a different session: never retried
        )
        return Attach(ws)


def _status_of(exc: GatewayError) -> int | None:
    cause = exc.__cause__
    found = api_status(cause) if cause is not None else None
    return found.status if found is not None else None


def _event(line: bytes) -> dict[str, Any] | None:
    """One watch event; an ``ERROR`` event raises (410 as :class:`Gone`)."""
    event = json.loads(line)
    if not isinstance(event, dict):
        return None
    obj = event.get("object") or {}
    if event.get("type") == "ERROR":
        if obj.get("code") == 410:
            raise Gone(str(obj.get("message", "resourceVersion too old")))
        raise SandboxError(f"watching the Pod failed: {obj.get('message')} (HTTP {obj.get('code')})")
    return event


def _lines(response: Any) -> Iterator[bytes]:
    """Complete lines of a streamed response, each bounded by ``MAX_WATCH_LINE``."""
    buf = bytearray()
    for chunk in response.stream(65536, decode_content=False):
        buf += chunk
        while True:
            end = buf.find(b"\n")
            if end < 0:
                break
            line = bytes(buf[:end])
            del buf[: end + 1]
            if line.strip():
                yield line
        if len(buf) > MAX_WATCH_LINE:
            raise SandboxError(f"a watch event is larger than {MAX_WATCH_LINE} bytes")
    if buf.strip():
        yield bytes(buf)


class Attach:
    """One attach session, read one WebSocket message at a time (the client's own buffered ``update`` would keep
    whatever arrives, unbounded, and decode it as text: output is capped and framed here instead).

    ``recv(timeout)`` returns ``(channel, data)``, or ``None`` when the session closed; it raises ``TimeoutError``
    when nothing arrived in time. Channels: 1 stdout (the supervisor's frames), 2 stderr, 3 the API server's
    status."""

    def __init__(self, ws: Any) -> None:
        self._ws = ws
        self.closed = False

    def send(self, data: bytes, *, timeout: float, chunk: int = 1 << 16) -> None:
        """Write ``data`` to the container's stdin in messages of at most ``chunk`` bytes (no half-close: its EOF is
        how the supervisor learns the gateway is gone)."""
        self._ws.sock.settimeout(max(timeout, 0.001))
        view = memoryview(data)
        try:
            while view:
                self._ws.write_channel(_CHANNEL_STDIN, bytes(view[:chunk]))
                view = view[chunk:]
        except Exception as exc:
            if "imeout" in type(exc).__name__:
                raise TimeoutError(str(exc)) from exc
            raise map_api_error(exc, "sending the payload to the Pod") from exc

    def recv(self, timeout: float) -> tuple[int, bytes] | None:
        if self.closed:
            return None
        sock = self._ws.sock
        sock.settimeout(max(timeout, 0.001))
        while True:
            try:
                opcode, frame = sock.recv_data_frame(True)
            except Exception as exc:
                name = type(exc).__name__
                if "Timeout" in name or isinstance(exc, TimeoutError):
                    raise TimeoutError(str(exc)) from exc
                if "Closed" in name:
                    self.closed = True
                    return None
                raise map_api_error(exc, "reading from the Pod") from exc
            if opcode == 0x8:  # close
                self.closed = True
                return None
            if opcode not in (0x1, 0x2):  # ping / pong / continuation bookkeeping
                continue
            data = frame.data if isinstance(frame.data, bytes) else str(frame.data).encode()
            if not data:
                continue
            if data[0] == _CHANNEL_CLOSE:  # v5: the server closed one channel (stdout ends with the program)
                continue
            return data[0], data[1:]

    def idle(self) -> bool:
        """True while the session is open and silent: a waiting supervisor writes nothing, so anything readable
        (a message, the close) means the Pod is not fit to serve (an idle pooled Pod is checked at claim)."""
        if self.closed:
            return False
        sock = getattr(getattr(self._ws, "sock", None), "sock", None)
        if sock is None:
            return False
        try:
            readable, _, _ = select.select([sock], [], [], 0)
        except (OSError, ValueError):
            return False
        return not readable

    def close(self) -> None:
        """End the session at once: with ``stdinOnce`` the supervisor's stdin closes, and it ends the run itself.

        A close frame is sent without waiting for the peer's answer (websocket-client's own ``close`` waits up
        to 3 s for it, reading whatever a flooding sandbox still sends), then the socket is shut; its ``close``
        also skips the shutdown once the peer has closed first, which would leak the socket."""
        self.closed = True
        sock = getattr(self._ws, "sock", None)
        if sock is None:
            return
        with contextlib.suppress(Exception):
            if sock.connected:
                sock.settimeout(0.5)
                sock.send_close()
        with contextlib.suppress(Exception):
            sock.shutdown()
