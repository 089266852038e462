"""Iceberg catalogs for encrypted tables: tables by identifier, commits by compare-and-swap.

::

    from icecrypt.catalog import load_catalog
    catalog = load_catalog("local", warehouse="/data/warehouse", kms=kms)   # SQLite, embedded
    catalog.create_namespace("db")
    table = catalog.create_table("db.events", schema, table_key_id="keyA")
    table.append(rows)                       # commits through the catalog
    catalog.load_table("db.events").scan().to_arrow()

``type`` selects the backend: ``sql`` (the default: SQLite or PostgreSQL, in the JDBC
catalog's tables that Iceberg Java and PyIceberg share) or ``glue`` (AWS Glue).
Properties take PyIceberg's names plus Iceberg Java's KMS properties
(``encryption.kms-type``, ...); ``kms=`` passes a KMS client directly.
"""

from __future__ import annotations

from typing import Any

from icecrypt.catalog._base import Catalog
from icecrypt.errors import (
    CatalogError,
    InvalidIdentifierError,
    NamespaceAlreadyExistsError,
    NamespaceNotEmptyError,
    NoSuchNamespaceError,
    NoSuchTableError,
    TableAlreadyExistsError,
)

__all__ = [
    "Catalog",
    "CatalogError",
    "GlueCatalog",
    "InvalidIdentifierError",
    "NamespaceAlreadyExistsError",
    "NamespaceNotEmptyError",
    "NoSuchNamespaceError",
    "NoSuchTableError",
    "SqlCatalog",
    "TableAlreadyExistsError",
    "load_catalog",
]

CATALOG_TYPES = {
    "sql": ("icecrypt.catalog._sql", "SqlCatalog"),
    "glue": ("icecrypt.catalog._glue", "GlueCatalog"),
}


def load_catalog(name: str, *, kms: Any = None, **properties: str) -> Catalog:
    """The catalog ``name`` of type ``properties["type"]`` (``sql`` when missing, or
    ``glue``), configured by ``properties`` (PyIceberg's names: ``uri``, ``warehouse``,
    ``s3.endpoint``, ...; KMS: ``encryption.kms-type``, ...) or ``kms=``."""
    import importlib

    kind = str(properties.get("type") or "sql").strip().lower()
    if kind not in CATALOG_TYPES:
        raise CatalogError(f"catalog {name!r}: unknown type {kind!r} (known: {', '.join(sorted(CATALOG_TYPES))})")
    module, cls_name = CATALOG_TYPES[kind]
    cls = getattr(importlib.import_module(module), cls_name)
    return cls(name, kms=kms, **properties)


def __getattr__(attr: str) -> Any:
    # the backends import their drivers' packages (SQLAlchemy, boto3) only when used
    for module, cls_name in CATALOG_TYPES.values():
        if attr == cls_name:
            import importlib

            return getattr(importlib.import_module(module), cls_name)
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
