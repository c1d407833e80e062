"""Compliance reports built only from the audit trail.

:func:`build_report` verifies each trail (and its anchors), streams its records through the typed views of
:mod:`gateway.audit.records` into bounded aggregates, and returns one frozen :class:`Report`;
:func:`render` turns it into JSON, Markdown, CSV or HTML. The CIS Docker Benchmark control catalogue is one
data file (:mod:`gateway.report.controls`).
"""

from __future__ import annotations

from gateway.report.build import ReportFilters, build_report
from gateway.report.controls import load_catalogue
from gateway.report.model import Report
from gateway.report.progress import Progress
from gateway.report.render import FORMATS, render

__all__ = ["FORMATS", "Progress", "Report", "ReportFilters", "build_report", "load_catalogue", "render"]
