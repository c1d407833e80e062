"""Sessions: a principal's own sandbox state that lasts across executions, under the same policy and audit.

:class:`SessionManager` (``manager.py``) is owned by the Gateway (:attr:`gateway.Gateway.sessions`);
``model.py`` holds what it hands out (:class:`SessionInfo`, :class:`SessionResult`); ``files.py`` moves a
workspace session's files (:class:`SessionFile`); ``ahead.py`` makes a workspace session's next container
ahead.
"""

from __future__ import annotations

from gateway.sessions.files import SessionFile
from gateway.sessions.manager import RawSessionRequest, SessionManager
from gateway.sessions.model import SessionInfo, SessionResult, SessionState

__all__ = ["RawSessionRequest", "SessionFile", "SessionInfo", "SessionManager", "SessionResult", "SessionState"]
