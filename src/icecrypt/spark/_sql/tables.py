"""The bridge's catalog methods: namespaces, loading, creating, altering, dropping and
renaming tables, and metadata tables' rows (see :mod:`.bridge` for the protocol and
:mod:`.ddl` for the semantics)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from icecrypt.spark._sql import catalogs as _catalogs
from icecrypt.spark._sql import ddl as _ddl
from icecrypt.spark._sql import types as _types
from icecrypt.spark._sql.protocol import catalog_of, identifier, method
from icecrypt.spark._sql.staging import Transaction


def _load(catalog: Any, ident: tuple[str, ...]) -> Any:
    return catalog.load_table(ident)


# --- namespaces -------------------------------------------------------------------------------


@method("list_namespaces")
def _list_namespaces(bridge: Any, request: dict[str, Any]) -> Any:
    _, catalog = catalog_of(request)
    return _ddl.list_namespaces(catalog, identifier(request.get("parent") or ()))


@method("namespace_exists")
def _namespace_exists(bridge: Any, request: dict[str, Any]) -> Any:
    _, catalog = catalog_of(request)
    namespace = identifier(request["namespace"])
    return bool(namespace) and catalog.namespace_exists(namespace)


@method("namespace_metadata")
def _namespace_metadata(bridge: Any, request: dict[str, Any]) -> Any:
    from icecrypt.errors import NoSuchNamespaceError

    _, catalog = catalog_of(request)
    namespace = identifier(request["namespace"])
    if not namespace:
        raise NoSuchNamespaceError(f"catalog {catalog.name!r}: the catalog's root is not a namespace")
    return catalog.namespace_properties(namespace)  # NoSuchNamespaceError when it does not exist


@method("alter_namespace")
def _alter_namespace(bridge: Any, request: dict[str, Any]) -> Any:
    """ALTER NAMESPACE ... SET / UNSET PROPERTIES (and SET LOCATION): one update."""
    _, catalog = catalog_of(request)
    catalog.update_namespace_properties(identifier(request["namespace"]), request.get("remove") or [],
                                        request.get("set") or {})
    return True


@method("create_namespace")
def _create_namespace(bridge: Any, request: dict[str, Any]) -> Any:
    _, catalog = catalog_of(request)
    properties = {k: v for k, v in (request.get("properties") or {}).items() if k not in ("owner",)}
    catalog.create_namespace(identifier(request["namespace"]), properties or None)
    return True


@method("drop_namespace")
def _drop_namespace(bridge: Any, request: dict[str, Any]) -> Any:
    _, catalog = catalog_of(request)
    return _ddl.drop_namespace(catalog, identifier(request["namespace"]), bool(request.get("cascade")))


# --- tables -----------------------------------------------------------------------------------


@method("list_tables")
def _list_tables(bridge: Any, request: dict[str, Any]) -> Any:
    _, catalog = catalog_of(request)
    return [list(t) for t in catalog.list_tables(identifier(request["namespace"]))]


@method("load_table")
def _load_table(bridge: Any, request: dict[str, Any]) -> Any:
    name, catalog = catalog_of(request)
    timestamp = request.get("timestamp")
    selection = _catalogs.resolve(catalog, identifier(request["identifier"]), request.get("version"),
                                  None if timestamp is None else int(timestamp))
    table = _load(catalog, selection.identifier)
    selection, wap = _catalogs.audit_publish(table, selection, request.get("wap_branch"), request.get("wap_id"))
    described = _ddl.describe(name, table, selection, wap=wap)
    if described["kind"] == "table" and not _catalogs.on_local_files(table):
        return _ddl.object_store(described, request["catalog"], table, selection)
    return described


@method("create_table")
def _create_table(bridge: Any, request: dict[str, Any]) -> Any:
    name, catalog = catalog_of(request)
    return _ddl.create_table(catalog, name, identifier(request["identifier"]), request["schema"],
                             request.get("transforms") or [], request.get("properties") or {})


@method("drop_table")
def _drop_table(bridge: Any, request: dict[str, Any]) -> Any:
    from icecrypt.errors import NoSuchTableError

    _, catalog = catalog_of(request)
    try:
        catalog.drop_table(identifier(request["identifier"]), purge=bool(request.get("purge")))
    except NoSuchTableError:
        return False
    return True


@method("rename_table")
def _rename_table(bridge: Any, request: dict[str, Any]) -> Any:
    _, catalog = catalog_of(request)
    source, target = identifier(request["from"]), identifier(request["to"])
    rename = getattr(catalog, "rename_table", None)
    if rename is None:
        raise _ddl.Unsupported(f"catalog {catalog.name!r}: renaming tables is not supported by this catalog")
    rename(source, target)
    return True


@method("alter_table")
def _alter_table(bridge: Any, request: dict[str, Any]) -> Any:
    name, catalog = catalog_of(request)
    ident = identifier(request["identifier"])
    table = _load(catalog, ident)
    transaction = Transaction.on(catalog, ident, table)
    try:
        _apply_changes(transaction.table, request.get("changes") or [], _catalogs.describe_identifier(catalog, ident))
        transaction.publish()
    except BaseException:
        transaction.discard()
        raise
    return _ddl.describe(name, _load(catalog, ident), _catalogs.Selection(ident))


# --- ALTER TABLE ------------------------------------------------------------------------------


def _position(update: Any, path: list[str], position: dict[str, Any] | None) -> None:
    if not position:
        return
    if position.get("first"):
        update.move_first(tuple(path))
    else:
        update.move_after(tuple(path), (*path[:-1], position["after"]))


def _apply_changes(table: Any, changes: list[dict[str, Any]], what: str) -> None:
    """Apply Spark's table changes to ``table`` (a transaction's): properties in one
    update, columns in one schema update, snapshot selection as Iceberg's Spark catalog
    takes it (``current-snapshot-id``, ``cherry-pick-snapshot-id``)."""
    properties = [c for c in changes if c["op"] in ("set_property", "remove_property")]
    columns = [c for c in changes if c["op"] not in ("set_property", "remove_property")]
    current = cherry = None
    pending: list[dict[str, Any]] = []
    for change in properties:
        key = change["key"]
        if change["op"] == "set_property" and key in ("current-snapshot-id", "cherry-pick-snapshot-id"):
            try:
                value = int(change["value"])
            except ValueError:
                raise ValueError(f"{what}: {key}={change['value']!r} is not a snapshot id") from None
            if key == "current-snapshot-id":
                current = value
            else:
                cherry = value
            continue
        if key == "location":
            raise _ddl.Unsupported(f"{what}: SET LOCATION is not supported (icecrypt pins a table's location)")
        if key in ("sort-order", "identifier-fields"):
            raise ValueError(f"{what}: {key!r} is a reserved property (not settable by SET TBLPROPERTIES)")
        if key == "format-version":
            if change["op"] == "set_property" and str(change.get("value")).strip() == str(table.format_version):
                continue
            raise ValueError(f"{what}: format-version cannot be changed (icecrypt keeps tables at format-version 3)")
        if key in ("provider", "format", "table_type"):
            raise ValueError(f"{what}: {key!r} is reserved (table metadata, not a property)")
        pending.append(change)
    if current is not None and cherry is not None:
        raise ValueError(f"{what}: current-snapshot-id and cherry-pick-snapshot-id cannot be set together")
    if columns:
        _apply_columns(table, columns, what)
    if pending:
        update = table.update_properties()
        try:
            for change in pending:
                if change["op"] == "set_property":
                    update.set(change["key"], str(change["value"]))
                else:
                    update.remove(change["key"])
        except ValueError as exc:
            raise ValueError(f"{what}: {exc}") from None
        update.commit()
    if current is not None or cherry is not None:
        with table.manage_snapshots() as manage:
            if current is not None:
                manage.set_current_snapshot(current)
            else:
                manage.cherry_pick(cherry)


def _default_value(change: Mapping[str, Any], field_type: Any, what: str) -> Any:
    """The value of a column DEFAULT of type ``field_type`` (an Iceberg type): the literal
    Spark folded it to, or, when Spark sent only its SQL (ALTER COLUMN ... SET DEFAULT),
    that SQL evaluated here (Spark checked it is a constant); None for DEFAULT NULL."""
    from icecrypt.spark._sql.filters import literal_value

    node = change.get("default_value") or {}
    if "lit" in node:
        return literal_value(node)
    sql = node.get("unsupported") or change.get("default")
    shown, why = _types.spark_type(field_type, ids=False)
    if sql and why is None and field_type.is_primitive:
        from pyspark.sql import SparkSession
        from pyspark.sql.types import _parse_datatype_json_value

        from icecrypt.table.files.manifest_write import to_internal

        spark = SparkSession.getActiveSession()
        if spark is not None:
            ddl = _parse_datatype_json_value(shown).simpleString()
            value = spark.sql(f"SELECT CAST(({sql}) AS {ddl}) AS v").collect()[0][0]
            return to_internal(value, field_type)
    raise _ddl.Unsupported(f"{what}: DEFAULT {sql} is not a value icecrypt can keep as a column default (a boolean, "
                           "number, string, date, timestamp, binary or decimal literal)")


def _apply_columns(table: Any, changes: list[dict[str, Any]], what: str) -> None:
    update = table.update_schema()
    try:
        for change in changes:
            op, path = change["op"], list(change.get("path") or [])
            shown = ".".join(path)
            if op == "add_column":
                field_type = _types.iceberg_type(change["type"], f"{what}: column {shown}")
                default = None
                if change.get("default") is not None:
                    default = _default_value(change, field_type, f"{what}: ADD COLUMN {shown}")
                update.add_column(tuple(path), field_type, doc=change.get("comment"),
                                  required=not change.get("nullable", True), default_value=default)
                _position(update, path, change.get("position"))
            elif op == "update_default":
                value = None
                if change.get("default_value") is not None:
                    field_type = table.schema.find_field(".".join(path)).field_type
                    value = _default_value(change, field_type, f"{what}: ALTER COLUMN {shown} SET DEFAULT")
                update.update_default(tuple(path), value)
            elif op == "rename_column":
                update.rename_column(tuple(path), change["new_name"])
            elif op == "update_type":
                update.update_column(tuple(path), field_type=_types.iceberg_type(change["type"],
                                                                                 f"{what}: column {shown}"))
            elif op == "update_nullability":
                if not change["nullable"]:
                    raise ValueError(f"cannot make column {shown!r} NOT NULL: rows written before may hold nulls")
                update.make_column_optional(tuple(path))
            elif op == "update_comment":
                update.update_column(tuple(path), doc=change.get("comment") or "")
            elif op == "update_position":
                _position(update, path, change.get("position"))
            elif op == "delete_column":
                try:
                    update.delete_column(tuple(path))
                except ValueError:
                    if change.get("if_exists") and not _has_column(table, path):
                        continue
                    raise
            else:
                raise _ddl.Unsupported(f"{what}: {change.get('shown') or op} is not supported")
    except ValueError as exc:
        if str(exc).startswith(what):
            raise
        raise ValueError(f"{what}: {exc}") from None
    update.commit()


def _has_column(table: Any, path: list[str]) -> bool:
    try:
        table.schema.find_field(".".join(path))
    except ValueError:
        return False
    return True


# --- metadata tables --------------------------------------------------------------------------


@method("dataset:metadata")
def _metadata_dataset(bridge: Any, request: dict[str, Any]) -> Any:
    """The rows of a metadata table as a JVM Dataset with the described schema."""
    from pyspark.sql.types import StructType

    from icecrypt.spark._schema import Projection, spark_schema

    _, catalog = catalog_of(request)
    ref = request["ref"]
    timestamp = request.get("timestamp")
    selection = _catalogs.resolve(catalog, identifier(ref["identifier"]) + (ref["metadata_table"],),
                                  request.get("version"), None if timestamp is None else int(timestamp))
    table = _load(catalog, selection.identifier)
    rows = _ddl.metadata_rows(table, selection)
    schema = StructType.fromJson(request["schema"]) if request.get("schema") else spark_schema(rows.schema)
    batches = [Projection(rows.schema, schema, f"metadata table {selection.metadata_table}").apply(b)
               for b in rows.to_batches()]
    import pyarrow as pa

    projected = pa.Table.from_batches(batches, schema=batches[0].schema) if batches else None
    if projected is None:
        frame = bridge.spark.createDataFrame([], schema)
    else:
        frame = bridge.spark.createDataFrame(projected, schema=schema)
    return frame._jdf
