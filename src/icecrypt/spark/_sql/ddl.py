"""What the SQL catalog's DDL does to icecrypt's catalogs and tables: namespaces, the
description of a table Spark gets (schema, partitioning, properties), ``CREATE TABLE``
(and the staged creates and replaces behind ``... AS SELECT``), ``ALTER TABLE``,
``DROP TABLE`` and ``RENAME``.

Everything goes through the public API of :mod:`icecrypt.catalog` and
:mod:`icecrypt.table` (``create_table``, ``update_schema``, ``update_spec``,
``update_properties``, ...), so the checks, pins and commit model are those of every
other writer; several changes of one statement are one commit (:mod:`.staging`).
Semantics are Iceberg's Spark catalog's: a table with ``encryption.key-id`` in its
``TBLPROPERTIES`` is encrypted under that master key; ``USING iceberg`` (or ``parquet``);
partition transforms ``identity``, ``bucket``, ``truncate``, ``years``, ``months``,
``days`` and ``hours`` with the field names Iceberg's Spark catalog gives them
(``<column>_bucket``, ``<column>_trunc``, ``<column>_year``, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    TruncateTransform,
    YearTransform,
)

from icecrypt.spark._sql import catalogs as _catalogs
from icecrypt.spark._sql import types as _types

__all__ = ["describe", "partition_spec"]

#: properties Spark adds to a CREATE that are not table properties
_SPARK_RESERVED = ("provider", "location", "external", "is_managed_location")
#: what Iceberg's Spark catalog shows, and refuses in TBLPROPERTIES
_SHOWN = ("format", "provider", "location", "current-snapshot-id", "format-version", "sort-order",
          "identifier-fields", "table_type")
_ENCRYPTION_PROPERTIES = ("encryption.key-id", "encryption.data-key-length")
PARTITION_FIELD_ID_START = 1000


class Unsupported(Exception):
    """A statement the catalog does not run (the message says which and why)."""


# --- describing a table -------------------------------------------------------------------


def _sort_order(table: Any) -> list[dict[str, Any]]:
    from icecrypt.table.files.write_data import table_sort_order

    order = table_sort_order(table.metadata)
    if order is None:
        return []
    fields = []
    for field in order.fields:
        column = table.schema.find_column_name(field.source_id)
        fields.append({"transform": _transform_name(field.transform), "param": _transform_param(field.transform),
                       "column": column.split(".") if column else None, "direction": field.direction.value,
                       "null_order": field.null_order.value})
    return fields


def _transform_name(transform: Any) -> str:
    for kind, name in ((IdentityTransform, "identity"), (BucketTransform, "bucket"), (TruncateTransform, "truncate"),
                       (YearTransform, "years"), (MonthTransform, "months"), (DayTransform, "days"),
                       (HourTransform, "hours")):
        if isinstance(transform, kind):
            return name
    return str(transform)


def _transform_param(transform: Any) -> int | None:
    if isinstance(transform, BucketTransform):
        return transform.num_buckets
    if isinstance(transform, TruncateTransform):
        return transform.width
    return None


def partitioning(table: Any) -> list[dict[str, Any]]:
    """The default spec's fields as Spark transforms (void fields left out)."""
    out = []
    for field in table.spec.fields:
        name = _transform_name(field.transform)
        if name == "void":
            continue
        column = table.schema.find_column_name(field.source_id)
        out.append({"transform": name, "param": _transform_param(field.transform),
                    "column": column.split(".") if column else None, "name": field.name})
    return out


def _describe_order(order: list[dict[str, Any]]) -> str:
    parts = []
    for f in order:
        column = ".".join(f["column"] or ["?"])
        term = column if f["transform"] == "identity" else (
            f"{f['transform']}({f['param']}, {column})" if f["param"] is not None else f"{f['transform']}({column})")
        direction = "ASC" if f["direction"] == "asc" else "DESC"
        nulls = "NULLS FIRST" if f["null_order"] == "nulls-first" else "NULLS LAST"
        parts.append(f"{term} {direction} {nulls}")
    return ", ".join(parts)


def properties(table: Any, snapshot_id: int | None) -> dict[str, str]:
    """What Spark shows as the table's properties (Iceberg's Spark table's set)."""
    own = table.properties
    shown = {
        "format": f"iceberg/{(own.get('write.format.default') or 'parquet').lower()}",
        "provider": "iceberg",
        "location": table.location,
        "current-snapshot-id": "none" if snapshot_id is None else str(snapshot_id),
        "format-version": str(table.format_version),
        "table_type": "EXTERNAL",
    }
    order = _sort_order(table)
    if order:
        shown["sort-order"] = _describe_order(order)
    identifiers = [table.schema.find_column_name(i) for i in table.schema.identifier_field_ids]
    if identifiers:
        shown["identifier-fields"] = "[" + ",".join(identifiers) + "]"
    for key, value in own.items():
        if key not in ("location", "provider"):
            shown[key] = value
    return shown


def _ref_kind(table: Any, name: str) -> str:
    ref = table.model.refs.get(name)
    if ref is None:
        refs = ", ".join(sorted(map(repr, table.model.refs))) or "none"
        raise KeyError(f"table {table.location} has no branch or tag {name!r} (its refs: {refs})")
    return ref.snapshot_ref_type.value


def selected(table: Any, selection: _catalogs.Selection) -> tuple[Any, Any, str | None]:
    """(snapshot read or None, schema read with, branch written to or None)."""
    from icecrypt.table.read.travel import resolve_read

    branch, tag = selection.branch, selection.tag
    if selection.ref is not None:
        if _ref_kind(table, selection.ref) == "branch":
            branch = selection.ref
        else:
            tag = selection.ref
    as_of = selection.as_of_ms
    snapshot, schema = resolve_read(table, snapshot_id=selection.snapshot_id, as_of_timestamp=as_of, branch=branch,
                                    tag=tag)
    return snapshot, schema, branch


def describe(catalog_name: str, table: Any, selection: _catalogs.Selection,
             wap: _catalogs.Wap | None = None) -> dict[str, Any]:
    """The description of a table (or what ``selection`` selects in it) the JVM's table
    object is built from, and the reference it hands back for its scans and writes (with
    ``wap``, the session's write-audit-publish branch or id: :func:`.catalogs.audit_publish`)."""
    name = ".".join((catalog_name, *selection.identifier))
    if selection.metadata_table is not None:
        from icecrypt.spark._schema import spark_schema

        rows = metadata_rows(table, selection)
        return {"kind": "metadata", "name": f"{name}.{selection.metadata_table}",
                "schema": spark_schema(rows.schema).jsonValue(), "ref": _ref(selection, None, None)}
    if selection.changelog:
        return _describe_changelog(name, table, selection)
    snapshot, schema, branch = selected(table, selection)
    snapshot_id = None if snapshot is None else snapshot.snapshot_id
    travel = selection.time_travel
    label = name if branch is None else f"{name}.branch_{branch}"
    ref = _ref(selection, snapshot_id, None if travel else (branch or "main"), schema.schema_id, table.spec.spec_id)
    if wap is not None and wap.branch is not None:
        ref["branch"] = wap.branch  # read main until the branch exists; the first write creates it
    if wap is not None and wap.wap_id is not None:
        ref["wap_id"] = wap.wap_id
    return {
        "kind": "table",
        "name": label,
        "schema": _types.spark_schema(schema),
        "read_schema": _types.read_schema(schema),
        "partition_type": _partition_type(table, schema),
        "partitioning": partitioning(table),
        "sort_order": _sort_order(table),
        "properties": properties(table, snapshot_id),
        "snapshot_id": snapshot_id,
        "time_travel": travel,
        "encrypted": table.encrypted,
        "ref": ref,
    }


def object_store(described: dict[str, Any], spec: dict[str, Any], table: Any,
                 selection: _catalogs.Selection) -> dict[str, Any]:
    """The description of a table on an object store (``s3://``, ...): Spark's Parquet
    reader and writer have no file system for it here, so the JVM serves it through
    icecrypt's ``icecrypt.iceberg`` data source, named by this catalog (the same catalog
    properties, pin and KMS; every key stays in the data source's Python), with the
    selected snapshot, branch or tag as the source's options.  Reads and appends
    (``INSERT INTO``, ``INSERT OVERWRITE`` of the whole table, CTAS: ``write._stage``) work,
    ``DELETE FROM`` by a row filter (the driver's, as for every table), and the other
    row-level statements as copy-on-write rewrites through the source (the JVM's
    ``SourceRewrite``: option ``icecrypt.rewrite`` of :mod:`icecrypt.spark._iceberg`)."""
    from icecrypt.spark import _iceberg as ib
    from icecrypt.spark._common import ENCRYPTION_NONE, OPT_ENCRYPTION

    if selection.changelog:
        raise Unsupported(f"{described['name']}: the changelog of a table on an object store is not served in SQL "
                          "(read it with icecrypt.iceberg's option changelog=true)")
    options = {"path": ".".join(selection.identifier), ib.OPT_CATALOG: spec["name"]}
    for key, value in (spec.get("options") or {}).items():
        options[ib._CATALOG_PREFIX + str(key)] = str(value)  # the catalog, as the driver opens it
        if str(key) not in ib._OWN_OPTIONS:  # and its KMS and storage properties, as the source takes them
            options[str(key)] = str(value)
    branch, tag = selection.branch, selection.tag
    if selection.ref is not None:
        branch, tag = (selection.ref, None) if _ref_kind(table, selection.ref) == "branch" else (None, selection.ref)
    for option, value in ((ib.OPT_SNAPSHOT_ID, selection.snapshot_id), (ib.OPT_AS_OF_TIMESTAMP, selection.as_of_ms),
                          (ib.OPT_BRANCH, branch), (ib.OPT_TAG, tag)):
        if value is not None:
            options[option] = str(value)
    if not described["encrypted"]:  # the catalog's (pinned) view of the table: the source takes it as plaintext
        options[OPT_ENCRYPTION] = ENCRYPTION_NONE
    if described["ref"].get("wap_id") is not None:
        options[ib.OPT_WAP_ID] = described["ref"]["wap_id"]
    if branch is None and described["ref"].get("branch") not in (None, "main"):
        options[ib.OPT_BRANCH] = described["ref"]["branch"]  # spark.wap.branch
    return {"kind": "source", "source": ib.NAME, "name": described["name"], "schema": described["schema"],
            "properties": described["properties"], "partitioning": described["partitioning"],
            "time_travel": described["time_travel"], "ref": described["ref"], "options": options}


def _describe_changelog(name: str, table: Any, selection: _catalogs.Selection) -> dict[str, Any]:
    """``db.t.changes``: the table's current columns and Iceberg's three change columns,
    read-only; its scans plan a changelog (``.scan.plan_changelog``)."""
    from icecrypt.table.read.incremental import CHANGE_COLUMNS

    schema = table.schema
    clash = [f.name for f in schema.fields if f.name.lower() in {c.lower() for c in CHANGE_COLUMNS}]
    if clash:
        raise Unsupported(f"{name}.{_catalogs.CHANGES}: the table's column {clash[0]!r} has the name of a changelog "
                          "column")
    spark = _types.spark_schema(schema)
    spark["fields"] = [*spark["fields"],
                       {"name": CHANGE_COLUMNS[0], "type": "string", "nullable": False, "metadata": {}},
                       {"name": CHANGE_COLUMNS[1], "type": "integer", "nullable": False, "metadata": {}},
                       {"name": CHANGE_COLUMNS[2], "type": "long", "nullable": False, "metadata": {}}]
    ref = _ref(selection, table.current_snapshot_id, None, schema.schema_id, table.spec.spec_id)
    ref["changelog"] = True
    return {
        "kind": "table",
        "changelog": True,
        "name": f"{name}.{_catalogs.CHANGES}",
        "schema": spark,
        "read_schema": _types.read_schema(schema),
        "partition_type": None,
        "partitioning": [],
        "sort_order": [],
        "properties": properties(table, table.current_snapshot_id),
        "snapshot_id": table.current_snapshot_id,
        "time_travel": False,
        "encrypted": table.encrypted,
        "ref": ref,
    }


def _partition_type(table: Any, schema: Any) -> dict[str, Any] | None:
    """The Spark type of the ``_partition`` metadata column (every spec's partition fields,
    all nullable), or None when a field's type has no Spark twin the scan can give."""
    from icecrypt.spark._sql.scan import partition_encodable
    from icecrypt.table.model.metadata_columns import partition_type

    struct = partition_type(table.specs, schema)
    if not all(partition_encodable(f.field_type) for f in struct.fields):
        return None
    return _types.spark_type(struct, ids=False)[0]


def _ref(selection: _catalogs.Selection, snapshot_id: int | None, branch: str | None, schema_id: int | None = None,
         spec_id: int | None = None) -> dict[str, Any]:
    return {"identifier": list(selection.identifier), "metadata_table": selection.metadata_table,
            "snapshot_id": snapshot_id, "branch": branch, "schema_id": schema_id, "spec_id": spec_id}


def metadata_rows(table: Any, selection: _catalogs.Selection) -> Any:
    """The rows of the metadata table ``selection`` names (an Arrow table; key metadata
    as fingerprints, never bytes)."""
    snapshot_id = None
    if selection.time_travel:
        snapshot, _, _ = selected(table, selection)
        snapshot_id = None if snapshot is None else snapshot.snapshot_id
    if snapshot_id is not None:
        from icecrypt.table.read.inspect import _SNAPSHOT_TABLES

        if selection.metadata_table not in _SNAPSHOT_TABLES:
            raise ValueError(f"metadata table {selection.metadata_table!r} shows the whole table: it takes no "
                             "VERSION or TIMESTAMP AS OF")
    return table.inspect.table(selection.metadata_table, snapshot_id=snapshot_id)


# --- partition specs --------------------------------------------------------------------------


def _argument_column(arg: Mapping[str, Any], what: str) -> str:
    if "ref" not in arg:
        raise ValueError(f"{what}: expected a column, not {arg.get('lit')!r}")
    return ".".join(arg["ref"])


def _argument_int(arg: Mapping[str, Any], what: str) -> int:
    value = arg.get("lit")
    if "ref" in arg or not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{what}: expected a positive integer, not {value!r}")
    return value


_TIME = {"years": (YearTransform, "year"), "year": (YearTransform, "year"), "months": (MonthTransform, "month"),
         "month": (MonthTransform, "month"), "days": (DayTransform, "day"), "day": (DayTransform, "day"),
         "date": (DayTransform, "day"), "hours": (HourTransform, "hour"), "hour": (HourTransform, "hour"),
         "date_hour": (HourTransform, "hour")}


def _transform(entry: Mapping[str, Any]) -> tuple[str, Any, str]:
    """(source column, transform, partition field name) of a Spark transform, named as
    Iceberg's Spark catalog names partition fields."""
    name = str(entry.get("name", "")).lower()
    args = list(entry.get("args") or ())
    shown = f"{name}({', '.join(str(a.get('lit', '.'.join(a.get('ref') or ()))) for a in args)})"
    if name == "identity" and len(args) == 1:
        column = _argument_column(args[0], shown)
        return column, IdentityTransform(), column
    if name in _TIME and len(args) == 1:
        column = _argument_column(args[0], shown)
        kind, suffix = _TIME[name]
        return column, kind(), f"{column}_{suffix}"
    if name == "bucket" and len(args) == 2:
        if "ref" in args[0]:
            args.reverse()
        column = _argument_column(args[1], shown)
        return column, BucketTransform(_argument_int(args[0], shown)), f"{column}_bucket"
    if name == "bucket":
        raise ValueError(f"partition transform {shown}: icecrypt buckets one column (bucket(N, column))")
    if name == "truncate" and len(args) == 2:
        if "ref" in args[0]:
            args.reverse()
        column = _argument_column(args[1], shown)
        return column, TruncateTransform(_argument_int(args[0], shown)), f"{column}_trunc"
    raise ValueError(f"unsupported partition transform {shown} (identity, bucket(N, c), truncate(W, c), years, months, "
                     "days and hours are)")


def partition_spec(schema: Any, transforms: list[Mapping[str, Any]]) -> PartitionSpec:
    """The partition spec of ``PARTITIONED BY`` (Spark's transforms) over ``schema``."""
    fields = []
    names: set[str] = set()
    for index, entry in enumerate(transforms):
        column, transform, name = _transform(entry)
        try:
            source = schema.find_field(column)
        except ValueError:
            raise ValueError(f"cannot partition by {column!r}: no such column") from None
        if not transform.can_transform(source.field_type):
            raise ValueError(f"cannot partition by {_transform_name(transform)}({column}): it does not apply to "
                             f"{source.field_type} values")
        if name in names:
            raise ValueError(f"partition field {name!r} is given twice")
        names.add(name)
        fields.append(PartitionField(source.field_id, PARTITION_FIELD_ID_START + index, transform, name))
    return PartitionSpec(*fields, spec_id=0)


# --- CREATE TABLE ----------------------------------------------------------------------------


def create_properties(given: Mapping[str, str], what: str) -> tuple[dict[str, str], str | None, str | None]:
    """(the table properties of a CREATE, its master key id or None, its location or
    None), Iceberg's Spark catalog's rules plus icecrypt's: format-version 3 only, the
    encryption properties icecrypt knows only."""
    properties = {str(k): str(v) for k, v in given.items()}
    provider = properties.pop("provider", None)
    if provider is not None and provider.lower() not in ("iceberg", "parquet"):
        raise ValueError(f"{what}: USING {provider} is not supported: the catalog's tables are Iceberg tables with "
                         "Parquet data files (USING iceberg)")
    location = properties.pop("location", None)
    for key in ("external", "is_managed_location"):
        properties.pop(key, None)
    # what SHOW CREATE TABLE shows beside the table's own properties
    if properties.get("format", "iceberg/parquet").lower() == "iceberg/parquet":
        properties.pop("format", None)
    properties.pop("current-snapshot-id", None)
    version = properties.pop("format-version", None)
    if version is not None and version.strip() != "3":
        raise ValueError(f"{what}: format-version {version}: icecrypt creates format-version 3 tables")
    for key in _SHOWN:
        if key in properties:
            raise ValueError(f"{what}: {key!r} is reserved (table metadata, not a property)")
    for key in properties:
        if key.startswith("encryption.") and key not in _ENCRYPTION_PROPERTIES:
            raise ValueError(f"{what}: unknown encryption property {key!r} (known: {', '.join(_ENCRYPTION_PROPERTIES)})")
    key_id = (properties.get("encryption.key-id") or "").strip() or None
    if "encryption.key-id" in properties and key_id is None:
        raise ValueError(f"{what}: encryption.key-id is empty")
    if (properties.get("write.format.default") or "parquet").strip().lower() != "parquet":
        raise ValueError(f"{what}: write.format.default={properties['write.format.default']}: the catalog writes "
                         "Parquet data files")
    return properties, key_id, location


def create_table(catalog: Any, catalog_name: str, identifier: tuple[str, ...], schema_json: Mapping[str, Any],
                 transforms: list[Mapping[str, Any]], given: Mapping[str, str]) -> dict[str, Any]:
    what = _catalogs.describe_identifier(catalog, identifier)
    schema = _types.iceberg_schema(schema_json, what)
    spec = partition_spec(schema, transforms)
    props, key_id, location = create_properties(given, what)
    if key_id is not None and catalog.kms is None:
        raise ValueError(f"{what}: encryption.key-id={key_id}: the catalog has no KMS (its encryption.kms-type "
                         "and encryption.kms.* options)")
    catalog.create_table(identifier, schema, table_key_id=key_id, partition_spec=spec, properties=props,
                         location=location)
    table = catalog.load_table(identifier)
    return describe(catalog_name, table, _catalogs.Selection(tuple(identifier)))


# --- namespaces ------------------------------------------------------------------------------


def list_namespaces(catalog: Any, parent: tuple[str, ...]) -> list[list[str]]:
    """The namespaces directly under ``parent`` (the top-level ones for ``()``)."""
    if parent and not catalog.namespace_exists(parent):
        from icecrypt.errors import NoSuchNamespaceError

        raise NoSuchNamespaceError(f"catalog {catalog.name!r}: namespace {'.'.join(parent)} does not exist")
    children = set()
    for namespace in catalog.list_namespaces():
        namespace = tuple(namespace)
        if len(namespace) > len(parent) and namespace[:len(parent)] == parent:
            children.add(namespace[:len(parent) + 1])
    return [list(n) for n in sorted(children)]


def drop_namespace(catalog: Any, namespace: tuple[str, ...], cascade: bool) -> bool:
    from icecrypt.errors import NoSuchNamespaceError

    if not catalog.namespace_exists(namespace):
        raise NoSuchNamespaceError(f"catalog {catalog.name!r}: namespace {'.'.join(namespace)} does not exist")
    if cascade:
        for child in list_namespaces(catalog, namespace):
            drop_namespace(catalog, tuple(child), True)
        for identifier in catalog.list_tables(namespace):
            catalog.drop_table(tuple(identifier))
    catalog.drop_namespace(namespace)
    return True
