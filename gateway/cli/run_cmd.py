"""``gateway run``, ``gateway reap`` and ``gateway doctor``."""

from __future__ import annotations

import argparse
import codecs
import contextlib
import json
import signal
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from gateway import ExecutionResult, Gateway
from gateway.cli.arguments import (
    add_file_arguments,
    add_profile_arguments,
    env_field,
    files_field,
    profile_fields,
    read_text,
)
from gateway.cli.backend import add_backend_args, make_runner
from gateway.cli.otel import OTEL_HELP, setup_otel
from gateway.errors import (
    EXIT_USAGE,
    AuditError,
    GatewayError,
    InterruptedRunError,
    PolicyError,
    RequestError,
    exit_code_for,
)

__all__ = ["build_request", "register"]


def register(sub: argparse._SubParsersAction[Any]) -> None:
    run = sub.add_parser(
        "run",
        help="run code through the gateway",
        description="Decide, audit and run code in a hardened single-use sandbox. Exit status: the program's own; "
        "77 denied by policy; 75 waiting for an operator's approval (the approval id on stderr; nothing ran); "
        "124 killed at the deadline; 137 killed for memory (or the sandbox killed for another "
        "resource limit); 125 gateway or engine failure; 130 / 143 the gateway itself was interrupted (SIGINT / "
        "SIGTERM: its sandbox removed, the outcome recorded); "
        "2 usage or invalid request.",
    )
    src = run.add_mutually_exclusive_group(required=True)
    src.add_argument("--code", help="the program text")
    src.add_argument("source", nargs="?", help="a file with the program, or - for stdin")
    add_profile_arguments(run)
    add_file_arguments(run)
    run.add_argument(
        "--package",
        action="append",
        default=[],
        metavar="SPEC",
        help="install a package before the run (repeatable; pip requirement or npm spec, as the policy's "
        "spec.packages allows)",
    )
    run.add_argument(
        "--egress",
        action="append",
        default=[],
        metavar="HOST[:PORT[,PORT...]]",
        help="with --network egress: reach only this host (repeatable; narrows the policy's list, never widens it)",
    )
    run.add_argument("--principal", help="who is asking (agent name)")
    _common(run)
    run.set_defaults(func=_run)

    reap = sub.add_parser(
        "reap",
        help="remove sandbox containers left behind by a crash: this instance's and expired ones",
        description="Remove gateway sandbox containers past their deadline (and this instance's, named by "
        "$GATEWAY_INSTANCE). Other instances' live sandboxes are left alone unless --all is given.",
    )
    _common(reap)
    reap.add_argument(
        "--all", dest="everything", action="store_true", help="remove every gateway container, live or not"
    )
    reap.set_defaults(func=_reap)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", help="policy file (default: $GATEWAY_POLICY, then the shipped default policy)")
    p.add_argument("--audit-dir", help="audit trail directory (default: $GATEWAY_AUDIT_DIR, then ./audit)")
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON result object at the end instead of the program output (written live without it)",
    )
    p.add_argument("--otel", metavar="EXPORTER", help=OTEL_HELP)
    add_backend_args(p)


def build_request(args: argparse.Namespace, stdin_text: str | None = None) -> dict[str, Any]:
    """Turn ``gateway run`` flags into a request object (the same JSON the HTTP API and ``check`` take)."""
    if args.code is not None:
        code = args.code
    elif args.source == "-":
        code = stdin_text if stdin_text is not None else sys.stdin.read()
    else:
        code = read_text(Path(args.source), "program file")
    req: dict[str, Any] = {"code": code, **profile_fields(args)}
    if args.principal is not None:
        req["principal"] = args.principal
    if args.env:
        req["env"] = env_field(args.env)
    if args.file:
        req["files"] = files_field(args.file)
    if args.package:
        req["packages"] = list(args.package)
    if args.egress:
        req["egress"] = [egress_destination(item) for item in args.egress]
    return req


def egress_destination(item: str) -> dict[str, Any]:
    """``--egress HOST[:PORT[,PORT...]]`` as a request's ``egress`` entry (an IPv6 literal in brackets:
    ``[2001:db8::1]:443``); without ports the policy's default port applies."""
    host, ports = item, ""
    if item.startswith("["):
        end = item.find("]")
        rest = item[end + 1 :]
        if end < 0 or (rest and not rest.startswith(":")):
            raise RequestError(f"--egress {item!r}: expected [IPv6]:PORT or [IPv6]")
        host, ports = item[1:end], rest[1:]
    elif item.count(":") == 1:
        host, _, ports = item.partition(":")
    if not host:
        raise RequestError(f"--egress {item!r}: expected HOST[:PORT[,PORT...]]")
    entry: dict[str, Any] = {"host": host}
    if ports:
        try:
            entry["ports"] = [int(port) for port in ports.split(",")]
        except ValueError:
            raise RequestError(f"--egress {item!r}: ports must be numbers separated by commas") from None
    return entry


class _LiveOutput:
    """The program's output written to this process's stdout/stderr as the runner collects it.

    Decoded as UTF-8 with replacement like the final result (incrementally, so a character split across
    chunks is not mangled). ``finish`` writes whatever of the result was not streamed (nothing, with the Docker
    runner: the streamed bytes are the result's bytes), so nothing is printed twice."""

    def __init__(self) -> None:
        self._decoders = {name: codecs.getincrementaldecoder("utf-8")("replace") for name in ("stdout", "stderr")}
        self._sent = {"stdout": 0, "stderr": 0}

    def __call__(self, stream: str, data: bytes) -> None:
        self._sent[stream] += len(data)
        self._write(stream, self._decoders[stream].decode(data))

    def finish(self, result: ExecutionResult) -> None:
        outcome = result.outcome
        for stream in ("stdout", "stderr"):
            rest = (getattr(outcome, stream) if outcome is not None else b"")[self._sent[stream] :]
            self._write(stream, self._decoders[stream].decode(rest, final=True))

    @staticmethod
    def _write(stream: str, text: str) -> None:
        if text:
            out = sys.stdout if stream == "stdout" else sys.stderr
            out.write(text)
            out.flush()


def _print_human(result: ExecutionResult, live: _LiveOutput) -> None:
    data = result.to_dict()
    live.finish(result)
    notes: list[str] = [
        f"gateway: warning: {w['rule']} at {w.get('path', '$')}: {w['message']}"
        + ("" if "mode)" in w["message"] else f" ({w.get('mode', 'audit')} mode)")
        for w in data["warnings"]
    ]
    if result.pending:
        notes.append(_pending_note(result))
    elif result.decision is not None and not result.decision.allowed:
        notes.append(f"gateway: denied by policy {data['policy']['name']} (request {result.request_id}):")
        notes.extend(f"  {v['rule']} at {v.get('path', '$')}: {v['message']}" for v in data["violations"])
    if result.error is not None:
        notes.append(result.error.diagnostics())
        if isinstance(result.error, PolicyError) and result.decision is None:
            notes.append("gateway: nothing ran; the rejection is recorded in the audit trail (policy.rejected)")
    if data["stdout_truncated"] or data["stderr_truncated"]:
        notes.append(
            "gateway: output truncated at the policy's cap"
            + (" and the program was stopped" if data["output_limit_killed"] else "")
        )
    if data["timed_out"]:
        notes.append("gateway: killed at the deadline")
    if data["oom_killed"]:
        notes.append("gateway: killed for exceeding the memory limit")
    reason = (result.outcome.sandbox.get("reason") if result.outcome is not None else None) or ""
    if reason == "Evicted":
        notes.append("gateway: the node evicted the sandbox's Pod (node pressure or its ephemeral-storage limit)")
    elif data["resource_killed"]:
        notes.append("gateway: the sandbox ended without reporting the program's exit (killed for a resource limit)")
    egress = data.get("egress")
    if egress is not None:  # a run with network egress: what its proxy saw (each connection is in the trail)
        notes.append(
            f"gateway: egress: {egress['connections']} connection(s), {egress['denied']} denied, "
            f"{egress['bytes_out']} bytes out, {egress['bytes_in']} bytes in"
        )
    if not result.audit_ok:
        notes.append("gateway: WARNING: the audit record of this request could not be written")
    for note in notes:
        print(note, file=sys.stderr)


def _pending_note(result: ExecutionResult) -> str:
    """What a held request tells people: its approval id, the rules that asked, and what happens next."""
    rules = ", ".join(r.rule for r in result.decision.approvals) if result.decision is not None else ""
    return (
        f"gateway: waiting for approval {result.approval_id} (asked by {rules}); nothing ran. An operator decides with "
        f"`gateway approvals approve {result.approval_id} --reason ...` (or deny); then run the identical request again"
    )


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """SIGTERM and SIGINT raise :class:`InterruptedRunError` in the main thread, once.

    Raised inside the runner, it ends the run like any runner failure: the runner kills and removes the
    container in its ``finally``, and the Gateway records the outcome with this error. A second signal during
    that clean-up is ignored, so that the clean-up and the outcome record complete. (A gateway killed with
    SIGKILL cannot clean up: then the supervisor sees its stdin close and ends the sandbox itself.)
    """
    if threading.current_thread() is not threading.main_thread():  # signal handlers belong to the main thread
        yield
        return
    names = (signal.SIGTERM, signal.SIGINT)
    previous = {signum: signal.getsignal(signum) for signum in names}

    def interrupted(signum: int, frame: FrameType | None) -> None:
        for name in names:
            signal.signal(name, signal.SIG_IGN)
        raise InterruptedRunError(signum)

    for signum in names:
        signal.signal(signum, interrupted)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _run(args: argparse.Namespace) -> int:
    try:
        request = build_request(args)
    except RequestError as exc:
        print(exc.diagnostics(), file=sys.stderr)
        return EXIT_USAGE
    shutdown = setup_otel(args.otel)
    live = _LiveOutput()  # human output is written as it arrives; --json stays one object at the end
    runner = None
    try:
        runner = make_runner(args)
        with _interruptible(), Gateway.from_env(args.policy, args.audit_dir, runner=runner) as gw:
            _sweep(gw)
            result = gw.execute(request, on_output=None if args.json else live)
    except GatewayError as exc:
        # The gateway could not start (policy unusable, trail unwritable), or was interrupted before it ran
        # anything: fail closed. Only a trail failure means a record is missing: an unusable policy was recorded
        # as policy.rejected before Gateway.from_env raised (when that record fails, the AuditError is raised).
        result = ExecutionResult(uuid.uuid4().hex, None, error=exc, audit_ok=not isinstance(exc, AuditError))
    finally:
        if runner is not None:
            runner.close()
        shutdown()
    if args.json:
        print(json.dumps(result.to_dict(), ensure_ascii=False))
        if result.pending:
            print(_pending_note(result), file=sys.stderr)
    else:
        _print_human(result, live)
    if isinstance(result.error, InterruptedRunError):
        return 128 + result.error.signum
    return result.exit_status


def _sweep(gw: Gateway) -> None:
    """Remove sandboxes that outlived their deadline (a gateway killed mid-run, an engine restart): audited.
    Best effort: an engine that cannot be listed now is reported by the run itself."""
    try:
        gw.reap(expired_only=True)
    except InterruptedRunError:
        raise
    except GatewayError:
        pass


def _reap(args: argparse.Namespace) -> int:
    shutdown = setup_otel(args.otel)
    runner = None
    try:
        runner = make_runner(args)
        with Gateway.from_env(args.policy, args.audit_dir, runner=runner) as gw:
            ids = gw.reap(everything=args.everything)
    except GatewayError as exc:
        if args.json:
            print(json.dumps({"error": exc.to_dict()}))
        else:
            print(exc.diagnostics(), file=sys.stderr)
        return exit_code_for(exc)
    finally:
        if runner is not None:
            runner.close()
        shutdown()
    if args.json:
        print(json.dumps({"removed": ids}))
    else:
        print(f"removed {len(ids)} container(s)" + (": " + " ".join(i[:12] for i in ids) if ids else ""))
    return 0
