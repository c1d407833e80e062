"""Validate exported OCSF events with the maintained ``py-ocsf-models`` library (OCSF 1.5.0).

``py-ocsf-models`` 0.10 implements the base event and the OCSF objects, but of the event classes only the
Findings: it has no model of API Activity, Authentication, Application Lifecycle or Application Error. So an
event is validated in two layers:

1. **The library**: the event against :class:`BaseEvent` (metadata, product, severity, status, message,
   unmapped...) and every object the export fills against the library's model of that object (``actor.user``
   and ``user``: ``User`` with its ``Account``; ``api``: ``API`` with ``RequestElements`` /
   ``ResponseElements``; each of ``resources``: ``ResourceDetails``; ``policy``: ``Policy``; ``app``:
   ``Product``). The library's models ignore unknown keys, so each one is also dumped back and compared with
   the input: a misspelt or mistyped field fails instead of being dropped silently.
2. **The class layer the library lacks**: the attributes the OCSF 1.5.0 schema marks required for each class
   and the activity ids it defines (``events/application/api_activity.json`` and the others in
   ocsf/ocsf-schema at tag 1.5.0), its ``at_least_one`` constraints (Network and HTTP Activity), the types of
   the network objects the export fills (``traffic``, an endpoint's ``port``, ``http_request``), and
   ``type_uid = class_uid * 100 + activity_id``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from py_ocsf_models import OCSF_VERSION
from py_ocsf_models.events.base_event import BaseEvent
from py_ocsf_models.objects.api import API
from py_ocsf_models.objects.policy import Policy
from py_ocsf_models.objects.product import Product
from py_ocsf_models.objects.resource_details import ResourceDetails
from py_ocsf_models.objects.user import User
from pydantic import BaseModel

__all__ = ["OCSF_VERSION", "validate_event"]

# From the OCSF 1.5.0 schema: base_event.json's required attributes, each class's own, its activity ids.
_BASE_REQUIRED = ("activity_id", "category_uid", "class_uid", "metadata", "severity_id", "time", "type_uid")
_CLASSES: dict[int, tuple[int, tuple[str, ...], frozenset[int]]] = {
    6003: (6, ("actor", "api", "src_endpoint"), frozenset({0, 1, 2, 3, 4, 99})),  # API Activity
    6002: (6, ("app",), frozenset({0, 1, 2, 3, 4, 5, 6, 7, 8, 99})),  # Application Lifecycle
    6008: (6, (), frozenset({0, 1, 2, 99})),  # Application Error
    3002: (3, ("user",), frozenset({0, 1, 2, 3, 4, 5, 6, 7, 99})),  # Authentication
    4001: (4, (), frozenset({0, 1, 2, 3, 4, 5, 6, 7, 99})),  # Network Activity
    4002: (4, (), frozenset({0, 1, 2, 3, 4, 5, 6, 7, 8, 99})),  # HTTP Activity
}
_ENDPOINTS = ("dst_endpoint", "src_endpoint")
_AT_LEAST_ONE: dict[int, tuple[tuple[str, ...], ...]] = {  # each class's at_least_one constraints
    4001: (_ENDPOINTS,),  # network.json's
    4002: (("http_request", "http_response"), _ENDPOINTS),  # http_activity.json's, and network.json's it extends
}
_TRAFFIC = ("bytes", "bytes_in", "bytes_out", "packets", "packets_in", "packets_out")
_ACTOR_ONE_OF = ("process", "user", "iam_role", "invoked_by", "session", "app_name", "app_uid")
_ENDPOINT_ONE_OF = ("ip", "uid", "name", "hostname", "svc_name", "instance_uid", "interface_uid", "interface_name")


def _strict(model: type[BaseModel], data: Any, where: str) -> None:
    """Validate ``data`` with a library model and require that nothing was ignored or coerced."""
    assert isinstance(data, Mapping), f"{where}: expected an object, got {data!r}"
    parsed = model.model_validate(data)
    dumped = parsed.model_dump(mode="json", exclude_unset=True)
    assert dumped == dict(data), f"{where}: {model.__name__} dropped or changed fields: {data!r} -> {dumped!r}"


def validate_event(event: Mapping[str, Any]) -> None:
    """Raise (pydantic ``ValidationError`` or ``AssertionError``) unless ``event`` is a valid OCSF event."""
    base = {k: v for k, v in event.items() if k in BaseEvent.model_fields}
    _strict(BaseEvent, base, "event")
    assert event["metadata"]["version"] == OCSF_VERSION
    for key in _BASE_REQUIRED:
        assert key in event, f"missing required {key}"
    class_uid, activity = event["class_uid"], event["activity_id"]
    assert class_uid in _CLASSES, f"unexpected class {class_uid}"
    category, required, activities = _CLASSES[class_uid]
    assert event["category_uid"] == category
    assert activity in activities, f"activity {activity} is not one of class {class_uid}"
    if activity == 99:
        assert event.get("activity_name"), "activity Other needs activity_name"
    assert event["type_uid"] == class_uid * 100 + activity
    assert isinstance(event["time"], int)
    assert event["status_id"] in (0, 1, 2, 99)
    for key in required:
        assert key in event, f"class {class_uid}: missing required {key}"
    for keys in _AT_LEAST_ONE.get(class_uid, ()):
        assert any(k in event for k in keys), f"class {class_uid} needs one of {keys}"
    traffic = event.get("traffic")
    if traffic is not None:
        assert all(k in _TRAFFIC and type(v) is int and v >= 0 for k, v in traffic.items()), f"traffic: {traffic!r}"
    for key in ("src_endpoint", "dst_endpoint"):
        port = event.get(key, {}).get("port")
        assert port is None or (type(port) is int and 0 <= port <= 65535), f"{key}.port: {port!r}"
    request = event.get("http_request")
    if request is not None:
        assert isinstance(request.get("http_method"), str), f"http_request.http_method: {request!r}"
        url = request.get("url")
        assert url is None or ("url_string" in url or "path" in url), "http_request.url needs url_string or path"
    actor = event.get("actor")
    if actor is not None:
        assert any(k in actor for k in _ACTOR_ONE_OF), f"actor needs one of {_ACTOR_ONE_OF}"
        if "user" in actor:
            _strict(User, actor["user"], "actor.user")
    if "user" in event:
        _strict(User, event["user"], "user")
    if "api" in event:
        _strict(API, event["api"], "api")
    for index, resource in enumerate(event.get("resources", ())):
        _strict(ResourceDetails, resource, f"resources[{index}]")
    if "policy" in event:
        _strict(Policy, event["policy"], "policy")
    if "app" in event:
        _strict(Product, event["app"], "app")
    for key in ("src_endpoint", "dst_endpoint"):
        if key in event:
            assert any(k in event[key] for k in _ENDPOINT_ONE_OF), f"{key} needs one of {_ENDPOINT_ONE_OF}"
