"""The gateway's version, written in this one place.

``gateway.__version__`` re-exports it, the audit records and spans carry it, and hatchling reads it from here
for the package metadata (``[tool.hatch.version]`` in ``pyproject.toml``).
"""

from __future__ import annotations

__version__ = "0.1.0"
