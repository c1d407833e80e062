"""The contract of ``benchmarks/peers.py --json`` (its shape, not its timings), with the case runners injected,
and the hardened ``docker run`` flags the CLI case is built from. No engine, no timing asserts."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


@pytest.fixture
def peers(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import peers as module  # a script directory: importable once it is on the path

    return module


class FakeCase:
    """A case whose calls return at once (or fail), recording how many lanes each level asked for."""

    def __init__(self, name: str, *, status: str | None = None, fail_after: int | None = None) -> None:
        self.name = name
        self.status = status
        self.fail_after = fail_after
        self.calls = 0
        self.asked: list[int] = []
        self.shrunk = 0
        self._lock = threading.Lock()

    def _run(self) -> str | None:
        with self._lock:
            self.calls += 1
            if self.fail_after is not None and self.calls > self.fail_after:
                raise SystemExit(f"{self.name}: stdout was ''")
        return self.status

    def lanes(self, k: int) -> list[Any]:
        self.asked.append(k)
        return [self._run] * k

    def shrink(self) -> None:
        self.shrunk += 1

    def close(self) -> None:
        pass


def _measure(
    peers: ModuleType, cases: dict[str, Any], errors: dict[str, str], *, burst_requests: int = 6
) -> dict[str, Any]:
    settled: list[str] = []
    report: dict[str, Any] = peers.measure(
        cases,
        errors=errors,
        runtimes=["runc", "runsc"],
        rounds=3,
        warmup=1,
        requests_per_lane=1,
        burst_requests=burst_requests,
        pool_size=2,
        settle=settled.append,
        pool_state=lambda name: {"ready": 2} if name.startswith("gateway_pool") else None,
    )
    report["settled"] = settled
    return report


def test_report_shape_with_injected_cases(peers: ModuleType) -> None:
    names = [f"{base}{suffix}" for suffix in ("", "_runsc") for base in peers.BASE_CASES]
    cases = {n: FakeCase(n, status="hit" if n.startswith("gateway_pool") else None) for n in names}
    cases["epicbox_runsc"] = FakeCase("epicbox_runsc", fail_after=2)  # fails in its third call
    errors = {"llm_sandbox_runsc": "worker did not start: boom"}  # never set up: no case object
    del cases["llm_sandbox_runsc"]

    report = _measure(peers, cases, errors)
    json.dumps(report)  # the whole report is JSON

    assert set(report["cases"]) == set(names)
    for name in names:
        row = report["cases"][name]
        if name in ("epicbox_runsc", "llm_sandbox_runsc"):
            assert set(row) == {"error"}, name  # an error, never numbers
            continue
        assert isinstance(row["p50_ms"], float), name
        assert isinstance(row["p95_ms"], float), name
        assert row["n"] == 3
    assert "stdout was ''" in report["cases"]["epicbox_runsc"]["error"]
    assert report["cases"]["llm_sandbox_runsc"]["error"] == "worker did not start: boom"
    assert report["cases"]["gateway_pool"]["pool"] == {"hit": 3}

    ok = [n for n in names if n not in ("epicbox_runsc", "llm_sandbox_runsc")]
    assert set(report["throughput"]) == set(ok)
    for name in ok:
        assert set(report["throughput"][name]) == {"1", "4", "8"}
        assert all(rps > 0 for rps in report["throughput"][name].values())
        assert cases[name].asked == [1] * 4 + [8] + ([1] if name.startswith("gateway_") else [])
        assert cases[name].shrunk == 1  # the extra lanes given back once its levels are done

    # one call per lane: concurrency 1 is the latency rounds' rate, not timed again
    assert report["throughput_1_from_latency_rounds"] is True
    assert report["throughput_pool"]["gateway_pool"] == {"4": {"hit": 4}, "8": {"hit": 8}}
    assert "gateway_cold" not in report["throughput_pool"]
    assert set(report["burst"]) == {"gateway_cold", "gateway_pool", "gateway_cold_runsc", "gateway_pool_runsc"}
    assert report["burst"]["gateway_pool"]["requests"] == 6
    assert report["burst"]["gateway_pool"]["pool_size"] == 2
    assert report["burst"]["gateway_pool"]["pool"] == {"hit": 6}
    assert report["burst"]["gateway_pool"]["pool_before"] == {"ready": 2}
    assert report["burst"]["gateway_cold"]["pool_size"] is None
    assert "pool" not in report["burst"]["gateway_cold"]
    assert len(report["burst"]["gateway_cold"]["latencies_ms"]) == 6
    assert report["settled"].count("gateway_pool") == 3  # before each timed throughput level and the burst
    assert report["burst_from_throughput_level"] is None  # a burst of 6 is no level: run on its own
    assert set(report["phase_seconds"]) == {"latency", "throughput", "burst"}

    assert set(report["ratios"]) >= {
        "gateway_pool/gateway_cold",
        "gateway_cold/docker_cli",
        "gateway_pool_runsc/epicbox_runsc",
    }
    assert report["ratios"]["gateway_pool_runsc/epicbox_runsc"] is None  # no p50 for a failed case
    assert len(report["targets"]) == 8
    assert all(t["met"] in (True, False, None) for t in report["targets"])


def test_a_failing_call_under_concurrency_is_the_case_error(peers: ModuleType) -> None:
    cases = {"docker_cli": FakeCase("docker_cli", fail_after=5)}  # 1 warm-up + 3 rounds + 1 fine, then fails
    report = _measure(peers, cases, {})
    assert report["cases"]["docker_cli"] == {"error": "at concurrency 4: docker_cli: stdout was ''"}
    assert report["throughput"] == {}  # no partial row for a failed case


def test_quick_defaults_and_bad_arguments(peers: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    args = peers.parse_args(["--quick", "--json", "--cases", "gateway_cold,gateway_pool", "--runtimes", "runc"])
    assert (args.n, args.warmup, args.throughput_requests, args.burst_factor) == (3, 1, 1, 2)
    assert args.cases == ["gateway_cold", "gateway_pool"]
    assert args.runtimes == ["runc"]
    with pytest.raises(SystemExit):
        peers.parse_args(["--cases", "gateway_warm"])
    assert "unknown ['gateway_warm']" in capsys.readouterr().err


def test_cli_flags_carry_the_gateways_hardening(peers: ModuleType, tmp_path: Path) -> None:
    import cases  # on the path through the fixture

    options = cases.gateway_profile_options("runc", tmp_path / "audit")
    assert options["labels"]["io.agent-gateway.policy"].startswith("default@sha256:")  # the profile part only
    assert "io.agent-gateway.request" not in options["labels"]
    flags = cases.cli_flags({**options, "labels": {"x": "1"}}, tmp_path)
    joined = " ".join(flags)
    for expected in (
        "--rm",
        "--network none",
        "--read-only",
        "--cap-drop ALL",
        "--security-opt no-new-privileges",
        "--user 65534:65534",
        "--pids-limit 64",
        "--ipc private",
        "--cgroupns private",
        "--runtime runc",
        "--label x=1",
    ):
        assert expected in joined, expected
    seccomp = next(f for f in flags if f.startswith("seccomp="))
    assert json.loads(Path(seccomp.removeprefix("seccomp=")).read_text())["defaultAction"]
    with pytest.raises(SystemExit, match="no CLI flag for option 'privileged'"):
        cases.cli_flags({"privileged": True}, tmp_path)


def test_one_call_per_lane_takes_the_burst_from_the_level_of_its_size(peers: ModuleType) -> None:
    names = ["gateway_cold", "gateway_pool", "docker_cli"]
    cases = {n: FakeCase(n, status="hit" if n == "gateway_pool" else None) for n in names}
    report = _measure(peers, cases, {}, burst_requests=4)
    assert report["burst_from_throughput_level"] == 4
    assert set(report["burst"]) == {"gateway_cold", "gateway_pool"}
    assert report["burst"]["gateway_pool"]["requests"] == 4
    assert report["burst"]["gateway_pool"]["pool"] == {"hit": 4}
    assert report["burst"]["gateway_pool"]["pool_before"] == {"ready": 2}  # what the level started from
    assert report["burst"]["gateway_cold"]["pool_size"] is None
    for name in names:  # no call beyond the latency rounds and the two timed levels
        assert cases[name].calls == 4 + 4 + 8, name
        assert cases[name].asked == [1] * 4 + [8], name
