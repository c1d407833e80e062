"""The LLM tools' ``packages`` parameter: offered (bounded by the policy) on a tool whose language the policy allows
installs for, never on a session-bound tool; a call's packages reach the request and the policy decides them; and
each description says the network the policy gives by default.

Python packages come from policies/examples/egress-mirror.yaml, npm ones from
tests/policies/packages/npm/npm-mirror.yaml; runs go to the fake runner through a fake installer.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import anyio
from mcp import Client

from gateway import Gateway
from gateway.audit import MemoryAuditSink
from gateway.decision.settings import SandboxSettings
from gateway.packages import Installed
from gateway.policy import load_policy
from gateway.policy.model import EGRESS, Policy
from gateway.resources import default_policy_path, policies_dir
from gateway.runner.fake import FakeRunner
from gateway.runspec import RunSpec
from gateway.service.endpoints import tools_for
from gateway.service.mcp import build_server
from gateway.slots import HostSlots
from gateway.tool import ToolHandler, tool_definition, tool_definitions
from tests.unit.sessions_support import SESSIONS_POLICY

MIRROR = load_policy(policies_dir() / "examples" / "egress-mirror.yaml")
NPM = load_policy(Path(__file__).parents[2] / "policies" / "packages" / "npm" / "npm-mirror.yaml")
TREE = Installed(
    key="c" * 64, root="/cache/trees", path="/cache/trees/" + "c" * 64, image_id="sha256:img",
    distributions=(), files=(), cached=True,
)  # fmt: skip


class FakeInstaller:
    """Records what the install phase was asked for; the run then gets the tree."""

    def __init__(self) -> None:
        self.installed: list[tuple[str, ...]] = []

    def install(self, settings: SandboxSettings, *, request_id: str, slots: HostSlots) -> Installed:
        assert settings.packages is not None
        self.installed.append(tuple(str(r) for r in settings.packages.requirements))
        return TREE

    def apply(self, spec: RunSpec, installed: Installed) -> RunSpec:
        return dataclasses.replace(spec, packages=True)


def parameters(tools: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {tool["function"]["name"]: tool["function"]["parameters"] for tool in tools}


def test_a_language_with_packages_gets_a_bounded_packages_parameter() -> None:
    python = parameters(tool_definitions(MIRROR))["execute_python"]
    packages = python["properties"]["packages"]
    assert packages["type"] == "array"
    assert packages["maxItems"] == MIRROR.packages.max == 8  # type: ignore[union-attr]
    assert packages["items"] == {"type": "string", "minLength": 1, "maxLength": 200}
    assert "pip requirement strings such as 'requests>=2'" in packages["description"]
    assert "only requests, urllib3, idna, certifi, charset-normalizer are allowed" in packages["description"]
    assert python["required"] == ["code"]
    assert python["additionalProperties"] is False


def test_npm_packages_are_offered_on_the_javascript_tool_with_the_npm_bounds() -> None:
    tools = parameters(tool_definitions(NPM))
    javascript = tools["execute_javascript"]["properties"]["packages"]
    assert javascript["maxItems"] == 4
    assert "npm specs such as 'left-pad@^1.3'" in javascript["description"]
    assert "only left-pad, ms, @types/*, lodash.* are allowed" in javascript["description"]
    assert tools["execute_python"]["properties"]["packages"]["maxItems"] == 8
    http = {tool["function"]["name"]: tool["function"]["description"] for tool in tools_for(NPM)}
    assert '"packages": packages}' in http["execute_javascript"]  # the /v1/executions body it stands for


def test_a_language_without_packages_keeps_todays_schema() -> None:
    default = load_policy(default_policy_path())
    assert parameters(tool_definitions(default))["execute_python"] == tool_definition(60)["function"]["parameters"]
    shell_too = dataclasses.replace(
        MIRROR, languages=dataclasses.replace(MIRROR.languages, allowed=("python", "shell"))
    )
    shell = parameters(tool_definitions(shell_too))["execute_shell"]
    assert set(shell["properties"]) == {"code", "timeout"}
    assert "packages" not in parameters(tools_for(default))["execute_python"]["properties"]


def test_a_call_with_packages_where_none_are_offered_is_refused_and_nothing_runs() -> None:
    runner = FakeRunner()
    handler = ToolHandler(Gateway(load_policy(default_policy_path()), runner=runner, audit=MemoryAuditSink()))
    answer = handler("execute_python", {"code": "import idna", "packages": ["idna"]})
    assert answer["ok"] is False
    assert answer["error"]["type"] == "invalid_arguments"
    assert answer["error"]["message"] == (
        "unknown argument(s) ['packages']; execute_python accepts only 'code', 'timeout': the policy allows no "
        "package installs for python"
    )
    assert runner.calls == []


def test_a_calls_packages_reach_the_request_the_install_and_the_run() -> None:
    runner, installer, sink = FakeRunner(), FakeInstaller(), MemoryAuditSink()
    with Gateway(MIRROR, runner=runner, audit=sink, packages=installer) as gateway:
        answer = ToolHandler(gateway)("execute_python", {"code": "import idna", "packages": ["IDNA", "requests>=2"]})
    assert answer["ok"] is True
    [received] = [r for r in sink.records if r["event_type"] == "request.received"]
    assert received["data"]["request"]["packages"] == ["IDNA", "requests>=2"]
    assert installer.installed == [("idna", "requests>=2")]
    [(spec, _)] = runner.calls
    assert spec.packages


def test_a_denied_package_answers_with_its_rule_and_nothing_installs() -> None:
    runner, installer = FakeRunner(), FakeInstaller()
    with Gateway(MIRROR, runner=runner, audit=MemoryAuditSink(), packages=installer) as gateway:
        answer = ToolHandler(gateway)("execute_python", {"code": "import numpy", "packages": ["numpy"]})
    assert answer["allowed"] is False
    assert [d["rule"] for d in answer["denied_because"]] == ["packages.allowed"]
    assert "numpy" in answer["denied_because"][0]["message"]
    assert installer.installed == []
    assert runner.calls == []


def test_packages_that_are_not_a_list_of_strings_are_refused() -> None:
    handler = ToolHandler(Gateway(MIRROR, runner=FakeRunner(), audit=MemoryAuditSink(), packages=FakeInstaller()))
    for wrong in ("idna", [1], {"idna": "3"}):
        answer = handler("execute_python", {"code": "x", "packages": wrong})
        assert answer["error"]["type"] == "invalid_arguments"
        assert "'packages' must be an array of strings" in answer["error"]["message"]


def sessions_with_packages() -> Policy:
    sessions = load_policy(SESSIONS_POLICY)
    languages = dataclasses.replace(sessions.languages, allowed=("python", "javascript"))
    return dataclasses.replace(sessions, languages=languages, packages=NPM.packages, npm=NPM.npm)


def test_the_session_bound_tool_offers_no_packages_and_refuses_them() -> None:
    policy = sessions_with_packages()
    tools = parameters(tool_definitions(policy, session="kernel"))
    assert set(tools["execute_python"]["properties"]) == {"code", "timeout"}
    assert "packages" in tools["execute_javascript"]["properties"]  # runs each call afresh, outside the session
    assert "packages" in parameters(tool_definitions(policy))["execute_python"]["properties"]
    runner = FakeRunner()
    handler = ToolHandler(Gateway(policy, runner=runner, audit=MemoryAuditSink()), session="kernel")
    answer = handler("execute_python", {"code": "x = 1", "packages": ["idna"]})
    assert answer["error"]["type"] == "invalid_arguments"
    assert (
        "an execution in the handler's session cannot install packages (sessions.profile)"
        in (answer["error"]["message"])
    )
    assert handler.session_id is None  # refused before any session was opened
    assert runner.calls == []


class RemoteTools:
    """A remote gateway as the handler sees it: the service's tools (``GET /v1/tools``) and its sessions."""

    sessions = None

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.executed: list[dict[str, Any]] = []

    def tools(self) -> list[dict[str, Any]]:
        return tools_for(self.policy)

    def execute(self, request: dict[str, Any]) -> Any:
        self.executed.append(request)
        raise AssertionError("a refused call must not reach the service")


def test_a_remote_session_handler_drops_packages_from_the_services_session_bound_tool() -> None:
    remote = RemoteTools(sessions_with_packages())
    handler = ToolHandler(remote, session="workspace")  # type: ignore[arg-type]
    tools = parameters(handler.definitions())
    assert set(tools["execute_python"]["properties"]) == {"code", "timeout"}
    assert "packages" in tools["execute_javascript"]["properties"]
    answer = handler("execute_python", {"code": "x = 1", "packages": ["idna"]})
    assert answer["error"]["type"] == "invalid_arguments"
    assert remote.executed == []


def test_the_description_says_the_policys_default_network_once() -> None:
    [none] = tool_definitions(MIRROR)
    assert "in an isolated, network-less sandbox" in none["function"]["description"]
    assert "network none" not in none["function"]["description"]
    egress = dataclasses.replace(
        MIRROR, network=dataclasses.replace(MIRROR.network, default=EGRESS, allowed=("none", EGRESS))
    )
    [tool] = tool_definitions(egress)
    description = tool["function"]["description"]
    assert "in an isolated sandbox with network access only to mirror.internal (ports 18089, 18443) and" in description
    assert "network-less" not in description
    assert "network egress" not in description


def test_mcp_lists_the_packages_parameter_and_routes_a_call_with_packages() -> None:
    runner, installer = FakeRunner(), FakeInstaller()

    async def listed_and_called(gateway: Gateway) -> tuple[dict[str, Any], Any]:
        async with Client(build_server(ToolHandler(gateway, principal="agent-7"), max_concurrent=2)) as client:
            [tool] = (await client.list_tools()).tools
            return tool.input_schema, await client.call_tool("execute_python", {"code": "x", "packages": ["idna"]})

    with Gateway(MIRROR, runner=runner, audit=MemoryAuditSink(), packages=installer) as gateway:
        schema, called = anyio.run(listed_and_called, gateway)
    assert schema["properties"]["packages"]["maxItems"] == 8
    assert called.is_error is False
    assert installer.installed == [("idna",)]
