"""The gateway as a service: who may call it (principals and their tokens), and later the HTTP application.

:mod:`gateway.service.principals` is the principals store the ``gateway principals`` commands write and the
service reads: a frozen model, strict loading, token issuing and constant-time authentication.
"""

from __future__ import annotations

from gateway.service.principals import (
    DEFAULT_QUOTAS,
    Principal,
    Principals,
    PrincipalsStore,
    Quotas,
    TokenRecord,
    load_principals,
    load_principals_text,
    principals_path_from_env,
)

__all__ = [
    "DEFAULT_QUOTAS",
    "Principal",
    "Principals",
    "PrincipalsStore",
    "Quotas",
    "TokenRecord",
    "load_principals",
    "load_principals_text",
    "principals_path_from_env",
]
