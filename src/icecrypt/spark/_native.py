"""Reads of encrypted Iceberg tables by Spark's own Parquet reader (the native path).

::

    import icecrypt.spark

    spark = icecrypt.spark.configure(SparkSession.builder).getOrCreate()   # the jar on the classpath
    df = icecrypt.spark.read_table(spark, "/warehouse/db/events", **kms_options)

The scan is planned here, on the driver, as ``icecrypt.iceberg`` plans it (KMS -> KEK ->
manifest list -> manifests -> file scan tasks).  The Parquet data files go to Spark's file
source (``spark.read.format("parquet")``, vectorized reader, column pruning, filter
pushdown, whole-stage codegen): parquet-java decrypts them with the project's
``DecryptionPropertiesFactory`` (``org.icecrypt.spark.FileDecryption``, in the jar
:func:`jar_path` names), which takes each file's DEK and AAD prefix from the read's
Hadoop configuration.  Columns are matched by Iceberg field id
(``spark.sql.parquet.fieldId.read.enabled``), so renamed and re-added columns read right.
Deletion vectors and position deletes are read here, on the driver, as read_task reads
them (authenticated), and applied inside Spark's Parquet scan by
``org.icecrypt.spark.LiveRows``, Spark's Parquet format giving only the live rows: each
batch of Spark's vectorized reader becomes a batch of views of its live rows (no copy, no
filter above the scan), a row's position in its file being a running count when a task
reads a whole file with no filter pushed into Parquet, else parquet-java's row index.
Everything else — files with equality deletes, Avro data files, files with deletes under
a table with a column named as the one Spark reads that row index into — is read by
:func:`icecrypt.table.read_task` in Python workers (``mapInArrow`` over the planned
tasks), and the parts are unioned.  The rows are those of
``EncryptedTable.scan()``.

The native path is taken when it applies: a classic (not Connect) session with the jar
loadable, and none of what only the Python path does (options ``filter``,
``metadata-table``, the incremental and changelog options, metadata columns, a name
mapping, ``initial-default`` values, a type promoted by schema evolution, column names
that differ only by case, a column name an earlier schema gave another column (Spark's
Parquet filters match names, not ids), types Spark's Parquet reader does not map — time, uuid, fixed,
nanosecond timestamps, geo, variant, unknown).  Otherwise, or with option
``native=false``, :func:`read_table` returns ``spark.read.format("icecrypt.iceberg")``.

Routed reads: in a session built with :func:`configure` (which adds icecrypt's session
extension, ``org.icecrypt.spark.Extensions``), ``spark.read.format("icecrypt.iceberg")``
takes the same path by itself.  The extension's analyzer rule
(``org.icecrypt.spark.NativeRouting``) hands each batch read of the Python source to the
planner :func:`icecrypt.spark.route` registered for the session (over Py4J, on the driver), and puts the
DataFrame it answers with in the relation's place when the columns match; Spark's
optimizer then prunes and pushes filters into the Parquet scan.  Option ``native`` means
what it means for :func:`read_table`.  Appends and full overwrites of ``icecrypt.iceberg``
go to the same planner, which writes them with Spark's own Parquet writer when that
applies (``icecrypt.spark._native_write``).

Key transport: per read, one data source option ``icecrypt.secret.file-keys`` holding the
DEK and AAD prefix of each planned file (never a KEK or master key).  Spark turns
DataFrameReader options into the scan's Hadoop configuration, broadcast to the executors;
it shows them in no query plan (``explain``, every mode), no UI page or REST answer and
no event log (measured with Spark 4.x; tests/test_secrets_hygiene.py checks it), and the
name matches Spark's default ``spark.redaction.regex`` in case a Spark version ever does.
Executors parse it once per read (``org.icecrypt.spark.FileKeys``: cached under the read
id and the SHA-256 digest of the whole text, dropped and zeroed when the last task of the
JVM that used it ends).
The Python tasks carry their files' key metadata as ``icecrypt.iceberg``'s do.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import logging
import os
import sys
import threading
import uuid
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

from icecrypt.spark._options import NAME, OPT_NATIVE


#: the jar with icecrypt's JVM code (built by scripts/build-jar.sh, shipped in the wheel)
JAR_NAME = "icecrypt-spark.jar"
#: parquet-java's hook and icecrypt's factory class
FACTORY_PROPERTY = "parquet.crypto.factory.class"
FACTORY_CLASS = "org.icecrypt.spark.FileDecryption"
#: the read's file keys and id (org.icecrypt.spark.FileKeys parses them)
KEYS_PROPERTY = "icecrypt.secret.file-keys"
READ_ID_PROPERTY = "icecrypt.read-id"
#: Spark reads Parquet columns by field id only with this session setting, and reads a
#: file without field ids as nulls (instead of failing) with the second one on
FIELD_ID_READ = "spark.sql.parquet.fieldId.read.enabled"
FIELD_ID_IGNORE_MISSING = "spark.sql.parquet.fieldId.read.ignoreMissing"
#: the session extension (static: set when the session is built, by :func:`configure`) whose
#: analyzer rule routes ``icecrypt.iceberg`` reads, and that rule
EXTENSIONS_PROPERTY = "spark.sql.extensions"
EXTENSIONS_CLASS = "org.icecrypt.spark.Extensions"
ROUTING_CLASS = "org.icecrypt.spark.NativeRouting"
#: Spark's Parquet format with a table's position deletes applied in the scan, the option
#: with the positions, and the column Spark's Parquet reader gives parquet-java's row index in
DELETES_FORMAT = "org.icecrypt.spark.LiveRows"
DELETES_OPTION = "icecrypt.deletes"
ROW_INDEX_COLUMN = "_tmp_metadata_row_index"

__all__ = ["FACTORY_CLASS", "JAR_NAME", "configure", "jar_path", "native_available", "read_table"]


def jar_path() -> str:
    """The path of icecrypt's jar (``FileNotFoundError`` if this install has none)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), JAR_NAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"icecrypt.spark: {path} is missing (a source checkout builds it with "
                                "`make build` or scripts/build-jar.sh)")
    return path


def configure(builder: Any) -> Any:
    """``builder`` (a ``SparkSession.Builder``) with icecrypt's jar added to ``spark.jars``,
    icecrypt's session extension added to ``spark.sql.extensions`` (its analyzer rule sends
    ``icecrypt.iceberg`` reads to the native path once :func:`icecrypt.spark.route` — called by
    ``icecrypt.spark.register`` — names the driver's planner) and Parquet field-id reads on
    (a file without field ids fails); returns it.

    On a local master (``local``, ``local[N]``, ``local-cluster[...]``, set on ``builder``)
    the Python workers run the driver's interpreter unless the user chose one
    (``spark.pyspark.python`` or ``PYSPARK_PYTHON``): a job started as ``venv/bin/python
    job.py`` without the virtual environment on the PATH would otherwise start ``python3``
    from the PATH, which has no icecrypt.  The setting is recorded as Spark's
    ``spark.pyspark.python`` and, because PySpark starts its workers from the environment,
    as ``PYSPARK_PYTHON`` in this process's environment (before the session starts)."""
    builder = _add_to_list(builder, "spark.jars", jar_path())
    builder = _add_to_list(builder, EXTENSIONS_PROPERTY, EXTENSIONS_CLASS)
    builder = _default_python(builder)
    return builder.config(FIELD_ID_READ, "true").config(FIELD_ID_IGNORE_MISSING, "false")


#: Spark's setting of the Python workers' interpreter
PYTHON_PROPERTY = "spark.pyspark.python"


def _default_python(builder: Any) -> Any:
    """``builder`` with the workers' interpreter set to the driver's, on a local master when
    none is chosen (see :func:`configure`)."""
    options = getattr(builder, "_options", None) or {}
    master = str(options.get("spark.master") or "")
    if not master.startswith("local") or options.get(PYTHON_PROPERTY) or os.environ.get("PYSPARK_PYTHON"):
        return builder
    os.environ["PYSPARK_PYTHON"] = sys.executable
    return builder.config(PYTHON_PROPERTY, sys.executable)


def _add_to_list(builder: Any, key: str, value: str) -> Any:
    """``builder`` with ``value`` appended to the comma-separated setting ``key``."""
    try:
        current = builder._options.get(key, "")
    except AttributeError:
        current = ""
    values = [v.strip() for v in current.split(",") if v.strip()] if current else []
    if value not in values:
        values.append(value)
    return builder.config(key, ",".join(values))


def _jvm_session(spark: Any) -> Any:
    """The classic session's JVM session, None for Spark Connect."""
    return getattr(spark, "_jsparkSession", None)


def jvm_class(spark: Any, name: str) -> Any:
    """The class ``name`` (fully qualified) of the classic session ``spark``'s JVM, addressed
    by its name.  Reaching it as ``spark._jvm.org.icecrypt...`` costs a Py4J round trip per
    step, and the JVM answers each step by trying to load a class of that name from every
    jar of the driver's class path and failing: when the SQL catalog's scan planning walked
    to ``Keys`` per scan, those lookups were 96 of the driver JVM's 1,636 profiler samples
    over tests/spark_sql/test_sql_rowlevel.py (24 of 1,271 after; the rest are PySpark's
    own).  A missing class is found at the first use of a member (``Py4JError``), as by
    the walk."""
    from py4j.java_gateway import JavaClass

    return JavaClass(name, spark.sparkContext._jvm._gateway_client)


def native_available(spark: Any, *, install: bool = True) -> bool:
    """Whether Spark's Parquet reader in ``spark`` can load icecrypt's factory.  With
    ``install`` and a jar not yet on the classpath, it is added: ``addJar`` for executors
    of a cluster and, for the driver and ``local`` executors (which share the driver's
    class loader), to the class loader of the session's Hadoop configuration."""
    jsession = _jvm_session(spark)
    if jsession is None:
        return False
    try:
        loader = jsession.sessionState().newHadoopConf().getClassLoader()
        if _loads(spark, loader):
            return True
        if not install:
            return False
        jar = jar_path()
        spark.sparkContext._jsc.addJar(jar)
        jvm = spark.sparkContext._jvm
        if loader.getClass().getName() != "org.apache.spark.util.MutableURLClassLoader":
            return False
        loader.addURL(jvm.java.io.File(jar).toURI().toURL())
        return _loads(spark, loader)
    except FileNotFoundError:
        return False
    except Exception:  # noqa: BLE001 - a JVM that cannot take the jar: the Python path
        return False


def _loads(spark: Any, loader: Any) -> bool:
    try:
        jvm_class(spark, "java.lang.Class").forName(FACTORY_CLASS, False, loader)
        return True
    except Exception:  # noqa: BLE001 - py4j raises Py4JJavaError(ClassNotFoundException)
        return False


# --- what the native path can read -------------------------------------------------------------


def _spark_type(t: Any) -> Any:
    """The Spark type Spark's Parquet reader reads an Iceberg type as (field ids on every
    struct field), or None when it has none that matches ``icecrypt.iceberg``."""
    from pyiceberg import types as it
    from pyspark.sql import types as st

    simple = {it.BooleanType: st.BooleanType, it.IntegerType: st.IntegerType, it.LongType: st.LongType,
              it.FloatType: st.FloatType, it.DoubleType: st.DoubleType, it.DateType: st.DateType,
              it.TimestampType: st.TimestampNTZType, it.TimestamptzType: st.TimestampType,
              it.StringType: st.StringType, it.BinaryType: st.BinaryType}
    for iceberg_type, spark_type in simple.items():
        if type(t) is iceberg_type:
            return spark_type()
    if isinstance(t, it.DecimalType):
        return st.DecimalType(t.precision, t.scale)
    if isinstance(t, it.StructType):
        fields = []
        for field in t.fields:
            inner = _spark_type(field.field_type)
            if inner is None:
                return None
            fields.append(st.StructField(field.name, inner, field.optional, {"parquet.field.id": field.field_id}))
        return st.StructType(fields)
    if isinstance(t, it.ListType):
        element = _spark_type(t.element_type)
        return None if element is None else st.ArrayType(element, not t.element_required)
    if isinstance(t, it.MapType):
        key, value = _spark_type(t.key_type), _spark_type(t.value_type)
        return None if key is None or value is None else st.MapType(key, value, not t.value_required)
    return None  # time, uuid, fixed, nanosecond timestamps, geo, variant, unknown


def _fields(schema: Any) -> Iterator[Any]:
    """Every field of an Iceberg schema, nested ones included."""
    stack = list(schema.fields)
    while stack:
        field = stack.pop()
        yield field
        t = field.field_type
        if hasattr(t, "fields"):
            stack.extend(t.fields)
        elif hasattr(t, "element_field"):
            stack.append(t.element_field)
        elif hasattr(t, "key_field"):
            stack.extend([t.key_field, t.value_field])


def _why_not(table: Any, scan: Any, options: Mapping[str, str]) -> str | None:
    """Why the scan cannot take the native path (None: it can)."""
    from icecrypt.spark import _iceberg as ib
    from icecrypt.table.model.metadata_columns import is_metadata

    for name in (ib.OPT_FILTER, ib.OPT_METADATA_TABLE, *ib._INCREMENTAL_OPTIONS):
        if str(options.get(name) or "").strip():
            return f"option {name}"
    if ib._changelog(options):
        return f"option {ib.OPT_CHANGELOG}"
    if table.properties.get("schema.name-mapping.default"):
        return "the table has a name mapping (files without field ids)"
    reused = reused_names(table.metadata)
    if reused:
        return (f"column name {sorted(reused)[0]!r} named another column in an earlier schema (Spark's Parquet "
                "filters match names)")
    projected = scan.projected
    if any(is_metadata(f) for f in projected.fields):
        return "metadata columns are projected"
    names = [f.name.lower() for f in projected.fields]
    if len(set(names)) != len(names):
        return "column names differ only by case"
    types_by_id: dict[int, set[str]] = {}
    for schema in table.metadata.get("schemas", []):
        for field_id, type_name in _schema_fields(schema):
            types_by_id.setdefault(field_id, set()).add(type_name)
    for field in _fields(projected):
        if field.initial_default is not None:
            return f"column {field.name!r} has an initial-default"
        if len(types_by_id.get(field.field_id, ())) > 1:
            return f"column {field.name!r} changed type"
        if _spark_type(field.field_type) is None:
            return f"column {field.name!r} is {field.field_type}"
    return None


def reused_names(metadata: Mapping[str, Any]) -> set[str]:
    """Column paths (``a``, ``s.x``) that some schema of the table gave to another field id
    than another schema did (a column dropped and another added under its name, two
    columns that swapped names).  Spark's Parquet row-group filters match a file's columns
    by name: on such a column they would test another column's statistics and skip row
    groups that hold matching rows."""
    ids: dict[str, set[Any]] = {}
    for schema in metadata.get("schemas") or ():
        stack = [("", f) for f in schema.get("fields") or ()]
        while stack:
            prefix, field = stack.pop()
            path = f"{prefix}{field.get('name')}"
            ids.setdefault(path, set()).add(field.get("id"))
            t = field.get("type")
            if isinstance(t, dict) and t.get("type") == "struct":
                stack.extend((f"{path}.", f) for f in t.get("fields") or ())
    return {path for path, found in ids.items() if len(found) > 1}


def _schema_fields(schema: Mapping[str, Any]) -> Iterator[tuple[Any, str]]:
    """(field id, type: a primitive's name, or struct/list/map) of every field of a table
    metadata schema (JSON), nested ones and list elements, map keys and values included."""
    stack: list[tuple[Any, Any]] = [(f.get("id"), f.get("type")) for f in schema.get("fields", [])]
    while stack:
        field_id, t = stack.pop()
        if not isinstance(t, dict):
            yield field_id, str(t)
            continue
        yield field_id, str(t.get("type"))
        stack.extend((f.get("id"), f.get("type")) for f in t.get("fields", []))
        stack.extend((t.get(f"{part}-id"), t[part]) for part in ("element", "key", "value") if part in t)


def _native_task(task: Any, encrypted: bool) -> bool:
    """A task Spark's Parquet reader can read: a Parquet data file (with key metadata in an
    encrypted table) whose deletes, if any, are deletion vectors or position deletes (the
    equality deletes of a task send its file to the Python path)."""
    from icecrypt.table.files.manifest import EQUALITY_DELETES

    return (task.file.file_format == "PARQUET" and (task.file.key_metadata is not None or not encrypted)
            and all(d.content != EQUALITY_DELETES for d in task.deletes))


#: the largest row position LiveRows takes (32-bit bitmaps)
_MAX_FILTERED_POSITION = 2**31 - 1


def _deleted_positions(tasks: list[Any], filesystem: Any, cache: dict) -> Any:
    """The sorted deleted row positions of the data file of ``tasks`` (its splits, which
    share its deletes), read on the driver as read_task reads them; None when none is."""
    from icecrypt.table.files.read import _positions

    if not tasks[0].deletes:
        return None
    return _positions(tasks[0], filesystem, cache)


def _deletes_option(deletes: Mapping[str, tuple[int, Any]]) -> str:
    """LiveRows' option, in base64: per file, its path as given to Spark, its record count
    and the deltas of its sorted deleted positions, a byte each (255: the next of the wide
    deltas, big-endian uint32, that follow).  Mostly a byte per position, written ten times
    faster than zlib compressed the uint32 deltas, to a similar size."""
    import struct

    import numpy as np

    out = bytearray()
    for path, (rows, deleted) in deletes.items():
        name = path.encode("utf-8")
        deltas = np.diff(np.asarray(deleted, dtype=np.int64), prepend=0)
        wide = deltas >= 255
        out += struct.pack(">i", len(name)) + name + struct.pack(">qii", rows, len(deltas), int(wide.sum()))
        out += np.minimum(deltas, 255).astype(np.uint8).tobytes() + deltas[wide].astype(">u4").tobytes()
    return _b64(bytes(out))


# --- the read --------------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _file_keys(files: Mapping[str, Any]) -> str:
    """The value of KEYS_PROPERTY for ``files`` (path given to Spark -> TaskFile)."""
    entries = []
    for path, file in files.items():
        km = file.key()
        length = -1 if km.file_length is None else int(km.file_length)
        entries.append(f"{base64.urlsafe_b64encode(path.encode()).decode('ascii')}.{_b64(km.encryption_key)}."
                       f"{_b64(km.aad_prefix or b'')}.{length}")
    return ",".join(entries)


#: what Spark's file source expands in a path it is given
_GLOB_CHARACTERS = frozenset("*?[]{}\\")


def _spark_path(fs_path: str, filesystem: Any) -> str | None:
    """The path Spark's file source opens for a file icecrypt reads at ``fs_path`` (local
    files only for now: object stores would need Spark's own Hadoop credentials)."""
    import pyarrow.fs as pafs

    if (filesystem is None or isinstance(filesystem, pafs.LocalFileSystem)) and fs_path.startswith("/"):
        return "file://" + fs_path
    return None


#: py4j logs each command it sends (a native read's file keys among them) at DEBUG
_PY4J_LOGGERS = ("py4j.clientserver", "py4j.java_gateway")
_in_flight = threading.local()


class _HideCommands(logging.Filter):
    """Replaces the text of py4j's records logged while this thread passes keys to the JVM."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(_in_flight, "depth", 0):
            record.msg, record.args = "(a py4j command of an icecrypt native read: not logged, it may hold keys)", ()
        return True


_HIDE_COMMANDS = _HideCommands()


@contextlib.contextmanager
def _keys_in_flight() -> Iterator[None]:
    """Within: py4j's records of this thread's calls are logged without their text."""
    for name in _PY4J_LOGGERS:
        logger = logging.getLogger(name)
        if _HIDE_COMMANDS not in logger.filters:
            logger.addFilter(_HIDE_COMMANDS)
    _in_flight.depth = getattr(_in_flight, "depth", 0) + 1
    try:
        yield
    finally:
        _in_flight.depth -= 1


def read_table(spark: Any, location: str, **options: str) -> Any:
    """The rows of the encrypted Iceberg table at ``location`` (directory, metadata.json or,
    with option ``catalog``, an identifier) as a DataFrame, with ``icecrypt.iceberg``'s
    options; the native path when it applies (module docstring), option ``native=false``
    for the Python path only, ``native=true`` to fail when it does not apply."""
    from icecrypt.spark._iceberg_source import IcebergDataSource

    options = {str(k).lower(): str(v) for k, v in options.items()}
    mode = options.pop(OPT_NATIVE, "auto").strip().lower()
    if mode not in ("auto", "true", "false"):
        raise ValueError(f"icecrypt.spark.read_table: option {OPT_NATIVE}={mode!r} must be auto, true or false")
    frame, why = (None, "option native=false") if mode == "false" else _native_read(spark, location, options)
    if frame is not None:
        return frame
    if mode == "true":
        raise ValueError(f"icecrypt.spark.read_table: table {location}: the native path does not apply ({why})")
    spark.dataSource.register(IcebergDataSource)
    # native=false: the routing rule (route) must not plan this read a second time
    return spark.read.format(NAME).options(**options).option(OPT_NATIVE, "false").load(location)


def _encode(options: Mapping[str, str]) -> str:
    """``options`` as NativeRouting.plannedRead takes them: name, NUL, value, NUL, ..."""
    return "\0".join(item for pair in options.items() for item in pair)


#: NativeRouting's JavaClass per session whose JVM loads icecrypt's jar (native_available
#: costs eight Py4J round trips: once per session, not per read)
_routing_classes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _routing(spark: Any) -> Any:
    routing = _routing_classes.get(spark)
    if routing is None and native_available(spark):
        routing = _routing_classes[spark] = jvm_class(spark, ROUTING_CLASS)
    return routing


def _native_read(spark: Any, location: str, options: dict[str, str]) -> tuple[Any, str]:
    """(the DataFrame of the native path, "") or (None, why it does not apply)."""
    with _keys_in_flight():  # the file keys option and the Python part's pickled tasks
        return _plan_native_read(spark, location, options)


def _plan_native_read(spark: Any, location: str, options: dict[str, str]) -> tuple[Any, str]:
    from pyspark.sql.classic.dataframe import DataFrame

    from icecrypt.spark import _iceberg as ib
    from icecrypt.spark._common import columns_option, file_error
    from icecrypt.spark._schema import spark_schema

    jsession = _jvm_session(spark)
    if jsession is None:
        return None, "not a classic Spark session (Spark Connect)"
    routing = _routing(spark)
    if routing is None:
        return None, f"{JAR_NAME} cannot be loaded in this session (icecrypt.spark.configure)"
    full = {**options, ib.OPT_PATH: location}
    table = ib._open_table(full, location)
    try:
        scan = ib._new_scan(table, full, columns_option(full), None)
    except ValueError as exc:
        raise ValueError(f"{ib.NAME}: table {location}: {exc}") from None
    why = _why_not(table, scan, full)
    if why is not None:
        return None, why
    try:
        tasks = scan.plan_files()
    except Exception as exc:
        raise file_error(exc, f"{ib.NAME}: planning the scan of table {location}") from exc
    encrypted = table.encrypted
    by_file: dict[str, list[Any]] = {}
    for task in tasks:
        by_file.setdefault(task.file.path, []).append(task)
    # Spark's reader puts the row index LiveRows reads in a column of that name: a table
    # column so named sends the files with deletes to the Python path
    positions_readable = all(f.name.lower() != ROW_INDEX_COLUMN for f in scan.schema.fields)
    files: dict[str, Any] = {}  # Spark path -> data file, every file Spark's reader reads
    filtered: dict[str, Any] = {}  # Spark path -> deleted positions, the files with deletes
    rest: list[Any] = []
    cache: dict = {}
    for group in by_file.values():
        file = group[0].file
        path = _spark_path(file.fs_path, table.filesystem)
        if path is None:
            return None, "the table is not on the local file system"
        # a path Spark's file source would expand as a glob (Java keeps '*' in partition
        # directories) is read in Python, as are tasks Spark's reader cannot take
        glob = bool(set(path) & _GLOB_CHARACTERS)
        if glob or not all(_native_task(t, encrypted) for t in group) or (group[0].deletes and not positions_readable):
            rest.extend(group)
            continue
        try:
            deleted = _deleted_positions(group, table.filesystem, cache)
        except Exception as exc:
            raise file_error(exc, f"{ib.NAME}: reading the deletes of {file.path} in table {location}") from exc
        if deleted is not None and not 0 <= int(deleted[0]) <= int(deleted[-1]) <= _MAX_FILTERED_POSITION:
            rest.extend(group)  # positions LiveRows does not take: read_task ignores those out of range
            continue
        files[path] = file
        if deleted is not None:
            filtered[path] = deleted
    if not files:
        return None, "no Parquet data file without equality deletes (and without glob characters) in the scan"
    output = spark_schema(scan.arrow_schema)
    # a file that fails to decrypt or is gone fails the read, whatever the session's
    # spark.sql.files.ignoreCorruptFiles / ignoreMissingFiles say (no silently missing rows)
    schema = _spark_type(scan.schema.as_struct())
    settings = {"ignoreCorruptFiles": "false", "ignoreMissingFiles": "false"}
    if encrypted:
        settings.update({FACTORY_PROPERTY: FACTORY_CLASS, READ_ID_PROPERTY: uuid.uuid4().hex,
                         KEYS_PROPERTY: _file_keys(files)})
    session_settings = _encode({FIELD_ID_READ: "true", FIELD_ID_IGNORE_MISSING: "false"})
    parts = []
    for paths in ([path for path in files if path not in filtered], list(filtered)):
        if not paths:
            continue
        if paths[0] in filtered:
            deletes = {path: (files[path].record_count, filtered[path]) for path in paths}
            source, read_options = DELETES_FORMAT, {**settings, DELETES_OPTION: _deletes_option(deletes)}
        else:
            source, read_options = "parquet", settings
        # one call: Spark's file source over the paths, cast to the Python path's types. Its
        # file index holds the files' statuses, taken on the driver: nothing is listed (a
        # listing is a Spark job of a task per file past 32 files), and a planned path that
        # is not a file (a directory, whose entries a listing would read) is refused
        # (_unplanned); None when the index does not hold every planned file, and such a
        # read takes the Python path
        try:
            jdf = routing.plannedRead(jsession, session_settings, source, schema.json(), output.json(),
                                      _encode(read_options), "\0".join(paths))
        except Exception as exc:
            unplanned = _unplanned(exc, location)
            if unplanned is None:
                raise
            raise unplanned from None
        if jdf is None:
            return None, f"Spark's Parquet source does not list all {len(paths)} planned data files"
        parts.append(DataFrame(jdf, spark))
    if rest:
        parts.append(_python_part(spark, rest, scan, output, table, location))
    frame = parts[0]
    for part in parts[1:]:
        frame = frame.unionAll(part)
    return frame, ""


#: what NativeRouting.plannedRead throws for a listed file the read did not plan
_UNPLANNED_CLASS = ROUTING_CLASS + "$UnplannedFile"


def _unplanned(exc: Exception, location: str) -> Exception | None:
    """A FormatError naming the table and the file when ``exc`` is plannedRead refusing a
    file Spark's file source lists but the read did not plan (a planned data file replaced
    by a directory, e.g. one holding a link to another table's file): never read."""
    from icecrypt.errors import FormatError
    from icecrypt.spark._iceberg import NAME

    java = getattr(exc, "java_exception", None)
    if java is None or java.getClass().getName() != _UNPLANNED_CLASS:
        return None
    return FormatError(f"{NAME}: table {location}: {java.getMessage()}")


def _python_part(spark: Any, tasks: list[Any], scan: Any, output: Any, table: Any, location: str) -> Any:
    """The rows of ``tasks`` read by read_task in Python workers, one task per partition."""
    from icecrypt.spark._schema import Projection

    projection = Projection(scan.arrow_schema, output, f"{NAME}: table {location}")
    read = functools.partial(_read_tasks, tuple(tasks), table.filesystem, projection, location)
    return spark.range(0, len(tasks), numPartitions=len(tasks)).mapInArrow(read, output)


def _read_tasks(tasks: tuple, filesystem: Any, projection: Any, location: str, batches: Iterator[Any]) -> Iterator[Any]:
    from icecrypt.spark._common import file_error
    from icecrypt.table import read_task

    for batch in batches:
        for index in batch.column(0).to_pylist():
            try:
                for rows in read_task(tasks[index], filesystem):
                    yield projection.apply(rows)
            except Exception as exc:
                raise file_error(exc, f"{NAME}: task {index} of table {location}") from exc
