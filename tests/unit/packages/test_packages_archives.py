"""The gateway's own reading of a downloaded archive: name and version from its file name (PEP 427 for a wheel; a
source archive only without binary_only), sha256 of its bytes; and the requirements pinning exactly those."""

from __future__ import annotations

import hashlib

import pytest

from gateway.errors import PackageRefusedError
from gateway.packages.archives import distribution_of, pinned_requirements
from gateway.packages.cache import Distribution


@pytest.mark.parametrize(
    ("filename", "name", "version"),
    [
        ("idna-3.7-py3-none-any.whl", "idna", "3.7"),
        ("Charset_Normalizer-3.3.2-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", "charset-normalizer",
         "3.3.2"),
        ("pkg-1.0-1build-py3-none-any.whl", "pkg", "1.0"),  # with a build tag
        ("pkg-1!2.0.post1+local_1-py3-none-any.whl", "pkg", "1!2.0.post1+local_1"),
    ],
)  # fmt: skip
def test_a_wheels_name_and_version_come_from_its_file_name_and_its_digest_from_its_bytes(
    filename: str, name: str, version: str
) -> None:
    found = distribution_of(filename, b"the bytes the gateway read", binary_only=True)
    assert found == Distribution(name, version, hashlib.sha256(b"the bytes the gateway read").hexdigest(), filename)


@pytest.mark.parametrize(
    "filename",
    [
        "idna-3.7.whl",  # no tags
        "idna-3.7-py3-none-any.whl.exe",
        "idna-3.7-py3-none-any.zip",
        "../idna-3.7-py3-none-any.whl",
        "idna-3.7-py3-none-any .whl",
        "idna-x-py3-none-any.whl",  # a version starts with a digit
        "idna-3.7-py3-none-any-extra-part.whl",
    ],
)
def test_anything_not_named_as_a_wheel_is_refused(filename: str) -> None:
    with pytest.raises(PackageRefusedError, match="nothing from it reaches a run"):
        distribution_of(filename, b"", binary_only=False)


def test_a_source_archive_only_without_binary_only() -> None:
    with pytest.raises(PackageRefusedError, match=r"not a wheel, and spec\.packages\.binary_only is set"):
        distribution_of("gw-source-only-1.0.tar.gz", b"x", binary_only=True)
    found = distribution_of("gw-source-only-1.0.tar.gz", b"x", binary_only=False)
    assert (found.name, found.version) == ("gw-source-only", "1.0")


def test_the_requirements_pin_every_archive_to_the_computed_digest_and_refuse_two_of_one_project() -> None:
    dep = Distribution("gw-dep", "2.0", "b" * 64, "gw_dep-2.0-py3-none-any.whl")
    hello = Distribution("gw-hello", "1.0", "a" * 64, "gw_hello-1.0-py3-none-any.whl")
    assert pinned_requirements([hello, dep]) == (
        f"gw-dep==2.0 --hash=sha256:{'b' * 64}\ngw-hello==1.0 --hash=sha256:{'a' * 64}\n"
    )
    other = Distribution("gw-dep", "3.0", "c" * 64, "gw_dep-3.0-py3-none-any.whl")
    with pytest.raises(PackageRefusedError, match="two archives of gw-dep"):
        pinned_requirements([hello, dep, other])
