"""What one decision costs (validate, decide, total, whole ``Gateway.decide``) against a baseline in the same run,
and what parsing the worst request body would cost an event loop.

Decision cost: a typical request (``decision.REQUEST``, as JSON bytes, the way the HTTP interface hands it over)
goes through ``parse_request`` (*validate*: decode, copy, schema, build) and ``evaluate`` with the Docker
assembler and its guard under the compiled default policy (*decide*); *total* is both. *gateway* is a whole
``Gateway.decide`` of the same body (intake, decision, and the two audit records appended to a real
``JsonlAuditTrail`` with fsync), what ``POST /v1/decisions`` runs. Figures are CPU time per call (the cost
without the other sessions' load on the machine). Every block runs in a fresh ``python -I`` interpreter, and
blocks alternate between this checkout (or ``--code DIR``) and the baseline (``--baseline DIR``, a checkout of
another commit, or ``--baseline-rev REV``, extracted from this repository with ``git archive``), so drift in the
machine's load hits both alike; the ratios this/baseline are of the medians over blocks.

Worst bodies: the request bodies the service takes are at most ``max_body_bytes`` (4 MiB by default). Some
shapes of that size are expensive; each is timed (CPU) through ``json.loads`` and ``orjson.loads`` (the parse
alone), both schema validators on the parsed document, and the gateway's whole ``parse_request``, in this
process. An event loop that did any of it itself would stall every connection for that long.

    PYTHONPATH=. .venv/bin/python benchmarks/decision_cost.py [--code DIR] [--baseline-rev REV | --baseline DIR]
        [--n 2000] [--blocks 5] [--gateway-n 1000] [--repeat 3] [--max-body-bytes 4194304]
        [--skip-bodies | --skip-cost]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema_rs
import orjson
from jsonschema import Draft202012Validator

from gateway.errors import RequestError
from gateway.request import parse_request
from gateway.resources import load_schema

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decision import REQUEST  # the benchmark's typical request, next to this file

HERE = Path(__file__).resolve().parent.parent

# One block, run as `python -I -c BLOCK DIR N GATEWAY_N REQUEST_JSON`: -I ignores PYTHONPATH and the working
# directory, so DIR (first on sys.path) is the only gateway it imports. Public API only (the same in old and new).
BLOCK = """
import sys
sys.path.insert(0, sys.argv[1])
import gc, json, tempfile, time
import gateway
from gateway import Gateway
from gateway.audit import JsonlAuditTrail
from gateway.decision import evaluate
from gateway.policy import compile_policy, load_policy
from gateway.request import parse_request
from gateway.resources import default_policy_path
from gateway.runner.docker.options import DockerAssembler
from gateway.runner.fake import FakeRunner
n, gateway_n, body = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].encode()
clock = time.thread_time_ns
policy, assembler = compile_policy(load_policy(default_policy_path())), DockerAssembler()
for _ in range(300):
    assert evaluate(policy, parse_request(body), assembler=assembler).allowed
gc.collect()
validate = decide = 0
for _ in range(n):
    t0 = clock()
    request = parse_request(body)
    t1 = clock()
    decision = evaluate(policy, request, assembler=assembler)
    t2 = clock()
    validate += t1 - t0
    decide += t2 - t1
    assert decision.allowed
with tempfile.TemporaryDirectory() as directory:
    trail = JsonlAuditTrail(directory)
    gw = Gateway(load_policy(default_policy_path()), runner=FakeRunner(), audit=trail)
    for _ in range(100):
        assert gw.decide(body).allowed
    cpu = time.process_time()
    for _ in range(gateway_n):
        gw.decide(body)
    cpu = time.process_time() - cpu
    gw.close()
    trail.close()
print(json.dumps({
    "gateway_file": gateway.__file__,
    "validate_us": validate / n / 1000, "decide_us": decide / n / 1000,
    "total_us": (validate + decide) / n / 1000, "gateway_us": cpu / gateway_n * 1e6,
}))
"""
STAGES = ("validate_us", "decide_us", "total_us", "gateway_us")


def _block(directory: Path, n: int, gateway_n: int) -> dict[str, Any]:
    body = json.dumps(REQUEST)
    argv = [sys.executable, "-I", "-c", BLOCK, str(directory), str(n), str(gateway_n), body]
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        sys.exit(f"a block in {directory} failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout)
    if not Path(result["gateway_file"]).resolve().is_relative_to(directory.resolve()):
        sys.exit(f"the block imported {result['gateway_file']}, not a gateway under {directory}")
    return result


def _extract(rev: str, into: Path) -> Path:
    """The tree of ``rev`` of this repository, written under ``into``."""
    archive = subprocess.run(["git", "-C", str(HERE), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def decision_cost(codes: dict[str, Path], label: str, n: int, gateway_n: int, blocks: int) -> None:
    """The four stages' CPU per call in each of ``codes`` (``this``, and ``baseline`` when given)."""
    figures: dict[str, dict[str, list[float]]] = {code: {stage: [] for stage in STAGES} for code in codes}
    for block in range(blocks):
        for code, directory in codes.items():
            result = _block(directory, n, gateway_n)
            for stage in STAGES:
                figures[code][stage].append(result[stage])
            shown = "   ".join(f"{stage.removesuffix('_us')} {result[stage]:7.1f}" for stage in STAGES)
            print(f"block {block + 1} {code:>8}: {shown}  us CPU/call   load {os.getloadavg()[0]:.2f}")
    print()
    print(f"{'median over blocks, us CPU/call':34}" + "".join(f"{s.removesuffix('_us'):>12}" for s in STAGES))
    medians = {code: {s: statistics.median(v) for s, v in stages.items()} for code, stages in figures.items()}
    for code, stages in medians.items():
        name = f"{code} ({label})" if code == "baseline" else f"{code} ({codes['this']})"
        print(f"{name[:34]:34}" + "".join(f"{stages[s]:12.1f}" for s in STAGES))
    if "baseline" in codes:
        ratios = "".join(f"{medians['this'][s] / medians['baseline'][s]:12.2f}" for s in STAGES)
        print(f"{'this / baseline':34}{ratios}")


# --- the worst body --------------------------------------------------------------------------------------


def _filled(head: bytes, item: bytes | Callable[[int], bytes], tail: bytes, size: int) -> bytes:
    """``head``, then items (``item``, or ``item(i)`` for the i-th) comma-separated, then ``tail``: as many items
    as fit in ``size`` bytes."""
    make = item if callable(item) else (lambda _i: item)
    parts, room = [], size - len(head) - len(tail) + 1
    while room >= len(part := make(len(parts))) + 1:
        parts.append(part)
        room -= len(part) + 1
    return head + b",".join(parts) + tail


def bodies(size: int) -> dict[str, bytes]:
    head, tail = b'{"code":"x","metadata":{"a":[', b"]}}"
    return {
        "metadata: [[],[],...]": _filled(head, b"[]", tail, size),
        "metadata: [{},{},...]": _filled(head, b"{}", tail, size),
        "metadata: [0,0,...]": _filled(head, b"0", tail, size),
        'metadata: ["","",...]': _filled(head, b'""', tail, size),
        'env: {"A0":"",...}': _filled(b'{"code":"x","env":{', lambda i: b'"A%d":""' % i, b"}}", size),
        "one long string": b'{"code":"' + b"x" * (size - 12) + b'"}',
    }


def _cpu_ms(call: Callable[[], object], repeat: int) -> tuple[float, object]:
    """Least CPU time of ``call`` over ``repeat`` runs (one run when it takes over a second), and its result."""
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.thread_time()
        result = call()
        best = min(best, time.thread_time() - start)
        if best > 1.0:
            break
    return best * 1000, result


def _outcome(body: bytes) -> str:
    try:
        parse_request(body)
    except RequestError as exc:
        return f"refused, {len(exc.problems)} problem(s)"
    return "accepted"


def worst_bodies(size: int, repeat: int) -> None:
    """CPU ms of each expensive body: the parse alone (json, orjson), each schema validator on the parsed
    document (jsonschema-rs's verdict; python-jsonschema's every error, which explains a refused request), and
    the gateway's whole ``parse_request`` (decode, copy, validate, build)."""
    schema = load_schema("request")
    fast = jsonschema_rs.Draft202012Validator(schema, validate_formats=True, ignore_unknown_formats=False)
    explain = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    print(f"\nworst bodies of at most {size} bytes (max_body_bytes), CPU ms (least of {repeat}; one run over 1 s):")
    columns = ("json.loads", "orjson", "jsonschema-rs", "py-jsonschema", "parse_request")
    print(f"{'body':24}{'bytes':>9}" + "".join(f"{c:>15}" for c in columns) + "   outcome")
    for name, body in bodies(size).items():
        assert len(body) <= size, name
        plain, doc = _cpu_ms(lambda body=body: json.loads(body), repeat)
        rust, _ = _cpu_ms(lambda body=body: orjson.loads(body), repeat)
        verdict, _ = _cpu_ms(lambda doc=doc: fast.is_valid(doc), repeat)
        errors, _ = _cpu_ms(lambda doc=doc: list(explain.iter_errors(doc)), repeat)
        whole, outcome = _cpu_ms(lambda body=body: _outcome(body), repeat)
        figures = "".join(f"{ms:15.1f}" for ms in (plain, rust, verdict, errors, whole))
        print(f"{name:24}{len(body):>9}{figures}   {outcome}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--code", type=Path, default=HERE, help="the code measured (default: this checkout)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--baseline", type=Path, metavar="DIR", help="a checkout of the baseline code")
    which.add_argument("--baseline-rev", metavar="REV", help="a revision of this repository as the baseline")
    parser.add_argument("--n", type=int, default=2000, help="validate+decide calls per block (default 2000)")
    parser.add_argument("--gateway-n", type=int, default=1000, help="Gateway.decide calls per block (default 1000)")
    parser.add_argument("--blocks", type=int, default=5, help="blocks per code (default 5)")
    parser.add_argument("--repeat", type=int, default=3, help="timings of each worst body (default 3)")
    parser.add_argument("--max-body-bytes", type=int, default=4 * 1024 * 1024, help="(default 4 MiB)")
    parser.add_argument("--skip-bodies", action="store_true", help="only the decision cost")
    parser.add_argument("--skip-cost", action="store_true", help="only the worst bodies")
    args = parser.parse_args()
    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if not args.skip_cost:
        with tempfile.TemporaryDirectory() as scratch:
            baseline, label = None, ""
            if args.baseline is not None:
                baseline, label = args.baseline.resolve(), str(args.baseline)
            elif args.baseline_rev is not None:
                baseline, label = _extract(args.baseline_rev, Path(scratch)), args.baseline_rev
            codes = {"this": args.code.resolve()} | ({} if baseline is None else {"baseline": baseline})
            decision_cost(codes, label, args.n, args.gateway_n, args.blocks)
    if not args.skip_bodies:
        worst_bodies(args.max_body_bytes, args.repeat)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
