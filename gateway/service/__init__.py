"""The gateway as a service: who may call it (principals and their tokens) and the HTTP application.

:mod:`gateway.service.principals` is the principals store the ``gateway principals`` commands write and the
service reads: a frozen model, strict loading, token issuing and constant-time authentication.
:class:`~gateway.service.service.Service` is what ``gateway serve`` serves, and
:func:`~gateway.service.app.build_app` its Starlette application; both are imported from their modules (this
package imports neither, so the CLI manages principals without Starlette).
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
