"""Principals: who may call the gateway service, with which tokens, under which policy, quotas and role.

The principals file is YAML (``schemas/principals.schema.json``) holding, for each principal, the SHA-256 digest
of each of its tokens, never a token. :mod:`~gateway.service.principals.model` is the frozen model and the
constant-time :meth:`Principals.authenticate`; :mod:`~gateway.service.principals.loading` reads a file strictly
(every problem as ``file:line: $.path: message``); :mod:`~gateway.service.principals.store`
(:class:`PrincipalsStore`) issues tokens and writes the file, locked, checked and atomic. Every public name is
importable from here.
"""

from __future__ import annotations

from gateway.service.principals.loading import MAX_PRINCIPALS_BYTES, load_principals, load_principals_text
from gateway.service.principals.model import (
    API_VERSION,
    DEFAULT_PRINCIPALS_FILE,
    DEFAULT_QUOTAS,
    KIND,
    QUOTA_FIELDS,
    TOKEN_PREFIX,
    Principal,
    Principals,
    Quotas,
    Role,
    TokenRecord,
    name_problem,
    principals_path_from_env,
    token_digest,
)
from gateway.service.principals.store import PrincipalsStore, issue_token

__all__ = [
    "API_VERSION",
    "DEFAULT_PRINCIPALS_FILE",
    "DEFAULT_QUOTAS",
    "KIND",
    "MAX_PRINCIPALS_BYTES",
    "QUOTA_FIELDS",
    "TOKEN_PREFIX",
    "Principal",
    "Principals",
    "PrincipalsStore",
    "Quotas",
    "Role",
    "TokenRecord",
    "issue_token",
    "load_principals",
    "load_principals_text",
    "name_problem",
    "principals_path_from_env",
    "token_digest",
]
