"""What a downloaded archive is, from its file name and its bytes alone: the gateway's own reading, not pip's.

A wheel's name is parsed by the PEP 427 grammar (``{name}-{version}(-{build})?-{python}-{abi}-{platform}.whl``,
each part without ``-``); a source archive (``{name}-{version}.tar.gz`` or ``.zip``) only when the policy allows
source builds. The sha256 is computed here over the bytes the gateway read. Pure functions, no I/O.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

from gateway.errors import PackageRefusedError
from gateway.packages.cache import Distribution
from gateway.policy.packages import canonical_name

__all__ = ["distribution_of", "pinned_requirements"]

_NAME = r"[A-Za-z0-9._]+"
_VERSION_PART = r"[0-9][A-Za-z0-9._+!]*"
_TAG = r"[A-Za-z0-9._]+"
_WHEEL = re.compile(
    rf"(?P<name>{_NAME})-(?P<version>{_VERSION_PART})(?:-(?P<build>[0-9][A-Za-z0-9._]*))?-{_TAG}-{_TAG}-{_TAG}\.whl",
    re.ASCII,
)
_SDIST = re.compile(rf"(?P<name>[A-Za-z0-9._-]+)-(?P<version>{_VERSION_PART})\.(?:tar\.gz|zip)", re.ASCII)


def distribution_of(filename: str, data: bytes, *, binary_only: bool) -> Distribution:
    """The distribution an archive named ``filename`` holding ``data`` is: canonical name and version from the
    name, sha256 of ``data``. A name outside the grammar, or a source archive with ``binary_only``, raises
    :class:`PackageRefusedError` (nothing from the install reaches a run)."""
    found = _WHEEL.fullmatch(filename)
    if found is None and not binary_only:
        found = _SDIST.fullmatch(filename)
    if found is None:
        if binary_only and not filename.endswith(".whl"):
            why = "not a wheel, and spec.packages.binary_only is set"
        else:
            why = "named as neither a wheel (PEP 427) nor a source archive (name-version.tar.gz)"
        raise PackageRefusedError(f"the download left {filename!r}, {why}; nothing from it reaches a run")
    return Distribution(
        name=canonical_name(found["name"]),
        version=found["version"],
        sha256=hashlib.sha256(data).hexdigest(),
        filename=filename,
    )


def pinned_requirements(distributions: Sequence[Distribution]) -> str:
    """A requirements file pinning exactly ``distributions``, each to the sha256 the gateway computed
    (``name==version --hash=sha256:...``), for ``pip install --require-hashes``. Two archives of one project are
    refused: the set must be one resolution."""
    seen: dict[str, Distribution] = {}
    for d in distributions:
        if d.name in seen:
            raise PackageRefusedError(
                f"the download left two archives of {d.name} ({seen[d.name].filename}, {d.filename}); an install "
                "is one resolution, so nothing from it reaches a run"
            )
        seen[d.name] = d
    return "".join(
        f"{d.name}=={d.version} --hash=sha256:{d.sha256}\n" for d in sorted(seen.values(), key=lambda d: d.name)
    )
