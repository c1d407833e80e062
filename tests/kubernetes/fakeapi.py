"""A faithful fake of the Kubernetes API endpoints the backend uses, served by uvicorn on a loopback port.

Endpoints (core/v1, JSON, the API server's own shapes and status codes):

- ``POST   /api/v1/namespaces/{ns}/pods``               201, 409 AlreadyExists, 422 Invalid (a manifest the guard
  would refuse reaches here only in a test of the guard's seam)
- ``GET    /api/v1/namespaces/{ns}/pods/{name}``        200, 404
- ``GET    /api/v1/namespaces/{ns}/pods?labelSelector``  200 (a PodList with its resourceVersion)
- ``GET    /api/v1/namespaces/{ns}/pods?watch=true&fieldSelector=metadata.name=N&resourceVersion=V``: a chunked
  stream of ``{"type", "object"}`` lines; a ``resourceVersion`` older than the compaction point answers like the
  real server: HTTP 200 and one ``ERROR`` event with a 410 Gone ``Status`` (or an HTTP 410, ``gone_as_http``)
- ``DELETE /api/v1/namespaces/{ns}/pods/{name}``        200, 404
- ``GET    /api/v1/namespaces/{ns}/pods/{name}/log``    200 (``limitBytes``), 404
- ``WS     /api/v1/namespaces/{ns}/pods/{name}/attach`` the ``v4.channel.k8s.io`` protocol (one channel byte
  before each message: 0 stdin, 1 stdout, 2 stderr, 3 status), 404 before the container runs

A fake kubelet moves each Pod Pending → ContainerCreating → Running (or ErrImageNeverPull for an image it does not
have, or stays unschedulable), and plays the container: it reads the supervisor's payload from stdin, verifies
its framing, and answers with frames under the payload's key, as scripted by ``FakeCluster.program`` (a kernel's
payload: cell 0, then each cell as scripted by ``FakeCluster.cell_program``). The real supervisor never runs on
the host.

Failures are injected per call: ``cluster.fail("POST", "pods", 429, times=1, retry_after=0)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import marshal
import struct
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from gateway.runner.frames import (
    FRAME_CELL,
    FRAME_ERROR,
    FRAME_EXIT,
    FRAME_FILE_DATA,
    FRAME_FILE_NAME,
    FRAME_META,
    FRAME_STDERR,
    FRAME_STDOUT,
    FRAME_VALUE,
    encode_frame,
)
from gateway.runner.supervisor import CELL_MAGIC, MAGIC

Action = tuple[Any, ...]
"""One step of a fake program: ("out", bytes), ("err", bytes), ("file", name, bytes), ("meta", oom: bool),
("exit", status), ("error", message), ("sleep", seconds), ("raw", bytes: unframed stdout), ("oom",) the kubelet
OOM-kills the container, ("evict",) the kubelet evicts the Pod, ("hang",) never answer again. Kernel cells also:
("value", flags, repr bytes), ("cell", interrupted: bool) the cell's end, ("killed", reason, status) the
kernel's final frame."""


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}  # fmt: skip


def default_program(request: dict[str, Any]) -> list[Action]:
    return [("out", b"4\n"), ("meta", False), ("exit", 0)]


def default_cell(cell: dict[str, Any]) -> list[Action]:
    return [("out", b"4\n"), ("meta", False), ("value", 0, b""), ("cell", False)]


@dataclass
class Failure:
    method: str
    what: str
    """``pods`` (create/list/watch), ``pod`` (read/delete), ``log``, ``attach``."""
    status: int
    times: int
    retry_after: float | None = None


@dataclass
class FakeCluster:
    images: set[str] = field(default_factory=lambda: {"gateway/sandbox-python:3.11-bookworm"})
    program: Callable[[dict[str, Any]], list[Action]] = default_program
    cell_program: Callable[[dict[str, Any]], list[Action]] = default_cell
    """Kernel mode: the frames that answer one cell ({"code", "timeout_s"})."""
    schedulable: bool = True
    start_delay_s: float = 0.05
    gone_as_http: bool = False
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    events: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)
    compacted: int = 0
    """Watches from a resourceVersion below this get 410 Gone."""
    version: int = 100
    failures: list[Failure] = field(default_factory=list)
    calls: list[tuple[str, str, str]] = field(default_factory=list)
    """(method, what, name) of every request, in order."""
    payloads: list[dict[str, Any]] = field(default_factory=list)
    cells: list[dict[str, Any]] = field(default_factory=list)
    """Every kernel cell the fake container received (decoded)."""
    """Every payload the fake container received (decoded)."""
    submitted: list[dict[str, Any]] = field(default_factory=list)
    """Every Pod manifest as POSTed."""
    deleted: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)
    """Set when a Pod is deleted: its container (and attach session) ends, as the kubelet would end it."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    loop: asyncio.AbstractEventLoop | None = None
    changed: asyncio.Condition | None = None

    # -- the test's controls ---------------------------------------------------------------------------

    def fail(self, method: str, what: str, status: int, *, times: int = 1, retry_after: float | None = None) -> None:
        self.failures.append(Failure(method, what, status, times, retry_after))

    def compact(self) -> None:
        """Make every resourceVersion so far too old for a watch (the server's etcd compaction)."""
        self.compacted = self.version + 1

    def live(self) -> list[str]:
        return sorted(name for (_, name) in self.pods)

    # -- state -----------------------------------------------------------------------------------------

    def _next_version(self) -> str:
        self.version += 1
        return str(self.version)

    async def _changed(self, kind: str, pod: dict[str, Any]) -> None:
        pod["metadata"]["resourceVersion"] = self._next_version()
        self.events.append((self.version, kind, copy.deepcopy(pod)))
        assert self.changed is not None
        async with self.changed:
            self.changed.notify_all()

    def _injected(self, method: str, what: str) -> Response | None:
        for failure in self.failures:
            if failure.method == method and failure.what == what and failure.times > 0:
                failure.times -= 1
                headers = {} if failure.retry_after is None else {"Retry-After": str(int(failure.retry_after))}
                reasons = {429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable", 403: "Forbidden"}
                reason = reasons.get(failure.status, "Failure")
                body = status_body(failure.status, reason, f"injected {failure.status} for {method} {what}")
                return JSONResponse(body, status_code=failure.status, headers=headers)
        return None

    # -- the fake kubelet ------------------------------------------------------------------------------

    async def _kubelet(self, key: tuple[str, str]) -> None:
        await asyncio.sleep(self.start_delay_s)
        pod = self.pods.get(key)
        if pod is None:
            return
        if not self.schedulable:
            pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                            "message": "0/3 nodes are available: 3 Insufficient memory."}]  # fmt: skip
            await self._changed("MODIFIED", pod)
            return
        container = pod["spec"]["containers"][0]
        pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]
        waiting = {"waiting": {"reason": "ContainerCreating"}}
        pod["status"]["containerStatuses"] = [{"name": container["name"], "state": waiting, "ready": False,
                                               "restartCount": 0, "image": container["image"]}]  # fmt: skip
        await self._changed("MODIFIED", pod)
        await asyncio.sleep(self.start_delay_s)
        if key not in self.pods:
            return
        status = pod["status"]["containerStatuses"][0]
        if container["image"] not in self.images and container.get("imagePullPolicy") == "Never":
            status["state"] = {
                "waiting": {
                    "reason": "ErrImageNeverPull",
                    "message": f'Container image "{container["image"]}" is not present with pull policy of Never',
                }
            }
        else:
            pod["status"]["phase"] = "Running"
            status["state"] = {"running": {"startedAt": _now()}}
            status["containerID"] = f"fake://{uuid.uuid4().hex}"
            status["imageID"] = f"fake-image@sha256:{'1' * 64}"
        await self._changed("MODIFIED", pod)

    async def _terminate(self, key: tuple[str, str], code: int, reason: str, *, pod_reason: str | None = None) -> None:
        pod = self.pods.get(key)
        if pod is None or pod["status"].get("phase") in ("Succeeded", "Failed"):
            return
        pod["status"]["phase"] = "Succeeded" if code == 0 and pod_reason is None else "Failed"
        if pod_reason is not None:
            pod["status"]["reason"] = pod_reason
            pod["status"]["message"] = "The node was low on resource: memory."
        state = {"terminated": {"exitCode": code, "reason": reason, "finishedAt": _now()}}
        pod["status"]["containerStatuses"][0]["state"] = state
        await self._changed("MODIFIED", pod)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def build_app(cluster: FakeCluster) -> Starlette:
    async def create(request: Request) -> Response:
        ns = request.path_params["ns"]
        injected = cluster._injected("POST", "pods")
        body = await request.json()
        cluster.calls.append(("POST", "pods", str(body.get("metadata", {}).get("name"))))
        if injected is not None and injected.status_code != 500:
            return injected
        name = body["metadata"]["name"]
        key = (ns, name)
        if key in cluster.pods:
            return JSONResponse(status_body(409, "AlreadyExists", f'pods "{name}" already exists'), status_code=409)
        if body.get("metadata", {}).get("namespace", ns) != ns:
            return JSONResponse(status_body(400, "BadRequest", "the namespace of the object does not match"), 400)
        cluster.submitted.append(copy.deepcopy(body))
        pod = copy.deepcopy(body)
        pod["metadata"].update(uid=str(uuid.uuid4()), creationTimestamp=_now(), namespace=ns)
        pod["status"] = {"phase": "Pending", "qosClass": "Guaranteed"}
        cluster.pods[key] = pod
        await cluster._changed("ADDED", pod)
        asyncio.get_running_loop().create_task(cluster._kubelet(key))
        if injected is not None:  # a 500 after the write: the create happened, its answer is lost
            return injected
        return JSONResponse(pod, status_code=201)

    async def pods(request: Request) -> Response:
        if request.method == "POST":
            return await create(request)
        ns = request.path_params["ns"]
        query = request.query_params
        if query.get("watch") in ("true", "1", "True"):
            return await watch(request, ns)
        cluster.calls.append(("GET", "pods", query.get("labelSelector", "")))
        injected = cluster._injected("GET", "pods")
        if injected is not None:
            return injected
        selector = query.get("labelSelector", "")
        wanted = dict(part.split("=", 1) for part in selector.split(",") if "=" in part)
        items = [copy.deepcopy(p) for (n, _), p in sorted(cluster.pods.items()) if n == ns
                 and all(p["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())]  # fmt: skip
        return JSONResponse({"kind": "PodList", "apiVersion": "v1", "items": items,
                             "metadata": {"resourceVersion": str(cluster.version)}})  # fmt: skip

    async def watch(request: Request, ns: str) -> Response:
        query = request.query_params
        field_selector = query.get("fieldSelector", "")
        name = field_selector.removeprefix("metadata.name=")
        cluster.calls.append(("WATCH", "pods", name))
        injected = cluster._injected("WATCH", "pods")
        if injected is not None:
            return injected
        since = int(query.get("resourceVersion") or 0)
        timeout = float(query.get("timeoutSeconds") or 30)
        gone = since < cluster.compacted
        if gone and cluster.gone_as_http:
            return JSONResponse(status_body(410, "Expired", f"too old resource version: {since}"), status_code=410)

        async def stream() -> Any:
            if gone:
                event = {"type": "ERROR", "object": status_body(410, "Expired", f"too old resource version: {since}")}
                yield (json.dumps(event) + "\n").encode()
                return
            seen = since
            end = time.monotonic() + timeout
            assert cluster.changed is not None
            while time.monotonic() < end:
                for version, kind, obj in list(cluster.events):
                    if version > seen and obj["metadata"]["name"] == name and obj["metadata"]["namespace"] == ns:
                        seen = version
                        yield (json.dumps({"type": kind, "object": obj}) + "\n").encode()
                async with cluster.changed:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(cluster.changed.wait(), timeout=max(end - time.monotonic(), 0.01))

        return StreamingResponse(stream(), media_type="application/json")

    async def pod(request: Request) -> Response:
        ns, name = request.path_params["ns"], request.path_params["name"]
        cluster.calls.append((request.method, "pod", name))
        injected = cluster._injected(request.method, "pod")
        if injected is not None:
            return injected
        found = cluster.pods.get((ns, name))
        if found is None:
            return JSONResponse(status_body(404, "NotFound", f'pods "{name}" not found'), status_code=404)
        if request.method == "DELETE":
            del cluster.pods[(ns, name)]
            cluster.deleted.setdefault((ns, name), asyncio.Event()).set()
            found["metadata"]["deletionTimestamp"] = _now()
            await cluster._changed("DELETED", found)
            return JSONResponse(found)
        return JSONResponse(copy.deepcopy(found))

    async def log(request: Request) -> Response:
        ns, name = request.path_params["ns"], request.path_params["name"]
        cluster.calls.append(("GET", "log", name))
        injected = cluster._injected("GET", "log")
        if injected is not None:
            return injected
        found = cluster.pods.get((ns, name))
        if found is None:
            return JSONResponse(status_body(404, "NotFound", f'pods "{name}" not found'), status_code=404)
        data = found.get("_log", b"")
        limit = int(request.query_params.get("limitBytes") or len(data))
        return Response(data[:limit], media_type="text/plain")

    async def attach(ws: WebSocket) -> None:
        ns, name = ws.path_params["ns"], ws.path_params["name"]
        cluster.calls.append(("WS", "attach", name))
        key = (ns, name)
        found = cluster.pods.get(key)
        running = found is not None and "running" in (found["status"].get("containerStatuses") or [{}])[0].get(
            "state", {}
        )
        injected = cluster._injected("WS", "attach")
        if not running or injected is not None:
            await ws.close(code=1008)  # the handshake is refused: the client sees it fail
            return
        # uvicorn hands the offered subprotocols over in the scope (its wsproto driver drops the header).
        offered = ws.scope.get("subprotocols") or ws.headers.get("sec-websocket-protocol", "").split(",")
        protocols = [p.strip() for p in offered]
        if "v4.channel.k8s.io" not in protocols:
            await ws.close(code=1002)
            return
        await ws.accept(subprotocol="v4.channel.k8s.io")
        await play(ws, key)

    async def receive(ws: WebSocket, key: tuple[str, str], buf: bytearray) -> bytes | None:
        """The next length-prefixed message on stdin (a payload or a cell); None when the session ended or the Pod
        was deleted meanwhile (then the session is closed, as the kubelet would end the container)."""
        gone = cluster.deleted.setdefault(key, asyncio.Event())
        while len(buf) < 8 or len(buf) < 8 + struct.unpack(">I", bytes(buf[4:8]))[0]:
            receive = asyncio.ensure_future(ws.receive_bytes())
            deleted = asyncio.ensure_future(gone.wait())
            done, _ = await asyncio.wait({receive, deleted}, return_when=asyncio.FIRST_COMPLETED)
            if receive not in done:
                receive.cancel()
                await ws.close()  # the Pod was deleted while its supervisor waited: the session ends
                return None
            deleted.cancel()
            try:
                message = receive.result()
            except WebSocketDisconnect:
                return None
            assert message[0] == 0, "stdin arrives on channel 0"
            buf += message[1:]
        size = struct.unpack(">I", bytes(buf[4:8]))[0]
        message = bytes(buf[: 8 + size])
        del buf[: 8 + size]
        return message

    async def act(ws: WebSocket, key: tuple[str, str], actions: list[Action], player: Player) -> bool:
        """Play ``actions`` as the supervisor's frames; False when the container ended (the session is over)."""
        kinds = {"out": FRAME_STDOUT, "err": FRAME_STDERR, "meta": FRAME_META, "exit": FRAME_EXIT,
                 "error": FRAME_ERROR}  # fmt: skip
        for action in actions:
            kind = action[0]
            if kind == "sleep":
                await asyncio.sleep(action[1])
                continue
            if kind == "hang":
                await _until_closed(ws)
                await cluster._terminate(key, 137, "Error")
                return False
            if kind == "oom":
                await cluster._terminate(key, 137, "OOMKilled")
                await ws.close()
                return False
            if kind == "evict":
                await cluster._terminate(key, 137, "Error", pod_reason="Evicted")
                await ws.close()
                return False
            if kind == "raw":
                data = b"\x01" + action[1]
            elif kind == "file":
                await ws.send_bytes(b"\x01" + player.frame(FRAME_FILE_NAME, action[1].encode()))
                data = b"\x01" + player.frame(FRAME_FILE_DATA, action[2])
            elif kind == "value":
                data = b"\x01" + player.frame(FRAME_VALUE, bytes((action[1],)) + action[2])
            elif kind == "cell":
                cell = {"seq": player.cells, "interrupted": bool(action[1]), "files_truncated": False}
                data = b"\x01" + player.frame(FRAME_CELL, json.dumps(cell).encode())
            elif kind == "killed":
                player.code = int(action[2])
                final = {"status": player.code, "files_truncated": False, "killed": action[1]}
                data = b"\x01" + player.frame(FRAME_EXIT, json.dumps(final).encode())
            else:
                if kind == "meta":
                    payload = json.dumps({"oom_killed": bool(action[1])}).encode()
                elif kind == "exit":
                    player.code = int(action[1])
                    payload = json.dumps({"status": player.code, "files_truncated": False}).encode()
                elif kind == "error":
                    payload = json.dumps({"error": action[1]}).encode()
                else:
                    payload = action[1]
                data = b"\x01" + player.frame(kinds[kind], payload)
            try:
                await ws.send_bytes(data)
            except (WebSocketDisconnect, RuntimeError):
                await cluster._terminate(key, 137, "Error")
                return False
        return True

    async def play(ws: WebSocket, key: tuple[str, str]) -> None:
        buf = bytearray()
        message = await receive(ws, key, buf)
        if message is None:
            await cluster._terminate(key, 125, "Error")
            return
        assert message[:4] == MAGIC
        request = marshal.loads(message[8:])  # noqa: S302 - the payload the runner under test wrote
        cluster.payloads.append(request)
        player = Player(request["key"])
        if request.get("kernel"):
            await kernel(ws, key, buf, player)
            return
        if not await act(ws, key, cluster.program(request), player):
            return
        # Like the supervisor: after the final frame, wait (at most 10 s) for stdin to close, then exit.
        await _until_closed(ws, 10.0)
        await cluster._terminate(key, player.code, "Completed" if player.code == 0 else "Error")

    async def kernel(ws: WebSocket, key: tuple[str, str], buf: bytearray, player: Player) -> None:
        """Kernel mode: ready (cell 0), then each cell as ``cluster.cell_program`` scripts it, until a final frame,
        the session's end or the Pod's deletion."""
        if not await act(ws, key, [("cell", False)], player):
            return
        while True:
            message = await receive(ws, key, buf)
            if message is None:
                await cluster._terminate(key, 137, "Error")  # stdin closed: the supervisor kills all and exits
                return
            assert message[:4] == CELL_MAGIC, "only cells follow a kernel's payload"
            cell = marshal.loads(message[8:])  # noqa: S302 - a cell the runner under test wrote
            cluster.cells.append(cell)
            player.cells += 1
            actions = cluster.cell_program(cell)
            if not await act(ws, key, actions, player):
                return
            if any(action[0] in ("killed", "exit") for action in actions):
                await _until_closed(ws, 10.0)
                await cluster._terminate(key, player.code, "Error")
                return

    routes = [
        Route("/api/v1/namespaces/{ns}/pods", pods, methods=["GET", "POST"]),
        Route("/api/v1/namespaces/{ns}/pods/{name}", pod, methods=["GET", "DELETE"]),
        Route("/api/v1/namespaces/{ns}/pods/{name}/log", log, methods=["GET"]),
        WebSocketRoute("/api/v1/namespaces/{ns}/pods/{name}/attach", attach),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        cluster.loop = asyncio.get_running_loop()
        cluster.changed = asyncio.Condition()
        yield

    return Starlette(routes=routes, lifespan=lifespan)


@dataclass
class Player:
    """The fake supervisor's side of one session: its frame key and sequence, the cells so far, the exit status."""

    key: bytes
    seq: int = 0
    cells: int = 0
    code: int = 0

    def frame(self, kind: bytes, data: bytes) -> bytes:
        out = encode_frame(self.key, self.seq, kind, data)
        self.seq += 1
        return out


async def _until_closed(ws: WebSocket, timeout: float | None = None) -> None:
    try:
        while True:
            await asyncio.wait_for(ws.receive(), timeout=timeout)
            if ws.client_state.name == "DISCONNECTED":
                return
    except (WebSocketDisconnect, TimeoutError, RuntimeError):
        return


def files_of(request: dict[str, Any]) -> dict[str, bytes]:
    return dict(request["files"])


class FakeApiServer:
    """The fake on 127.0.0.1 (a free port) in a uvicorn thread; ``url`` is the API server's address."""

    def __init__(self, cluster: FakeCluster | None = None) -> None:
        self.cluster = cluster or FakeCluster()
        config = uvicorn.Config(
            build_app(self.cluster), host="127.0.0.1", port=0, log_level="warning", ws="wsproto", lifespan="on"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="fake-kube-api", daemon=True)

    def start(self) -> FakeApiServer:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            assert self._thread.is_alive(), "the fake API server died while starting"
            assert time.monotonic() < deadline, "the fake API server did not start"
            time.sleep(0.02)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)
