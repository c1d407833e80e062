"""npm installs on the real engine, under runc and runsc: a package from a local registry installs in a sandbox of
its own and `require`s in the run, read-only; an identical request installs nothing; what the policy does not allow
never reaches a run; no package's install script runs.

The registry is tests/npm_registry.py on 127.0.0.1 (tarballs built by the test), allowed through an explicit CIDR
entry the way an operator allows an internal mirror; its name resolves through the runner's test resolver only.
"""

from __future__ import annotations

import hashlib
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gateway import Gateway
from gateway.errors import PackageRefusedError
from gateway.packages.docker import DockerInstaller
from gateway.packages.npm import Installers
from gateway.policy.loader import load_policy_text
from gateway.resources import policies_dir
from gateway.result import ExecutionResult
from tests.integration.conftest import gateway_containers
from tests.integration.packages_support import PackageGateways, outcome_data
from tests.npm_registry import NpmPackage, NpmRegistry, build_package

pytestmark = pytest.mark.integration

HOST = "registry.test"
NODE_IMAGE = "gateway/sandbox-node:24-bookworm"
SCRIPT = "node -e \"require('fs').writeFileSync('ran-' + process.env.npm_lifecycle_event, 'x')\""

PACKAGES: list[NpmPackage] = [
    build_package(
        "gw-hello", "1.0.0", "module.exports = 'hello ' + require('gw-dep');\n", dependencies={"gw-dep": "^2.0.0"}
    ),
    build_package("gw-dep", "2.0.0", "module.exports = 'world';\n"),
    build_package("gw-dep", "2.1.0", "module.exports = 'world';\n"),
    build_package("gw-other", "1.0.0", "module.exports = 1;\n"),
    build_package("gw-greedy", "1.0.0", "module.exports = require('gw-other');\n", dependencies={"gw-other": "*"}),
    build_package(
        "gw-scripted", "1.0.0", "module.exports = 'quiet';\n",
        scripts=dict.fromkeys(("preinstall", "install", "postinstall", "prepare"), SCRIPT),
    ),
]  # fmt: skip


@pytest.fixture(scope="module")
def registry(engine: Any) -> Iterator[NpmRegistry]:
    try:
        engine.images.get(NODE_IMAGE)
    except Exception:  # noqa: BLE001 - any failure: the image is not there
        pytest.skip(f"{NODE_IMAGE} is missing; run scripts/build-image.sh {NODE_IMAGE}")
    with NpmRegistry(PACKAGES, host=HOST) as served:
        yield served


def policy_text(runtime: str, port: int, *, allow: str = '["gw-hello", "gw-dep", "gw-greedy", "gw-scripted"]') -> str:
    base = policies_dir() / ("strict.yaml" if runtime == "runsc" else "default.yaml")
    return textwrap.dedent(f"""\
        apiVersion: gateway.agent-exec/v1
        kind: Policy
        extends: {base}
        metadata: {{name: npm-it-{runtime}}}
        spec:
          languages:
            allowed: [javascript]
            default: javascript
            images:
              javascript: {{default: {NODE_IMAGE}}}
          images:
            default: {NODE_IMAGE}
            allow:
              - {{repository: gateway/sandbox-node, tags: ["24-bookworm"]}}
          limits:
            memory: {{default: 256m, max: 256m}}
          network:
            egress:
              allow:
                - {{host: {HOST}, ports: [{port}], cidrs: [127.0.0.0/8]}}
          packages:
            npm:
              registry: http://{HOST}:{port}/
              allow: {allow}
              size: 64m
        """)


@dataclass
class Npm:
    gateway: Gateway
    installer: Installers

    def run(self, code: str, **request: Any) -> ExecutionResult:
        return self.gateway.execute({"code": textwrap.dedent(code), "language": "javascript", **request})


@pytest.fixture
def make_npm(engine: Any, runtime: str, registry: NpmRegistry, tmp_path: Path) -> Iterator[Callable[..., Npm]]:
    gateways = PackageGateways(engine, HOST, tmp_path)

    def make(**policy: Any) -> Npm:
        compiled = load_policy_text(policy_text(runtime, registry.port, **policy), source=str(tmp_path / "npm.yaml"))
        gateway, installer, _ = gateways.make(
            compiled, lambda runner, cache: Installers(DockerInstaller(runner, cache))
        )
        return Npm(gateway, installer)

    yield make
    gateways.close()


def test_a_package_requires_read_only_and_the_second_request_hits_the_cache(
    make_npm: Callable[..., Npm], registry: NpmRegistry, engine: Any
) -> None:
    npm = make_npm()
    code = """
        const fs = require("fs");
        console.log(require("gw-hello"));
        console.log(require.resolve("gw-hello"));
        try { fs.writeFileSync("/opt/gateway-packages/node_modules/gw-hello/new.js", "x"); console.log("written"); }
        catch (e) { console.log("not written", e.code === "EROFS" || e.code === "EACCES"); }
    """
    first = npm.run(code, packages=["gw-hello@^1"])
    assert first.error is None, first.to_dict()
    assert first.outcome is not None
    assert first.outcome.stdout.decode().splitlines() == [
        "hello world",
        "/opt/gateway-packages/node_modules/gw-hello/index.js",
        "not written true",
    ], first.outcome.stderr
    assert npm.installer.npm.install_count == 1
    record = outcome_data(npm.gateway, first)["packages"]
    assert record["cached"] is False
    # the newest gw-dep within ^2.0.0, each with the sha256 of the tarball the registry served
    assert [(d["name"], d["version"]) for d in record["distributions"]] == [("gw-dep", "2.1.0"), ("gw-hello", "1.0.0")]
    served = {p.filename: hashlib.sha256(p.data).hexdigest() for p in PACKAGES}
    assert all(served[d["filename"]] == d["sha256"] for d in record["distributions"])
    files = {f["path"]: f["sha256"] for f in record["files"]}
    index_js = b"module.exports = 'hello ' + require('gw-dep');\n"
    assert files["node_modules/gw-hello/index.js"] == hashlib.sha256(index_js).hexdigest()
    assert "package-lock.json" in files
    asked = len(registry.requests)

    second = npm.run("console.log(require('gw-hello'))", packages=["gw-hello@^1"])
    assert second.error is None, second.to_dict()
    assert second.outcome is not None
    assert second.outcome.stdout == b"hello world\n"
    assert npm.installer.npm.install_count == 1  # no install sandbox ran
    assert len(registry.requests) == asked  # nothing was asked of the registry
    again = outcome_data(npm.gateway, second)["packages"]
    assert again["cached"] is True
    assert again["tree_sha256"] == record["tree_sha256"]
    assert gateway_containers(engine) == []


def test_a_dependency_outside_allow_is_refused_and_nothing_runs(make_npm: Callable[..., Npm], engine: Any) -> None:
    npm = make_npm()
    result = npm.run("console.log('ran')", packages=["gw-greedy"])
    assert isinstance(result.error, PackageRefusedError), result.to_dict()
    assert "gw-other" in result.error.message
    assert "spec.packages.npm.allow" in result.error.message
    assert result.outcome is None
    assert gateway_containers(engine) == []


def test_a_package_outside_allow_is_denied_before_any_install(make_npm: Callable[..., Npm]) -> None:
    npm = make_npm()
    result = npm.run("console.log('ran')", packages=["gw-other"])
    assert not result.decision.allowed
    assert "packages.allowed" in {v.rule for v in result.decision.violations}
    assert npm.installer.npm.install_count == 0


def test_install_scripts_never_run(make_npm: Callable[..., Npm]) -> None:
    npm = make_npm()
    result = npm.run("console.log(require('gw-scripted'))", packages=["gw-scripted"])
    assert result.error is None, result.to_dict()
    assert result.outcome is not None
    assert result.outcome.stdout == b"quiet\n"
    files = [f["path"] for f in outcome_data(npm.gateway, result)["packages"]["files"]]
    assert "node_modules/gw-scripted/index.js" in files
    assert not [path for path in files if "/ran-" in path], files
