"""The HTTP endpoints of a workspace session's files: ``PUT`` and ``GET /v1/sessions/{id}/files/{path}`` (raw
bytes) and ``GET /v1/sessions/{id}/files`` (the listing), over the session manager's file API.

``{path}`` is the rest of the URL path, percent-decoded once by the server (``%2e%2e`` is ``..`` and ``%2f`` a
``/``, then refused or taken as such) and checked by the one name check in the workspace store: traversal, an
absolute path, NUL and backslash are 422 ``request.workspace_path`` naming the path; a symlink anywhere on the
way is refused, never followed. An upload is ``application/octet-stream`` (415 otherwise), bounded like every
body (``max_body_bytes``, the body budget, ``body_read_s``) and counted against the caller's rpm before it is
read; the policy's caps follow (413 ``request.file_too_large``). Files are the owner's alone: another principal's
session id is 404 like an unknown one, and the operator role has no file access to other principals' sessions.
"""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from gateway import Caller
from gateway.errors import BodiesInFlightError, OverQuotaError, RequestError
from gateway.service.bodies import OCTET_MEDIA_TYPE, read_octet_body
from gateway.service.endpoints import admit, counted, note_refused, respond, v1
from gateway.service.replies import Reply
from gateway.service.service import Service

__all__ = ["get_file", "list_files", "put_file"]


@counted("/v1/sessions/{session_id}/files/{path}")
@v1
async def put_file(request: Request, caller: Caller, request_id: str) -> Response:
    """Write the body at ``path`` in the caller's workspace session: 200 with ``path``, ``bytes``, ``sha256``."""
    service = Service.of(request)
    if (over := admit(request, caller, request_id, service.quotas_of(caller))) is not None:
        return over
    config = service.config
    try:
        body, held = await read_octet_body(
            request, config.max_body_bytes, config.body_read_s,
            hold=lambda size: service.bodies.take(caller.principal, size),
        )  # fmt: skip
    except (RequestError, OverQuotaError, BodiesInFlightError) as exc:
        note_refused(exc, request, caller, request_id)
        raise
    session_id, path = request.path_params["session_id"], request.path_params["path"]
    try:
        service.refuse_gone(caller, request_id=request_id, path=request.url.path)  # gone while the body was read?
        done = await run_in_threadpool(
            lambda: service.gateway.sessions.put_file(
                session_id, path, body, principal=caller.principal, caller=caller, request_id=request_id
            )
        )
    finally:
        held.release()
    return respond(Reply(200, {"session_id": session_id, **done.to_dict()}, request_id))


@counted("/v1/sessions/{session_id}/files/{path}")
@v1
async def get_file(request: Request, caller: Caller, request_id: str) -> Response:
    """The raw bytes of the file at ``path`` in the caller's workspace session."""
    sessions = Service.of(request).gateway.sessions
    session_id, path = request.path_params["session_id"], request.path_params["path"]
    data = await run_in_threadpool(
        lambda: sessions.get_file(session_id, path, principal=caller.principal, caller=caller, request_id=request_id)
    )
    return Response(data, media_type=OCTET_MEDIA_TYPE, headers={"X-Request-Id": request_id})


@counted("/v1/sessions/{session_id}/files")
@v1
async def list_files(request: Request, caller: Caller, request_id: str) -> Response:
    """The regular files of the caller's workspace session: ``files`` (``path``, ``bytes``), ``truncated``."""
    sessions = Service.of(request).gateway.sessions
    session_id = request.path_params["session_id"]
    listing = await run_in_threadpool(lambda: sessions.list_files(session_id, principal=caller.principal))
    body = {
        "session_id": session_id,
        "files": [{"path": f.path, "bytes": f.size} for f in listing.files],
        "truncated": listing.truncated,
    }
    return respond(Reply(200, body, request_id))
