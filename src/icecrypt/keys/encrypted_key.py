"""EncryptedKey: one entry of a table's ``encryption-keys`` list (SPEC.md §3.6).

Two kinds of entries share the type: a key-encryption key (KEK), wrapped by the KMS master
key whose id is its ``encrypted-by-id`` and timestamped with ``KEY_TIMESTAMP``; and a
manifest list's key metadata, wrapped by a KEK whose id is its ``encrypted-by-id``.
"""

from __future__ import annotations

import base64
import binascii
import types
from collections.abc import Mapping
from typing import Any

from icecrypt.errors import FormatError

__all__ = ["EncryptedKey", "KEY_TIMESTAMP"]

#: property of a KEK entry: creation time, decimal milliseconds since the epoch; its UTF-8
#: bytes are the AAD of every key metadata the KEK wraps
KEY_TIMESTAMP = "KEY_TIMESTAMP"


#: parsed entries without properties, by (key-id, base64 text, encrypted-by-id): a table
#: holds one entry per snapshot and every commit reads them all again.  Entries are
#: immutable and hold only wrapped bytes, so sharing them is safe.
_PARSED: dict[tuple[str, Any, Any], EncryptedKey] = {}
_PARSED_MAX = 1 << 16


class EncryptedKey:
    """An immutable ``encryption-keys`` entry: an id, wrapped bytes and who wrapped them.

    ``properties`` is a read-only mapping of strings, or ``None``; an empty mapping is
    stored as ``None`` because Java writes neither.  Equality and hashing are by value.
    """

    __slots__ = ("_key_id", "_encrypted_key_metadata", "_encrypted_by_id", "_properties", "_base64")

    def __init__(
        self,
        key_id: str,
        encrypted_key_metadata: Any,
        encrypted_by_id: str | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> None:
        if not isinstance(key_id, str):
            raise TypeError(f"key_id must be a str, not {type(key_id).__name__}")
        if encrypted_by_id is not None and not isinstance(encrypted_by_id, str):
            raise TypeError(f"encrypted_by_id must be a str or None, not {type(encrypted_by_id).__name__}")
        if isinstance(encrypted_key_metadata, str):
            raise TypeError("encrypted_key_metadata must be bytes-like, not str")
        props = None
        if properties:
            props = dict(properties)
            for k, v in props.items():
                if not isinstance(k, str) or not isinstance(v, str):
                    raise TypeError("properties must map str to str")
            props = types.MappingProxyType(props)
        object.__setattr__(self, "_key_id", key_id)
        object.__setattr__(self, "_encrypted_key_metadata", bytes(memoryview(encrypted_key_metadata)))
        object.__setattr__(self, "_encrypted_by_id", encrypted_by_id)
        object.__setattr__(self, "_properties", props)
        object.__setattr__(self, "_base64", None)  # to_json's text, made once: every commit writes every entry

    @property
    def key_id(self) -> str:
        return self._key_id

    @property
    def encrypted_key_metadata(self) -> bytes:
        """The wrapped bytes: a KMS blob for a KEK, ``nonce || ct || tag`` otherwise."""
        return self._encrypted_key_metadata

    @property
    def encrypted_by_id(self) -> str | None:
        return self._encrypted_by_id

    @property
    def properties(self) -> Mapping[str, str] | None:
        return self._properties

    @property
    def key_timestamp(self) -> str | None:
        """The ``KEY_TIMESTAMP`` property (set on KEKs only), or ``None``."""
        return None if self._properties is None else self._properties.get(KEY_TIMESTAMP)

    def replace(self, **changes: Any) -> EncryptedKey:
        """A copy with some of ``key_id``, ``encrypted_key_metadata``, ``encrypted_by_id``,
        ``properties`` changed."""
        fields = {
            "key_id": self._key_id,
            "encrypted_key_metadata": self._encrypted_key_metadata,
            "encrypted_by_id": self._encrypted_by_id,
            "properties": self._properties,
        }
        unknown = set(changes) - set(fields)
        if unknown:
            raise TypeError(f"unknown EncryptedKey fields: {', '.join(sorted(unknown))}")
        fields.update(changes)
        return EncryptedKey(**fields)

    def to_json(self) -> dict[str, Any]:
        """A JSON object with Java's field names and order; absent fields are omitted."""
        obj: dict[str, Any] = {
            "key-id": self._key_id,
            "encrypted-key-metadata": self._base64 or self._encode_base64(),
        }
        if self._encrypted_by_id is not None:
            obj["encrypted-by-id"] = self._encrypted_by_id
        if self._properties:
            obj["properties"] = dict(self._properties)
        return obj

    def _encode_base64(self) -> str:
        text = base64.b64encode(self._encrypted_key_metadata).decode("ascii")
        object.__setattr__(self, "_base64", text)
        return text

    @classmethod
    def from_json(cls, obj: Any) -> EncryptedKey:
        """Parse an ``encryption-keys`` entry; raises :class:`icecrypt.FormatError`.

        Unknown fields are ignored, as Java does.  ``encrypted-key-metadata`` is standard
        base64; missing padding is accepted (Java's decoder accepts it too).
        """
        if type(obj) is not dict and not isinstance(obj, Mapping):
            raise FormatError(f"encryption key entry must be a JSON object, not {type(obj).__name__}")
        key_id = obj.get("key-id")
        if not isinstance(key_id, str):
            raise FormatError("encryption key entry has no string 'key-id'")
        text = obj.get("encrypted-key-metadata")
        props = obj.get("properties")
        by = obj.get("encrypted-by-id")
        memo = None
        if props is None and isinstance(text, str) and (by is None or isinstance(by, str)):
            memo = (key_id, text, by)
        if memo is not None:
            hit = _PARSED.get(memo)
            if hit is not None:
                return hit
        if not isinstance(text, str):
            raise FormatError(f"encryption key {key_id!r} has no string 'encrypted-key-metadata'")
        try:
            wrapped = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
        except (binascii.Error, ValueError):
            raise FormatError(f"encryption key {key_id!r}: 'encrypted-key-metadata' is not valid base64") from None
        if by is not None and not isinstance(by, str):
            raise FormatError(f"encryption key {key_id!r}: 'encrypted-by-id' must be a string")
        if props is not None:
            if not isinstance(props, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in props.items()
            ):
                raise FormatError(f"encryption key {key_id!r}: 'properties' must map strings to strings")
        if props:
            return cls(key_id, wrapped, by, props)
        # everything is checked above: build it directly (a table holds one entry per
        # snapshot, and every commit parses them all)
        entry = object.__new__(cls)
        object.__setattr__(entry, "_key_id", key_id)
        object.__setattr__(entry, "_encrypted_key_metadata", wrapped)
        object.__setattr__(entry, "_encrypted_by_id", by)
        object.__setattr__(entry, "_properties", None)
        object.__setattr__(entry, "_base64", None)
        if memo is not None:
            if len(_PARSED) >= _PARSED_MAX:
                _PARSED.clear()
            _PARSED[memo] = entry
        return entry

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("EncryptedKey is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("EncryptedKey is immutable")

    def _astuple(self) -> tuple:
        props = None if self._properties is None else tuple(sorted(self._properties.items()))
        return (self._key_id, self._encrypted_key_metadata, self._encrypted_by_id, props)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EncryptedKey):
            return NotImplemented
        return self._astuple() == other._astuple()

    def __hash__(self) -> int:
        return hash(self._astuple())

    def __reduce__(self):
        return (EncryptedKey, (self._key_id, self._encrypted_key_metadata, self._encrypted_by_id,
                               None if self._properties is None else dict(self._properties)))

    def __repr__(self) -> str:
        parts = [f"key_id={self._key_id!r}"]
        if self._encrypted_by_id is not None:
            parts.append(f"encrypted_by_id={self._encrypted_by_id!r}")
        parts.append(f"encrypted_key_metadata=<{len(self._encrypted_key_metadata)} bytes>")
        if self._properties:
            parts.append(f"properties={dict(self._properties)!r}")
        return f"EncryptedKey({', '.join(parts)})"
