"""The gateway's own reading of an npm install's package-lock.json: every package a registry package the policy
allows, from the registry's host, with a sha512 integrity (listed, when the policy lists hashes)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.egress.addresses import Destination
from gateway.errors import PackageRefusedError
from gateway.packages.npm import check_tree_paths, lock_packages, npm_request_key
from gateway.policy.model import NpmRule
from tests.npm_registry import integrity

REGISTRY = "http://registry.test:4873/npm/"
MS = integrity(b"ms tarball")
DEP = integrity(b"dep tarball")


def rule(**changes: Any) -> NpmRule:
    fields: dict[str, Any] = {
        "registry": REGISTRY,
        "registry_egress": Destination("registry.test", (4873,)),
        "allow": ("ms", "@scope/*"),
    }
    return NpmRule(**(fields | changes))


def entry(name: str, version: str, digest: str, **extra: Any) -> dict[str, Any]:
    tarball = f"{REGISTRY}{name}/-/{name.rsplit('/', 1)[-1]}-{version}.tgz"
    return {"version": version, "resolved": tarball, "integrity": digest, **extra}


def lock(packages: dict[str, Any]) -> bytes:
    root = {"name": "gateway-packages", "dependencies": {"ms": "^2"}}
    return json.dumps({"lockfileVersion": 3, "packages": {"": root, **packages}}).encode()


def test_every_package_is_read_with_its_place_name_and_integrity() -> None:
    found = lock_packages(
        lock({
            "node_modules/ms": entry("ms", "2.1.3", MS),
            "node_modules/ms/node_modules/@scope/dep": entry("@scope/dep", "1.0.0", DEP),
        }),
        rule(),
    )  # fmt: skip
    assert [(p.path, p.name, p.version, p.integrity) for p in found] == [
        ("node_modules/ms", "ms", "2.1.3", MS),
        ("node_modules/ms/node_modules/@scope/dep", "@scope/dep", "1.0.0", DEP),
    ]


@pytest.mark.parametrize(
    ("packages", "why"),
    [
        ({"node_modules/evil": entry("evil", "1.0.0", MS)}, "spec.packages.npm.allow does not list"),
        ({"node_modules/@other/dep": entry("@other/dep", "1.0.0", MS)}, "allow does not list"),
        (
            {"node_modules/ms": entry("ms", "2.1.3", MS) | {"resolved": "http://evil.test:4873/npm/ms/-/ms-2.1.3.tgz"}},
            "not from the registry",
        ),
        (
            {"node_modules/ms": entry("ms", "2.1.3", MS) | {"resolved": "http://registry.test:4873/other/ms.tgz"}},
            "not from the registry",
        ),
        ({"node_modules/ms": entry("ms", "2.1.3", MS) | {"resolved": "git+ssh://git@x/ms.git"}}, "not from the"),
        ({"node_modules/ms": {"resolved": "../ms", "link": True}}, "a link"),
        ({"node_modules/ms": entry("ms", "2.1.3", MS, inBundle=True)}, "bundled"),
        ({"node_modules/ms": entry("ms", "2.1.3", MS) | {"name": "evil"}}, "an alias"),
        ({"node_modules/ms": {"version": "2.1.3"}}, "no version, resolved URL or integrity"),
        ({"node_modules/ms": entry("ms", "2.1.3", "sha1-AAAA")}, "one sha512 is required"),
        ({"../escape": entry("ms", "2.1.3", MS)}, "not a package below node_modules"),
        ({"node_modules/../../x": entry("ms", "2.1.3", MS)}, "not a package below node_modules"),
    ],
    ids=[
        "outside-allow", "other-scope", "other-host", "other-path", "git", "link", "bundled", "alias", "no-dist",
        "sha1", "outside-tree", "dotdot",
    ],
)  # fmt: skip
def test_a_package_that_is_not_an_allowed_registry_package_is_refused(packages: dict[str, Any], why: str) -> None:
    with pytest.raises(PackageRefusedError, match=why):
        lock_packages(lock(packages), rule())


def test_with_hashes_only_a_listed_integrity_passes() -> None:
    listed = rule(hashes=(("ms@2.1.3", (MS,)),))
    assert [p.name for p in lock_packages(lock({"node_modules/ms": entry("ms", "2.1.3", MS)}), listed)] == ["ms"]
    with pytest.raises(PackageRefusedError, match="not one listed"):
        lock_packages(lock({"node_modules/ms": entry("ms", "2.1.3", DEP)}), listed)
    with pytest.raises(PackageRefusedError, match="is not listed"):
        lock_packages(lock({"node_modules/ms": entry("ms", "2.1.4", MS)}), listed)


def test_a_lock_file_that_is_not_one_is_refused() -> None:
    with pytest.raises(PackageRefusedError, match="not a lock file"):
        lock_packages(b"{}", rule())


def test_the_request_key_depends_on_registry_specs_and_image_only() -> None:
    key = npm_request_key(rule(), ["ms@^2", "@scope/a"], "sha256:1")
    assert key == npm_request_key(rule(allow=("*",)), ["@scope/a", "ms@^2"], "sha256:1")
    assert key != npm_request_key(rule(), ["ms@^2"], "sha256:1")
    assert key != npm_request_key(rule(), ["ms@^2", "@scope/a"], "sha256:2")
    assert key != npm_request_key(rule(registry="http://registry.test:4873/"), ["ms@^2", "@scope/a"], "sha256:1")


def test_every_installed_file_belongs_to_a_package_of_the_lock_file() -> None:
    packages = {"node_modules/ms", "node_modules/ms/node_modules/@scope/dep"}
    check_tree_paths(
        [
            "npm.json", "tree/package.json", "tree/node_modules/.package-lock.json", "tree/node_modules/ms/index.js",
            "tree/node_modules/ms/node_modules/@scope/dep/lib/a.js",
        ],
        packages,
    )  # fmt: skip
    for stray in ["tree/node_modules/evil/index.js", "tree/node_modules/@scope/dep/index.js", "tree/node_modules/x"]:
        with pytest.raises(PackageRefusedError, match="belongs to no package"):
            check_tree_paths([stray], packages)
