"""The principals' model: frozen :class:`Principal` records (with their :class:`Quotas` and tokens,
:class:`TokenRecord`), the :class:`Principals` of one file indexed by name and token id, and constant-time
:meth:`Principals.authenticate`.

Tokens are ``agw_<id>_<secret>``: a fixed prefix that secret scanners can match, the token's public id (8 hex
digits, also stored beside the digest and named by audit records) and 256 random bits in base64url. A token is
256 random bits, so a plain SHA-256 is the right digest: nothing can be guessed, and a slow password hash would
only make every request slow.

:meth:`Principals.authenticate` looks the token up by its public id and compares digests with
:func:`hmac.compare_digest`; a malformed token or an unknown id is compared against a dummy digest, so the work
done does not depend on which principal (if any) the token names. Ids are public; digests never leave the
package.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from gateway.errors import PrincipalsInvalidError, Problem, UnknownPrincipalError
from gateway.resources import load_schema

__all__ = [
    "API_VERSION",
    "DEFAULT_PRINCIPALS_FILE",
    "DEFAULT_QUOTAS",
    "KIND",
    "MAX_TOKEN_CHARS",
    "QUOTA_FIELDS",
    "TOKEN_PREFIX",
    "Principal",
    "Principals",
    "Quotas",
    "Role",
    "TokenRecord",
    "name_problem",
    "principals_path_from_env",
    "token_digest",
]

API_VERSION = "gateway.agent-exec/v1"
KIND = "Principals"
DEFAULT_PRINCIPALS_FILE = "principals.yaml"
"""Relative to the working directory, when neither ``--principals`` nor ``GATEWAY_PRINCIPALS`` names a file."""
TOKEN_PREFIX = "agw_"  # noqa: S105 - the public prefix of every token, not a secret
"""Every token starts with this, so secret scanners (and people) recognise a leaked one."""
MAX_TOKEN_CHARS = 256
"""A presented token longer than this fails without being hashed (a real one is 56 characters)."""
_TOKEN_RE = re.compile(r"agw_([0-9a-f]{8})_([A-Za-z0-9_-]{43})")
_DUMMY_DIGEST = hashlib.sha256(b"no principal has this token").hexdigest()

Role = Literal["agent", "operator"]


def principals_path_from_env(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Which principals file applies: ``--principals``, else ``GATEWAY_PRINCIPALS``, else ``./principals.yaml``."""
    if explicit:
        return Path(explicit)
    env = os.environ.get("GATEWAY_PRINCIPALS")
    if env:
        return Path(env)
    return Path(DEFAULT_PRINCIPALS_FILE)


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a principal (the schema's pattern, the request's ``principal`` spelling), or None."""
    pattern = load_schema("principals")["$defs"]["principal"]["properties"]["name"]["pattern"]
    if re.fullmatch(pattern, name):
        return None
    return f"{name!r} is not a principal name: a letter or digit, then up to 127 of A-Z a-z 0-9 _ . @ : / -"


def token_digest(token: str) -> str:
    """SHA-256 (lowercase hex) of the full token: what the principals file stores."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def _rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class Quotas:
    """How much of the service one principal may use."""

    max_concurrent: int = 8
    """Executions of this principal running at once (at most the service's global bound less one,
    :meth:`~gateway.service.quotas.QuotaGate.share`; start and reload warn of any other value than this default
    that the share cuts)."""
    rpm: int = 600
    """Executions and dry runs per minute (``POST /v1/executions``, ``POST /v1/decisions``, MCP tool calls)."""
    all_rpm: int = 3000
    """Authenticated requests of any kind per minute: the reads, ``/metrics`` and MCP messages that run nothing,
    and the runs ``rpm`` counts too. Larger than ``rpm``, so that a principal's polling does not spend its runs
    (a value below ``rpm`` counts as ``rpm``)."""
    queue: int = 32
    """Requests that may wait for an execution slot; beyond it the service answers 429."""

    def to_dict(self) -> dict[str, int]:
        return {"max_concurrent": self.max_concurrent, "rpm": self.rpm, "all_rpm": self.all_rpm, "queue": self.queue}


DEFAULT_QUOTAS = Quotas()
QUOTA_FIELDS = frozenset(DEFAULT_QUOTAS.to_dict())


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """One issued token as the file keeps it: its public id and the digest of the full token."""

    id: str
    """Public id (8 hex digits, also inside the token); audit records name it."""
    sha256: str
    """SHA-256 of the full token. Never printed by ``gateway principals list``."""
    created: datetime
    """When it was issued (UTC)."""

    def to_dict(self) -> dict[str, str]:
        return {"id": self.id, "sha256": self.sha256, "created": _rfc3339(self.created)}

    def public_dict(self) -> dict[str, str]:
        """What may be shown: the id and when it was issued, no digest."""
        return {"id": self.id, "created": _rfc3339(self.created)}


@dataclass(frozen=True, slots=True)
class Principal:
    """One caller of the service."""

    name: str
    role: Role
    policy: Path
    """Absolute path of the policy its requests are decided under."""
    quotas: Quotas = DEFAULT_QUOTAS
    tokens: tuple[TokenRecord, ...] = ()
    """Its valid tokens; empty after ``revoke`` (it cannot authenticate until ``rotate`` issues one)."""
    quotas_set: frozenset[str] = QUOTA_FIELDS
    """The quota fields the file sets for it; the others take the service's defaults (the server config's
    ``quotas``, see :meth:`effective_quotas`) and are not written back."""

    def effective_quotas(self, defaults: Quotas) -> Quotas:
        """Its quotas, each field it does not set taken from ``defaults``."""
        mine, theirs = self.quotas.to_dict(), defaults.to_dict()
        return Quotas(**{key: mine[key] if key in self.quotas_set else theirs[key] for key in mine})

    @property
    def is_operator(self) -> bool:
        """Operators may also read ``/metrics`` and the audit endpoints."""
        return self.role == "operator"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "role": self.role,
            "policy": str(self.policy),
            "tokens": [t.to_dict() for t in self.tokens],
        }
        quotas = {key: value for key, value in self.quotas.to_dict().items() if key in self.quotas_set}
        if quotas:
            out["quotas"] = quotas
        return out

    def public_dict(self) -> dict[str, Any]:
        """What ``gateway principals list`` shows: everything but the digests."""
        out = self.to_dict()
        out["tokens"] = [t.public_dict() for t in self.tokens]
        return out


@dataclass(frozen=True, slots=True)
class Principals:
    """Every principal of one file, indexed by name and by token id. Build it with :meth:`of`."""

    principals: tuple[Principal, ...]
    source: str
    """The file it was read from (or will be written to)."""
    by_name: Mapping[str, Principal] = field(repr=False, compare=False)
    by_token_id: Mapping[str, tuple[Principal, TokenRecord]] = field(repr=False, compare=False)

    @classmethod
    def of(cls, principals: Collection[Principal], *, source: str = "<memory>") -> Principals:
        """The set of ``principals``; :class:`PrincipalsInvalidError` for a duplicate name or token id."""
        by_name: dict[str, Principal] = {}
        by_token: dict[str, tuple[Principal, TokenRecord]] = {}
        problems: list[Problem] = []
        for index, principal in enumerate(principals):
            if principal.name in by_name:
                problems.append(Problem(f"duplicate principal name {principal.name!r}", path=f"$.principals[{index}]"))
            by_name.setdefault(principal.name, principal)
            for token in principal.tokens:
                if token.id in by_token:
                    problems.append(Problem(f"duplicate token id {token.id!r}", path=f"$.principals[{index}]"))
                by_token.setdefault(token.id, (principal, token))
        if problems:
            raise PrincipalsInvalidError(f"{source} has {len(problems)} problem(s)", problems=problems)
        return cls(tuple(principals), source, MappingProxyType(by_name), MappingProxyType(by_token))

    def __len__(self) -> int:
        return len(self.principals)

    def __iter__(self) -> Iterator[Principal]:
        return iter(self.principals)

    def __contains__(self, name: object) -> bool:
        return name in self.by_name

    def get(self, name: str) -> Principal:
        """The principal called ``name``; :class:`UnknownPrincipalError` when there is none."""
        try:
            return self.by_name[name]
        except KeyError:
            known = ", ".join(sorted(self.by_name)) or "none"
            raise UnknownPrincipalError(f"no principal named {name!r} in {self.source} (principals: {known})") from None

    def authenticate(self, token: str) -> tuple[Principal, str] | None:
        """The principal holding ``token`` and the token's public id, or None.

        Constant time in what matters: the token is hashed and compared with :func:`hmac.compare_digest`
        whether or not it is well formed and whether or not its id exists (an unknown id is compared against
        a dummy digest), so timing tells an attacker nothing about which principals exist beyond the public
        ids. Only the length cap returns early, and it depends on the input alone.
        """
        if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS:
            return None
        match = _TOKEN_RE.fullmatch(token)
        entry = self.by_token_id.get(match.group(1)) if match else None
        expected = entry[1].sha256 if entry is not None else _DUMMY_DIGEST
        same = hmac.compare_digest(token_digest(token), expected)
        if entry is None or not same:
            return None
        return entry[0], entry[1].id

    def token_ids(self) -> frozenset[str]:
        return frozenset(self.by_token_id)

    # --- changes (each returns a new set; the store writes it) -----------------------------------------

    def with_principal(self, principal: Principal) -> Principals:
        """This set with ``principal`` replacing the one of the same name, or appended when it is new."""
        if principal.name in self.by_name:
            items = [principal if p.name == principal.name else p for p in self.principals]
        else:
            items = [*self.principals, principal]
        return Principals.of(items, source=self.source)

    def without(self, name: str) -> Principals:
        self.get(name)
        return Principals.of([p for p in self.principals if p.name != name], source=self.source)

    def to_document(self) -> dict[str, Any]:
        return {"apiVersion": API_VERSION, "kind": KIND, "principals": [p.to_dict() for p in self.principals]}
