"""Known-vulnerable Docker Engine and runc versions: a small table, checked by ``gateway doctor``.

Each entry names a CVE, the component (``engine``: the ``Version`` of ``GET /version``; ``runc``: the
``RuncCommit.ID`` of ``GET /info``), the affected upstream ranges, the distribution builds known to carry the
fix, and a precondition when the flaw needs one (an authorization plugin). The sources are in ``docs/doctor.md``;
the table is deliberately short (container breakouts and authorization bypasses: what matters to a sandbox
host) and is not a substitute for the distribution's security tracker.

Versions are compared on their upstream part (``20.10.24`` of ``20.10.24+dfsg1``; ``1.1.5`` of
``1.1.5+ds1-1+deb12u1``; ``1.4.0-rc.3`` sorts before ``1.4.0``). A distribution build (a ``+`` suffix) may
carry a backported fix its upstream number does not show: when the full build string is listed in
``fixed_builds`` it is fixed; when the engine reports a build suffix without the package revision (Debian's
``docker.io`` reports ``20.10.24+dfsg1`` for every revision), the result is *unknown*, not fixed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal

__all__ = ["KNOWN_VULNERABILITIES", "Finding", "KnownVulnerability", "Version", "match", "parse_version"]

Version = tuple[int, int, int, int]
"""``(major, minor, patch, pre)``; ``pre`` is the release-candidate number, or a large number for a release."""

_RELEASE: Final = 1 << 30
_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:-rc\.?(\d+))?")


def parse_version(text: str) -> Version | None:
    """The upstream version at the start of ``text`` (``v1.1.12-0-g51d5e94``, ``27.1.1``, ``1.4.0-rc.3``)."""
    m = _VERSION.match(text.strip())
    if m is None:
        return None
    major, minor, patch, rc = m.groups()
    return int(major), int(minor), int(patch or 0), _RELEASE if rc is None else int(rc)


def _v(text: str) -> Version:
    parsed = parse_version(text)
    if parsed is None:  # pragma: no cover - the table below is literal
        raise ValueError(text)
    return parsed


@dataclass(frozen=True, slots=True)
class KnownVulnerability:
    cve: str
    component: Literal["engine", "runc"]
    summary: str
    affected: tuple[tuple[Version, Version], ...]
    """Half-open ranges ``[low, high)`` of affected upstream versions."""
    fixed: str
    """The fixed releases, for the remediation text."""
    fixed_builds: tuple[str, ...] = ()
    """Distribution builds (exact version strings) that carry the fix."""
    needs: Literal["authz_plugin"] | None = None
    """A precondition: without it the flaw cannot be exploited on this engine."""
    reference: str = ""


_ZERO: Final = (0, 0, 0, 0)

KNOWN_VULNERABILITIES: Final[tuple[KnownVulnerability, ...]] = (
    KnownVulnerability(
        cve="CVE-2024-41110",
        component="engine",
        summary="AuthZ plugin bypass: a request with a zero-length body is forwarded to the plugin without it",
        # fixed in 23.0.15, 26.1.5 and 27.1.1; branches whose fixed release was not confirmed count as affected
        affected=((_ZERO, _v("23.0.15")), (_v("24.0.0"), _v("26.1.5")), (_v("27.0.0"), _v("27.1.1"))),
        fixed="23.0.15, 26.1.5, 27.1.1 or later (Debian bookworm: docker.io 20.10.24+dfsg1-1+deb12u1)",
        fixed_builds=("20.10.24+dfsg1-1+deb12u1",),
        needs="authz_plugin",
        reference="https://github.com/moby/moby/security/advisories/GHSA-v23v-6jw2-98fq",
    ),
    KnownVulnerability(
        cve="CVE-2026-34040",
        component="engine",
        summary="AuthZ plugin bypass with an oversized request body",
        affected=((_ZERO, _v("29.3.1")),),
        fixed="29.3.1 or later",
        needs="authz_plugin",
        reference="https://github.com/moby/moby/security/advisories/GHSA-x744-4wpc-v9h2",
    ),
    KnownVulnerability(
        cve="CVE-2019-5736",
        component="runc",
        summary="container breakout: a container process overwrites the host's runc binary via /proc/self/exe",
        affected=((_ZERO, _v("1.0.0-rc7")),),
        fixed="1.0.0-rc7 or later (Docker 18.09.2)",
        reference="https://www.openwall.com/lists/oss-security/2019/02/11/2",
    ),
    KnownVulnerability(
        cve="CVE-2024-21626",
        component="runc",
        summary="'Leaky Vessels': a leaked host file descriptor gives a container a working directory on the host",
        affected=((_ZERO, _v("1.1.12")),),
        fixed="1.1.12 or later (Debian bookworm: runc 1.1.5+ds1-1+deb12u1)",
        fixed_builds=("1.1.5+ds1-1+deb12u1",),
        reference="https://github.com/opencontainers/runc/security/advisories/GHSA-xr7r-f8xq-vfvv",
    ),
    *(
        KnownVulnerability(
            cve=cve,
            component="runc",
            summary=summary,
            affected=(
                (_ZERO, _v("1.2.8")),
                (_v("1.3.0-rc.1"), _v("1.3.3")),
                (_v("1.4.0-rc.1"), _v("1.4.0-rc.3")),
            ),
            fixed="1.2.8, 1.3.3, 1.4.0-rc.3 or later",
            reference=reference,
        )
        for cve, summary, reference in (
            (
                "CVE-2025-31133",
                "container breakout through maskedPaths: /dev/null replaced by a symlink during container creation",
                "https://github.com/opencontainers/runc/security/advisories/GHSA-9493-h29p-rfm2",
            ),
            (
                "CVE-2025-52565",
                "container breakout through the /dev/console bind mount raced during container creation",
                "https://nvd.nist.gov/vuln/detail/CVE-2025-52565",
            ),
            (
                "CVE-2025-52881",
                "writes to /proc redirected to other procfs files (LSM labels, sysctls) by a racing container",
                "https://nvd.nist.gov/vuln/detail/CVE-2025-52881",
            ),
        )
    ),
)


@dataclass(frozen=True, slots=True)
class Finding:
    vulnerability: KnownVulnerability
    verdict: Literal["vulnerable", "unknown", "not_exploitable"]
    """``unknown``: a distribution build whose package revision the engine does not report."""


def _affected(vuln: KnownVulnerability, version: Version) -> bool:
    return any(low <= version < high for low, high in vuln.affected)


def match(component: str, reported: str, *, authz_plugin: bool) -> list[Finding]:
    """The table's entries that apply to ``reported`` (the version string the engine reports)."""
    version = parse_version(reported)
    if version is None:
        return []
    findings: list[Finding] = []
    text = reported.strip().removeprefix("v")
    for vuln in KNOWN_VULNERABILITIES:
        if vuln.component != component or not _affected(vuln, version) or text in vuln.fixed_builds:
            continue
        if vuln.needs == "authz_plugin" and not authz_plugin:
            verdict: Literal["vulnerable", "unknown", "not_exploitable"] = "not_exploitable"
        elif "+" in text and any(b.startswith(text) and b != text for b in vuln.fixed_builds):
            verdict = "unknown"  # e.g. "20.10.24+dfsg1": the revision that says whether the backport is in is cut
        else:
            verdict = "vulnerable"
        findings.append(Finding(vuln, verdict))
    return findings
