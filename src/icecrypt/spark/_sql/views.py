"""The bridge's view methods: Spark 4's ``ViewCatalog`` over the catalog's views
(:mod:`icecrypt.catalog._views`: Iceberg's view metadata, recorded with its digest).

Spark hands a view over as its SQL text, the catalog and namespace it was created in, the
schema of its result, the column names of its query, the SQL settings it captured and its
schema binding mode; they are kept in Iceberg's view document (the SQL as the ``spark``
dialect's representation, the schema as an Iceberg schema, the rest as properties, the
column names under Iceberg Java's ``spark.query-column-names``) and handed back as they
came.  Catalogs of type glue and hadoop keep no views: there a view is never found, and
creating one is refused."""

from __future__ import annotations

import json
from typing import Any

from icecrypt.spark._sql import ddl as _ddl
from icecrypt.spark._sql import types as _types
from icecrypt.spark._sql.protocol import catalog_of, identifier, method

#: properties that carry what Spark hands over beside the SQL (not shown as the view's own)
QUERY_COLUMN_NAMES = "spark.query-column-names"  # Iceberg Java's name
SQL_CONFIGS = "spark.sql-configs"
SCHEMA_MODE = "spark.schema-mode"
_INTERNAL = (QUERY_COLUMN_NAMES, SQL_CONFIGS, SCHEMA_MODE)


def _keeps_views(catalog: Any) -> bool:
    from icecrypt.catalog._sql import SqlCatalog

    return isinstance(catalog, SqlCatalog)


def _what(catalog: Any, ident: tuple[str, ...]) -> str:
    return f"catalog {catalog.name!r}: view {'.'.join(ident)}"


@method("list_views")
def _list_views(bridge: Any, request: dict[str, Any]) -> Any:
    _, catalog = catalog_of(request)
    namespace = identifier(request["namespace"])
    if not _keeps_views(catalog):
        if not catalog.namespace_exists(namespace):
            from icecrypt.errors import NoSuchNamespaceError

            raise NoSuchNamespaceError(f"catalog {catalog.name!r}: namespace {'.'.join(namespace)} does not exist")
        return []
    return [list(v) for v in catalog.list_views(namespace)]


@method("load_view")
def _load_view(bridge: Any, request: dict[str, Any]) -> Any:
    from icecrypt.errors import NoSuchViewError

    _, catalog = catalog_of(request)
    ident = identifier(request["identifier"])
    if not _keeps_views(catalog) or len(ident) < 2:
        raise NoSuchViewError(f"{_what(catalog, ident)} does not exist")
    return describe(catalog.load_view(ident))


def describe(view: Any) -> dict[str, Any]:
    """What Spark's ``View`` is built from."""
    properties = dict(view.properties)
    names = properties.pop(QUERY_COLUMN_NAMES, None)
    configs = properties.pop(SQL_CONFIGS, None)
    mode = properties.pop(SCHEMA_MODE, None)
    return {
        "sql": view.sql,
        "current_catalog": view.default_catalog,
        "current_namespace": list(view.default_namespace),
        "schema": _types.spark_schema(view.schema),
        "query_column_names": names.split(",") if names else [],
        "sql_configs": json.loads(configs) if configs else {},
        "schema_mode": mode,
        "properties": properties,
    }


@method("create_view")
def _create_view(bridge: Any, request: dict[str, Any]) -> Any:
    _, catalog = catalog_of(request)
    ident = identifier(request["identifier"])
    if not _keeps_views(catalog):
        raise _ddl.Unsupported(f"{_what(catalog, ident)}: views are kept by catalogs of type sql only")
    schema = _types.iceberg_schema(request["schema"], _what(catalog, ident))
    properties = {str(k): str(v) for k, v in (request.get("properties") or {}).items()}
    for key in _INTERNAL:
        if key in properties:
            raise ValueError(f"{_what(catalog, ident)}: property {key} is the catalog's own")
    names = [str(n) for n in request.get("query_column_names") or []]
    if any("," in n for n in names):
        raise ValueError(f"{_what(catalog, ident)}: a column of the view's query has a comma in its name "
                         f"({', '.join(repr(n) for n in names if ',' in n)}); Iceberg keeps the names comma-separated")
    if names:
        properties[QUERY_COLUMN_NAMES] = ",".join(names)
    configs = request.get("sql_configs") or {}
    if configs:
        properties[SQL_CONFIGS] = json.dumps({str(k): str(v) for k, v in configs.items()}, sort_keys=True)
    if request.get("schema_mode"):
        properties[SCHEMA_MODE] = str(request["schema_mode"])
    summary = {"engine-name": "spark", "engine-version": str(request.get("engine_version") or "")}
    view = catalog.create_view(ident, request["sql"], schema, dialect="spark",
                               default_catalog=request.get("current_catalog"),
                               default_namespace=tuple(request.get("current_namespace") or ()),
                               properties=properties, summary=summary, replace=bool(request.get("replace")))  # fmt: skip
    return describe(view)


@method("drop_view")
def _drop_view(bridge: Any, request: dict[str, Any]) -> Any:
    from icecrypt.errors import NoSuchViewError

    _, catalog = catalog_of(request)
    ident = identifier(request["identifier"])
    if not _keeps_views(catalog) or len(ident) < 2:
        return False
    try:
        catalog.drop_view(ident)
    except NoSuchViewError:
        return False
    return True


@method("rename_view")
def _rename_view(bridge: Any, request: dict[str, Any]) -> Any:
    _, catalog = catalog_of(request)
    source, target = identifier(request["from"]), identifier(request["to"])
    if not _keeps_views(catalog):
        raise _ddl.Unsupported(f"{_what(catalog, source)}: views are kept by catalogs of type sql only")
    catalog.rename_view(source, target)
    return True
