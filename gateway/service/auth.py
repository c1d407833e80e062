"""Bearer authentication, in Starlette's shape: :class:`BearerTokens` is the ``AuthenticationBackend`` of an
``AuthenticationMiddleware`` on each route that needs a token (``/v1``, ``/metrics``, ``/mcp``).

The request's user is a :class:`CallerUser` (the token's :class:`~gateway.Caller`) or, when the token did not
authenticate, :class:`Refused`: the failure is recorded in the ``auth.failed`` summaries
(:class:`~gateway.service.authlog.AuthFailures`, in a worker thread) and :func:`caller_of` raises the 401.
A token that authenticates counts its request against the principal's ``all_rpm``
(:meth:`~gateway.service.quotas.QuotaGate.count_authenticated`): here, once per request, whatever the route
(``/v1``, ``/metrics``, every ``/mcp`` message); over it the user is :class:`OverRate`, the refusal is
summarised in ``request.refused`` (:class:`~gateway.service.quotas.Refusals`) and :func:`caller_of` raises
the 429. A refusal is the endpoint's, not the middleware's, so that it is answered and counted like the
endpoint's other errors. Open routes (``/healthz``, ``/readyz``, ``/openapi.json``) have no such middleware: a header
sent to them is not even read.
"""

from __future__ import annotations

from starlette.authentication import AuthCredentials, AuthenticationBackend, BaseUser, UnauthenticatedUser
from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection

from gateway import Caller
from gateway.errors import AuthenticationError, OverQuotaError
from gateway.service.authlog import FailureReason, presented_token_id
from gateway.service.service import Service

__all__ = ["AUTHENTICATED", "BearerTokens", "CallerUser", "OverRate", "Refused", "caller_of"]

AUTHENTICATED = "authenticated"
"""The scope of a request whose bearer token authenticated (``request.auth.scopes``)."""


class CallerUser(BaseUser):
    """The user of a request whose bearer token authenticated: the token's principal and public id."""

    def __init__(self, caller: Caller) -> None:
        self.caller = caller

    @property
    def principal(self) -> str:
        """What the access log names (:func:`gateway.service.accesslog.scope_principal`)."""
        return self.caller.principal

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def display_name(self) -> str:
        return self.caller.principal

    @property
    def identity(self) -> str:
        return self.caller.token_id


class Refused(UnauthenticatedUser):
    """The user of a request whose bearer token did not authenticate (already recorded): why, for the 401."""

    def __init__(self, message: str) -> None:
        self.message = message


class OverRate(UnauthenticatedUser):
    """The user of a request whose token authenticated but whose principal is over its ``all_rpm`` (already
    recorded): the access log still names the principal, :func:`caller_of` raises the 429."""

    def __init__(self, caller: Caller, error: OverQuotaError) -> None:
        self.caller = caller
        self.error = error

    @property
    def principal(self) -> str:
        return self.caller.principal


class BearerTokens(AuthenticationBackend):
    """``Authorization: Bearer <token>`` checked against the service's principals (constant time,
    :meth:`~gateway.service.principals.Principals.authenticate`). A failure is recorded with its reason:
    ``missing`` (no header), ``malformed`` (not ``Bearer <token>``, or not a token of the gateway's format) or
    ``unknown`` (a well-formed token no principal holds: unknown, rotated or revoked)."""

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, BaseUser]:
        service = Service.of(conn)
        header = conn.headers.get("authorization")
        reason: FailureReason
        token = ""
        if header is None:
            reason = "missing"
        else:
            scheme, _, token = header.strip().partition(" ")
            token = token.strip()
            reason = "malformed" if scheme.lower() != "bearer" or not token else "unknown"
        if reason == "unknown":
            found = service.principals.authenticate(token)
            if found is not None:
                caller = Caller(found[0].name, found[1])
                try:
                    quotas = found[0].effective_quotas(service.config.quotas)
                    service.quota_gate.count_authenticated(caller.principal, quotas)
                except OverQuotaError as exc:
                    await run_in_threadpool(
                        service.refusals.note, exc, principal=caller.principal, token_id=caller.token_id,
                        request_id=None, path=conn.url.path,
                    )  # fmt: skip
                    return AuthCredentials(), OverRate(caller, exc)
                return AuthCredentials([AUTHENTICATED]), CallerUser(caller)
            if presented_token_id(token) is None:
                reason = "malformed"
        client = conn.client.host if conn.client is not None else None
        token_id = presented_token_id(token) if token else None
        await run_in_threadpool(
            service.auth_failures.note, reason, token_id=token_id, client=client, path=conn.url.path
        )
        message = (
            "no bearer token" if reason == "missing" else "the bearer token is not valid (unknown, rotated or revoked)"
        )
        return AuthCredentials(), Refused(message)


def caller_of(conn: HTTPConnection) -> Caller:
    """The request's authenticated caller; :class:`~gateway.errors.OverQuotaError` (429) when its principal is
    over its ``all_rpm``; :class:`~gateway.errors.AuthenticationError` (401) otherwise, also for a route without
    :class:`BearerTokens` (refused rather than served unattributed)."""
    user = conn.scope.get("user")
    if isinstance(user, OverRate):
        raise user.error
    if isinstance(user, CallerUser):
        return user.caller
    if isinstance(user, Refused):
        raise AuthenticationError(user.message)
    raise AuthenticationError(f"{conn.url.path} checks no bearer token; it cannot serve an authenticated call")
