"""Public names of a package imported on first use (PEP 562) instead of with the package.

A process that needs one submodule (an audit worker imports only ``gateway.audit._scan`` or
``gateway.audit.ocsf_export``) then does not pay for importing everything the package re-exports (the policy loader,
jsonschema, the decision engine, OpenTelemetry: about 0.3 s of CPU per interpreter, and a verify or export
starts one per CPU). The package keeps a literal ``__all__`` and imports the names under ``TYPE_CHECKING``
for the type checker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from importlib import import_module
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(
    package: str, modules: Mapping[str, Iterable[str]], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package`` (whose globals are ``namespace``), for the names of
    each module in ``modules`` (module -> names). A name, once imported, is kept in ``namespace``."""
    where = {name: module for module, names in modules.items() for name in names}

    def attribute(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = namespace[name] = getattr(import_module(module), name)
        return value

    def names() -> list[str]:
        return sorted({*namespace, *where})

    return attribute, names
