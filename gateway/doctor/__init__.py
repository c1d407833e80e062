"""``gateway doctor``'s checks of the Docker daemon and the host (:mod:`gateway.doctor.checks`) and the table of
known-vulnerable engine and runc versions (:mod:`gateway.doctor.vulns`). Pure functions of the engine's
``GET /info`` and ``GET /version`` answers; the CLI (``gateway/cli/doctor_cmd.py``) fetches them."""

from __future__ import annotations

from gateway.doctor.checks import Check, Status
from gateway.doctor.vulns import KNOWN_VULNERABILITIES, KnownVulnerability

__all__ = ["KNOWN_VULNERABILITIES", "Check", "KnownVulnerability", "Status"]
