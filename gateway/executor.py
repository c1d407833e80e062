"""What :mod:`gateway.tool` and :mod:`gateway.simple` need from whoever runs a request: one small protocol.

A local :class:`gateway.Gateway` and a remote :class:`gateway.client.Client` both satisfy it, so the same
handler serves a model in-process or through ``gateway serve``. The result is read through ``to_dict()`` (the
``--json`` result object, the same keys either way) and a few properties; nothing else is assumed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from gateway.errors import GatewayError

__all__ = ["Executor", "ResultLike"]


@runtime_checkable
class ResultLike(Protocol):
    """:class:`gateway.ExecutionResult` or :class:`gateway.client.RemoteResult`."""

    @property
    def request_id(self) -> str: ...

    @property
    def allowed(self) -> bool: ...

    @property
    def ran(self) -> bool: ...

    @property
    def error(self) -> GatewayError | None: ...

    def to_dict(self) -> dict[str, Any]: ...


class Executor(Protocol):
    """Runs one request (the body of ``gateway check``) and reports it without raising for what the gateway
    decided or failed at: a denial, an invalid request, an engine that is down are all in the result."""

    def execute(self, request: Mapping[str, Any]) -> ResultLike: ...
