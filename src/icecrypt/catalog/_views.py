"""Views: Iceberg's view metadata (format version 1), as the catalog keeps them.

A view is a versioned SQL text and the schema of its result.  Each version is a
``<location>/metadata/<NNNNN>-<uuid>.metadata.json`` document of Iceberg's view spec::

    {"view-uuid", "format-version": 1, "location", "current-version-id",
     "versions": [{"version-id", "timestamp-ms", "schema-id", "summary",
                   "representations": [{"type": "sql", "sql", "dialect"}],
                   "default-catalog", "default-namespace"}],
     "version-log": [{"version-id", "timestamp-ms"}], "schemas": [...], "properties"}

The catalog records where the current document is, in the same row kind Iceberg Java's
JDBC catalog uses for views (``iceberg_type = 'VIEW'``), and the SHA-256 of its bytes: a
document read back must match it, or the view is refused.  Whoever can write the
warehouse's storage cannot change what a view runs; what is read from storage is input,
and a view's SQL runs with the reader's rights.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import posixpath
import time
import uuid
from collections.abc import Mapping
from typing import Any

from icecrypt.errors import CatalogError, TableIntegrityError

__all__ = ["View", "new_document", "parse_document", "replaced_document"]

FORMAT_VERSION = 1
#: documents above this size are refused before they are parsed
MAX_DOCUMENT_BYTES = 16 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class View:
    """A view as its current version defines it."""

    identifier: tuple[str, ...]
    metadata_location: str
    view_uuid: str
    location: str
    version_id: int
    sql: str
    dialect: str
    default_catalog: str | None
    default_namespace: tuple[str, ...]
    schema: Any  # pyiceberg Schema
    properties: dict[str, str]
    document: dict[str, Any] = dataclasses.field(repr=False)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _version(version_id: int, schema_id: int, sql: str, dialect: str, default_catalog: str | None,
             default_namespace: tuple[str, ...], summary: Mapping[str, str]) -> dict[str, Any]:
    version: dict[str, Any] = {
        "version-id": version_id, "timestamp-ms": _now_ms(), "schema-id": schema_id,
        "summary": {str(k): str(v) for k, v in summary.items()},
        "representations": [{"type": "sql", "sql": sql, "dialect": dialect}],
        "default-namespace": list(default_namespace),
    }  # fmt: skip
    if default_catalog is not None:
        version["default-catalog"] = default_catalog
    return version


def _schema_json(schema: Any, schema_id: int) -> dict[str, Any]:
    document = json.loads(schema.model_dump_json())
    document["schema-id"] = schema_id
    return document


def new_document(location: str, sql: str, schema: Any, *, dialect: str, default_catalog: str | None,
                 default_namespace: tuple[str, ...], properties: Mapping[str, str],
                 summary: Mapping[str, str]) -> dict[str, Any]:
    """The first version of a new view."""
    version = _version(1, 0, sql, dialect, default_catalog, default_namespace, summary)
    return {
        "view-uuid": str(uuid.uuid4()), "format-version": FORMAT_VERSION, "location": location,
        "current-version-id": 1, "versions": [version],
        "version-log": [{"version-id": 1, "timestamp-ms": version["timestamp-ms"]}],
        "schemas": [_schema_json(schema, 0)], "properties": {str(k): str(v) for k, v in properties.items()},
    }  # fmt: skip


def replaced_document(previous: dict[str, Any], sql: str, schema: Any, *, dialect: str,
                      default_catalog: str | None, default_namespace: tuple[str, ...],
                      properties: Mapping[str, str], summary: Mapping[str, str]) -> dict[str, Any]:
    """The next version of a view (CREATE OR REPLACE VIEW): its UUID, location and
    history kept, a new version with its own schema made current."""
    document = json.loads(json.dumps(previous))
    version_id = max(v["version-id"] for v in document["versions"]) + 1
    schema_id = max(s.get("schema-id", 0) for s in document["schemas"]) + 1
    version = _version(version_id, schema_id, sql, dialect, default_catalog, default_namespace, summary)
    document["versions"].append(version)
    document["schemas"].append(_schema_json(schema, schema_id))
    document["version-log"].append({"version-id": version_id, "timestamp-ms": version["timestamp-ms"]})
    document["current-version-id"] = version_id
    document["properties"] = {str(k): str(v) for k, v in properties.items()}
    return document


def metadata_location(location: str, document: Mapping[str, Any]) -> str:
    """Where a version's document goes: ``<location>/metadata/<NNNNN>-<uuid>.metadata.json``
    (NNNNN: the number of versions before it)."""
    number = len(document["versions"]) - 1
    return posixpath.join(location.rstrip("/"), "metadata", f"{number:05d}-{uuid.uuid4()}.metadata.json")


def encode(document: Mapping[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def parse_document(data: bytes, *, where: str, recorded_digest: str | None, identifier: tuple[str, ...],
                   metadata_location: str) -> View:
    """A view's current version from the bytes of its document, which must have the
    SHA-256 the catalog recorded (TableIntegrityError) and follow the view spec
    (CatalogError naming what is wrong)."""
    from pyiceberg.schema import Schema

    if recorded_digest is None:
        raise TableIntegrityError(f"{where}: the catalog holds no digest of the view's metadata file "
                                  f"{metadata_location}: it is not read")
    if len(data) > MAX_DOCUMENT_BYTES:
        raise CatalogError(f"{where}: view metadata {metadata_location} is {len(data)} bytes, above "
                           f"{MAX_DOCUMENT_BYTES}")
    if digest(data) != recorded_digest:
        raise TableIntegrityError(f"{where}: view metadata {metadata_location} is not the file the catalog "
                                  "recorded (its SHA-256 differs): it was changed in storage and is not used")
    try:
        document = json.loads(data)
        if document.get("format-version") != FORMAT_VERSION:
            raise ValueError(f"format-version {document.get('format-version')!r} (icecrypt reads views of version 1)")
        current = document["current-version-id"]
        (version,) = [v for v in document["versions"] if v["version-id"] == current]
        (schema_doc,) = [s for s in document["schemas"] if s.get("schema-id", 0) == version["schema-id"]]
        sql = [r for r in version["representations"] if r.get("type") == "sql"]
        if not sql:
            raise ValueError("the current version has no SQL representation")
        chosen = next((r for r in sql if str(r.get("dialect", "")).lower() == "spark"), sql[0])
        namespace = tuple(str(level) for level in version.get("default-namespace") or ())
        properties = {str(k): str(v) for k, v in (document.get("properties") or {}).items()}
        return View(identifier, metadata_location, str(document["view-uuid"]), str(document["location"]),
                    int(current), str(chosen["sql"]), str(chosen.get("dialect", "")),
                    version.get("default-catalog"), namespace, Schema.model_validate(schema_doc), properties,
                    document)  # fmt: skip
    except (ValueError, KeyError, TypeError) as exc:
        raise CatalogError(f"{where}: view metadata {metadata_location} is malformed: {exc}") from None
