"""Sessions: a principal's own sandbox state that lasts across executions, under the same policy and audit.

:class:`SessionManager` (``manager.py``) is owned by the Gateway (:attr:`gateway.Gateway.sessions`);
``model.py`` holds what it hands out (:class:`SessionInfo`, :class:`SessionResult`).
"""

from __future__ import annotations

from gateway.sessions.manager import RawSessionRequest, SessionManager
from gateway.sessions.model import SessionInfo, SessionResult, SessionState

__all__ = ["RawSessionRequest", "SessionInfo", "SessionManager", "SessionResult", "SessionState"]
