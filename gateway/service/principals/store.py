"""The principals file's writer: :class:`PrincipalsStore` issues tokens and changes the file, locked, checked
and atomic.

Under an exclusive lock file (concurrent ``gateway principals`` commands are serialised), it reloads the file,
applies one change, checks that the new text loads, and replaces the file atomically (a temporary file in the
same directory, fsync, rename, fsync of the directory; mode 0600). A reader (the service, on SIGHUP) sees the
old file or the new one, never a torn one. A clear token is returned once, by :meth:`PrincipalsStore.add` or
:meth:`PrincipalsStore.rotate`, and then exists only with its holder: the file keeps its digest.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import os
import secrets
from collections.abc import Callable, Collection, Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import yaml

from gateway._files import whole_file
from gateway.errors import PrincipalExistsError, PrincipalsError, PrincipalsInvalidError, PrincipalsNotFoundError
from gateway.policy import load_policy
from gateway.service.principals.loading import load_principals, load_principals_text
from gateway.service.principals.model import (
    DEFAULT_QUOTAS,
    QUOTA_FIELDS,
    TOKEN_PREFIX,
    Principal,
    Principals,
    Quotas,
    Role,
    TokenRecord,
    name_problem,
    token_digest,
)

__all__ = ["PrincipalsStore", "issue_token", "render"]

_SECRET_BYTES = 32
_T = TypeVar("_T")


def render(principals: Principals) -> str:
    """The file's text: a header, then the document as block YAML."""
    body = yaml.dump(principals.to_document(), Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=200)
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
        text = render(principals)
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
