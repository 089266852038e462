"""Helpers shared by the KMS backends: typed catalog properties and argument checks.

Every helper takes the backend's ``kms-type`` name for its errors; a backend binds it
once with :func:`functools.partial`.  Messages quote property values and key ids, never
key bytes.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from icecrypt.errors import InsecureTransportWarning, KmsError, KmsKeyNotFoundError

_TRUE = ("true",)
_FALSE = ("false",)
_LENIENT_TRUE = ("true", "1", "yes")
_LENIENT_FALSE = ("false", "0", "no")


def int_property(properties: Mapping[str, str], name: str, default: int, minimum: int, *, backend: str) -> int:
    """``properties[name]`` as an int of at least ``minimum``; ``default`` when unset or blank."""
    raw = properties.get(name)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise KmsError(f"invalid {name} {raw!r}: expected an integer", backend=backend) from None
    if value < minimum:
        raise KmsError(f"invalid {name} {raw!r}: must be at least {minimum}", backend=backend)
    return value


def bool_property(
    properties: Mapping[str, str], name: str, default: bool, *, backend: str, lenient: bool = False
) -> bool:
    """``properties[name]`` as a bool: ``true``/``false`` (also ``1/0/yes/no`` if ``lenient``)."""
    raw = properties.get(name)
    if raw is None or str(raw).strip() == "":
        return default
    text = str(raw).strip().lower()
    if text in (_LENIENT_TRUE if lenient else _TRUE):
        return True
    if text in (_LENIENT_FALSE if lenient else _FALSE):
        return False
    raise KmsError(f"invalid {name} {raw!r}: expected true or false", backend=backend)


def key_bytes(key: Any, what: str, empty_error: type[KmsError] = KmsError, *, backend: str) -> bytes:
    """``key`` as bytes; a TypeError or KmsError that never shows the value otherwise."""
    if isinstance(key, str) or not isinstance(key, (bytes, bytearray, memoryview)):
        raise TypeError(f"{what} must be a bytes-like object, not {type(key).__name__}")
    data = bytes(key)
    if not data:
        raise empty_error(f"{what} is empty", backend=backend)
    return data


def check_key_id(wrapping_key_id: Any, *, backend: str) -> str:
    """A non-blank string key id, or KmsKeyNotFoundError."""
    if not isinstance(wrapping_key_id, str) or not wrapping_key_id.strip():
        raise KmsKeyNotFoundError(f"invalid wrapping key id {wrapping_key_id!r}", backend=backend)
    return wrapping_key_id


def list_property(properties: Mapping[str, str], name: str) -> tuple[str, ...]:
    """``properties[name]`` as a comma-separated list of non-blank items (empty when unset)."""
    raw = properties.get(name)
    if raw is None:
        return ()
    return tuple(item.strip() for item in str(raw).split(",") if item.strip())


def allow_insecure_transport(properties: Mapping[str, str], name: str, what: str, *, backend: str) -> None:
    """Refuse an insecure transport (``what``: a plain ``http://`` endpoint, TLS verification
    off) unless property ``name`` is ``true``; when it is, warn with
    :class:`~icecrypt.errors.InsecureTransportWarning` and go on."""
    if not bool_property(properties, name, False, backend=backend):
        raise KmsError(
            f"{what}: keys and credentials would cross the network unprotected; use TLS, or set "
            f"{name}=true to allow it (local test servers only)",
            backend=backend,
        )
    warnings.warn(f"{backend} KMS: {what} ({name}=true): not for production", InsecureTransportWarning, stacklevel=4)


def refuse_key_id(wrapping_key_id: str, why: str, *, backend: str) -> KmsKeyNotFoundError:
    """The error for a key id outside what the client's configuration allows."""
    return KmsKeyNotFoundError(
        f"wrapping key id {wrapping_key_id!r} is refused: {why} (a key id comes from table metadata, which "
        "anyone who can write the table's storage can edit; the configuration says which keys may be used)",
        backend=backend,
    )
