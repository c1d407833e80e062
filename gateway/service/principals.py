"""Principals: who may call the gateway service, with which tokens, under which policy, quotas and role.

The principals file is YAML (``schemas/principals.schema.json``) read with the project's strict YAML reader,
so every problem is reported as ``file:line: $.path: message``. It holds, for each principal, the SHA-256
digest of each of its tokens, never a token: the clear token is returned once by :meth:`PrincipalsStore.add`
or :meth:`PrincipalsStore.rotate` and then exists only with its holder.

Tokens are ``agw_<id>_<secret>``: a fixed prefix that secret scanners can match, the token's public id
(8 hex digits, also stored beside the digest and named by audit records) and 256 random bits in base64url.
A token is 256 random bits, so a plain SHA-256 is the right digest: nothing can be guessed, and a slow
password hash would only make every request slow.

:meth:`Principals.authenticate` looks the token up by its public id and compares digests with
:func:`hmac.compare_digest`; a malformed token or an unknown id is compared against a dummy digest, so the
work done does not depend on which principal (if any) the token names. Ids are public; digests never leave
this module.

:class:`PrincipalsStore` changes the file: under an exclusive lock file (concurrent ``gateway principals``
commands are serialised), it reloads the file, applies one change, checks that the new text loads, and
replaces the file atomically (a temporary file in the same directory, fsync, rename, fsync of the directory;
mode 0600). A reader (the service, on SIGHUP) sees the old file or the new one, never a torn one.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, TypeVar, cast

import yaml
from jsonschema import Draft202012Validator

from gateway._files import whole_file
from gateway.errors import (
    PrincipalExistsError,
    PrincipalsError,
    PrincipalsInvalidError,
    PrincipalsNotFoundError,
    Problem,
    UnknownPrincipalError,
)
from gateway.policy import load_policy
from gateway.resources import load_schema
from gateway.validation import load_yaml_checked
from gateway.yamlstrict import LoadedYaml, read_capped

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

API_VERSION = "gateway.agent-exec/v1"
KIND = "Principals"
DEFAULT_PRINCIPALS_FILE = "principals.yaml"
"""Relative to the working directory, when neither ``--principals`` nor ``GATEWAY_PRINCIPALS`` names a file."""
MAX_PRINCIPALS_BYTES = 4 * 1024 * 1024
"""A principals file larger than this is refused before parsing."""
TOKEN_PREFIX = "agw_"  # noqa: S105 - the public prefix of every token, not a secret
"""Every token starts with this, so secret scanners (and people) recognise a leaked one."""
MAX_TOKEN_CHARS = 256
"""A presented token longer than this fails without being hashed (a real one is 56 characters)."""
_SECRET_BYTES = 32
_TOKEN_RE = re.compile(r"agw_([0-9a-f]{8})_([A-Za-z0-9_-]{43})")
_DUMMY_DIGEST = hashlib.sha256(b"no principal has this token").hexdigest()

Role = Literal["agent", "operator"]
_T = TypeVar("_T")


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
    """Executions of this principal running at once."""
    rpm: int = 600
    """Requests per minute."""
    queue: int = 32
    """Requests that may wait for an execution slot; beyond it the service answers 429."""

    def to_dict(self) -> dict[str, int]:
        return {"max_concurrent": self.max_concurrent, "rpm": self.rpm, "queue": self.queue}


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

    def render(self) -> str:
        """The file's text: a header, then the document as block YAML."""
        body = yaml.dump(self.to_document(), Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=200)
        return _HEADER + body


_HEADER = (
    "# Principals of the gateway service (schemas/principals.schema.json), written by `gateway principals`.\n"
    "# Tokens are stored only as SHA-256 digests; a clear token is shown once, when it is issued.\n"
)


class _Dumper(yaml.SafeDumper):
    """Block YAML without anchors: the strict reader refuses aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def issue_token(taken_ids: Collection[str], *, now: datetime | None = None) -> tuple[str, TokenRecord]:
    """A new token (to show once) and its record (to store): 256 random bits, an id not in ``taken_ids``."""
    token_id = secrets.token_hex(4)
    while token_id in taken_ids:
        token_id = secrets.token_hex(4)
    secret = base64.urlsafe_b64encode(secrets.token_bytes(_SECRET_BYTES)).rstrip(b"=").decode("ascii")
    token = f"{TOKEN_PREFIX}{token_id}_{secret}"
    created = (now or datetime.now(UTC)).astimezone(UTC).replace(microsecond=0)
    return token, TokenRecord(token_id, token_digest(token), created)


# --- loading ---------------------------------------------------------------------------------------------


@cache
def _validator() -> Draft202012Validator:
    return Draft202012Validator(load_schema("principals"), format_checker=Draft202012Validator.FORMAT_CHECKER)


def _invalid(source: str, problems: list[Problem]) -> PrincipalsInvalidError:
    problems = sorted(problems, key=lambda p: (p.line or 0, p.path))
    return PrincipalsInvalidError(
        f"{source} is not a valid principals file: {len(problems)} problem(s)", problems=problems
    )


def _semantic(loaded: LoadedYaml) -> list[Problem]:
    """What the schema cannot say: unique names and token ids, normalised absolute policy paths."""
    problems: list[Problem] = []

    def fail(path: str, message: str) -> None:
        problems.append(
            Problem(message, path=path, source=loaded.source, line=loaded.line_of(path), code="principals.semantic")
        )

    names: dict[str, str] = {}
    token_ids: dict[str, str] = {}
    for index, raw in enumerate(loaded.data["principals"]):
        base = f"$.principals[{index}]"
        name = raw["name"]
        if name in names:
            fail(f"{base}.name", f"duplicate principal name {name!r} (first at line {loaded.line_of(names[name])})")
        else:
            names[name] = f"{base}.name"
        policy = raw["policy"]
        if os.path.normpath(policy) != policy:
            fail(f"{base}.policy", f"{policy!r} is not a normalised path; write {os.path.normpath(policy)!r}")
        for t_index, token in enumerate(raw["tokens"]):
            path = f"{base}.tokens[{t_index}].id"
            if token["id"] in token_ids:
                first = loaded.line_of(token_ids[token["id"]])
                fail(path, f"duplicate token id {token['id']!r} (first at line {first}); token ids are unique")
            else:
                token_ids[token["id"]] = path
    return problems


def _principal(raw: dict[str, Any]) -> Principal:
    quotas = raw.get("quotas", {})
    return Principal(
        name=raw["name"],
        role=cast(Role, raw["role"]),
        policy=Path(raw["policy"]),
        quotas=Quotas(
            max_concurrent=quotas.get("max_concurrent", DEFAULT_QUOTAS.max_concurrent),
            rpm=quotas.get("rpm", DEFAULT_QUOTAS.rpm),
            queue=quotas.get("queue", DEFAULT_QUOTAS.queue),
        ),
        tokens=tuple(
            TokenRecord(t["id"], t["sha256"], datetime.fromisoformat(t["created"]).astimezone(UTC))
            for t in raw["tokens"]
        ),
        quotas_set=frozenset(quotas),
    )


def load_principals_text(text: str | bytes, *, source: str = "<string>") -> Principals:
    """Principals from YAML text; :class:`PrincipalsInvalidError` lists every problem as file:line: $.path."""
    if len(text) > MAX_PRINCIPALS_BYTES:
        problem = Problem(f"{len(text)} bytes is above the {MAX_PRINCIPALS_BYTES} byte cap", source=source)
        raise _invalid(source, [problem])
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _invalid(source, [Problem(f"not valid UTF-8 at byte {exc.start}", source=source)]) from exc
    loaded, problems = load_yaml_checked(
        text, source=source, validator=_validator(), domain="principals", invalid=_invalid
    )
    if not problems:
        problems = _semantic(loaded)
    if problems:
        raise _invalid(source, problems)
    return Principals.of([_principal(raw) for raw in loaded.data["principals"]], source=source)


def load_principals(path: str | os.PathLike[str]) -> Principals:
    """Principals from the file at ``path``; :class:`PrincipalsNotFoundError` when it does not exist."""
    source = os.fspath(path)
    data = read_capped(
        source,
        MAX_PRINCIPALS_BYTES,
        missing=lambda: PrincipalsNotFoundError(f"principals file {source} does not exist"),
        unreadable=lambda reason: PrincipalsError(f"principals file {source} cannot be read: {reason}"),
    )
    return load_principals_text(data, source=source)


# --- the store -------------------------------------------------------------------------------------------


class PrincipalsStore:
    """The principals file and its changes: locked, validated, atomic, mode 0600."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    def load(self) -> Principals:
        return load_principals(self.path)

    def add(
        self,
        name: str,
        *,
        policy: str | os.PathLike[str],
        role: Role = "agent",
        quotas: Quotas = DEFAULT_QUOTAS,
        quotas_set: frozenset[str] = QUOTA_FIELDS,
        now: datetime | None = None,
    ) -> str:
        """Append a principal with one new token (the file is created if absent); return the clear token.

        The policy must load (:func:`gateway.policy.load_policy`; its :class:`PolicyError` propagates) and is
        stored as an absolute path. Only the quota fields in ``quotas_set`` are stored; the others follow the
        service's defaults. A name the file already holds is a :class:`PrincipalExistsError`.
        """
        why = name_problem(name)
        if why is not None:
            raise PrincipalsInvalidError(why)
        absolute = Path(os.path.abspath(policy))
        load_policy(absolute)

        def change(current: Principals) -> tuple[Principals, str]:
            if name in current:
                raise PrincipalExistsError(f"{current.source} already has a principal named {name!r}")
            token, record = issue_token(current.token_ids(), now=now)
            principal = Principal(
                name=name, role=role, policy=absolute, quotas=quotas, tokens=(record,), quotas_set=quotas_set
            )
            return current.with_principal(principal), token

        return self._update(change, create=True)

    def rotate(self, name: str, *, now: datetime | None = None) -> str:
        """Give ``name`` one new token and revoke all its others; return the clear token."""

        def change(current: Principals) -> tuple[Principals, str]:
            principal = current.get(name)
            token, record = issue_token(current.token_ids(), now=now)
            return current.with_principal(_replace_tokens(principal, (record,))), token

        return self._update(change)

    def revoke(self, name: str, *, remove: bool = False) -> Principal:
        """Revoke every token of ``name`` (it stays, unable to authenticate, until ``rotate``), or with
        ``remove`` delete the principal altogether. Returns the principal as it was."""

        def change(current: Principals) -> tuple[Principals, Principal]:
            principal = current.get(name)
            if remove:
                return current.without(name), principal
            return current.with_principal(_replace_tokens(principal, ())), principal

        return self._update(change)

    # --- mechanics ---------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """An exclusive ``flock`` on ``<file>.lock``: one writer at a time, across processes."""
        try:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise PrincipalsError(
                f"cannot open the lock file {self.lock_path}: {exc.strerror or exc}",
                hint="the directory of the principals file must be writable",
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _update(self, change: Callable[[Principals], tuple[Principals, _T]], *, create: bool = False) -> _T:
        with self._locked():
            try:
                current = self.load()
            except PrincipalsNotFoundError:
                if not create:
                    raise
                current = Principals.of((), source=str(self.path))
            updated, result = change(current)
            self._write(updated)
            return result

    def _write(self, principals: Principals) -> None:
        text = principals.render()
        load_principals_text(text, source=str(self.path))  # never replace a good file with one that does not load
        try:
            with whole_file(self.path, sync=True, mode=0o600) as fh:
                fh.write(text.encode("utf-8"))
        except OSError as exc:
            if exc.filename == str(self.path.parent):  # the rename is done, its durability is not
                raise PrincipalsError(
                    f"{self.path} was replaced but its directory could not be synced: {exc.strerror or exc}"
                ) from exc
            raise PrincipalsError(f"cannot write {self.path}: {exc.strerror or exc}; it is unchanged") from exc


def _replace_tokens(principal: Principal, tokens: tuple[TokenRecord, ...]) -> Principal:
    return replace(principal, tokens=tokens)
