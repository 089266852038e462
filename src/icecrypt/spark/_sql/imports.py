"""The files an import procedure (``add_files``, ``migrate``) takes from its source: a
directory of Parquet files (```parquet`.`<dir>```) or a Parquet table of Spark's session
catalog, each file with its Hive-style partition values (``col=value`` directories); and
``migrate`` itself.

Only the directory is listed (``icecrypt.table.ops.add_files.list_files``), through the
Iceberg table's own filesystem, and only under the table's directories (a table reads
nothing else).  Nothing here reads a file's contents: ``EncryptedTable.add_files`` checks
each footer.
"""

from __future__ import annotations

import contextlib
import json
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs

from icecrypt.spark._sql.catalogs import PathCatalog, describe_identifier, parse_identifier
from icecrypt.table.ops.add_files import SourceFile, list_files

__all__ = ["SessionTable", "migrate", "session_table", "source_files"]

_FORMATS = ("parquet", "orc", "avro", "csv", "json", "text", "delta", "iceberg")


@dataclass(frozen=True)
class SessionTable:
    """What Spark's session catalog says of a table: its location (as a URI), whether
    Spark owns its directory (MANAGED), its partition columns, its Spark schema."""

    name: str  # spark_catalog.db.t, quoted
    location: str
    managed: bool
    partition_columns: tuple[str, ...]
    schema: Any  # pyspark StructType
    partitions: frozenset[str] | None  # the partitions the catalog registers ('a=1/b=x'); None: unpartitioned


def _quoted(parts: tuple[str, ...]) -> str:
    return ".".join("`" + p.replace("`", "``") + "`" for p in parts)


def session_table(spark: Any, ident: tuple[str, ...]) -> SessionTable:
    """A Parquet table of Spark's session catalog (``db.t`` or ``spark_catalog.db.t``)."""
    if len(ident) == 3 and ident[0].lower() == "spark_catalog":
        ident = ident[1:]
    if len(ident) != 2:
        raise ValueError(f"{'.'.join(ident)}: a table of Spark's session catalog is named db.t")
    name = "spark_catalog." + _quoted(ident)
    if not spark.catalog.tableExists(name):
        raise ValueError(f"{'.'.join(ident)}: no such table in Spark's session catalog")
    details: dict[str, str] = {}
    partitions: list[str] = []
    section = None
    for row in spark.sql(f"DESCRIBE TABLE EXTENDED {name}").collect():
        key, value = (row[0] or "").strip(), (row[1] or "").strip()
        if key == "# col_name":  # the header of the partition columns
            continue
        if key.startswith("# "):
            section = key
            continue
        if not key:
            section = None if section == "# Partition Information" else section
            continue
        if section == "# Partition Information":
            partitions.append(key)
        elif section == "# Detailed Table Information":
            details[key] = value
    provider = details.get("Provider", "").lower()
    parquet = provider == "parquet" or (provider == "hive" and "parquet" in details.get("InputFormat", "").lower())
    if not parquet:
        raise ValueError(f"{'.'.join(ident)}: a {provider or 'non-file'} table; only Parquet tables can be imported")
    if details.get("Type", "").upper() == "VIEW" or not details.get("Location"):
        raise ValueError(f"{'.'.join(ident)}: has no location of files to import")
    registered = frozenset(r[0] for r in spark.sql(f"SHOW PARTITIONS {name}").collect()) if partitions else None
    return SessionTable(name, details["Location"], details.get("Type", "").upper() == "MANAGED", tuple(partitions),
                        spark.table(name).schema, registered)


def source_files(spark: Any, table: Any, source: Any, partition_filter: Mapping[str, str] | None) -> list[SourceFile]:
    """The files ``source`` (the procedure's ``source_table``) names, filtered by
    ``partition_filter`` (partition column -> value)."""
    if not isinstance(source, str) or not source.strip():
        raise ValueError("argument source_table: `parquet`.`<directory>` or a table (db.t) is required")
    ident = parse_identifier(source)
    if len(ident) == 2 and ident[0].lower() in _FORMATS:
        if ident[0].lower() != "parquet":
            raise ValueError(f"source_table {source}: only Parquet files can be added, not {ident[0]}")
        return list_files(table.filesystem, table.fs_path(ident[1].rstrip("/"), what="add_files source directory"),
                          ident[1], None, partition_filter)
    found = session_table(spark, ident)
    return list_files(table.filesystem, table.fs_path(found.location, what="add_files source directory"),
                      found.location, found.partition_columns, partition_filter, found.partitions)


def migrate(spark: Any, catalog: Any, identifier: tuple[str, ...], properties: dict[str, str], *,
            drop_backup: bool, backup_name: str | None) -> int:
    """Iceberg's ``migrate`` across catalogs: the Parquet table ``identifier`` of Spark's
    session catalog becomes the Iceberg table ``identifier`` of ``catalog``, at the same
    location, its files added as they are (:func:`source_files` of the table); returns
    how many.  The table is created with the source's schema, identity partitions on
    its partition columns, and ``properties``; it is plaintext (its files are).

    The source stays in Spark's session catalog, as it was (another catalog: no name
    clash, the backup Iceberg keeps), unless ``backup_name`` renames it or
    ``drop_backup`` drops it; both only for an external table, whose rename and drop
    leave its files where they are (a managed table's would move or delete the files the
    new table holds: refused, before anything is done).  If the import fails, the new
    table is dropped and its metadata directory removed: the source is as it was."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform

    from icecrypt.spark._sql import ddl as _ddl
    from icecrypt.spark._sql import types as _types
    from icecrypt.table.files.io import Locations

    what = describe_identifier(catalog, identifier)
    source = session_table(spark, identifier)
    if properties.get("encryption.key-id"):
        raise ValueError(f"{what}: encryption.key-id: migrate keeps the source's files as they are, in plaintext, so "
                         "the table cannot be encrypted (CREATE TABLE ... AS SELECT writes an encrypted copy)")
    if drop_backup and backup_name:
        raise ValueError(f"{what}: drop_backup and backup_table_name: the source is either dropped or renamed")
    backup = None
    if drop_backup or backup_name:
        if source.managed:
            raise ValueError(f"{what}: {source.name} is a managed table of Spark's session catalog: renaming or dropping "
                             "it would move or delete the files the migrated table holds (migrate it without "
                             "drop_backup and backup_table_name; it then stays as it was)")
        if backup_name:
            backup = parse_identifier(backup_name)
            backup = backup[1:] if len(backup) == 3 and backup[0].lower() == "spark_catalog" else backup
            if len(backup) != 2 or spark.catalog.tableExists("spark_catalog." + _quoted(backup)):
                raise ValueError(f"{what}: backup_table_name {backup_name!r} must name a new table (db.t) of Spark's "
                                 "session catalog")
    if isinstance(catalog, PathCatalog):  # whose drop (the rollback) removes the table's whole directory
        raise ValueError(f"{what}: a catalog of path tables keeps each table in its own directory; migrate needs one "
                         "that can create a table at the source's location (type sql or glue)")
    schema = _types.iceberg_schema(json.loads(source.schema.json()), what)
    spec = PartitionSpec(*(PartitionField(schema.find_field(c).field_id, 1000 + i, IdentityTransform(), c)
                           for i, c in enumerate(source.partition_columns)), spec_id=0)
    props, _, _ = _ddl.create_properties(properties, what)
    location = source.location.rstrip("/")
    fs = catalog.filesystem_for(location)
    root = Locations(fs).normalized_fs_path(location)  # the session catalog's word, as the caller's
    metadata_dir = posixpath.join(root, "metadata")
    if fs.get_file_info(metadata_dir).type != pafs.FileType.NotFound:
        raise ValueError(f"{what}: {location}/metadata already exists (an Iceberg table's?): nothing was migrated")
    files = list_files(fs, root, location, source.partition_columns, None, source.partitions)
    catalog.create_table(identifier, schema, table_key_id=None, partition_spec=spec, properties=props,
                         location=location)
    try:
        table = catalog.load_table(identifier)
        added = table.add_files([f.location for f in files],
                                partition_values={f.location: f.partition for f in files if f.partition}).added_files
    except BaseException:
        with contextlib.suppress(Exception):
            catalog.drop_table(identifier)
        with contextlib.suppress(Exception):
            fs.delete_dir(metadata_dir)
        raise
    try:
        if drop_backup:
            spark.sql(f"DROP TABLE {source.name}")
        elif backup is not None:
            spark.sql(f"ALTER TABLE {source.name} RENAME TO {_quoted(backup)}")
    except Exception as exc:
        raise RuntimeError(f"{what}: the table was migrated ({added} files), but {source.name} could not be "
                           f"{'dropped' if drop_backup else 'renamed'}: {exc}") from exc
    return added

