"""Policy-driven security gateway for AI-agent code execution."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
