"""The Gateway's install phase: before a run whose decision lists packages it asks its installer for the tree, runs
the specification the installer amended, and lists the tree in the execution.outcome record; an install that
fails or is refused is the run's error, and nothing runs."""

from __future__ import annotations

import dataclasses

import jsonschema

from gateway import Gateway
from gateway.audit.memory import MemoryAuditSink
from gateway.decision.settings import SandboxSettings
from gateway.errors import PackageRefusedError
from gateway.packages import Distribution, Installed, InstalledFile
from gateway.policy import load_policy
from gateway.resources import load_schema, policies_dir
from gateway.runner import FakeRunner
from gateway.runspec import RunSpec
from gateway.slots import HostSlots

POLICY = load_policy(policies_dir() / "examples" / "egress-mirror.yaml")
TREE = Installed(
    key="c" * 64, root="/cache/trees", path="/cache/trees/" + "c" * 64, image_id="sha256:img",
    distributions=(Distribution("idna", "3.7", "a" * 64, "idna-3.7-py3-none-any.whl"),),
    files=(InstalledFile("idna/__init__.py", 6, "b" * 64),), cached=True,
)  # fmt: skip


class FakeInstaller:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.installed: list[tuple[str, ...]] = []

    def install(self, settings: SandboxSettings, *, request_id: str, slots: HostSlots) -> Installed:
        assert settings.packages is not None
        self.installed.append(tuple(str(r) for r in settings.packages.requirements))
        if self.error is not None:
            raise self.error
        return TREE

    def apply(self, spec: RunSpec, installed: Installed) -> RunSpec:
        return dataclasses.replace(spec, packages=True)


def test_the_run_gets_the_installers_spec_and_the_record_lists_the_tree() -> None:
    runner, installer = FakeRunner(), FakeInstaller()
    sink = MemoryAuditSink()
    with Gateway(POLICY, runner=runner, audit=sink, packages=installer) as gateway:
        result = gateway.execute({"code": "import idna", "packages": ["IDNA"]})
        plain = gateway.execute({"code": "print(1)"})
    assert result.error is None
    assert plain.error is None
    assert installer.installed == [("idna",)]
    [(spec, _), (other, _)] = runner.calls
    assert spec.packages
    assert not other.packages
    records = [r for r in sink.records if r["event_type"] == "execution.outcome"]
    assert records[0]["data"]["packages"] == TREE.to_record()
    assert records[0]["data"]["packages"]["cached"] is True
    jsonschema.validate(records[0], load_schema("audit-record"))
    assert "packages" not in records[1]["data"]


def test_a_refused_install_is_the_runs_error_and_nothing_runs() -> None:
    runner = FakeRunner()
    refusal = PackageRefusedError("the install resolved numpy==2.0, which spec.packages.allow does not list")
    sink = MemoryAuditSink()
    with Gateway(POLICY, runner=runner, audit=sink, packages=FakeInstaller(refusal)) as gateway:
        result = gateway.execute({"code": "import idna", "packages": ["idna"]})
    assert result.error is refusal
    assert runner.calls == []
    [record] = [r for r in sink.records if r["event_type"] == "execution.outcome"]
    assert record["data"]["error"]["code"] == "packages.refused"
    assert "numpy" in record["data"]["error"]["message"]


def test_only_a_docker_runner_gets_an_installer_by_default() -> None:
    from gateway.packages import installer_for
    from gateway.packages.docker import DockerInstaller
    from gateway.packages.npm import Installers
    from gateway.runner.docker.runner import DockerRunner

    assert installer_for(FakeRunner()) is None
    runner = DockerRunner()  # connects to no engine until it runs something
    installer = installer_for(runner)
    assert isinstance(installer, Installers)  # pip's for python runs, npm's for javascript
    assert isinstance(installer.python, DockerInstaller)
