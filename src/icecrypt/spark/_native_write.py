"""Appends and overwrites of encrypted Iceberg tables by Spark's own Parquet writer (the
native write path).

In a session built with :func:`icecrypt.spark.configure` and registered with
:func:`icecrypt.spark.register`, ``df.write.format("icecrypt.iceberg").mode("append" |
"overwrite").save(table)`` reaches :func:`write` (icecrypt's analyzer rule puts
``org.icecrypt.spark.NativeWrite`` in the Python table's place; Spark calls it on the
driver with the DataFrame).  When the native path applies, the rows are written by
``DataFrame.write.parquet``: Spark's writer, whole-stage codegen, no Python worker.
parquet-java encrypts each file as Iceberg Java does through icecrypt's
``EncryptionPropertiesFactory`` (``org.icecrypt.spark.FileEncryption``): AES_GCM_V1, the
file's own DEK as footer key, an encrypted footer, a 16-byte AAD prefix not stored in the
file.  Columns carry their Iceberg field ids (``parquet.field.id``), so Iceberg Java and
``EncryptedTable.scan()`` read them by id.

Keys: one fresh 32-byte secret per write, in the write's Hadoop configuration as
``icecrypt.secret.write-key`` (a name Spark redacts; never a KEK or master key).  Each
file's DEK and AAD prefix are HMAC-SHA256 of it and the file's name (Spark names every
file of a job uniquely), so executors need no KMS and the driver, which derives the same
keys for the files the job wrote, records them in the files' key metadata.  The driver
then reads each file's footer (decrypted and authenticated) for its row count and column
statistics and commits the files as ``icecrypt.iceberg``'s writer commits its tasks'
(:class:`icecrypt.spark._iceberg.IcebergWriter`): branches, WAP, catalogs, the table pin.
A job that fails leaves no file behind.

The native path takes unpartitioned, unsorted Parquet tables on the local file system
(their data under ``write.data.path`` when set; the object-storage layout goes to the
Python source) whose columns are primitives or structs of them (Spark's writer puts no
field id on list elements or map keys and values), written from columns of the same types (or a
widening: int to long, float to double, a decimal to a wider one), for appends and
full overwrites, with options ``branch``, ``wap-id``, ``catalog`` and ``table-key-id``.
Everything else is written by the Python source, as before (option ``native=false``
asks for it; ``native=true`` fails instead, saying why).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import logging
import os
from collections.abc import Mapping
from typing import Any

from icecrypt.spark._options import NAME, OPT_NATIVE

#: parquet-java's hook and icecrypt's factory for writes (org.icecrypt.spark.FileEncryption)
ENCRYPTION_CLASS = "org.icecrypt.spark.FileEncryption"
SECRET_PROPERTY = "icecrypt.secret.write-key"
KEY_LENGTH_PROPERTY = "icecrypt.write-key-length"
_AAD_PREFIX_LENGTH = 16
#: table codec -> Spark's name for it
_CODECS = {"zstd": "zstd", "snappy": "snappy", "gzip": "gzip", "uncompressed": "uncompressed"}
#: table property -> parquet-java's Hadoop setting
_PARQUET_SETTINGS = {
    "write.parquet.row-group-size-bytes": "parquet.block.size",
    "write.parquet.page-size-bytes": "parquet.page.size",
    "write.parquet.dict-size-bytes": "parquet.dictionary.page.size",
    "write.parquet.page-row-limit": "parquet.page.row.count.limit",
}
#: the timestamps Iceberg stores: INT64 microseconds (Spark's default is INT96)
_TIMESTAMP_TYPE = "spark.sql.parquet.outputTimestampType"


def derive(secret: bytes, label: str, name: str, length: int) -> bytes:
    """FileEncryption's derivation: HMAC-SHA256(secret, label 0x00 name)[:length]."""
    return hmac.new(secret, label.encode("ascii") + b"\0" + name.encode("utf-8"), hashlib.sha256).digest()[:length]


def file_key(secret: bytes, name: str, key_length: int) -> Any:
    """The DEK and AAD prefix FileEncryption gives the file named ``name``."""
    from icecrypt.keys import StandardKeyMetadata

    return StandardKeyMetadata(derive(secret, "icecrypt-dek", name, key_length),
                               derive(secret, "icecrypt-aad", name, _AAD_PREFIX_LENGTH))


def _new_secret() -> bytes:
    return os.urandom(32)


def write(spark: Any, jdf: Any, options: dict[str, str], overwrite: bool) -> None:
    """What NativeWrite's insert runs: the native write, or the Python source's."""
    from pyspark.sql.classic.dataframe import DataFrame

    from icecrypt.spark._native import _keys_in_flight

    options = dict(options)
    location = options.pop("path")
    mode = options.pop(OPT_NATIVE, "auto").strip().lower()
    frame = DataFrame(jdf, spark)
    with _keys_in_flight():  # the write's secret goes to the JVM as an option
        why = _write(spark, frame, location, options, overwrite)
    if why is None:
        return
    logging.getLogger("icecrypt.spark").debug("icecrypt.iceberg: table %s: the Python source writes (%s)",
                                              location, why)
    if mode == "true":
        raise ValueError(f"{NAME}: table {location}: the native write does not apply ({why})")
    (frame.write.format(NAME).options(**options).option(OPT_NATIVE, "false")
     .mode("overwrite" if overwrite else "append").save(location))


def _why_not_options(options: Mapping[str, str], overwrite: bool) -> str | None:
    from icecrypt.spark import _iceberg as ib

    allowed = {ib.OPT_BRANCH, ib.OPT_WAP_ID, ib.OPT_CATALOG, ib.OPT_TABLE_KEY_ID, ib.OPT_WRITE_FORMAT,
               ib.OPT_OVERWRITE_MODE}
    for name, value in options.items():
        if name in ib._OWN_OPTIONS and name not in allowed and str(value).strip():
            return f"option {name}"
    if (options.get(ib.OPT_WRITE_FORMAT) or "parquet").strip().lower() != "parquet":
        return f"option {ib.OPT_WRITE_FORMAT}"
    if overwrite and (options.get(ib.OPT_OVERWRITE_MODE) or "static").strip().lower() != "static":
        return f"option {ib.OPT_OVERWRITE_MODE}"
    return None


def _write(spark: Any, frame: Any, location: str, options: dict[str, str], overwrite: bool) -> str | None:
    """Write and commit; None when done, else why the native path does not apply (then
    nothing was written, and a table the attempt created is gone again)."""
    from icecrypt.spark import _iceberg as ib
    from icecrypt.spark._native import _jvm_session, native_available

    if _jvm_session(spark) is None:
        return "not a classic Spark session (Spark Connect)"
    why = _why_not_options(options, overwrite)
    if why is not None:
        return why
    if not native_available(spark):
        return "icecrypt's jar cannot be loaded in this session (icecrypt.spark.configure)"
    try:
        writer = ib.IcebergWriter({**options, ib.OPT_PATH: location}, frame.schema, overwrite)
    except Exception as exc:  # noqa: BLE001 - the Python source raises it again, as it always has
        return f"preparing the write failed: {type(exc).__name__}: {exc}"
    secret = _new_secret()
    try:
        table = writer._table()
        plan = _plan(table, frame, writer.renames)
        if not isinstance(plan, str):
            columns, directory, fs_directory = plan
            out = _writer(frame.select(*columns), table, secret)
    except Exception as exc:  # noqa: BLE001 - as above
        plan = f"preparing the write failed: {type(exc).__name__}: {exc}"
    if isinstance(plan, str):
        if writer.created:
            writer._drop_if_empty()
        return plan
    try:
        with _session_setting(spark, _TIMESTAMP_TYPE, "TIMESTAMP_MICROS"):
            out.save("file://" + fs_directory)
        data_files = _data_files(table, directory, fs_directory, secret, table.encryption_manager.data_key_length)
    except BaseException:
        _remove_job_files(table, fs_directory)
        writer.abort([])
        raise
    try:
        writer.commit([ib.TaskDataFiles(data_files)])  # deletes the files if it fails
    finally:
        _remove_job_files(table, fs_directory, keep_data=True)
    return None


def _writer(frame: Any, table: Any, secret: bytes) -> Any:
    """``frame``'s DataFrameWriter: Parquet as the table asks for it, encrypted by
    FileEncryption with ``secret``, no _SUCCESS file."""
    out = (frame.write.mode("append").format("parquet")
           .option("compression", _CODECS[_codec(table)])
           .option("mapreduce.fileoutputcommitter.marksuccessfuljobs", "false")
           .option("parquet.crypto.factory.class", ENCRYPTION_CLASS)
           .option(SECRET_PROPERTY, base64.b64encode(secret).decode("ascii"))
           .option(KEY_LENGTH_PROPERTY, str(table.encryption_manager.data_key_length)))
    properties = table.properties
    for name, setting in _PARQUET_SETTINGS.items():
        if name in properties:
            out = out.option(setting, str(int(properties[name])))
    if _codec(table) == "zstd":
        # the table's level, else 1: the level icecrypt's Python writer (Arrow's default) uses
        # (parquet-java's default, 3, is slower to write)
        level = properties.get("write.parquet.compression-level") or "1"
        out = out.option("parquet.compression.codec.zstd.level", str(int(level)))
    return out


def _codec(table: Any) -> str:
    return (table.properties.get("write.parquet.compression-codec") or "zstd").strip().lower()


def _plan(table: Any, frame: Any, renames: Mapping[str, str]) -> tuple[list[Any], str, str] | str:
    """(the columns to write, the job's directory as a table location and as a local path),
    or why the native path does not apply."""
    import pyarrow.fs as pafs
    from pyspark.sql import functions as F

    from icecrypt.spark._native import _spark_type
    from icecrypt.table.commit.target import _Target
    from icecrypt.table.files.write_data import table_sort_order
    from icecrypt.table.ops.write import write_layout

    if not table.encrypted:
        return "the table is not encrypted"
    if not isinstance(table.filesystem, pafs.LocalFileSystem):
        return "the table is not on the local file system"
    if not table.spec.is_unpartitioned():
        return "the table is partitioned"
    if table_sort_order(table.metadata) is not None:
        return "the table has a sort order"
    properties = table.properties
    if (properties.get("write.format.default") or "parquet").strip().lower() != "parquet":
        return "the table's write.format.default is not parquet"
    if _codec(table) not in _CODECS:
        return f"codec {_codec(table)}"
    if "write.parquet.compression-level" in properties and _codec(table) != "zstd":
        return f"a compression level for codec {_codec(table)}"
    if any(name.startswith("write.parquet.bloom-filter") for name in properties):
        return "the table asks for bloom filters"
    given = {renames.get(f.name, f.name): f for f in frame.schema.fields}
    columns = []
    for field in table.schema.fields:
        target = _spark_type(field.field_type)
        if target is None or _has_collection(target):
            return f"column {field.name!r} is {field.field_type}"
        source = given.get(field.name)
        if source is None:
            if field.write_default is not None:
                return f"column {field.name!r} has a write-default"
            column = F.lit(None).cast(target)
        else:
            why = _why_not_type(source.dataType, target)
            if why is not None:
                return f"column {source.name!r}: {why}"
            column = F.col("`" + source.name.replace("`", "``") + "`").cast(target)
            if field.required:
                column = F.when(column.isNull(), F.raise_error(F.lit(
                    f"icecrypt.iceberg: a null in required column {field.name!r} of table {table.location}"
                ))).otherwise(column)
        columns.append(column.alias(field.name, metadata={"parquet.field.id": field.field_id}))
    layout = write_layout(_Target.of(table), table.metadata)  # write.data.path, as the Python source honours it
    if layout.object_storage:
        return "the table uses the object-storage layout (a hashed directory per file)"
    directory = f"{layout.data_root}/{os.urandom(8).hex()}"
    fs_directory = table.fs_path(directory, what="data directory")
    # glob characters and ',' (Spark's path lists) are expanded, ':' refused in a relative
    # Hadoop path; '%' is a literal character of Hadoop's Path(String) (N%2FA stays one name)
    if set(fs_directory) & set("*?[]{}\\,:") or not fs_directory.startswith("/"):
        return "the table's path holds characters Hadoop's paths expand or refuse"
    return columns, directory, fs_directory


def _has_collection(t: Any) -> bool:
    from pyspark.sql import types as st

    if isinstance(t, (st.ArrayType, st.MapType)):
        return True
    return isinstance(t, st.StructType) and any(_has_collection(f.dataType) for f in t.fields)


def _why_not_type(given: Any, target: Any) -> str | None:
    """Why a column of type ``given`` is not written as ``target`` here (None: it is, by a
    cast that changes no value)."""
    from pyspark.sql import types as st

    if given == target or isinstance(given, st.NullType):
        return None
    widening = {st.IntegerType: (st.ByteType, st.ShortType), st.LongType: (st.ByteType, st.ShortType, st.IntegerType),
                st.DoubleType: (st.FloatType,)}
    if isinstance(target, tuple(widening)) and isinstance(given, widening[type(target)]):
        return None
    if (isinstance(target, st.DecimalType) and isinstance(given, st.DecimalType) and given.scale == target.scale
            and given.precision <= target.precision):
        return None
    if isinstance(target, st.StructType) and isinstance(given, st.StructType):
        if [f.name for f in given.fields] != [f.name for f in target.fields]:
            return "its fields are not the table's, in the table's order"
        for inner, want in zip(given.fields, target.fields):
            if not want.nullable:
                return f"field {want.name!r} is required"
            why = _why_not_type(inner.dataType, want.dataType)
            if why is not None:
                return f"field {inner.name!r}: {why}"
        return None
    return f"{given.simpleString()} is written as {target.simpleString()} by the Python source only"


@contextlib.contextmanager
def _session_setting(spark: Any, name: str, value: str) -> Any:
    before = spark.conf.get(name, None)
    spark.conf.set(name, value)
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(name)
        else:
            spark.conf.set(name, before)


def _data_files(table: Any, directory: str, fs_directory: str, secret: bytes, key_length: int) -> list[dict[str, Any]]:
    """The manifest records of the files the job wrote into ``fs_directory``: their key
    metadata (the derived keys, the stored length), row counts and statistics from their
    footers, decrypted and authenticated here."""
    import pyarrow.fs as pafs

    from icecrypt.parquet import open_file
    from icecrypt.table.files.io import delete_file
    from icecrypt.table.files.write_data import _parquet_stats, _statistics_plan, data_file_record, drop_nan_bounds

    schema = table.schema
    stats_plan = _statistics_plan(schema, table.properties)
    records = []
    infos = table.filesystem.get_file_info(pafs.FileSelector(fs_directory))
    for info in sorted(infos, key=lambda i: i.base_name):
        if info.type != pafs.FileType.File or info.base_name.startswith((".", "_")):
            continue  # Hadoop's checksum files
        key = file_key(secret, info.base_name, key_length).with_file_length(info.size)
        with open_file(info.path, key, filesystem=table.filesystem) as file:
            metadata = file.metadata
        if metadata.num_rows == 0:  # Spark writes a file for an empty DataFrame: no data file
            delete_file(table.locations, info.path)
            continue
        stats = _parquet_stats(metadata, {}, schema, stats_plan)
        drop_nan_bounds(stats, schema)
        records.append(data_file_record(f"{directory}/{info.base_name}", "PARQUET", {}, metadata.num_rows, info.size,
                                        key, stats, 0))
    return records


def _remove_job_files(table: Any, path: str, *, keep_data: bool = False) -> None:
    """Best effort, confined to the table and never through a symbolic link: the files
    under the job's directory (with ``keep_data``, only those whose names start with "."
    or "_": Hadoop's checksum and marker files), then its directories left empty."""
    from icecrypt.table.files.io import Deletions

    if os.path.islink(path):
        return
    deletions = Deletions(table.locations, "native write")
    for directory, _, names in os.walk(path, topdown=False):  # symbolic links to directories: not entered
        for name in names:
            if not keep_data or name.startswith((".", "_")):
                with contextlib.suppress(OSError):
                    deletions.path(os.path.join(directory, name))
        with contextlib.suppress(OSError):  # one that still holds files stays
            os.rmdir(directory)
