"""Arguments shared by the commands: a bad value is a usage error (exit 2) naming its flag.

The request flags (``--image``, ``--memory``, ``--timeout``, ``--mount``, ``--env``, ``--file`` ...) are defined
here once, so ``gateway run`` and ``gateway session create|exec`` spell and read them alike.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gateway.audit.query import parse_time
from gateway.errors import AuditError, RequestError
from gateway.payload import request_file

__all__ = [
    "add_file_arguments",
    "add_profile_arguments",
    "env_field",
    "files_field",
    "profile_fields",
    "read_text",
    "time_argument",
]


def time_argument(value: str) -> str:
    """An RFC 3339 time or a date (``--since``, ``--until``), as the trail's timestamp text."""
    try:
        return parse_time(value)
    except AuditError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (e.g. 2026-12-01T09:30:00Z, or a date: 2026-12-01)") from None


def add_profile_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of the request fields that fix a sandbox's profile (image, language, limits, network, runtime,
    mounts): a run's, and a session's at its creation."""
    p.add_argument("--image", help="sandbox image NAME:TAG (must be on the policy's allowlist)")
    p.add_argument("--language", default=None, help="language of the code (default: the policy's)")
    p.add_argument("--memory", help="memory limit, e.g. 256m (at most the policy's ceiling)")
    p.add_argument("--cpus", type=float, help="CPU limit, e.g. 0.5")
    p.add_argument("--pids", type=int, help="process/thread limit")
    p.add_argument("--timeout", type=float, help="wall-clock limit in seconds")
    p.add_argument("--output-bytes", type=int, help="cap on each of stdout and stderr")
    p.add_argument("--network", help="network mode (default none; others only if the policy lists them)")
    p.add_argument("--runtime", help="container runtime: runc or runsc (gVisor)")
    p.add_argument("--mount", action="append", default=[], metavar="SRC:DST[:ro|rw]", help="bind mount (repeatable)")


def profile_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The request fields the :func:`add_profile_arguments` flags given set (none for a flag not given)."""
    req: dict[str, Any] = {key: getattr(args, key) for key in ("image", "language", "network", "runtime")}
    req = {key: value for key, value in req.items() if value is not None}
    limits = {
        name: value
        for name, value in (
            ("memory", args.memory),
            ("cpus", args.cpus),
            ("pids", args.pids),
            ("timeout_s", args.timeout),
            ("output_bytes", args.output_bytes),
        )
        if value is not None
    }
    if limits:
        req["limits"] = limits
    if args.mount:
        req["mounts"] = [_split_mount(m) for m in args.mount]
    return req


def add_file_arguments(p: argparse.ArgumentParser) -> None:
    """``--env NAME=VALUE`` and ``--file PATH[:DEST]``, both repeatable: read by :func:`env_field` and
    :func:`files_field`."""
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="environment (repeatable)")
    p.add_argument(
        "--file",
        action="append",
        default=[],
        metavar="PATH[:DEST]",
        help="send a file (repeatable; UTF-8 text as text, any other bytes as base64)",
    )


def env_field(items: list[str]) -> dict[str, str]:
    """``--env NAME=VALUE`` flags as a request's ``env``."""
    env: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise RequestError(f"--env {item!r}: expected NAME=VALUE")
        env[name] = value
    return env


def files_field(items: list[str]) -> dict[str, Any]:
    """``--file PATH[:DEST]`` flags as a request's ``files`` (DEST defaults to the file's own name)."""
    files: dict[str, Any] = {}
    for item in items:
        path, _, dest = item.partition(":")
        files[dest or Path(path).name] = _read_file(Path(path))
    return files


def _split_mount(spec: str) -> dict[str, str]:
    parts = spec.split(":")
    if len(parts) == 2:
        return {"source": parts[0], "target": parts[1], "mode": "ro"}
    if len(parts) == 3 and parts[2] in ("ro", "rw"):
        return {"source": parts[0], "target": parts[1], "mode": parts[2]}
    raise RequestError(f"--mount {spec!r}: expected SRC:DST or SRC:DST:ro|rw")


def _read_file(path: Path) -> Any:
    """A ``--file``'s content as a request carries it: UTF-8 text as text, any other bytes as base64."""
    try:
        data = path.read_bytes()
    except FileNotFoundError as exc:
        raise RequestError(f"--file {str(path)!r} does not exist") from exc
    except OSError as exc:
        raise RequestError(f"--file {str(path)!r} cannot be read: {exc.strerror}") from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return request_file(data)


def read_text(path: Path, what: str) -> str:
    """A UTF-8 text file the command reads (a program); ``what`` names it in the error."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise RequestError(f"{what} {str(path)!r} does not exist") from exc
    except UnicodeDecodeError as exc:
        raise RequestError(f"{what} {str(path)!r} is not UTF-8 text") from exc
    except OSError as exc:
        raise RequestError(f"{what} {str(path)!r} cannot be read: {exc.strerror}") from exc
