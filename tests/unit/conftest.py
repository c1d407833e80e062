"""Fixtures for the policy engine tests: shipped policies, and policies written into tmp dirs."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.policy import Policy, load_policy, load_policy_text
from gateway.resources import policies_dir

BASE_POLICY = """\
apiVersion: gateway.agent-exec/v1
kind: Policy
metadata:
  name: test
spec:
  images:
    default: gateway/sandbox-python:3.11-bookworm
    allow:
      - repository: gateway/sandbox-python
        tags: ["3.11-bookworm"]
        digests: ["sha256:{digest}"]
  limits:
    memory: {{default: 256m, max: 512m}}
    cpus: {{default: 1, max: 2}}
    pids: {{default: 64, max: 128}}
    timeout_s: {{default: 10, max: 60}}
    output_bytes: {{default: 1m, max: 4m}}
    output_files_bytes: {{default: 1m, max: 4m}}
    tmpfs: {{default: 64m, max: 128m}}
    code_size: {{max: 1k}}
    files_size: {{max: 2k}}
  user: {{uid: 65534, gid: 65534}}
"""
DIGEST = "a" * 64


@pytest.fixture(scope="session")
def default_policy() -> Policy:
    return load_policy(policies_dir() / "default.yaml")


@pytest.fixture(scope="session")
def strict_policy() -> Policy:
    return load_policy(policies_dir() / "strict.yaml")


@pytest.fixture
def base_policy_text() -> str:
    return BASE_POLICY.format(digest=DIGEST)


@pytest.fixture
def make_policy(base_policy_text: str) -> Callable[[str], Policy]:
    """The base test policy plus extra ``spec`` sections (YAML indented under spec)."""

    def make(extra: str = "") -> Policy:
        return load_policy_text(base_policy_text + textwrap.indent(textwrap.dedent(extra), "  "), source="test.yaml")

    return make


@pytest.fixture
def data_root(tmp_path: Path) -> Path:
    """An allowlisted host root with a file, a subdirectory and a sibling that shares its prefix."""
    root = tmp_path / "data"
    (root / "sets").mkdir(parents=True)
    (root / "sets" / "a.csv").write_text("x\n")
    (tmp_path / "data2").mkdir()
    return root


@pytest.fixture
def mount_policy(make_policy: Callable[[str], Policy], data_root: Path) -> Policy:
    return make_policy(
        f"""
        mounts:
          max_count: 2
          allow:
            - root: {data_root}
              modes: [ro]
              targets: [/data]
        """
    )
