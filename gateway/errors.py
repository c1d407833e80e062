"""The gateway's errors: one base class, a small tree, one table of exit codes and HTTP statuses.

Callers branch on ``code`` (stable, dotted) or on the class, never on message text. Every lower-level
exception (docker, requests, OS, YAML, JSON Schema) is mapped to one of these at the boundary where it
happens, chained with ``raise ... from exc`` so that the cause is never lost.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = [
    "EXIT_DENIED",
    "EXIT_GATEWAY_FAILURE",
    "EXIT_MEMORY",
    "EXIT_PENDING",
    "EXIT_TIMEOUT",
    "EXIT_USAGE",
    "ApprovalClosedError",
    "ApprovalConflictError",
    "ApprovalError",
    "ApprovalLimitError",
    "ApprovalNotFoundError",
    "AuditError",
    "AuditIntegrityError",
    "AuditSpaceError",
    "AuditUnavailableError",
    "AuthenticationError",
    "BodiesInFlightError",
    "BodyTimeoutError",
    "BodyTooLargeError",
    "CancelledRunError",
    "CapacityError",
    "CodeTooLargeError",
    "ContainerLeftError",
    "ContractError",
    "DecisionWorkerError",
    "EgressUnavailableError",
    "EngineUnavailableError",
    "ForbiddenError",
    "GatewayError",
    "HeadTooLargeError",
    "ImageMissingError",
    "InterruptedRunError",
    "MalformedRequestError",
    "OutputCallbackError",
    "OverQuotaError",
    "PackageError",
    "PackageInstallError",
    "PackageRefusedError",
    "PolicyError",
    "PolicyNotFoundError",
    "PrincipalExistsError",
    "PrincipalIdentityError",
    "PrincipalMismatchError",
    "PrincipalsError",
    "PrincipalsInvalidError",
    "PrincipalsNotFoundError",
    "Problem",
    "RequestError",
    "RunnerError",
    "SandboxError",
    "ServerConfigError",
    "ServiceError",
    "ServiceStoppingError",
    "ServiceUnreachableError",
    "SessionBusyError",
    "SessionError",
    "SessionGoneError",
    "SessionNotFoundError",
    "SessionUnavailableError",
    "TooManyConnectionsError",
    "UnknownPrincipalError",
    "UnsafeOptionsError",
    "UnsupportedMediaTypeError",
    "WorkspaceFileNotFoundError",
    "WorkspaceFileTooLargeError",
    "WorkspaceFullError",
    "WorkspacePathError",
    "exit_code_for",
    "http_status_for",
]

EXIT_USAGE = 2
"""Usage error or invalid request."""
EXIT_DENIED = 77
"""Denied by policy (sysexits ``EX_NOPERM``)."""
EXIT_PENDING = 75
"""Waiting for an operator's approval (sysexits ``EX_TEMPFAIL``): nothing ran; the approval id is on stderr."""
EXIT_TIMEOUT = 124
"""Killed at the deadline, as ``timeout(1)``."""
EXIT_GATEWAY_FAILURE = 125
"""The gateway or the engine failed, as ``docker run``."""
EXIT_MEMORY = 137
"""Killed for memory or another resource limit: output past its cap, a sandbox killed under its pids limit (128 +
SIGKILL). The JSON result's ``oom_killed`` / ``output_limit_killed`` / ``resource_killed`` say which."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One precise thing that is wrong with an input: where it is and what was expected."""

    message: str
    """What was found and what is allowed, in one sentence."""
    path: str = "$"
    """JSON path into the document (``$.limits.memory``)."""
    source: str | None = None
    """File name (or ``<request>``, ``<stdin>``) the document came from."""
    line: int | None = None
    """1-based line in ``source``, when known."""
    code: str | None = None
    """Stable machine-readable code for the problem, when one applies."""

    def __str__(self) -> str:
        where = ""
        if self.source is not None:
            where = f"{self.source}:{self.line}: " if self.line is not None else f"{self.source}: "
        return f"{where}{self.path}: {self.message}"

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"path": self.path, "message": self.message}
        if self.source is not None:
            out["source"] = self.source
        if self.line is not None:
            out["line"] = self.line
        if self.code is not None:
            out["code"] = self.code
        return out


class GatewayError(Exception):
    """Base of every error the gateway raises on purpose.

    ``code`` is stable and documented; ``problems`` lists every precise fault when there are several
    (a policy file with five mistakes reports five problems, sorted by line).
    """

    code: ClassVar[str] = "gateway.error"
    hint: ClassVar[str] = ""

    def __init__(self, message: str, *, problems: tuple[Problem, ...] | list[Problem] = (), hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.problems: tuple[Problem, ...] = tuple(problems)
        self._hint = hint or type(self).hint
        self.outcome: Any = None
        """What the sandbox had produced when this error ended the run (an ``Outcome``: output so far, the
        container id), set by the runner when a container existed; None when nothing ran."""
        self.request_id: str | None = None
        """The service's request id, on an error :mod:`gateway.client` rebuilt from an HTTP error body (it names
        the request in the server's audit trail and logs); None for an error raised in this process."""

    def diagnostics(self) -> str:
        """A multi-line text for people: the message, every problem, and what to do."""
        lines = [f"error[{self.code}]: {self.message}"]
        lines.extend(f"  {p}" for p in self.problems)
        if self._hint:
            lines.append(f"  hint: {self._hint}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"code": self.code, "message": self.message}
        if self.problems:
            out["problems"] = [p.to_dict() for p in self.problems]
        if self._hint:
            out["hint"] = self._hint
        return out


# --- policy -------------------------------------------------------------------------------------------


class PolicyError(GatewayError):
    """A policy could not be loaded: malformed YAML, schema violations, semantic errors."""

    code = "policy.invalid"
    hint = "fix the policy file; `gateway policy validate FILE` lists every problem"


class PolicyNotFoundError(PolicyError):
    code = "policy.not_found"
    hint = "pass --policy FILE or set GATEWAY_POLICY to an existing policy file"


# --- principals ---------------------------------------------------------------------------------------


class PrincipalsError(GatewayError):
    """The principals file (who may call the service, with which token digests, policy and quotas) or a
    ``gateway principals`` command failed."""

    code = "principals.error"


class PrincipalsInvalidError(PrincipalsError):
    """The principals file cannot be loaded: malformed YAML, schema violations, duplicate names or token ids."""

    code = "principals.invalid"
    hint = "fix the principals file (or re-create it with `gateway principals add`); every problem is listed"


class PrincipalsNotFoundError(PrincipalsError):
    code = "principals.not_found"
    hint = (
        "pass --principals FILE or set GATEWAY_PRINCIPALS to an existing file; "
        "`gateway principals add NAME --policy FILE` creates one"
    )


class UnknownPrincipalError(PrincipalsError):
    """A command named a principal the file does not hold."""

    code = "principals.unknown"
    hint = "`gateway principals list` shows the names in the file"


class PrincipalExistsError(PrincipalsError):
    """``gateway principals add`` named a principal the file already holds."""

    code = "principals.duplicate"
    hint = "choose another name, or `gateway principals rotate NAME` to give the existing principal a new token"


class PrincipalIdentityError(PrincipalsError):
    """``gateway mcp`` was not told who to act as, was told two contradicting things, or was told a revoked
    principal."""

    code = "principals.identity"
    hint = "`gateway mcp --principal NAME` (from the principals file) or `gateway mcp --policy FILE` (as yourself)"


# --- request ------------------------------------------------------------------------------------------


class RequestError(GatewayError):
    """The execution request is malformed (bad JSON, schema violations, bad sizes)."""

    code = "request.invalid"
    hint = "see schemas/request.schema.json for the request format"


class MalformedRequestError(RequestError):
    """The request body is not JSON at all (the HTTP service answers 400 ``request.malformed``)."""

    code = "request.malformed"
    hint = "send one JSON object (UTF-8) as the body"


class BodyTooLargeError(RequestError):
    """The request body is larger than the service's ``max_body_bytes`` (HTTP 413); nothing was parsed."""

    code = "request.too_large"
    hint = "send a smaller request (the limit is the server's max_body_bytes)"


class CodeTooLargeError(BodyTooLargeError):
    """A request's ``code`` is larger than any policy of the service accepts (the largest ``limits.code_size``
    of its policy set): refused at intake, before the request waits for a slot or is decided (413)."""

    code = "request.code_too_large"
    hint = "send at most your policy's ceiling (GET /v1/policy: ceilings.limits.code_size); larger data as files"


class WorkspacePathError(RequestError):
    """A path in a session's workspace that the file helpers refuse (its name, a symlink, not a regular file),
    absent, too large, or the workspace full (422 unless a subclass says otherwise)."""

    code = "request.workspace_path"


class WorkspaceFileNotFoundError(WorkspacePathError):
    """Nothing is at that path in the workspace (404)."""

    code = "request.workspace_not_found"


class WorkspaceFullError(WorkspacePathError):
    """The write does not fit: the workspace's file system is full (its size is the session's bound; 507)."""

    code = "request.workspace_full"


class WorkspaceFileTooLargeError(WorkspacePathError):
    """A file is larger than its cap (413): an upload over the policy's ``limits.files_size`` ceiling, or a
    download of a file over its ``limits.output_files_bytes`` ceiling (nothing of it is sent)."""

    code = "request.file_too_large"
    hint = "GET /v1/policy names both ceilings; split a larger file in an execution (or compress it) and move the parts"


class HeadTooLargeError(RequestError):
    """A request's head (request line and headers) grew past the service's ``max_header_bytes`` before it was
    complete (HTTP 431): answered and closed before the service held more of it."""

    code = "request.header_too_large"
    hint = "send shorter headers and URL (the limit is the server's max_header_bytes)"


class BodyTimeoutError(RequestError):
    """The request body did not arrive within the service's ``body_read_s`` (HTTP 408); nothing was parsed."""

    code = "request.timeout"
    hint = "send the whole body at once (the server waits at most its body_read_s for it)"


class UnsupportedMediaTypeError(RequestError):
    """The request body is not ``application/json`` (HTTP 415); it was not read."""

    code = "request.media_type"
    hint = "send the body with Content-Type: application/json"


class PrincipalMismatchError(RequestError):
    """The request names a ``principal`` other than the authenticated caller (HTTP 403): a token speaks only
    for its own principal, so the request is refused rather than silently re-attributed."""

    code = "auth.principal_mismatch"
    hint = "omit `principal` (the authenticated principal is used) or send the token of the principal you name"


# --- the service --------------------------------------------------------------------------------------


class ServiceError(GatewayError):
    """The HTTP service's own failures (configuration, authentication)."""

    code = "service.error"


class ServerConfigError(ServiceError):
    """The server configuration file is missing or invalid, or the service cannot start as configured
    (no principal holds a token: there is no unauthenticated mode)."""

    code = "server.config_invalid"
    hint = "fix the file (schemas/server.schema.json) or the flags; `gateway principals add NAME --policy P` adds one"


class AuthenticationError(ServiceError):
    """No bearer token, a malformed one, or one no principal holds (unknown, rotated away, revoked): HTTP 401."""

    code = "auth.failed"
    hint = "send `Authorization: Bearer <token>` with a token issued by `gateway principals add|rotate`"


class ForbiddenError(ServiceError):
    """An authenticated principal asked for an endpoint its role may not use (``/metrics`` and the audit
    endpoints are for operators): HTTP 403, audited as ``auth.forbidden``."""

    code = "auth.forbidden"
    hint = "use the token of a principal with role operator (`gateway principals add NAME --role operator`)"


class ServiceUnreachableError(ServiceError):
    """:mod:`gateway.client` could not get an answer from the service: connection refused, TLS failure, timeout,
    or a reply that is not HTTP. Whether a request that was sent ran is unknown: its id is not known either."""

    code = "service.unreachable"
    hint = "check the service's URL, that `gateway serve` is running, the TLS settings and the client's timeout"


class DecisionWorkerError(ServiceError):
    """The service's decision worker ended while deciding the request, or did not answer it in time (``gateway
    serve``: dry runs are decided in worker processes). The records the worker had built for its batch went with
    it; the service records the refusal (``request.refused``)."""

    code = "service.decision_failed"
    hint = "retry: the service replaces the worker (and decides in process meanwhile); its log says why it ended"


class TooManyConnectionsError(ServiceError):
    """The service holds as many client connections as it is configured for (``max_connections``): a new one is
    answered 503 with ``Retry-After`` and closed before its request is read, so no client can use up the
    service's file descriptors (which its audit trail and the engine connections need too)."""

    code = "service.too_many_connections"
    hint = "retry shortly; close idle connections, or raise max_connections in the server config"


class BodiesInFlightError(ServiceError):
    """The request bodies the service holds at once would pass its bound (``max_body_bytes_in_flight``) with
    this one: answered 503 before its body is read, so that many large bodies at once cannot exhaust the
    service's memory; nothing ran."""

    code = "service.bodies_in_flight"
    hint = "retry in a few seconds; an operator may raise max_body_bytes_in_flight in the server config"


class ServiceStoppingError(ServiceError):
    """The service stopped while the request was in flight and its grace (``grace_s``) was over: the request
    was cancelled (a run of it killed and removed) and answered 503."""

    code = "service.stopping"
    hint = "retry against a running instance; a long run needs a longer grace_s on the server"


class OverQuotaError(ServiceError):
    """The principal is over one of its quotas (requests per minute, or its queue of waiting executions is
    full): nothing ran; HTTP 429 with ``Retry-After`` (:attr:`retry_after_s`, whole seconds)."""

    code = "service.over_quota"
    hint = "retry after the Retry-After seconds, or ask the operator for larger quotas (`gateway principals add`)"

    def __init__(self, message: str, *, retry_after_s: int, quota: str, hint: str = "") -> None:
        super().__init__(message, hint=hint)
        self.retry_after_s = max(1, int(retry_after_s))
        """Whole seconds after which a retry can succeed (at least 1)."""
        self.quota = quota
        """Which quota refused it: ``rpm``, ``queue`` (full) or ``queue_wait`` (waited too long for a slot)."""


# --- contracts between the gateway's own parts ---------------------------------------------------------


class ContractError(GatewayError):
    """One part of the gateway handed another something it should never have built (a payload with a name
    the decision should have refused, a run specification with no deadline). The gateway's fault, never the
    caller's: exit 125, HTTP 500."""

    code = "gateway.contract"
    hint = "this is a bug in the gateway; the request was refused before anything ran. Please report it"


# --- decision / assembly ------------------------------------------------------------------------------


class UnsafeOptionsError(GatewayError):
    """The invariant guard refused assembled run options. This is a gateway bug and always a deny."""

    code = "decision.unsafe_options"


# --- runner -------------------------------------------------------------------------------------------


class RunnerError(GatewayError):
    """The sandbox backend failed (not the program inside it)."""

    code = "runner.error"


class EngineUnavailableError(RunnerError):
    code = "runner.engine_unavailable"
    hint = "start the Docker engine (scripts/setup.sh does it) or set DOCKER_HOST"


class ImageMissingError(RunnerError):
    code = "runner.image_missing"
    hint = "build the missing sandbox image locally with scripts/build-image.sh IMAGE (--list names them; no registry)"


class EgressUnavailableError(RunnerError):
    """A run the decision allowed network ``egress`` that this backend cannot give it (Kubernetes): refused before
    any Pod is made (fail closed), never run without the proxy."""

    code = "runner.egress_unavailable"
    hint = "ask for network none, or run it on the Docker backend (runs and sessions there have egress)"


class SandboxError(RunnerError):
    """The engine refused or lost a container (create/start/wait/inspect failed)."""

    code = "runner.sandbox_failed"


# --- packages -----------------------------------------------------------------------------------------


class PackageError(GatewayError):
    """A request's packages (``spec.packages``) could not be installed: the run did not start."""

    code = "packages.error"


class PackageRefusedError(PackageError):
    """The install phase resolved a distribution the policy refuses (a project outside ``allow``, an archive
    whose sha256 is not listed in ``hashes``): nothing it installed reaches a run."""

    code = "packages.refused"
    hint = "pin the requirement to an allowed version, or ask the policy's owner to allow the project (spec.packages)"


class PackageInstallError(PackageError):
    """The installer failed in its sandbox (the index unreachable, no version matching, a source-only package
    with ``binary_only``, the install tree full): the run did not start."""

    code = "packages.install_failed"
    hint = "check the requirement's name and version on the policy's index; binary_only needs a wheel for the image"


# --- capacity -----------------------------------------------------------------------------------------


class CapacityError(GatewayError):
    """Every host-wide execution slot stayed busy for the whole bounded wait: nothing ran; retry later."""

    code = "gateway.capacity"
    hint = "retry later, or raise the host's slot count (GATEWAY_SLOTS) if the host has room"


class ContainerLeftError(SandboxError):
    """The program ran to its end and reported, but its container could not be removed afterwards.

    The outcome (output, exit code, container id) is kept on the error: the report is the program's, and the
    container is left for ``gateway reap`` (it also ends itself at its deadline)."""

    code = "runner.container_left"
    hint = "the program's result is complete; remove the container with `gateway reap` (it expires at its deadline)"


class InterruptedRunError(GatewayError):
    """The gateway process was told to stop (SIGTERM, SIGINT) in the middle of a request.

    The sandbox is killed and removed, the outcome recorded with this error, and the CLI exits ``128 + signal``."""

    code = "gateway.interrupted"
    hint = "the gateway was interrupted; the run did not finish and its sandbox was removed"

    def __init__(self, signum: int) -> None:
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        super().__init__(f"the gateway was interrupted by {name} during the request; its sandbox was removed")
        self.signum = signum


class CancelledRunError(GatewayError):
    """The caller abandoned the run (``Gateway.execute(..., cancel=event)`` was set; the service sets it when
    its client disconnects). The sandbox is killed and removed, and the outcome recorded with this error.

    Its HTTP status is 499 (*client closed request*): nobody is left to read the response, but the audit
    trail and the logs name it."""

    code = "gateway.cancelled"
    hint = "the caller cancelled the run before it finished; its sandbox was killed and removed"


class OutputCallbackError(GatewayError):
    """The caller's output callback (``Gateway.execute(..., on_output=...)``) raised while the program ran.

    The callback's failure never weakens containment: the sandbox is killed and removed, the output kept so
    far is in the outcome, and the callback's exception is chained as ``__cause__``."""

    code = "gateway.output_callback"
    hint = "the run was stopped because the caller's output callback failed; fix the callback and retry"


# --- approvals ----------------------------------------------------------------------------------------


class ApprovalError(GatewayError):
    """An approval cannot be held, decided or used as asked (``gateway.audit.approvals``): nothing ran."""

    code = "approval.error"


class ApprovalNotFoundError(ApprovalError):
    """No approval has this id (in the trail's recent segments)."""

    code = "approval.not_found"


class ApprovalConflictError(ApprovalError):
    """An operator's action that cannot apply: decided twice, expired, or a digest that is not the request's."""

    code = "approval.conflict"


class ApprovalClosedError(ApprovalError):
    """The request's approval was denied or used up: it does not run (and asks anew only once that one expired)."""

    code = "approval.closed"


class ApprovalLimitError(ApprovalError):
    """The principal holds too many pending approvals: the request is not held (and does not run)."""

    code = "approval.too_many"


# --- sessions -----------------------------------------------------------------------------------------


class SessionError(GatewayError):
    """A request about a session that cannot be served as asked (``gateway.sessions``)."""

    code = "session.error"


class SessionNotFoundError(SessionError):
    """No session of the caller has this id. Another principal's session gets exactly this error, so that an id
    reveals nothing of a session the caller does not own."""

    code = "session.not_found"
    hint = "list your sessions (GET /v1/sessions) or create one (POST /v1/sessions)"


class SessionGoneError(SessionError):
    """The caller's session has ended (closed, expired or killed; the message says which and why)."""

    code = "session.gone"
    hint = "create a new session: the state of this one is gone"


class SessionBusyError(SessionError):
    """An execution is already running in this session; executions of one session run one at a time."""

    code = "session.busy"
    hint = "send the next execution when the running one has returned"


class SessionUnavailableError(SessionError):
    """This gateway cannot serve the session mode asked for (its backend has no kernels, or the mode is not
    built yet). Nothing was created."""

    code = "session.unavailable"


# --- audit --------------------------------------------------------------------------------------------


class AuditError(GatewayError):
    code = "audit.error"


class AuditUnavailableError(AuditError):
    """The trail cannot be written (disk full, read-only, lock failure, broken chain): fail closed."""

    code = "audit.unavailable"
    hint = "nothing ran; fix the audit directory (GATEWAY_AUDIT_DIR) and retry"


class AuditSpaceError(AuditUnavailableError):
    """The trail's file system is below its free-space watermark: new work is refused *before* the disk is
    full, so that the records of runs already in flight (their outcomes) can still be written."""

    code = "audit.low_space"
    hint = (
        "nothing ran; free space on the trail's file system (or move GATEWAY_AUDIT_DIR to a larger one) and "
        "retry; the watermark is GATEWAY_AUDIT_MIN_FREE (a size such as 64m, or a percentage such as 1%)"
    )


class AuditIntegrityError(AuditError):
    """The trail on disk is broken (torn tail, bad hash); the writer refuses to extend it."""

    code = "audit.integrity"
    hint = "run `gateway audit verify` to locate the break and `gateway audit repair` to seal it"


# --- one table ----------------------------------------------------------------------------------------

_TABLE: tuple[tuple[type[GatewayError], int, int], ...] = (
    # most specific first
    (PolicyNotFoundError, EXIT_GATEWAY_FAILURE, 500),
    (PolicyError, EXIT_GATEWAY_FAILURE, 500),
    (MalformedRequestError, EXIT_USAGE, 400),
    (BodyTooLargeError, EXIT_USAGE, 413),
    (BodyTimeoutError, EXIT_USAGE, 408),
    (HeadTooLargeError, EXIT_USAGE, 431),
    (UnsupportedMediaTypeError, EXIT_USAGE, 415),
    (PrincipalMismatchError, EXIT_USAGE, 403),
    (WorkspaceFileNotFoundError, EXIT_USAGE, 404),
    (WorkspaceFullError, EXIT_USAGE, 507),
    (WorkspaceFileTooLargeError, EXIT_USAGE, 413),
    (RequestError, EXIT_USAGE, 422),
    (UnknownPrincipalError, EXIT_USAGE, 404),
    (PrincipalExistsError, EXIT_USAGE, 409),
    (PrincipalIdentityError, EXIT_USAGE, 400),
    (PrincipalsNotFoundError, EXIT_GATEWAY_FAILURE, 500),
    (PrincipalsInvalidError, EXIT_GATEWAY_FAILURE, 500),
    (PrincipalsError, EXIT_GATEWAY_FAILURE, 500),
    (ServerConfigError, EXIT_GATEWAY_FAILURE, 500),
    (AuthenticationError, EXIT_USAGE, 401),
    (ForbiddenError, EXIT_USAGE, 403),
    (OverQuotaError, EXIT_GATEWAY_FAILURE, 429),
    (ServiceUnreachableError, EXIT_GATEWAY_FAILURE, 503),
    (DecisionWorkerError, EXIT_GATEWAY_FAILURE, 503),
    (TooManyConnectionsError, EXIT_GATEWAY_FAILURE, 503),
    (BodiesInFlightError, EXIT_GATEWAY_FAILURE, 503),
    (ServiceStoppingError, EXIT_GATEWAY_FAILURE, 503),
    (ServiceError, EXIT_GATEWAY_FAILURE, 500),
    (ContractError, EXIT_GATEWAY_FAILURE, 500),
    (UnsafeOptionsError, EXIT_GATEWAY_FAILURE, 500),
    (EngineUnavailableError, EXIT_GATEWAY_FAILURE, 503),
    (ImageMissingError, EXIT_GATEWAY_FAILURE, 503),
    (EgressUnavailableError, EXIT_GATEWAY_FAILURE, 501),
    (PackageRefusedError, EXIT_DENIED, 403),
    (PackageInstallError, EXIT_GATEWAY_FAILURE, 502),
    (PackageError, EXIT_GATEWAY_FAILURE, 500),
    (ContainerLeftError, EXIT_GATEWAY_FAILURE, 502),
    (SandboxError, EXIT_GATEWAY_FAILURE, 502),
    (RunnerError, EXIT_GATEWAY_FAILURE, 502),
    (CapacityError, EXIT_GATEWAY_FAILURE, 503),
    (ApprovalNotFoundError, EXIT_USAGE, 404),
    (ApprovalConflictError, EXIT_USAGE, 409),
    (ApprovalClosedError, EXIT_DENIED, 403),
    (ApprovalLimitError, EXIT_GATEWAY_FAILURE, 429),
    (ApprovalError, EXIT_USAGE, 400),
    (SessionNotFoundError, EXIT_USAGE, 404),
    (SessionGoneError, EXIT_USAGE, 410),
    (SessionBusyError, EXIT_USAGE, 409),
    (SessionUnavailableError, EXIT_GATEWAY_FAILURE, 501),
    (SessionError, EXIT_USAGE, 400),
    (AuditSpaceError, EXIT_GATEWAY_FAILURE, 507),
    (AuditUnavailableError, EXIT_GATEWAY_FAILURE, 503),
    (AuditIntegrityError, EXIT_GATEWAY_FAILURE, 503),
    (AuditError, EXIT_GATEWAY_FAILURE, 500),
    (InterruptedRunError, EXIT_GATEWAY_FAILURE, 503),
    (CancelledRunError, EXIT_GATEWAY_FAILURE, 499),
    (OutputCallbackError, EXIT_GATEWAY_FAILURE, 500),
    (GatewayError, EXIT_GATEWAY_FAILURE, 500),
)


def _row(err: BaseException | type[BaseException]) -> tuple[int, int]:
    cls = err if isinstance(err, type) else type(err)
    for klass, exit_code, status in _TABLE:
        if issubclass(cls, klass):
            return exit_code, status
    return EXIT_GATEWAY_FAILURE, 500


def exit_code_for(err: BaseException | type[BaseException]) -> int:
    """CLI exit status for an error; anything unknown is a gateway failure (125)."""
    return _row(err)[0]


def http_status_for(err: BaseException | type[BaseException]) -> int:
    """HTTP status for an error; anything unknown is a 500."""
    return _row(err)[1]
