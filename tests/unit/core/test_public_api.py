"""The public API and the shape of the package: what users import, and which way dependencies point."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
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


def test_the_principals_store_needs_no_runner_and_no_decision() -> None:
    """The service reads principals (and its configuration) before it builds a Gateway; the CLI manages them
    without an engine. The application and its decision workers are interfaces: they call the Gateway and never
    pick a backend (the ``gateway serve`` command hands them the runner factory) nor decide anything themselves."""
    modules = {path.name: path for path in _modules("service")}
    assert {"model.py", "loading.py", "store.py", "config.py", "authlog.py", "app.py"} <= set(modules)
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


# -- Layers and circles: no import runs upward, no modules import each other in a circle -------------------------

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "base",
        (
            "_files.py",
            "_lazy.py",
            "_ticker.py",
            "_version.py",
            "_workers.py",
            "canonical.py",
            "errors.py",
            "hostfs.py",
            "payload.py",
            "resources.py",
            "runspec.py",
            "sizes.py",
            "slots.py",
            "validation.py",
            "yamlstrict.py",
        ),
    ),
    ("egress", ("egress/",)),
    ("audit", ("audit/",)),
    ("policy", ("policy/",)),
    ("request", ("request.py",)),
    ("decision", ("decision/",)),
    ("runner interface", ("runner/frames.py", "runner/interface.py", "runner/supervisor.py")),
    ("runner backends", ("runner/",)),
    ("gateway", ("_gateway.py", "packages/", "result.py", "sessions/", "telemetry.py", "testing.py")),
    ("reports", ("doctor/", "report/", "sbom.py")),
    (
        "interfaces",
        ("__init__.py", "__main__.py", "cli/", "client.py", "executor.py", "service/", "simple.py", "tool.py"),
    ),
)
"""The package's layers, lowest first, by path under ``gateway/``; a folder holds every module below it that no
longer entry names. A module imports from its own layer and the ones below, never from one above.
docs/ARCHITECTURE.md ("Dependency rule") lists the same layers."""


@dataclass(frozen=True)
class Import:
    """One module of the package importing another, where the import statement is."""

    source: str
    """The importing module's path under the package, e.g. ``decision/engine.py``."""
    line: int
    target: str
    """The imported module's path under the package: ``from gateway.x import name`` imports ``x.py`` (or
    ``x/__init__.py``), or ``x/name.py`` when that is a module."""


def module_paths(package: Path) -> list[str]:
    return sorted(path.relative_to(package).as_posix() for path in package.rglob("*.py"))


def package_imports(package: Path) -> list[Import]:
    """Every import of one of ``package``'s modules by another, at module level or inside a function or class;
    imports under ``if TYPE_CHECKING:`` are left out (they never run)."""
    names = {_dotted(package.name, path): path for path in module_paths(package)}
    found: dict[Import, None] = {}  # one per statement and module imported, in the order met
    for name, path in names.items():
        tree = ast.parse((package / path).read_text(encoding="utf-8"), path)
        for line, imported in _imported_names(tree, name, path.endswith("__init__.py")):
            target = _longest_module_prefix(imported, names)
            if target is not None and target != name:
                found[Import(path, line, names[target])] = None
    return list(found)


def _dotted(package_name: str, path: str) -> str:
    parts = [package_name, *path.removesuffix(".py").split("/")]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_names(tree: ast.Module, module: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """``(line, dotted name)`` of every import that runs; a ``from`` import yields ``module.name`` for each name
    (a submodule, or a name defined in the module)."""
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")
                parts = parts[: len(parts) - node.level + (1 if is_package else 0)]
                base = ".".join(parts + ([node.module] if node.module else []))
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"


def _runtime_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """``node`` and every node below it, except what an ``if TYPE_CHECKING:`` holds for a type checker only."""
    if isinstance(node, ast.If) and _is_type_checking(node.test):
        for other in node.orelse:
            yield from _runtime_nodes(other)
        return
    yield node
    for child in ast.iter_child_nodes(node):
        yield from _runtime_nodes(child)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _longest_module_prefix(dotted: str, modules: Mapping[str, str]) -> str | None:
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in modules:
            return ".".join(parts[:end])
    return None


def layer_of(path: str, layers: Sequence[tuple[str, tuple[str, ...]]]) -> int | None:
    """The index of the layer whose longest entry holds the module at ``path``; None when none does."""
    best: tuple[int, int] | None = None  # (length of the entry, index of its layer)
    for index, (_, entries) in enumerate(layers):
        for entry in entries:
            holds = path == entry or (entry.endswith("/") and path.startswith(entry))
            if holds and (best is None or len(entry) > best[0]):
                best = (len(entry), index)
    return None if best is None else best[1]


def upward_imports(
    imports: Sequence[Import], layers: Sequence[tuple[str, tuple[str, ...]]], package: str = "gateway"
) -> list[str]:
    """One line per import from a lower layer to a higher one: ``file:line: from (layer) -> to (layer)``."""
    found = []
    for imp in imports:
        low, high = layer_of(imp.source, layers), layer_of(imp.target, layers)
        if low is not None and high is not None and high > low:
            found.append(
                f"{package}/{imp.source}:{imp.line}: {imp.source} ({layers[low][0]}) -> {imp.target} "
                f"({layers[high][0]})"
            )
    return found


def import_circles(imports: Sequence[Import], package: str = "gateway") -> list[str]:
    """One line per circle (a strongly connected set of modules): its modules, and its shortest loop as the
    imports that make it (``file:line: from -> to``)."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        graph.setdefault(imp.source, set()).add(imp.target)
    reach = {module: _reachable(graph, module) for module in graph}
    circles = {
        frozenset(other for other in reach[module] if module in reach.get(other, ()))
        for module in graph
        if module in reach[module]
    }
    found = []
    for circle in sorted(sorted(c) for c in circles):
        loop = _shortest_loop(graph, set(circle))
        steps = [
            next(imp for imp in imports if (imp.source, imp.target) == (source, target))
            for source, target in zip(loop, loop[1:] + loop[:1], strict=True)
        ]
        found.append(
            f"circle of {', '.join(circle)}; shortest loop: "
            + ", ".join(f"{package}/{imp.source}:{imp.line}: {imp.source} -> {imp.target}" for imp in steps)
        )
    return found


def _shortest_loop(graph: Mapping[str, set[str]], circle: set[str]) -> list[str]:
    """The shortest sequence of modules of ``circle`` each importing the next, the last importing the first."""
    return min((_loop_through(graph, circle, start) for start in sorted(circle)), key=len)


def _loop_through(graph: Mapping[str, set[str]], circle: set[str], start: str) -> list[str]:
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:  # breadth first: the first way back to ``start`` is a shortest one
        module = queue.popleft()
        if start in graph[module]:
            loop = [module]
            while loop[-1] != start:
                loop.append(came_from[loop[-1]])
            return loop[::-1]
        for target in sorted(graph[module] & circle):
            if target != start and target not in came_from:
                came_from[target] = module
                queue.append(target)
    raise AssertionError(f"{start} is on no loop of {sorted(circle)}")


def _reachable(graph: Mapping[str, set[str]], start: str) -> set[str]:
    """The modules ``start`` imports, directly or through others (``start`` itself only on a circle)."""
    seen: set[str] = set()
    todo = list(graph.get(start, ()))
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph.get(module, ()))
    return seen


def test_every_module_of_the_package_is_in_a_layer() -> None:
    unplaced = [path for path in module_paths(PACKAGE) if layer_of(path, LAYERS) is None]
    assert not unplaced, f"modules in no layer (add them to LAYERS here and in docs/ARCHITECTURE.md): {unplaced}"


def test_no_import_runs_from_a_lower_layer_to_a_higher_one() -> None:
    found = upward_imports(package_imports(PACKAGE), LAYERS)
    assert not found, "imports from a lower layer to a higher one (LAYERS):\n" + "\n".join(found)


def test_no_modules_import_each_other_in_a_circle() -> None:
    found = import_circles(package_imports(PACKAGE))
    assert not found, "import circles:\n" + "\n".join(found)


def test_the_architecture_document_lists_the_same_layers() -> None:
    text = (PACKAGE.parent / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    section = text.split("\n## Dependency rule\n", 1)[1].split("\n## ", 1)[0]
    assert "```text\n" in section, "the Dependency rule section lists the layers in a ```text block"
    block = section.split("```text\n", 1)[1].split("```", 1)[0]
    lines = block.replace("\n    ", " ").splitlines()  # an indented line continues the one above
    listed = [(name.strip(), tuple(entries.split())) for name, _, entries in (line.partition(":") for line in lines)]
    assert listed == [(name, entries) for name, entries in LAYERS]


def _package(root: Path, files: Mapping[str, str]) -> Path:
    package = root / "gateway"
    for path, text in {"__init__.py": "", **files}.items():
        (package / path).parent.mkdir(parents=True, exist_ok=True)
        (package / path).write_text(text, encoding="utf-8")
    return package


def test_the_layer_check_names_an_upward_import_inside_a_function_but_not_a_type_only_one(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {
            "low.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gateway.high import H\n"
            "def late():\n    from gateway import high\n",
            "high.py": "import gateway.low\nfrom gateway.sub import deep\n",
            "sub/__init__.py": "",
            "sub/deep.py": "from .. import low\n",
        },
    )
    layers = (("low", ("low.py", "sub/deep.py")), ("high", ("high.py", "sub/")))
    assert (layer_of("sub/deep.py", layers), layer_of("sub/__init__.py", layers)) == (0, 1)  # the longest entry
    assert layer_of("__init__.py", layers) is None
    assert upward_imports(package_imports(package), layers) == ["gateway/low.py:5: low.py (low) -> high.py (high)"]


def test_the_circle_check_names_each_circle_and_its_imports(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {
            "a.py": "import gateway.b\n",
            "b.py": "def f():\n    from .c import x\n",  # a lazy import closes the circle as well
            "c.py": "from gateway import a, d\n",
            "d.py": "import os\n",
            "e.py": "import typing\nif typing.TYPE_CHECKING:\n    from gateway import f\n",
            "f.py": "from gateway import e\n",  # a type-only import makes no circle
        },
    )
    assert import_circles(package_imports(package)) == [
        "circle of a.py, b.py, c.py; shortest loop: gateway/a.py:1: a.py -> b.py, gateway/b.py:2: b.py -> c.py, "
        "gateway/c.py:1: c.py -> a.py"
    ]
