"""Session requests: the execution request's intake for the profile fields, strict about everything else."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import RequestError
from gateway.request import MountRequest, RequestLimits, SessionRequest, parse_session_request


def _paths(data: Any) -> list[str]:
    with pytest.raises(RequestError) as info:
        parse_session_request(data)
    return [p.path for p in info.value.problems]


def test_a_full_request_is_built_with_sizes_in_bytes() -> None:
    request = parse_session_request(
        {
            "mode": "kernel", "idle_s": 60, "lifetime_s": 600.5, "workspace_size": "64m", "language": "python",
            "image": "gateway/sandbox-python:3.11-bookworm", "limits": {"memory": "256m", "pids": 64.0},
            "network": "none", "runtime": "runsc", "mounts": [{"source": "/srv/d", "target": "/data"}],
            "principal": "agent-1", "metadata": {"ticket": "T-1"},
        }
    )  # fmt: skip
    assert request == SessionRequest(
        mode="kernel", idle_s=60, lifetime_s=600.5, workspace_size=64 * 1024**2, language="python",
        image="gateway/sandbox-python:3.11-bookworm", limits=RequestLimits(memory=256 * 1024**2, pids=64),
        network="none", runtime="runsc", mounts=(MountRequest("/srv/d", "/data", "ro"),), principal="agent-1",
        metadata=request.metadata,
    )  # fmt: skip
    assert dict(request.metadata) == {"ticket": "T-1"}
    assert parse_session_request(request.to_dict()) == request


def test_json_text_is_read_strictly() -> None:
    assert parse_session_request('{"mode": "workspace"}') == SessionRequest(mode="workspace")
    assert _paths('{"mode": "workspace", "mode": "kernel"}') == ["$"]
    assert _paths(b"\xff") == ["$"]


@pytest.mark.parametrize(
    ("data", "paths"),
    [
        ({}, ["$"]),
        ({"mode": "notebook"}, ["$.mode"]),
        ({"mode": "workspace", "code": "x"}, ["$.code"]),
        ({"mode": "workspace", "idle_s": 0}, ["$.idle_s"]),
        ({"mode": "workspace", "lifetime_s": 604801}, ["$.lifetime_s"]),
        ({"mode": "workspace", "workspace_size": "1x"}, ["$.workspace_size"]),
        ({"mode": "workspace", "limits": {"memory": "lots"}}, ["$.limits.memory"]),
        ({"mode": "workspace", "mounts": [{"source": "/a:b", "target": "/data"}]}, ["$.mounts[0].source"]),
        ({"mode": "workspace", "runtime": "runc\n"}, ["$.runtime"]),
    ],
)
def test_bad_input_is_refused_with_its_path(data: dict[str, Any], paths: list[str]) -> None:
    assert _paths(data) == paths


def test_the_profile_request_is_the_execution_request_without_code() -> None:
    request = parse_session_request({"mode": "workspace", "limits": {"timeout_s": 5}, "principal": "a"})
    profile = request.profile_request()
    assert (profile.code, profile.files, profile.env) == ("", {}, {})
    assert (profile.limits.timeout_s, profile.principal) == (5, "a")
