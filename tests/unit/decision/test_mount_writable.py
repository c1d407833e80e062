"""Issue 13, defect 7: an rw mount's host directory must be writable by the policy's uid.

Before the fix the only symptom was ``Permission denied`` inside the program; now the decision warns
(``mounts.writable``, never a denial) and ``gateway check`` shows it. A relative mount source is reported as
"must be an absolute host path", not as the raw ``does not match '^/'``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.decision.rules.mounts import writable_by
from gateway.errors import PolicyError, RequestError
from gateway.policy import Policy, load_policy_text
from gateway.request import parse_request
from gateway.testing import decide

NOBODY = 65534


@pytest.fixture
def rw_policy(make_policy: Callable[[str], Policy], tmp_path: Path) -> Policy:
    (tmp_path / "work").mkdir()
    return make_policy(
        f"""
        mounts:
          allow:
            - root: {tmp_path / "work"}
              modes: [ro, rw]
              targets: [/data]
        """
    )


def _mount(source: Path, mode: str = "rw") -> dict[str, object]:
    return {"code": "x", "mounts": [{"source": str(source), "target": "/data", "mode": mode}]}


@pytest.mark.parametrize(
    ("owner", "expected"),
    [
        ((NOBODY, 0, 0o40700), True),  # owner with rwx
        ((NOBODY, 0, 0o40577), False),  # owner class applies even when others could write
        ((0, NOBODY, 0o40770), True),  # group
        ((0, NOBODY, 0o40750), False),
        ((0, 0, 0o40777), True),  # others
        ((0, 0, 0o40776), False),  # writable but not searchable: no file can be created
        ((0, 0, 0o40755), False),
    ],
)
def test_writable_by_follows_the_one_permission_class_that_applies(owner: tuple[int, int, int], expected: bool) -> None:
    assert writable_by(owner, NOBODY, NOBODY) is expected


def test_an_rw_source_the_policy_user_cannot_write_is_a_warning_not_a_denial(rw_policy: Policy, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.chmod(0o755)
    d = decide(rw_policy, parse_request(_mount(work)))
    assert d.allowed  # a warning, never a denial
    [warning] = [w for w in d.warnings if w.rule == "mounts.writable"]
    assert (warning.status, warning.mode, warning.path) == ("warn", "audit", "$.mounts[0].source")
    st = work.stat()
    assert warning.message == (
        f"rw mount source {work} (owner {st.st_uid}:{st.st_gid}, mode 0755) is not writable by the policy's user "
        f"{NOBODY}:{NOBODY}: the program will get 'Permission denied'; chown it to {NOBODY}:{NOBODY} or make it "
        f"group-writable for gid {NOBODY}"
    )


def test_a_writable_or_ro_source_gets_no_warning(rw_policy: Policy, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.chmod(0o755)
    ro = decide(rw_policy, parse_request(_mount(work, "ro")))
    assert ro.warnings == ()
    if os.geteuid() == 0:
        os.chown(work, NOBODY, NOBODY)
    else:
        work.chmod(0o777)
    rw = decide(rw_policy, parse_request(_mount(work)))
    assert rw.warnings == ()
    [result] = [r for r in rw.results if r.rule == "mounts.writable"]
    assert result.status == "pass"


def test_gateway_check_shows_the_warning(
    base_policy_text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    work = tmp_path / "work"
    work.mkdir(mode=0o755)
    work.chmod(0o755)
    policy = tmp_path / "policy.yaml"
    policy.write_text(base_policy_text + f"  mounts:\n    allow: [{{root: {work}, modes: [rw], targets: [/data]}}]\n")
    request = tmp_path / "req.json"
    request.write_text(json.dumps(_mount(work)))
    assert main(["check", str(request), "--policy", str(policy)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("decision: ALLOW")
    [line] = [line for line in out.splitlines() if "mounts.writable" in line]
    assert "$.mounts[0].source" in line
    assert f"not writable by the policy's user {NOBODY}:{NOBODY}" in line


def test_a_relative_mount_source_must_be_an_absolute_host_path(base_policy_text: str) -> None:
    with pytest.raises(RequestError) as caught:
        parse_request({"code": "x", "mounts": [{"source": "data", "target": "/data"}]})
    [problem] = caught.value.problems
    assert problem.path == "$.mounts[0].source"
    assert problem.message == "'data' must be an absolute host path"
    text = base_policy_text + "  mounts:\n    allow: [{root: srv/data, targets: [/data]}]\n"
    with pytest.raises(PolicyError) as policy_caught:
        load_policy_text(text, source="p.yaml")
    [problem] = policy_caught.value.problems
    assert (problem.path, problem.line) == ("$.spec.mounts.allow[0].root", 24)
    assert problem.message == "'srv/data' must be an absolute host path"
