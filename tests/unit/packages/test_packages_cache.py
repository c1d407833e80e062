"""Installed trees cached by resolved set: stored sealed with every file's sha256, found again by request key until
the entry expires or is dropped; what the policy does not allow is refused, naming the package."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path

import pytest

from gateway.errors import PackageRefusedError
from gateway.packages.cache import (
    MAX_RECORDED_FILES,
    Distribution,
    PackageCache,
    check_distributions,
    request_key,
)
from gateway.policy import load_policy
from gateway.resources import policies_dir

RULE = load_policy(policies_dir() / "examples" / "egress-mirror.yaml").packages
assert RULE is not None
IDNA = Distribution("idna", "3.7", "a" * 64, "idna-3.7-py3-none-any.whl")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _source(tmp_path: Path) -> Path:
    source = tmp_path / "tree"
    (source / "idna").mkdir(parents=True)
    (source / "idna" / "__init__.py").write_text("X = 1\n")
    (source / "idna-3.7.dist-info").mkdir()
    (source / "idna-3.7.dist-info" / "METADATA").write_text("Name: idna\n")
    return source


def test_a_stored_tree_is_sealed_hashed_and_found_by_its_request_key(tmp_path: Path) -> None:
    clock = Clock()
    cache = PackageCache(tmp_path / "cache", max_age_s=60, clock=clock)
    key = request_key(RULE, ["idna"], "sha256:img")
    assert cache.lookup(key) is None
    stored = cache.store(key, str(_source(tmp_path)), [IDNA], "sha256:img", max_bytes=1 << 20)
    assert not stored.cached
    tree = Path(stored.path)
    assert oct(os.stat(tree).st_mode & 0o777) == "0o555"
    assert oct(os.stat(tree / "idna" / "__init__.py").st_mode & 0o777) == "0o444"
    record = stored.to_record()
    assert record["files"] == [
        {"path": "idna-3.7.dist-info/METADATA", "size": 11, "sha256": hashlib.sha256(b"Name: idna\n").hexdigest()},
        {"path": "idna/__init__.py", "size": 6, "sha256": hashlib.sha256(b"X = 1\n").hexdigest()},
    ]
    assert (record["files_total"], record["bytes_total"]) == (2, 17)
    found = cache.lookup(key)
    assert found is not None
    assert found.cached
    assert (found.key, found.path, found.tree_sha256) == (stored.key, stored.path, stored.tree_sha256)
    clock.now += 61  # expired: resolved again next time
    assert cache.lookup(key) is None


def test_the_same_resolved_set_is_one_tree_and_drop_forgets_it(tmp_path: Path) -> None:
    cache = PackageCache(tmp_path / "cache")
    source = str(_source(tmp_path))
    one = cache.store("1" * 64, source, [IDNA], "img", max_bytes=1 << 20)
    two = cache.store("2" * 64, source, [IDNA], "img", max_bytes=1 << 20)
    assert one.path == two.path
    assert cache.drop("1" * 64) == 1
    assert cache.lookup("2" * 64) is not None
    assert cache.drop() == 1
    assert cache.lookup("2" * 64) is None
    assert list((tmp_path / "cache" / "trees").iterdir()) == []


def test_a_symlink_in_the_tree_is_refused_and_nothing_is_stored(tmp_path: Path) -> None:
    source = _source(tmp_path)
    (source / "idna" / "escape").symlink_to("/etc/passwd")
    cache = PackageCache(tmp_path / "cache")
    with pytest.raises(PackageRefusedError, match="symlink"):
        cache.store("1" * 64, str(source), [IDNA], "img", max_bytes=1 << 20)
    assert list((tmp_path / "cache" / "trees").iterdir()) == []


def test_a_tree_above_the_size_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PackageRefusedError, match=r"larger than spec.packages.size"):
        PackageCache(tmp_path / "cache").store("1" * 64, str(_source(tmp_path)), [IDNA], "img", max_bytes=10)


def test_the_record_lists_a_bounded_number_of_files(tmp_path: Path) -> None:
    source = tmp_path / "many"
    source.mkdir()
    for i in range(MAX_RECORDED_FILES + 5):
        (source / f"f{i:05}").write_text("")
    stored = PackageCache(tmp_path / "cache").store("1" * 64, str(source), [IDNA], "img", max_bytes=1 << 20)
    record = stored.to_record()
    assert len(record["files"]) == MAX_RECORDED_FILES
    assert record["files_total"] == MAX_RECORDED_FILES + 5


@pytest.mark.parametrize(
    ("distribution", "found"),
    [
        (Distribution("numpy", "2.0", "a" * 64, "numpy-2.0-cp311-manylinux.whl"), "numpy==2.0, which"),
        (Distribution("idna", "3.7", "a" * 64, "idna-3.7.tar.gz"), "not a wheel"),
    ],
)
def test_a_resolved_distribution_the_policy_refuses_is_named(distribution: Distribution, found: str) -> None:
    with pytest.raises(PackageRefusedError, match=found):
        check_distributions(RULE, [IDNA, distribution])


def test_hashes_refuse_an_unlisted_version_or_digest() -> None:
    rule = dataclasses.replace(RULE, hashes=(("idna==3.7", ("a" * 64,)),))
    check_distributions(rule, [IDNA])
    with pytest.raises(PackageRefusedError, match="not one listed"):
        check_distributions(rule, [Distribution("idna", "3.7", "b" * 64, "idna-3.7-py3-none-any.whl")])
    with pytest.raises(PackageRefusedError, match="is not listed"):
        check_distributions(rule, [Distribution("idna", "3.8", "a" * 64, "idna-3.8-py3-none-any.whl")])


def test_apply_binds_the_tree_read_only_after_the_requests_mounts_and_tells_the_sandbox(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from gateway.packages.docker import PACKAGES_TARGET, DockerInstaller
    from gateway.request import parse_request
    from gateway.runner.docker.mounts import STAGING_ROOT
    from gateway.runner.docker.options import DockerAssembler
    from gateway.testing import decide

    policy = load_policy(policies_dir() / "examples" / "egress-mirror.yaml")
    decision = decide(policy, parse_request({"code": "x", "packages": ["idna"]}))
    assert decision.run is not None
    stored = PackageCache(tmp_path / "cache").store("1" * 64, str(_source(tmp_path)), [IDNA], "img", max_bytes=1 << 20)
    installer = DockerInstaller(SimpleNamespace(assembler=DockerAssembler()), PackageCache(tmp_path / "cache"))  # type: ignore[arg-type]
    spec = installer.apply(decision.run, stored)
    [tree] = spec.mounts
    assert (tree.root, tree.path, tree.target, tree.read_only) == (stored.root, stored.path, PACKAGES_TARGET, True)
    assert tree.exec  # sealed and hash-checked: its compiled extensions may load
    assert (tree.device, tree.inode) == (os.stat(stored.path).st_dev, os.stat(stored.path).st_ino)
    [mount] = spec.options["mounts"]
    assert mount["Source"] == f"{STAGING_ROOT}/{decision.decision_id}/0"
    assert (mount["Target"], mount["ReadOnly"]) == (PACKAGES_TARGET, True)
    assert spec.packages  # the supervisor puts the tree on the program's path: no PYTHON* variable is set
    assert not any(name.startswith("PYTHON") for name in spec.options.get("environment") or {})
    assert "mounts" not in decision.run.options
