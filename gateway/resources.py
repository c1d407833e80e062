"""Where the shipped schemas and policies live, installed or in a source checkout.

In a wheel they are packaged under ``gateway/_data``; in a checkout (editable install, tests) they are the
top-level ``schemas/`` and ``policies/`` folders. No other module guesses paths.
"""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path
from typing import Any

__all__ = ["default_policy_path", "load_schema", "policies_dir", "policy_path_from_env", "schemas_dir"]

_PACKAGE = Path(__file__).resolve().parent


def _data_dir(name: str) -> Path:
    packaged = _PACKAGE / "_data" / name
    if packaged.is_dir():
        return packaged
    return _PACKAGE.parent / name


def schemas_dir() -> Path:
    return _data_dir("schemas")


def policies_dir() -> Path:
    return _data_dir("policies")


def default_policy_path() -> Path:
    return policies_dir() / "default.yaml"


def policy_path_from_env(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Which policy applies: an explicit path (``--policy``), else ``GATEWAY_POLICY``, else the shipped default."""
    if explicit:
        return Path(explicit)
    env = os.environ.get("GATEWAY_POLICY")
    if env:
        return Path(env)
    return default_policy_path()


@cache
def load_schema(name: str) -> dict[str, Any]:
    """Load ``schemas/<name>.schema.json``; cached because schemas never change at run time."""
    path = schemas_dir() / f"{name}.schema.json"
    with path.open(encoding="utf-8") as fh:
        data: dict[str, Any] = json.load(fh)
    return data
