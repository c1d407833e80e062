"""``gateway session create|exec|put|get|ls|close``: state that lasts across an agent's steps, from the shell.

A session belongs to the gateway instance that made it, and this process ends after each command, so every
action is a call to a running ``gateway serve`` through :class:`gateway.client.Client`.

The service is ``--service URL`` (default ``$GATEWAY_URL``); the caller is the principal of the token in
``$GATEWAY_TOKEN``, never a flag (a command line is visible to every user of the machine). ``create`` prints
the session id alone on stdout, so ``SID=$(gateway session create --mode kernel)`` works; ``exec`` prints the
program's stdout and stderr like ``gateway run``, then a kernel cell's value as a REPL would (its repr, on
stdout), and exits like it: the program's exit code, 77 denied, 124 deadline, 137 memory, 125 gateway failure,
2 usage or an unknown, ended or foreign session. ``put`` and ``get`` copy a file into or out of a workspace
session's ``/workspace`` (``-``: stdin, stdout). ``--json`` prints one JSON object instead; what is said to a
person (the new session's expiry, ``closed``) goes to stderr and only when stderr is a terminal.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from gateway._files import output_file
from gateway.cli.arguments import (
    add_file_arguments,
    add_profile_arguments,
    env_field,
    files_field,
    profile_fields,
    read_text,
)
from gateway.errors import (
    EXIT_DENIED,
    EXIT_USAGE,
    GatewayError,
    RequestError,
    SessionNotFoundError,
    exit_code_for,
)

if TYPE_CHECKING:
    from gateway.client import Client, RemoteResult, RemoteSession

__all__ = [
    "TOKEN_ENV",
    "URL_ENV",
    "create_body",
    "denial_lines",
    "exec_body",
    "exec_lines",
    "register",
    "session_lines",
]

URL_ENV = "GATEWAY_URL"
"""Where ``--service`` defaults from: the base URL of the running ``gateway serve``."""
TOKEN_ENV = "GATEWAY_TOKEN"  # noqa: S105 - the name of a variable, not a token
"""Where the caller's token comes from (``gateway principals add`` prints it); never a command-line flag."""
CLIENT_MARGIN_S = 30.0
"""Seconds the client waits beyond an execution's ``--timeout`` for the answer (start-up, the result's way back)."""


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "session",
        help="sessions of a running gateway serve: state that lasts across executions",
        description=f"Create, use, list and close sessions of the running `gateway serve` at --service URL "
        f"(default ${URL_ENV}), as the principal of the token in ${TOKEN_ENV}.",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    actions.required = True

    create = actions.add_parser(
        "create",
        help="create a session; print its id alone on stdout",
        description="Create a session under the caller's policy; its profile (image, runtime, limits, mounts) is "
        "fixed now. Prints the session id alone on stdout (SID=$(gateway session create --mode kernel)). Exit "
        "status: 0 created, 77 denied by policy, 2 usage or invalid request, 125 gateway failure.",
    )
    create.add_argument(
        "--mode",
        required=True,
        choices=("kernel", "workspace"),
        help="kernel: a live interpreter (variables persist); workspace: a /workspace that persists",
    )
    create.add_argument("--idle", type=float, metavar="S", help="seconds unused before it is removed (default: policy)")
    create.add_argument("--lifetime", type=float, metavar="S", help="seconds it lives once ready (default: policy)")
    create.add_argument("--workspace-size", metavar="SIZE", help="hard bound of its /workspace, e.g. 64m")
    add_profile_arguments(create)
    _common(create)
    create.set_defaults(func=_create)

    execute = actions.add_parser(
        "exec",
        help="run code in a session: a kernel cell, or a workspace execution",
        description="Run code in a session and print its output like `gateway run`; a kernel cell's value (the "
        "repr of its last expression) follows on stdout. Exit status: the program's own; 77 denied by policy; "
        "124 killed at the deadline; 137 killed for memory; 125 gateway or engine failure; 2 usage, invalid "
        "request, or no such session (unknown, ended, or another principal's).",
    )
    execute.add_argument("session_id", metavar="SID", type=_session_id)
    src = execute.add_mutually_exclusive_group(required=True)
    src.add_argument("code", nargs="?", metavar="CODE", help="the code, or - to read it from stdin")
    src.add_argument("-f", "--program", metavar="FILE", help="read the code from FILE")
    execute.add_argument("--timeout", type=float, metavar="S", help="wall-clock limit of this execution in seconds")
    add_file_arguments(execute)
    _common(execute)
    execute.set_defaults(func=_exec)

    put = actions.add_parser(
        "put",
        help="copy a local file into a workspace session's /workspace",
        description="Upload LOCAL (- for stdin) to REMOTE, a path under the session's /workspace (default: "
        "LOCAL's name). The path, bytes and sha256 written: on stderr at a terminal, with --json on stdout.",
    )
    put.add_argument("session_id", metavar="SID", type=_session_id)
    put.add_argument("local", metavar="LOCAL", help="the file to send, or - for stdin")
    put.add_argument("remote", metavar="REMOTE", nargs="?", help="its path under /workspace (default: LOCAL's name)")
    _common(put)
    put.set_defaults(func=_put)

    get = actions.add_parser(
        "get",
        help="copy a file out of a workspace session's /workspace",
        description="Download REMOTE, a path under the session's /workspace, to LOCAL (default: REMOTE's name in "
        "the current directory; - for stdout).",
    )
    get.add_argument("session_id", metavar="SID", type=_session_id)
    get.add_argument("remote", metavar="REMOTE", help="its path under /workspace")
    get.add_argument("local", metavar="LOCAL", nargs="?", help="where to write it, or - for stdout")
    _common(get)
    get.set_defaults(func=_get)

    ls = actions.add_parser("ls", help="list your live sessions (operators: --all, everyone's)")
    ls.add_argument("--all", dest="everyone", action="store_true", help="every principal's sessions (operators only)")
    _common(ls)
    ls.set_defaults(func=_ls)

    close = actions.add_parser("close", help="close a session: its sandbox and workspace are removed")
    close.add_argument("session_id", metavar="SID", type=_session_id)
    _common(close)
    close.set_defaults(func=_close)


SESSION_ID_CHARS = 32
"""The length of the ids the gateway issues (192 random bits, URL-safe base64)."""


def _id_chars(text: str) -> bool:
    """Only characters of URL-safe base64, the alphabet of the gateway's ids (so an id can name no other path)."""
    return bool(text) and all(c.isascii() and (c.isalnum() or c in "-_") for c in text)


def _looks_like_session_id(text: str) -> bool:
    return len(text) == SESSION_ID_CHARS and _id_chars(text)


class _Parser(argparse.ArgumentParser):
    """The actions' parser: it reads a session id as an argument even when the id starts with ``-`` (one in 64
    does, URL-safe base64 has ``-`` in its alphabet), where argparse would take it for an option (``-f...``:
    ``-f`` with a value; ``--s...``: ``--service``; else an unknown option)."""

    def _parse_optional(self, arg_string: str) -> Any:
        if _looks_like_session_id(arg_string):
            return None
        return super()._parse_optional(arg_string)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--service", metavar="URL", help=f"the running gateway serve (default: ${URL_ENV})")
    p.add_argument("--json", action="store_true", help="print one JSON object")


# --- request bodies ------------------------------------------------------------------------------------------


def create_body(args: argparse.Namespace) -> dict[str, Any]:
    """``POST /v1/sessions``'s body from ``create``'s flags."""
    body: dict[str, Any] = {"mode": args.mode}
    bounds = (("idle_s", args.idle), ("lifetime_s", args.lifetime), ("workspace_size", args.workspace_size))
    body.update((key, value) for key, value in bounds if value is not None)
    return body | profile_fields(args)


def exec_body(args: argparse.Namespace, stdin_text: str | None = None) -> dict[str, Any]:
    """``POST /v1/sessions/{id}/executions``'s body from ``exec``'s arguments."""
    if args.program is not None:
        code = read_text(Path(args.program), "-f")
    elif args.code == "-":
        code = stdin_text if stdin_text is not None else sys.stdin.read()
    else:
        code = args.code
    body: dict[str, Any] = {"code": code}
    if args.timeout is not None:
        body["limits"] = {"timeout_s": args.timeout}
    if args.env:
        body["env"] = env_field(args.env)
    if args.file:
        body["files"] = files_field(args.file)
    return body


# --- what is printed -----------------------------------------------------------------------------------------


def exec_lines(data: dict[str, Any]) -> tuple[str, list[str]]:
    """An execution's result (``RemoteResult.to_dict()``) as a person reads it: what goes after the program's
    own output on stdout (a kernel cell's value, as a REPL prints it), and the gateway's notes for stderr."""
    value = data.get("value")
    after = f"{value}\n" if value is not None else ""
    notes = [
        f"gateway: warning: {w['rule']} at {w.get('path', '$')}: {w['message']}" for w in data.get("warnings") or []
    ]
    if not data["allowed"] and data.get("error") is None:
        notes.extend(denial_lines(data))
    if data.get("stdout_truncated") or data.get("stderr_truncated"):
        stopped = " and the program was stopped" if data.get("output_limit_killed") else ""
        notes.append(f"gateway: output truncated at the policy's cap{stopped}")
    if data.get("value_truncated"):
        notes.append("gateway: the value was cut at the gateway's bound")
    if data.get("interrupted") and not data.get("session_ended"):
        notes.append("gateway: the cell was interrupted at its deadline; the session and its state remain")
    elif data.get("timed_out"):
        notes.append("gateway: killed at the deadline")
    if data.get("session_ended"):
        notes.append(f"gateway: the session was killed ({data['session_ended']}); its state is gone")
    if data.get("oom_killed"):
        notes.append("gateway: killed for exceeding the memory limit")
    elif data.get("resource_killed"):
        notes.append("gateway: the sandbox ended without reporting the program's exit (killed for a resource limit)")
    if data.get("audit_ok") is False:
        notes.append("gateway: WARNING: the audit record of this request could not be written")
    return after, notes


def denial_lines(data: dict[str, Any]) -> list[str]:
    """A denial (an execution's or a session's: ``request_id``, ``policy``, ``violations``) for stderr."""
    policy = (data.get("policy") or {}).get("name", "?")
    lines = [f"gateway: denied by policy {policy} (request {data['request_id']}):"]
    return lines + [f"  {v['rule']} at {v.get('path', '$')}: {v['message']}" for v in data["violations"]]


def session_lines(sessions: list[dict[str, Any]], *, principals: bool = False) -> list[str]:
    """``ls``: one line per session (id, mode, state, expiry, executions; the owner with ``principals``)."""
    return [
        f"{s['session_id']}  {s['mode']:<9}  {s['state']:<5}  expires {s['expires_at']}  "
        f"executions {s['executions']}" + (f"  principal {s['principal']}" if principals else "")
        for s in sessions
    ]


def _said(error: GatewayError, session_id: str | None) -> GatewayError:
    """The error as this command says it: an unknown session id (or another principal's: the service answers
    both alike) in the words of a shell user."""
    if isinstance(error, SessionNotFoundError) and session_id is not None:
        said = SessionNotFoundError(
            f"no session {session_id} (closed, expired, or not yours)",
            hint="`gateway session ls` lists yours; `gateway session create` makes one",
        )
        said.request_id = error.request_id
        return said
    return error


def _failed(args: argparse.Namespace, error: GatewayError) -> int:
    """Say ``error`` (``--json``: as ``{"error": ...}`` on stdout); its exit status."""
    error = _said(error, getattr(args, "session_id", None))
    if args.json:
        print(json.dumps({"error": error.to_dict()}))
    else:
        print(error.diagnostics(), file=sys.stderr)
    return exit_code_for(error)


def _tell(text: str) -> None:
    """Something for a person watching: stderr, and only when it is a terminal."""
    if sys.stderr.isatty():
        print(text, file=sys.stderr)


def _session_id(text: str) -> str:
    """A SID argument (a usage error naming SID when it is none)."""
    if not _id_chars(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a session id (as `gateway session create` prints)")
    return text


# --- the actions ---------------------------------------------------------------------------------------------


def _client(args: argparse.Namespace, timeout: float | None = None) -> Client:
    """The service's client as the token's principal (usage errors name what is missing)."""
    url = args.service or os.environ.get(URL_ENV, "")
    if not url:
        raise RequestError(
            f"gateway session: no service: pass --service URL or set ${URL_ENV} to the running `gateway serve` "
            "(e.g. http://127.0.0.1:8787)"
        )
    token = os.environ.get(TOKEN_ENV, "")
    if not token:
        raise RequestError(
            f"gateway session: no token: set ${TOKEN_ENV} to the token `gateway principals add` printed (it is "
            "never taken from the command line, which every user of the machine can read)"
        )
    from gateway.client import DEFAULT_TIMEOUT, Client  # noqa: PLC0415 - httpx (the client extra) only here

    try:
        return Client(url, token, timeout=max(DEFAULT_TIMEOUT, timeout or 0))
    except ValueError as exc:  # a token with whitespace
        raise RequestError(f"gateway session: ${TOKEN_ENV}: {exc}") from None


def _run_action(args: argparse.Namespace, action: Callable[[Client], int], timeout: float | None = None) -> int:
    """``action(client)`` with the usage errors and the service's errors said as this command says them."""
    try:
        client = _client(args, timeout)
    except RequestError as exc:
        print(exc.message, file=sys.stderr)
        return EXIT_USAGE
    try:
        with client:
            rc: int = action(client)
    except GatewayError as exc:
        return _failed(args, exc)
    return rc


def _create(args: argparse.Namespace) -> int:
    try:
        body = create_body(args)
    except RequestError as exc:
        print(exc.diagnostics(), file=sys.stderr)
        return EXIT_USAGE

    def create(client: Client) -> int:
        result = client.sessions.create(body)
        if result.error is not None:
            return _failed(args, result.error)
        data = result.to_dict()
        if args.json:
            print(json.dumps(data))
        session = result.session
        if session is None:
            if not args.json:
                print("\n".join(denial_lines(data)), file=sys.stderr)
            return EXIT_DENIED
        if not args.json:
            print(session.session_id)
            _tell(
                f"created {session.mode} session {session.session_id} (expires {data['expires_at']} unless used; "
                f"`gateway session close {session.session_id}` ends it)"
            )
        return 0

    return _run_action(args, create)


def _exec(args: argparse.Namespace) -> int:
    try:
        body = exec_body(args)
    except RequestError as exc:
        print(exc.diagnostics(), file=sys.stderr)
        return EXIT_USAGE

    def execute(client: Client) -> int:
        result: RemoteResult = client.sessions.execute(args.session_id, body)
        data = result.to_dict()
        if args.json:
            print(json.dumps(data, ensure_ascii=False))
            return result.exit_status
        _write(data["stdout"], data["stderr"])
        if result.error is not None:
            _failed(args, result.error)
            return result.exit_status
        after, notes = exec_lines(data)
        _write(after, "")
        for note in notes:
            print(note, file=sys.stderr)
        return result.exit_status

    return _run_action(args, execute, timeout=(args.timeout or 0) + CLIENT_MARGIN_S)


def _write(stdout: str, stderr: str) -> None:
    for text, stream in ((stdout, sys.stdout), (stderr, sys.stderr)):
        if text:
            stream.write(text)
            stream.flush()


def _ls(args: argparse.Namespace) -> int:
    def ls(client: Client) -> int:
        found: list[RemoteSession] = client.sessions.list(operator=args.everyone)
        sessions = [s.to_dict() for s in found]
        if args.json:
            print(json.dumps({"sessions": sessions}))
            return 0
        if not sessions:
            _tell("no live sessions")
        for line in session_lines(sessions, principals=args.everyone):
            print(line)
        return 0

    return _run_action(args, ls)


def _close(args: argparse.Namespace) -> int:
    def close(client: Client) -> int:
        client.sessions.close(args.session_id)
        if args.json:
            print(json.dumps({"session_id": args.session_id, "closed": True}))
        _tell(f"closed session {args.session_id}: its sandbox is gone")
        return 0

    return _run_action(args, close)


def _put(args: argparse.Namespace) -> int:
    remote = args.remote or (None if args.local == "-" else Path(args.local).name)
    if not remote:
        print("gateway session put: reading stdin (-), give the REMOTE path too", file=sys.stderr)
        return EXIT_USAGE
    try:
        data = sys.stdin.buffer.read() if args.local == "-" else Path(args.local).read_bytes()
    except FileNotFoundError:
        print(f"gateway session put: LOCAL {args.local!r} does not exist", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"gateway session put: LOCAL {args.local!r} cannot be read: {exc.strerror}", file=sys.stderr)
        return EXIT_USAGE

    def put(client: Client) -> int:
        stored = client.sessions.put_file(args.session_id, remote, data)
        if args.json:
            print(json.dumps(stored.to_dict()))
        _tell(f"wrote /workspace/{stored.path} ({stored.bytes} bytes, sha256 {stored.sha256})")
        return 0

    return _run_action(args, put)


def _get(args: argparse.Namespace) -> int:
    local = args.local or PurePosixPath(args.remote).name
    if not local or local in (".", ".."):
        print(f"gateway session get: REMOTE {args.remote!r} names no file; give LOCAL too", file=sys.stderr)
        return EXIT_USAGE

    def get(client: Client) -> int:
        data = client.sessions.get_file(args.session_id, args.remote)
        with output_file(local) as out:
            out.write(data)
        if args.json and local != "-":
            print(json.dumps({"path": args.remote, "bytes": len(data), "written": local}))
        if local != "-":
            _tell(f"wrote {local} ({len(data)} bytes) from /workspace/{args.remote}")
        return 0

    return _run_action(args, get)
