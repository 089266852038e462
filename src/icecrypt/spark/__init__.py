"""PySpark (>= 4.0) Python Data Sources for encrypted files and tables.

::

    import icecrypt.spark
    icecrypt.spark.register(spark)

    kms = {"encryption.kms-type": "local", "encryption.kms.local.keystore": "/secure/keystore.json"}
    df = (spark.read.format("icecrypt.parquet")          # or "icecrypt.avro"
          .options(**kms).option("encryption.key-id", "master")
          .option("keys.manifest", "/data/keys.json")
          .load("/data/events"))                          # file, directory, glob, list, URI

    (df.write.format("icecrypt.avro").options(**kms)
       .option("encryption.key-id", "master").option("keys.manifest", "/data/keys.json")
       .mode("append").save("/data/events-avro"))

    table = spark.read.format("icecrypt.iceberg").options(**kms).load("/warehouse/db/events")

Keys never travel in clear: options hold either the path of a key manifest
(``keys.manifest``, :mod:`icecrypt.keys.manifest`) or the text of one
(``keys.wrapped``, from :func:`wrap_keys`), the master key it must be wrapped under
(``encryption.key-id``: one under any other is refused), plus the KMS properties of
:func:`icecrypt.kms.create_kms_client` (Spark lower-cases option names).  By default every
worker unwraps what it needs itself; with ``keys.transport=task`` the driver does and the
tasks carry their files' data keys, so executors never call the KMS (``icecrypt.iceberg``
always works that way; see ``icecrypt.spark._keys``).  Reading plaintext files takes an
explicit ``encryption=none``.  :func:`read_table` reads a table with Spark's own Parquet
reader where it can (``icecrypt.spark._native``; :func:`configure` puts icecrypt's jar on a
session's classpath).  :func:`pack_environment` and :func:`use_archive` ship icecrypt
to executors as a packed virtual environment (``icecrypt.spark._ship``).  The modules ``_avro``, ``_parquet`` and ``_iceberg`` document their
options.
"""

from __future__ import annotations

import importlib
import uuid
import warnings
from collections.abc import Mapping
from typing import Any

from icecrypt.keys import ENCRYPTION_TABLE_KEY, StandardKeyMetadata
from icecrypt.kms import KeyManagementClient, create_kms_client
from icecrypt.spark._common import OPT_JOB_ID, OPT_KEYS_MANIFEST, OPT_KEYS_WRAPPED, resolve
from icecrypt.spark._keys import wrap_keys as _wrap_keys
from icecrypt.spark._native import configure, jar_path, native_available, read_table
from icecrypt.spark._routing import route, warn_unrouted
from icecrypt.spark._ship import executor_conf, pack_environment, use_archive

__all__ = [
    "DATA_SOURCES",
    "DEFAULT_MANIFEST_NAME",
    "AvroDataSource",
    "IcebergDataSource",
    "ParquetDataSource",
    "configure",
    "jar_path",
    "merge",
    "native_available",
    "read_table",
    "register",
    "route",
    "executor_conf",
    "pack_environment",
    "rewrite_data_files",
    "update",
    "upsert",
    "use_archive",
    "wrap_keys",
    "write",
]

#: the data sources :func:`register` registers, as "module:Class" (imported when
#: registered): icecrypt.avro, icecrypt.parquet, icecrypt.iceberg
DATA_SOURCES: tuple[str, ...] = (
    "icecrypt.spark._avro:AvroDataSource",
    "icecrypt.spark._parquet:ParquetDataSource",
    "icecrypt.spark._iceberg_source:IcebergDataSource",
)

#: where :func:`write` records keys when no manifest is named: inside the output
#: directory, under a name that directory listings skip
DEFAULT_MANIFEST_NAME = "_icecrypt_keys.json"


def __getattr__(name: str) -> Any:
    # The data source classes are imported on first use (each pulls in its format module).
    for entry in DATA_SOURCES:
        module, _, cls = entry.partition(":")
        if cls == name:
            return getattr(importlib.import_module(module), cls)
    raise AttributeError(f"module 'icecrypt.spark' has no attribute {name!r}")


def rewrite_data_files(spark: Any, table_path: str, **options: Any) -> Any:
    """Bin-pack an encrypted table's data files with the file work in executors and one
    commit on the driver (see :mod:`icecrypt.spark._maintenance`)."""
    from icecrypt.spark._maintenance import rewrite_data_files as run

    return run(spark, table_path, **options)


def merge(
    spark: Any, location: str, source: Any, on: list[str], *, when_matched_update: Any = None,
    when_matched_delete: bool = False, when_not_matched_insert: str | None = None, **options: Any,
) -> Any:
    """A distributed MERGE of the DataFrame ``source`` into an encrypted table on the
    join columns ``on``: the join and the data files in executors, one commit on the
    driver.  ``when_matched_update``: None, ``"all"`` or a mapping of column to a Spark
    Column (over ``target.<name>`` and ``source.<name>``) or a constant;
    ``when_matched_delete``; ``when_not_matched_insert``: None or ``"all"``.  ``options``:
    the ``icecrypt.iceberg`` options plus ``branch`` and ``isolation-level``.  Returns a
    :class:`~icecrypt.table.MergeResult`; moved and updated rows keep their row
    lineage.  On a conflict with a commit since the target was read,
    :class:`~icecrypt.CommitConflictError`, and the executors' files are deleted."""
    from icecrypt.spark._merge import merge as run

    return run(spark, location, source, on, when_matched_update=when_matched_update,
               when_matched_delete=when_matched_delete, when_not_matched_insert=when_not_matched_insert, **options)


def update(spark: Any, location: str, set: Any, where: str | None = None, **options: Any) -> int | None:
    """A distributed ``UPDATE``: the rows matching the Iceberg row filter ``where`` (every
    row when None) take the values of ``set`` (column -> a Spark Column over the row's
    columns, or a constant), read, changed and written in executors and committed once on
    the driver, by the table's ``write.update.mode``, with Java's conflict checks
    (``isolation-level`` option, default ``write.update.isolation-level``).  Rows keep
    their row ids.  Returns the new snapshot id (None when no row matched)."""
    from icecrypt.spark._merge import update as run

    return run(spark, location, set, where, **options)


def upsert(spark: Any, location: str, source: Any, join_cols: list[str] | None = None, **options: Any) -> Any:
    """PyIceberg's upsert of the DataFrame ``source``, distributed as :func:`merge` is:
    matched rows whose values differ are updated, the others inserted; the source must
    not repeat a key.  ``join_cols`` default: the schema's identifier fields.  Returns an
    :class:`~icecrypt.table.UpsertResult`."""
    from icecrypt.spark._merge import upsert as run

    return run(spark, location, source, join_cols, **options)


def register(spark: Any) -> None:
    """Register the icecrypt data sources (``icecrypt.avro``, ``icecrypt.parquet``,
    ``icecrypt.iceberg``) with a SparkSession.  Registering again is harmless.

    ``icecrypt.iceberg`` needs pyiceberg (the ``iceberg`` extra); without it that source
    is skipped with a warning and the file sources are still registered.  In a session
    built with :func:`configure`, its batch reads then take the native path where it
    applies (:func:`route`; option ``native=false`` turns that off for a read); a classic
    session built without it gets one ``RuntimeWarning`` naming :func:`configure`, as its
    ``icecrypt.iceberg`` reads and writes then run as Python tasks.
    """
    iceberg = False
    for entry in DATA_SOURCES:
        module, _, name = entry.partition(":")
        try:
            source = getattr(importlib.import_module(module), name)
        except ModuleNotFoundError as exc:
            if exc.name is None or exc.name.split(".")[0] == "icecrypt":
                raise
            warnings.warn(f"icecrypt.spark: {entry} not registered: {exc}", stacklevel=2)
            continue
        spark.dataSource.register(source)
        iceberg = iceberg or name == "IcebergDataSource"
    if iceberg:
        if not route(spark):
            warn_unrouted(spark)
        from icecrypt.spark._sql import register as register_catalog

        register_catalog(spark)


def wrap_keys(
    keys: Mapping[str, StandardKeyMetadata | bytes],
    *,
    kms: KeyManagementClient | None = None,
    kms_properties: Mapping[str, str] | None = None,
    table_key_id: str,
    data_key_length: int = 16,
) -> str:
    """The value of option ``keys.wrapped`` for ``keys`` (file path or URI -> key metadata).

    The key metadata is wrapped by a fresh KEK, itself wrapped by master key
    ``table_key_id`` of the KMS (``kms``, or the client ``kms_properties`` describe), so
    the option holds no key in clear.  Readers need the same KMS properties as options.
    """
    if (kms is None) == (kms_properties is None):
        raise TypeError("give one of kms and kms_properties")
    client = kms if kms is not None else create_kms_client(dict(kms_properties or {}))
    return _wrap_keys(keys, client, table_key_id, data_key_length=data_key_length)


def write(
    df: Any,
    path: str,
    *,
    format: str = "parquet",
    kms_properties: Mapping[str, str],
    table_key_id: str,
    keys_manifest: str | None = None,
    mode: str = "append",
    options: Mapping[str, str] | None = None,
) -> dict[str, StandardKeyMetadata]:
    """Write ``df`` encrypted to directory ``path`` and return the key metadata of the files
    this call wrote (URI or local path -> :class:`~icecrypt.keys.StandardKeyMetadata`).

    ``format`` is ``"parquet"`` or ``"avro"``; ``mode`` ``"append"`` or ``"overwrite"``.
    Keys are recorded in the key manifest ``keys_manifest`` (default
    ``<path>/_icecrypt_keys.json``), wrapped under master key ``table_key_id`` of the KMS
    ``kms_properties`` describe; ``options`` are further data source options.
    """
    from icecrypt.keys.manifest import read_key_manifest

    if format not in ("parquet", "avro"):
        raise ValueError(f"format must be 'parquet' or 'avro', not {format!r}")
    manifest = keys_manifest or f"{path.rstrip('/')}/{DEFAULT_MANIFEST_NAME}"
    job_id = uuid.uuid4().hex
    all_options = {**dict(kms_properties), **dict(options or {}),
                   ENCRYPTION_TABLE_KEY: table_key_id, OPT_KEYS_MANIFEST: manifest, OPT_JOB_ID: job_id}
    if OPT_KEYS_WRAPPED in {k.lower() for k in all_options}:
        raise ValueError(f"option {OPT_KEYS_WRAPPED} is for reads")
    df.write.format(f"icecrypt.{format}").mode(mode).options(**all_options).save(path)
    filesystem, manifest_path, _ = resolve(manifest, all_options)
    with create_kms_client(dict(kms_properties)) as kms:
        keys = read_key_manifest(manifest_path, kms, table_key_id=table_key_id, filesystem=filesystem)
    marker = f"-{job_id}-"
    return {name: km for name, km in keys.items() if marker in name.rsplit("/", 1)[-1]}
