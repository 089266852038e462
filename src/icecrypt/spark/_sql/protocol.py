"""What the bridge's methods are made of (:mod:`.bridge` serves them): the registry the
modules of the catalog add their methods to, and the helpers they share.  It imports
none of them, so that each can register here while the bridge imports them all."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["METHODS", "catalog_of", "identifier", "method"]

#: bridge method name -> ``function(bridge, request)``
METHODS: dict[str, Callable[[Any, dict[str, Any]], Any]] = {}


def method(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``function(bridge, request)`` as the bridge's method ``name``."""

    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        METHODS[name] = function
        return function

    return decorate


# --- helpers of the bridge's methods ------------------------------------------------------------


def catalog_of(request: dict[str, Any]) -> tuple[str, Any]:
    from icecrypt.spark._sql.catalogs import open_catalog

    spec = request["catalog"]
    return spec["name"], open_catalog(spec["name"], spec.get("options") or {})


def identifier(value: Any) -> tuple[str, ...]:
    return tuple(str(level) for level in value)
