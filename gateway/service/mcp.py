"""``gateway mcp``: the LLM tools (``execute_python``, and ``execute_shell`` / ``execute_javascript`` where the
policy allows those languages) served over MCP stdio, as one configured principal.

The tools are :mod:`gateway.tool`'s (one definition, one handler): ``tools/list`` offers one per language the
principal's policy allows, and the model sets only ``code``, a ``timeout`` up to the policy's ceiling, which
each tool's description states, and, where the policy allows installs for the tool's language, ``packages``.
Every call goes through one local :class:`~gateway.Gateway` with the principal's name in the request, so it is
decided under that principal's policy and audited with it.

Who the server acts as (:func:`resolve_identity`): ``--principal NAME`` takes the principal, its policy and its
``max_concurrent`` quota from the principals file; without it, ``--policy FILE`` must be given explicitly and
the calls are audited as ``local:<user>``, the owner of the process. There is no token over stdio: the trust
boundary is the process owner, who can read the principals file anyway. A revoked principal (no token) is
refused, so that ``gateway principals revoke`` also stops its MCP servers from starting.

Answers (:func:`tool_result`): a run (whatever its exit code) and a policy denial, with every rule id and
reason, are ordinary tool results; a gateway failure (engine down, trail unwritable, ...) or a call the tool
refuses (unknown tool, bad arguments) is a tool error (``isError``) carrying the code. Neither is a protocol
error: the model reads them like any answer. A run's answer carries the files the program wrote under ``./out``
with their contents (text as text, binary as base64), within the tool's bounds and marked where cut.

State (``--session kernel|workspace``, off by default): the server keeps one gateway session for its one MCP
session (the stdio connection), so the model's consecutive ``execute_python`` calls share state
(:class:`~gateway.tool.ToolHandler` with ``session``). It is created at start, under the principal's policy: a
policy that does not allow it stops the server before it serves anything (exit status 77, every rule id and
reason on stderr). It is closed when the connection ends (stdin closed, SIGTERM / SIGINT: ``session.closed``); a
server killed outright leaves a kernel that ends with its connection, and the next start's reap records it. A
session that ends meanwhile (idle, lifetime, killed) is replaced at the next call, whose answer says
``state_lost``. The other languages' tools run each call in a fresh sandbox.

Stdout belongs to the protocol: :func:`claim_stdio` moves the wire to private descriptors and points fd 1 at
stderr (fd 0 at the null device) before anything else happens, so no print, warning or library output can
corrupt the stream.
"""

from __future__ import annotations

import contextlib
import functools
import getpass
import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from io import TextIOWrapper
from pathlib import Path
from typing import Any, BinaryIO

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server

from gateway import Gateway, __version__
from gateway.errors import EXIT_DENIED, GatewayError, PrincipalIdentityError
from gateway.service.principals import DEFAULT_QUOTAS, load_principals, name_problem, principals_path_from_env
from gateway.tool import ToolHandler, ToolSession

__all__ = [
    "SERVER_NAME",
    "PrincipalIdentity",
    "StdioWire",
    "build_server",
    "claim_stdio",
    "resolve_identity",
    "serve",
    "tool_result",
]

SERVER_NAME = "agent-gateway"
LOCAL_PREFIX = "local:"
"""Calls of a server started with ``--policy`` and no principal are audited as ``local:<process owner>``."""


@dataclass(frozen=True, slots=True)
class PrincipalIdentity:
    """Who an MCP server acts as: the principal, the policy and the concurrency that come with it (a failure to
    resolve one is a :class:`PrincipalIdentityError`)."""

    principal: str
    """The name every request carries (the audit trail's ``principal``)."""
    policy: Path
    """The policy its calls are decided under."""
    max_concurrent: int
    """Calls run at once; more wait for one to finish (the principal's quota)."""


def resolve_identity(
    *, principal: str | None, principals_file: str | None, policy: str | None, user: str | None = None
) -> PrincipalIdentity:
    """The identity for ``gateway mcp`` flags (see the module docstring); :class:`PrincipalIdentityError` otherwise."""
    if principal is not None:
        if policy is not None:
            raise PrincipalIdentityError(
                f"--principal {principal} and --policy {policy}: the principal's own policy decides; "
                "drop --policy (or drop --principal to serve a local policy as the process owner)"
            )
        store = load_principals(principals_path_from_env(principals_file))
        found = store.get(principal)
        if not found.tokens:
            raise PrincipalIdentityError(
                f"principal {principal!r} in {store.source} is revoked (it has no token); "
                f"`gateway principals rotate {principal}` to serve it again"
            )
        return PrincipalIdentity(found.name, found.policy, found.quotas.max_concurrent)
    if policy is None:
        raise PrincipalIdentityError(
            "gateway mcp needs --principal NAME (its policy and quotas from the principals file) or an explicit "
            "--policy FILE (calls audited as the process owner); there is no default policy over MCP"
        )
    owner = user if user is not None else getpass.getuser()
    name = f"{LOCAL_PREFIX}{owner}"
    problem = name_problem(name)
    if problem is not None:
        raise PrincipalIdentityError(f"the process owner cannot name the local principal: {problem}; use --principal")
    return PrincipalIdentity(name, Path(policy).absolute(), DEFAULT_QUOTAS.max_concurrent)


# --- the wire ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StdioWire:
    """The protocol's own descriptors (private duplicates of the original stdin and stdout)."""

    reader: BinaryIO
    writer: BinaryIO


@contextlib.contextmanager
def claim_stdio() -> Iterator[StdioWire]:
    """Take stdin and stdout for the protocol: while inside, fd 0 reads the null device and fd 1 writes to
    stderr, so nothing but :func:`serve` can write to the client (a stray ``print``, a C library, a child
    process). Both are restored on exit."""
    sys.stdout.flush()
    wire_in = os.dup(0)
    wire_out = os.dup(1)
    saved_in, saved_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
        os.dup2(2, 1)
        with open(wire_in, "rb") as reader, open(wire_out, "wb") as writer:
            yield StdioWire(reader, writer)
    finally:
        sys.stdout.flush()
        os.dup2(saved_in, 0)
        os.dup2(saved_out, 1)
        for fd in (null, saved_in, saved_out):
            os.close(fd)


# --- the server ----------------------------------------------------------------------------------------


def tool_result(answer: dict[str, Any]) -> types.CallToolResult:
    """The MCP result of one tool answer: JSON text for the model plus the same object as structured content.

    ``isError`` only for a gateway failure or a refused call (the answer has an ``error``); a denial and a
    program that fails are results."""
    text = json.dumps(answer, ensure_ascii=False)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content=answer,
        is_error="error" in answer,
    )


def _tools(handler: ToolHandler) -> list[types.Tool]:
    """The handler's tools (one per language its policy allows) as MCP tools."""
    specs = [definition["function"] for definition in handler.definitions()]
    return [types.Tool(name=s["name"], description=s["description"], input_schema=s["parameters"]) for s in specs]


HandlerFor = Callable[[ServerRequestContext[Any]], ToolHandler]
"""The tool handler of one request's caller (the HTTP transport: the authenticated principal's)."""


Admit = Callable[[ServerRequestContext[Any]], contextlib.AbstractAsyncContextManager[None]]
"""Holds the caller's quota slot for one tool call (the HTTP service's admission); raises ``GatewayError``
(``service.over_quota``) to refuse it."""


def build_server(
    handler: ToolHandler | HandlerFor,
    *,
    max_concurrent: int | None,
    instructions: str | None = None,
    admit: Admit | None = None,
) -> Server[Any]:
    """The MCP server of one tool handler (or of a function giving each request's, see :data:`HandlerFor`):
    ``tools/list`` (the handler's tools, one per language its policy allows) and ``tools/call``, at most
    ``max_concurrent`` runs at once (None: the thread pool's limit). A call whose request is cancelled (or a
    server that is stopped) cancels its run: the sandbox is killed and removed and the outcome recorded, before
    the call returns."""
    fixed = handler if isinstance(handler, ToolHandler) else None
    resolve: HandlerFor | None = None if isinstance(handler, ToolHandler) else handler

    def handler_for(ctx: ServerRequestContext[Any]) -> ToolHandler:
        if fixed is not None:
            return fixed
        assert resolve is not None  # noqa: S101 - one of the two is set
        return resolve(ctx)

    tools = _tools(fixed) if fixed is not None else None
    limiter = anyio.CapacityLimiter(max_concurrent) if max_concurrent is not None else None

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools if tools is not None else _tools(handler_for(ctx)))

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        handler = handler_for(ctx)
        cancel = threading.Event()
        work = functools.partial(handler, params.name, dict(params.arguments or {}), cancel=cancel)

        async def cancel_on_exit() -> None:
            try:
                await anyio.sleep_forever()
            finally:  # cancelled: the call was, or it finished
                cancel.set()

        try:
            guard = admit(ctx) if admit is not None else contextlib.nullcontext()
            async with guard, anyio.create_task_group() as group:
                group.start_soon(cancel_on_exit)
                # Not abandoned on cancellation: the thread ends the run (its cancel event is set by the
                # watcher) and the call waits for that, so no sandbox outlives the call.
                answer = await anyio.to_thread.run_sync(work, limiter=limiter)
                group.cancel_scope.cancel()
        except GatewayError as exc:  # refused before anything ran (a quota of the caller)
            return tool_result({"error": exc.to_dict()})
        return tool_result(answer)

    return Server(
        SERVER_NAME,
        version=__version__,
        title="Agent gateway",
        instructions=instructions
        or f"Runs code (one tool per language the policy allows) in a hardened single-use sandbox as principal "
        f"{fixed.principal if fixed else '?'}.",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


async def _serve(server: Server[Any], wire: StdioWire) -> None:
    stdin = anyio.wrap_file(TextIOWrapper(wire.reader, encoding="utf-8", errors="replace"))
    stdout = anyio.wrap_file(TextIOWrapper(wire.writer, encoding="utf-8", write_through=True))
    with anyio.CancelScope() as scope:

        async def stop_on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    scope.cancel()  # in-flight calls cancel their runs, then the server ends
                    return

        async with anyio.create_task_group() as group:
            if threading.current_thread() is threading.main_thread():
                group.start_soon(stop_on_signal)
            async with stdio_server(stdin=stdin, stdout=stdout) as (read_stream, write_stream):
                await server.run(read_stream, write_stream, server.create_initialization_options())
            group.cancel_scope.cancel()


def serve(gateway: Gateway, identity: PrincipalIdentity, wire: StdioWire, *, session: ToolSession | None = None) -> int:
    """Serve the tools of ``identity``'s policy over ``wire`` until the client closes stdin or a SIGTERM /
    SIGINT arrives (in-flight runs are cancelled and recorded first). With ``session``, the calls share one
    gateway session, opened first and closed at the end (see the module). Returns the exit status: 0, or
    :data:`~gateway.errors.EXIT_DENIED` when the policy denies the session (nothing is served); a failure to
    open it is raised (its ``GatewayError``)."""
    handler = ToolHandler(gateway, principal=identity.principal, session=session)
    try:
        if session is not None:
            refused = _open_session(handler, session)
            if refused is not None:
                return refused
        kept = f", one {session} session for the connection" if session is not None else ""
        instructions = (
            f"Runs Python in one persistent {session} session (state is kept between execute_python calls; the "
            f"other languages' tools start afresh at each call) as principal {identity.principal}."
            if session is not None
            else None
        )
        server = build_server(handler, max_concurrent=identity.max_concurrent, instructions=instructions)
        names = ", ".join(tool["function"]["name"] for tool in handler.definitions())
        print(
            f"gateway mcp: serving {names} over stdio as principal "
            f"{identity.principal} (policy {handler.policy.ref}){kept}",
            file=sys.stderr,
        )
        anyio.run(_serve, server, wire)
    finally:
        handler.close()  # the connection ended: its session with it (session.closed)
    return 0


def _open_session(handler: ToolHandler, session: ToolSession) -> int | None:
    """Open the handler's session before serving: None when it is open, :data:`EXIT_DENIED` (the reasons on
    stderr) when the policy denies it; a failure is raised."""
    opened = handler.open()
    if opened is None or opened.allowed:
        return None
    if opened.error is not None:
        raise opened.error
    policy = handler.policy
    reasons = "; ".join(f"{v['rule']}: {v['message']}" for v in opened.to_dict()["violations"])
    print(
        f"gateway mcp: --session {session} is denied for principal {handler.principal} by policy {policy.ref}: "
        f"{reasons}. Serve without --session (each call then starts from nothing), or give the principal a "
        "policy with spec.sessions allowing this mode (see policies/examples/sessions.yaml).",
        file=sys.stderr,
    )
    return EXIT_DENIED
