"""The public API and the shape of the package: what users import, and which way dependencies point."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import gateway
from gateway.decision import RULE_IDS, RULES

PACKAGE = Path(gateway.__file__).parent

PUBLIC = [
    "Admission",
    "AuditError",
    "AuditIntegrityError",
    "AuditUnavailableError",
    "Caller",
    "ContractError",
    "Decision",
    "EngineUnavailableError",
    "ExecutionRequest",
    "ExecutionResult",
    "Gateway",
    "GatewayError",
    "ImageMissingError",
    "Policy",
    "PolicyError",
    "PolicyNotFoundError",
    "PolicySet",
    "PoolConfig",
    "Problem",
    "RequestError",
    "RuleResult",
    "RunnerError",
    "SandboxError",
    "UnsafeOptionsError",
    "__version__",
    "evaluate",
    "exit_code_for",
    "http_status_for",
    "load_policy",
    "load_policy_text",
    "parse_request",
]


def test_all_is_pinned() -> None:
    assert sorted(gateway.__all__) == PUBLIC
    for name in gateway.__all__:
        assert hasattr(gateway, name), name


def test_the_audit_package_lists_every_public_name_of_its_modules() -> None:
    # in a fresh interpreter: the names not imported yet are exactly the ones imported on first use
    probe = (
        "import gateway, gateway.audit as a; lazy = set(dir(a)) - set(vars(a)); "
        "print(sorted(lazy) == sorted(a.__all__), (set(dir(gateway)) - set(vars(gateway))) <= set(gateway.__all__))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "True"]
    import gateway.audit

    for name in gateway.audit.__all__:
        assert getattr(gateway.audit, name) is not None, name


def test_an_audit_worker_imports_neither_the_policy_package_nor_the_gateway() -> None:
    """Verify, report and export start one fresh interpreter per CPU: the package imports its public names'
    modules on first use, so a worker that needs only the audit modules does not import the policy loader
    (jsonschema), the decision engine or the Gateway (about 0.3 s of CPU each)."""
    probe = (
        "import sys, gateway.audit._scan, gateway.audit.ocsf_export; "
        "print(sorted(m for m in sys.modules if m.startswith(('gateway.policy', 'gateway.decision', "
        "'gateway._gateway', 'jsonschema', 'gateway.audit.jsonl'))))"
    )
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}  # this tree's package, wherever pytest runs
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True, env=env).stdout
    assert out.strip() == "[]"


def test_the_gateway_lives_in_the_core_not_in_service() -> None:
    from gateway import ExecutionResult, Gateway

    assert Gateway.__module__ == "gateway._gateway"
    assert ExecutionResult.__module__ == "gateway.result"
    assert not (PACKAGE / "service.py").exists()


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def _modules(subpackage: str) -> list[Path]:
    return sorted((PACKAGE / subpackage).rglob("*.py"))


def test_the_policy_package_imports_neither_the_decision_nor_intake() -> None:
    for path in _modules("policy"):
        bad = {m for m in _imports(path) if m.startswith(("gateway.decision", "gateway.request", "gateway.runner"))}
        assert not bad, f"{path.name} imports {bad}"


def test_the_principals_store_needs_no_runner_and_no_decision() -> None:
    """The service reads principals (and its configuration) before it builds a Gateway; the CLI manages them
    without an engine. The application and its decision workers are interfaces: they call the Gateway and never
    pick a backend (the ``gateway serve`` command hands them the runner factory) nor decide anything themselves."""
    modules = {path.name: path for path in _modules("service")}
    assert {"principals.py", "config.py", "authlog.py", "app.py"} <= set(modules)
    for path in modules.values():
        imports = _imports(path)
        if path.name in ("app.py", "service.py", "decisions.py"):
            bad = {
                m for m in imports if m.startswith(("gateway.decision", "gateway.runner.docker", "gateway._gateway"))
            }
        else:
            bad = {m for m in imports if m.startswith(("gateway.decision", "gateway.runner", "gateway._gateway"))}
        assert not bad, f"{path.name} imports {bad}"


DOCKER_WORDS = ("mem_limit", "memswap_limit", "nano_cpus", "pids_limit", "cap_drop", "security_opt", "network_mode")


def test_the_decision_package_knows_no_docker() -> None:
    for path in _modules("decision"):
        imports = _imports(path)
        assert not {m for m in imports if m == "docker" or m.startswith(("docker.", "gateway.runner.docker"))}, path
        text = path.read_text(encoding="utf-8")
        assert not [w for w in DOCKER_WORDS if w in text], f"{path.name} names docker-py keys"


def test_docker_py_is_imported_only_by_the_docker_backend() -> None:
    for path in sorted(PACKAGE.rglob("*.py")):
        if PACKAGE / "runner" / "docker" in path.parents:
            continue
        assert not {m for m in _imports(path) if m == "docker" or m.startswith("docker.")}, path


def test_rule_ids_are_unique_and_every_result_carries_a_registered_id() -> None:
    from gateway.policy import load_policy
    from gateway.request import parse_request
    from gateway.resources import default_policy_path
    from gateway.testing import decide

    assert len(RULE_IDS) == len(RULES)
    request = parse_request(
        {"code": "x", "env": {"A": "1"}, "files": {"a": "1"}, "mounts": [{"source": "/srv", "target": "/d"}]}
    )
    decision = decide(load_policy(default_policy_path()), request)
    assert {r.rule for r in decision.results} == RULE_IDS
