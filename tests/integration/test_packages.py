"""Package installs on the real engine, under runc and runsc: a package from a local index installs in a sandbox of its
own and imports in the run, read-only; an identical request installs nothing; what the policy does not allow never
reaches a run.

The index is tests/package_index.py on 127.0.0.1 (wheels written by the test, an sdist), allowed through an
explicit CIDR entry the way an operator allows an internal mirror; its name resolves through the runner's test
resolver only.
"""

from __future__ import annotations

import socket
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gateway import Gateway
from gateway.errors import PackageInstallError, PackageRefusedError
from gateway.packages.docker import PIP_PROGRAM, PIP_STEP, DockerInstaller
from gateway.policy.loader import load_policy_text
from gateway.resources import policies_dir
from gateway.result import ExecutionResult
from tests.integration.conftest import gateway_containers
from tests.integration.packages_support import PackageGateways, outcome_data
from tests.package_index import EXTENSION_TAG, Archive, PackageIndex, build_sdist, build_wheel, compile_extension

pytestmark = pytest.mark.integration

HOST = "index.test"
NATIVE = compile_extension("gw_native._native", 42)
"""A compiled extension module (the host's C compiler), as numpy's or pydantic-core's wheels hold; None without one."""


ARCHIVES: list[Archive] = [
    build_wheel(
        "gw-hello", "1.0",
        {"gw_hello/__init__.py": "from gw_dep import VALUE\nGREETING = 'hello ' + VALUE\n"}, requires=["gw-dep"],
    ),
    build_wheel("gw_dep", "2.0", {"gw_dep/__init__.py": "VALUE = 'world'\n"}),
    build_wheel("gw-other", "1.0", {"gw_other/__init__.py": "X = 1\n"}),
    build_wheel("gw-greedy", "1.0", {"gw_greedy/__init__.py": "\n"}, requires=["gw-other"]),
    build_sdist("gw-source-only", "1.0"),
]  # fmt: skip
if NATIVE is not None:
    ARCHIVES.append(
        build_wheel(
            "gw-native", "1.0", {"gw_native/__init__.py": "from gw_native._native import answer\n"},
            binaries={"gw_native/_native.abi3.so": NATIVE}, tag=EXTENSION_TAG,
        )
    )  # fmt: skip


@pytest.fixture(scope="module")
def index() -> Iterator[PackageIndex]:
    with PackageIndex(ARCHIVES) as served:
        yield served


def policy_text(
    runtime: str,
    port: int,
    *,
    allow: str = '["gw-hello", "gw-dep", "gw-greedy", "gw-source-only", "gw-native"]',
    hashes: str = "",
) -> str:
    base = policies_dir() / ("strict.yaml" if runtime == "runsc" else "default.yaml")
    return textwrap.dedent(f"""\
        apiVersion: gateway.agent-exec/v1
        kind: Policy
        extends: {base}
        metadata: {{name: packages-it-{runtime}}}
        spec:
          network:
            egress:
              allow:
                - {{host: {HOST}, ports: [{port}], cidrs: [127.0.0.0/8]}}
          packages:
            index: http://{HOST}:{port}/simple/
            allow: {allow}
            size: 64m
        """) + (f"    hashes: {hashes}\n" if hashes else "")


@dataclass
class Packages:
    gateway: Gateway
    installer: DockerInstaller
    cache: Path

    def run(self, code: str, **request: Any) -> ExecutionResult:
        return self.gateway.execute({"code": textwrap.dedent(code), **request})


@pytest.fixture
def make_packages(engine: Any, runtime: str, index: PackageIndex, tmp_path: Path) -> Iterator[Callable[..., Packages]]:
    gateways = PackageGateways(engine, HOST, tmp_path)

    def make(port: int | None = None, download_program: str = PIP_PROGRAM, **policy: Any) -> Packages:
        text = policy_text(runtime, index.port if port is None else port, **policy)
        compiled = load_policy_text(text, source=str(tmp_path / "packages.yaml"))
        made = gateways.make(
            compiled, lambda runner, cache: DockerInstaller(runner, cache, download_program=download_program)
        )
        return Packages(*made)

    yield make
    gateways.close()


def test_a_package_installs_imports_read_only_and_the_second_request_hits_the_cache(
    make_packages: Callable[..., Packages], index: PackageIndex, engine: Any
) -> None:
    packages = make_packages()
    code = """
        import os, socket, sys
        import gw_hello
        print(gw_hello.GREETING)
        print(gw_hello.__file__)
        try:
            open("/opt/gateway-packages/gw_hello/new.py", "w")
        except OSError as exc:
            fields = [line.split() for line in open("/proc/self/mountinfo")]
            options = [f[5].split(",")[0] for f in fields if f[4] == "/opt/gateway-packages"]
            print("not written", exc.errno in (13, 30), options)
        try:
            socket.create_connection(("127.0.0.1", 9), timeout=2)
        except OSError:
            print("no network")
    """
    first = packages.run(code, packages=["GW_Hello"])
    assert first.error is None, first.to_dict()
    assert first.outcome is not None
    out = first.outcome.stdout.decode().splitlines()
    assert out[0] == "hello world"
    assert out[1] == "/opt/gateway-packages/gw_hello/__init__.py"
    assert out[2] == "not written True ['ro']"  # EACCES or EROFS, and the mount is read-only
    assert out[3] == "no network"
    assert packages.installer.install_count == 1
    record = outcome_data(packages.gateway, first)["packages"]
    assert record["cached"] is False
    assert [(d["name"], d["version"]) for d in record["distributions"]] == [("gw-dep", "2.0"), ("gw-hello", "1.0")]
    by_name = {a.filename: a.sha256 for a in ARCHIVES}
    assert all(by_name[d["filename"]] == d["sha256"] for d in record["distributions"])
    paths = {f["path"] for f in record["files"]}
    assert {"gw_hello/__init__.py", "gw_dep/__init__.py"} <= paths
    assert record["files_total"] == len(record["files"])
    asked = len(index.requests)

    code = "import sys, gw_hello\nprint(gw_hello.GREETING, sys.path[:2], sys.flags.isolated)"
    second = packages.run(code, packages=["gw-hello"])
    assert second.error is None, second.to_dict()
    assert second.outcome is not None
    # where PYTHONPATH would put the tree, and the run went to the interpreter the sandbox started ahead (a fork
    # of the supervisor's `python3 -I`), not a fresh one
    assert second.outcome.stdout == b"hello world ['/workspace', '/opt/gateway-packages'] 1\n"
    assert packages.installer.install_count == 1  # no install sandbox ran
    assert len(index.requests) == asked  # nothing was asked of the index
    again = outcome_data(packages.gateway, second)["packages"]
    assert again["cached"] is True
    assert again["tree_sha256"] == record["tree_sha256"]
    assert gateway_containers(engine) == []


def test_a_dependency_outside_the_allow_list_is_refused_and_nothing_runs(
    make_packages: Callable[..., Packages], engine: Any
) -> None:
    packages = make_packages()
    result = packages.run("print('ran')", packages=["gw-greedy"])  # gw-greedy is allowed, its gw-other is not
    assert isinstance(result.error, PackageRefusedError), result.to_dict()
    assert "gw-other" in result.error.message
    assert "spec.packages.allow" in result.error.message
    assert result.outcome is None
    assert outcome_data(packages.gateway, result)["error"]["code"] == "packages.refused"
    assert not (packages.cache / "trees").exists()  # nothing was stored
    assert gateway_containers(engine) == []


def test_a_requested_name_outside_the_allow_list_is_denied_before_anything(
    make_packages: Callable[..., Packages],
) -> None:
    packages = make_packages()
    result = packages.run("print('ran')", packages=["gw-other"])
    assert result.decision is not None
    assert not result.decision.allowed
    assert [v.rule for v in result.decision.violations] == ["packages.allowed"]
    assert packages.installer.install_count == 0


def test_a_source_only_package_is_refused_with_binary_only(make_packages: Callable[..., Packages], engine: Any) -> None:
    packages = make_packages()
    result = packages.run("print('ran')", packages=["gw-source-only"])
    assert isinstance(result.error, PackageInstallError), result.to_dict()
    assert "gw-source-only" in result.error.message
    assert result.outcome is None
    assert gateway_containers(engine) == []


def test_an_unreachable_index_fails_the_install_and_nothing_runs(
    make_packages: Callable[..., Packages], engine: Any
) -> None:
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    packages = make_packages(port=closed)
    result = packages.run("print('ran')", packages=["gw-hello"])
    assert isinstance(result.error, PackageInstallError), result.to_dict()
    assert "gw-hello" in result.error.message
    assert result.outcome is None
    assert outcome_data(packages.gateway, result)["error"]["code"] == "packages.install_failed"
    assert gateway_containers(engine) == []


def test_a_run_that_asks_for_egress_gets_it_with_its_packages(
    make_packages: Callable[..., Packages], index: PackageIndex
) -> None:
    packages = make_packages()
    code = f"""
        import urllib.request
        import gw_hello
        print(gw_hello.GREETING)
        print(urllib.request.urlopen("http://{HOST}:{index.port}/simple/", timeout=20).status)
    """
    result = packages.run(code, packages=["gw-hello"], network="egress")
    assert result.error is None, result.to_dict()
    assert result.outcome is not None
    assert result.outcome.stdout == b"hello world\n200\n"


@pytest.mark.skipif(NATIVE is None, reason="no C compiler (cc or gcc) on this host to build the extension module")
def test_a_wheels_compiled_extension_loads_from_the_read_only_tree(make_packages: Callable[..., Packages]) -> None:
    packages = make_packages()
    code = """
        import gw_native
        print(gw_native.answer(), gw_native._native.__file__)
        try:
            open("/opt/gateway-packages/gw_native/x.so", "wb")
        except OSError:
            print("read-only")
    """
    result = packages.run(code, packages=["gw-native"])
    assert result.error is None, result.to_dict()
    assert result.outcome is not None
    assert result.outcome.stdout.decode().splitlines() == [
        "42 /opt/gateway-packages/gw_native/_native.abi3.so",
        "read-only",
    ], (result.outcome.exit_code, result.outcome.stderr.decode())


EVIL_DEP = build_wheel("gw_dep", "2.0", {"gw_dep/__init__.py": "VALUE = 'evil'\n"})
"""gw-dep 2.0 as the index does not serve it: what a download sandbox taken over by the index's archives could
leave in place of the real one."""
LATER_DEP = build_wheel("gw_dep", "9.9", {"gw_dep/__init__.py": "VALUE = 'later'\n"})


def lying_download(replace: str, data: bytes) -> str:
    """A download sandbox's program that runs pip, then writes ``data`` at ``dl/<replace>``, as a pip exploited by
    what the index served could, whatever it would say about it."""
    return PIP_STEP + f"open('dl/{replace}', 'wb').write({data!r})\nsys.exit(status)\n"


def test_an_archive_swapped_in_the_download_sandbox_is_caught_by_the_gateways_own_digest(
    make_packages: Callable[..., Packages], engine: Any
) -> None:
    real = next(a for a in ARCHIVES if a.filename == "gw_dep-2.0-py3-none-any.whl")
    hello = next(a for a in ARCHIVES if a.project == "gw-hello")
    hashes = f'{{"gw-dep==2.0": [{real.sha256}], "gw-hello==1.0": [{hello.sha256}]}}'
    packages = make_packages(hashes=hashes, download_program=lying_download(real.filename, EVIL_DEP.data))
    result = packages.run("print('ran')", packages=["gw-hello"])
    assert isinstance(result.error, PackageRefusedError), result.to_dict()
    assert f"gw-dep==2.0 has sha256 {EVIL_DEP.sha256}, not one listed" in result.error.message
    assert result.outcome is None
    assert not (packages.cache / "trees").exists()
    assert gateway_containers(engine) == []


def test_without_hashes_the_record_names_the_digest_of_what_was_installed_not_the_indexs(
    make_packages: Callable[..., Packages],
) -> None:
    real = next(a for a in ARCHIVES if a.filename == "gw_dep-2.0-py3-none-any.whl")
    packages = make_packages(download_program=lying_download(real.filename, EVIL_DEP.data))
    result = packages.run("import gw_dep; print(gw_dep.VALUE)", packages=["gw-hello"])
    assert result.error is None, result.to_dict()
    assert result.outcome is not None
    assert result.outcome.stdout == b"evil\n"
    distributions = {d["name"]: d for d in outcome_data(packages.gateway, result)["packages"]["distributions"]}
    assert distributions["gw-dep"]["sha256"] == EVIL_DEP.sha256 != real.sha256


def test_an_archive_named_as_another_version_than_it_holds_is_not_installed(
    make_packages: Callable[..., Packages], engine: Any
) -> None:
    packages = make_packages(download_program=lying_download("gw_dep-2.0-py3-none-any.whl", LATER_DEP.data))
    result = packages.run("print('ran')", packages=["gw-hello"])
    assert isinstance(result.error, PackageInstallError), result.to_dict()
    # pip reads version 9.9 in the wheel's metadata: the file pinned as gw-dep==2.0 is not a candidate for it
    assert "installing gw-hello (no network) failed" in result.error.message, result.error.message
    assert "gw-dep==2.0" in result.error.message
    assert result.outcome is None
    assert not (packages.cache / "trees").exists()
    assert gateway_containers(engine) == []


def test_an_extra_archive_the_policy_does_not_allow_is_refused(
    make_packages: Callable[..., Packages], engine: Any
) -> None:
    other = next(a for a in ARCHIVES if a.project == "gw-other")
    packages = make_packages(download_program=lying_download(other.filename, other.data))
    result = packages.run("print('ran')", packages=["gw-hello"])
    assert isinstance(result.error, PackageRefusedError), result.to_dict()
    assert "gw-other==1.0, which spec.packages.allow does not list" in result.error.message
    assert not (packages.cache / "trees").exists()
    assert gateway_containers(engine) == []
