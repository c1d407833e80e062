#!/usr/bin/env python3
"""The dependency audit of scripts/test.sh: pip-audit over the locked set (requirements/dev.txt).

    .venv/bin/python scripts/audit-deps.py [--lock FILE] [--ignore FILE] [--timeout SECONDS]

pip-audit asks a vulnerability service on the network about every pinned version (nothing is installed: the
lock is hashed and fully pinned, so no resolution is needed). The outcome is one line on stderr:

- ``==> pip-audit: N locked packages, no known vulnerabilities`` (exit 0);
- ``==> pip-audit: FAILED: ...`` with each vulnerable package, its version, the advisory and the fixed versions
  (exit 1), also for an ignore list that is not valid;
- ``==> pip-audit: SKIPPED: vulnerability service unreachable (...)`` (exit 0) when the service cannot be
  reached or does not answer within the time bound: CI without that network passes, and says so.

An advisory is ignored only when ``requirements/audit-ignore.txt`` names it (its id or any alias: PYSEC, GHSA,
CVE) with a reason on the same line. Any other failure of pip-audit (a broken lock, a crash) fails the step.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TIMEOUT_S = 180
_NETWORK = re.compile(
    r"requests\.exceptions\.(ConnectionError|ProxyError|ConnectTimeout|ReadTimeout|Timeout|SSLError)"
    r"|urllib3\.exceptions\.(MaxRetryError|NewConnectionError|ProxyError|ReadTimeoutError|ConnectTimeoutError)"
    r"|Temporary failure in name resolution|Name or service not known|Network is unreachable"
    r"|Connection refused|timed out"
)
"""What pip-audit's output says when the vulnerability service was not reached (not a finding, not a bug)."""


@dataclass(frozen=True)
class Ignored:
    advisory: str
    reason: str
    line: int


def say(text: str) -> None:
    print(f"==> pip-audit: {text}", file=sys.stderr, flush=True)


def read_ignores(path: Path) -> list[Ignored]:
    """``ID reason...`` lines; every entry needs a reason (what makes the advisory not apply, or until when)."""
    if not path.exists():
        return []
    found: list[Ignored] = []
    problems: list[str] = []
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        advisory, _, reason = text.partition(" ")
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9]*-[A-Za-z0-9-]+", advisory):
            problems.append(f"{path.name}:{number}: {advisory!r} is not an advisory id (PYSEC-..., GHSA-..., CVE-...)")
        elif not reason.strip():
            problems.append(f"{path.name}:{number}: {advisory} has no reason; write why it does not apply")
        else:
            found.append(Ignored(advisory.upper(), reason.strip(), number))
    if problems:
        raise ValueError("; ".join(problems))
    return found


def unreachable(output: str) -> str | None:
    """A one-line cause when pip-audit's output shows that the service was not reached."""
    if _NETWORK.search(output) is None:
        return None
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    last = next((line for line in reversed(lines) if _NETWORK.search(line)), lines[-1] if lines else "")
    return last[:200]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lock", type=Path, default=ROOT / "requirements" / "dev.txt")
    parser.add_argument("--ignore", type=Path, default=ROOT / "requirements" / "audit-ignore.txt")
    parser.add_argument(
        "--timeout", type=float, default=float(os.environ.get("GATEWAY_AUDIT_TIMEOUT", DEFAULT_TIMEOUT_S))
    )
    args = parser.parse_args(argv)
    try:
        ignores = read_ignores(args.ignore)
    except ValueError as exc:
        say(f"FAILED: {exc}")
        return 1
    pip_audit = Path(sys.executable).parent / "pip-audit"
    if not pip_audit.exists():
        say(f"FAILED: {pip_audit} is missing (it is a dev dependency: run bash scripts/setup.sh)")
        return 1
    with tempfile.TemporaryDirectory(prefix="pip-audit-") as tmp:
        report = Path(tmp) / "report.json"
        cmd = [str(pip_audit), "--disable-pip", "--require-hashes", "--requirement", str(args.lock)]
        cmd += ["--progress-spinner", "off", "--timeout", "15", "--format", "json", "--output", str(report)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, check=False)
        except subprocess.TimeoutExpired:
            say(f"SKIPPED: vulnerability service unreachable (no complete answer within {args.timeout:.0f} s)")
            return 0
        output = f"{done.stdout}\n{done.stderr}"
        if not report.exists():
            cause = unreachable(output)
            if cause is not None:
                say(f"SKIPPED: vulnerability service unreachable ({cause})")
                return 0
            sys.stderr.write(output)
            say(f"FAILED: pip-audit exited {done.returncode} without a report (see its output above)")
            return 1
        deps = json.loads(report.read_text(encoding="utf-8")).get("dependencies", [])
    return judge(deps, ignores)


def judge(deps: list[dict[str, object]], ignores: list[Ignored]) -> int:
    """Exit status for pip-audit's JSON ``dependencies``: 1 when any advisory is not on the ignore list."""
    by_id = {i.advisory: i for i in ignores}
    used: set[str] = set()
    findings: list[str] = []
    for dep in deps:
        for vuln in dep.get("vulns") or []:  # type: ignore[attr-defined]
            names = {str(vuln["id"]).upper(), *(str(a).upper() for a in vuln.get("aliases") or [])}
            matched = names & by_id.keys()
            if matched:
                used |= matched
                continue
            fixed = ", ".join(vuln.get("fix_versions") or []) or "no fixed release yet"
            findings.append(f"{dep['name']} {dep['version']}: {vuln['id']} (fixed in: {fixed})")
    stale = [i for i in ignores if i.advisory not in used]
    for entry in stale:
        say(f"note: audit-ignore.txt:{entry.line}: {entry.advisory} matches no finding any more; remove it")
    if findings:
        say(f"FAILED: {len(findings)} known vulnerabilit{'y' if len(findings) == 1 else 'ies'} in the locked set:")
        for line in findings:
            print(f"    {line}", file=sys.stderr)
        print(
            "    upgrade the pin (bash scripts/lock.sh --upgrade-package NAME) or, when an advisory does not apply, "
            "add it to requirements/audit-ignore.txt with the reason",
            file=sys.stderr,
        )
        return 1
    ignored = f" ({len(used)} ignored with a reason)" if used else ""
    say(f"{len(deps)} locked packages, no known vulnerabilities{ignored}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
