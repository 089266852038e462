"""``icecrypt table ...``: create, append to, scan, list, verify and expire Iceberg tables.

A TABLE argument is a table directory (Hadoop layout: ``metadata/v<N>.metadata.json``),
a ``metadata.json`` file, or a URI (``s3://bucket/path``) pyarrow can open.  The KMS
comes from the same properties as ``icecrypt keys`` and Iceberg's catalogs
(``--kms-type local --kms-property encryption.kms.local.keystore=PATH``); plaintext
tables need none.  ``verify`` exits with the status of the worst problem it found:
2 damaged (authentication or format), 3 unencrypted, 4 key missing, 1 missing file.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import re
import sys
from collections.abc import Iterator
from typing import Any

from icecrypt.cli._text import safe

__all__ = ["register"]

#: exit status per verify problem kind, worst first
VERIFY_EXIT = {"damaged": 2, "unencrypted": 3, "key-missing": 4, "missing": 1, "error": 1}


def register(subparsers: Any) -> Any:
    """Add the ``table`` command group to an argparse subparsers object."""
    table = subparsers.add_parser("table", help="encrypted Iceberg tables: create, append, scan, verify ...")
    sub = table.add_subparsers(dest="table_command", metavar="COMMAND", required=True)

    p = sub.add_parser("create", help="create a format-version 3 table (encrypted with --table-key-id)")
    p.add_argument("location", help="table directory or URI to create")
    schema = p.add_mutually_exclusive_group(required=True)
    schema.add_argument("--schema", help="columns, e.g. 'id long required, name string, price decimal(10, 2)'")
    schema.add_argument("--schema-from", metavar="FILE", help="take the schema of a Parquet/CSV/JSON/Arrow file")
    p.add_argument("--partition-by", action="append", default=[], metavar="FIELD",
                   help="partition field (repeatable): COLUMN, or a transform such as day(ts), bucket(16, id)")
    p.add_argument("--table-key-id", help="KMS master key id (encryption.key-id); omit for a plaintext table")
    p.add_argument("--property", action="append", default=[], metavar="K=V", help="table property (repeatable)")
    _add_common(p, table_arg=False)
    p.set_defaults(func=_create)

    p = sub.add_parser("append", help="append rows from Parquet/CSV/JSON/Arrow files (one commit)")
    p.add_argument("table")
    p.add_argument("files", nargs="+", metavar="FILE", help="input files (format by extension)")
    p.add_argument("--format", choices=("parquet", "avro"), help="data file format (default: table property)")
    _add_common(p)
    p.set_defaults(func=_append)

    p = sub.add_parser("scan", help="read rows (CSV to stdout, or --output FILE)")
    p.add_argument("table")
    p.add_argument("--columns", help="comma-separated columns (default: all)")
    p.add_argument("--filter", dest="row_filter", help="row filter, e.g. \"id > 5 and category = 'a'\"")
    p.add_argument("--snapshot", "--snapshot-id", dest="snapshot", type=int, help="snapshot id (time travel)")
    p.add_argument("--as-of-timestamp", metavar="TIME",
                   help="the snapshot current at TIME: ISO date/time (UTC unless it says) or ms since the epoch")
    p.add_argument("--branch", help="read the head of this branch")
    p.add_argument("--tag", help="read the snapshot of this tag")
    p.add_argument("--limit", type=_row_count, metavar="N", help="stop after this many rows (0 or more)")
    p.add_argument("--output", "-o", help="write to a file instead: .parquet, .csv, .jsonl, .arrow (plaintext!)")
    p.add_argument("--count", action="store_true", help="print only the number of rows")
    _add_common(p)
    p.set_defaults(func=_scan)

    p = sub.add_parser("snapshots", help="list snapshots")
    p.add_argument("table")
    p.add_argument("--json", action="store_true")
    _add_common(p)
    p.set_defaults(func=_snapshots)

    from icecrypt._metadata_tables import METADATA_TABLES

    p = sub.add_parser(
        "inspect", help="print a metadata table (snapshots, files, manifests, partitions, ...) as JSON lines",
        description="Print one of the table's metadata tables, one JSON object per row (non-ASCII and control "
                    "characters escaped, binary values as hex; key metadata shows as a key fingerprint, never a key).",
        epilog="examples:\n  icecrypt table inspect warehouse/db/orders snapshots\n"
               "  icecrypt table inspect warehouse/db/orders files --snapshot 4487484300036148224 --columns file_path,record_count\n"
               "  icecrypt table inspect db.orders partitions --catalog uri=sqlite:///cat.db --catalog warehouse=wh -o p.parquet",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("table")
    p.add_argument("name", choices=METADATA_TABLES, metavar="NAME", help=f"one of: {', '.join(METADATA_TABLES)}")
    p.add_argument("--snapshot", type=int, help="snapshot id (manifests, entries, files, data_files, delete_files, partitions)")
    p.add_argument("--columns", help="comma-separated columns (default: all)")
    p.add_argument("--output", "-o", help="write to a file instead: .parquet, .jsonl, .arrow")
    _add_common(p)
    p.set_defaults(func=_inspect)

    p = sub.add_parser("verify", help="authenticate every file of every snapshot (exit status says what is wrong)")
    p.add_argument("table")
    p.add_argument("--snapshot", type=int, help="verify this snapshot only")
    p.add_argument("--json", action="store_true")
    _add_common(p)
    p.set_defaults(func=_verify)

    p = sub.add_parser("expire", help="remove old snapshots and the files and keys only they need")
    p.add_argument("table")
    p.add_argument("--older-than", required=True,
                   help="ISO date/time (UTC unless given), milliseconds since the epoch, or an age like 7d, 12h, 30m")
    _add_common(p)
    p.set_defaults(func=_expire)

    p = sub.add_parser("rotate-keys", help="commit a new KEK and/or move every KEK to a new master key")
    p.add_argument("table")
    p.add_argument("--no-new-kek", dest="new_kek", action="store_false",
                   help="only re-wrap the KEKs (with --new-master-key); by default a new KEK is created")
    p.add_argument("--new-master-key", metavar="ID", help="re-wrap every KEK under this KMS master key")
    _add_common(p)
    p.set_defaults(func=_rotate_keys)

    p = sub.add_parser(
        "authenticate-metadata",
        help="add an authenticator to the current metadata version of an encrypted table (after checking it)",
        description="Commit the table's current version again with an icecrypt authenticator under a key only the "
                    "KMS can unwrap, so that readers with --require-authenticated-metadata accept it and every later "
                    "icecrypt commit chains to it.  Run it on a version you trust: a table made before authentication "
                    "existed, or after another engine (Iceberg Java, PyIceberg) committed.  Nothing is written when "
                    "the version is authenticated already.",
    )  # fmt: skip
    p.add_argument("table")
    _add_common(p)
    p.set_defaults(func=_authenticate_metadata)

    p = sub.add_parser("repair", help="restore keys a writer without encryption support dropped (from the metadata log)")
    p.add_argument("table")
    p.add_argument("--dry-run", action="store_true", help="find and authenticate the keys, commit nothing")
    _add_common(p)
    p.set_defaults(func=_repair)
    _register_maintenance(sub)
    return sub


def _add_common(p: argparse.ArgumentParser, *, table_arg: bool = True) -> None:
    p.add_argument("--kms-type", help="encryption.kms-type of the KMS holding the table key")
    p.add_argument("--kms-property", action="append", default=[], metavar="K=V",
                   help="KMS property (repeatable), e.g. encryption.kms.local.keystore=PATH")
    if table_arg:
        p.add_argument("--location-map", action="append", default=[], metavar="PREFIX=PATH",
                       help="read recorded locations under PREFIX from PATH (repeatable)")
        p.add_argument("--require-encryption", action="store_true",
                       help="refuse the table unless it is encrypted (a version without encryption.key-id, "
                            "as whoever can write the storage could commit, is an error)")
        p.add_argument("--require-authenticated-metadata", action="store_true",
                       help="refuse a metadata version without a valid icecrypt authenticator (implies "
                            "--require-encryption; see docs/security.md)")
        p.add_argument("--expect-key-id", metavar="ID",
                       help="the KMS master key id the table must be encrypted under (pins it; refused otherwise)")
        p.add_argument("--data-location", metavar="PATH",
                       help="the table's write.data.path, when it lies outside the table directory (a load by path "
                            "trusts no other location the metadata names)")
    # --- catalog options (icecrypt.catalog; catalog-core) ---
    p.add_argument("--catalog", action="append", default=[], metavar="K=V",
                   help="catalog property (repeatable: uri=..., warehouse=..., type=sql|glue, s3.*); "
                        "the table is then an identifier such as db.orders")
    p.add_argument("--catalog-name", default="default", help="the catalog's name (default: default)")
    # --- end catalog options ---
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars or notes on stderr")


# --- helpers -----------------------------------------------------------------------------------


def _row_count(text: str) -> int:
    """argparse type of ``--limit``: a number of rows, 0 to 2**63 - 1 (a negative one
    reached pyarrow's slice, which aborted the interpreter with a C++ length_error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of rows") from None
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"{value} is not a number of rows (0 or more)")
    return value


def _pairs(items: list[str], option: str) -> dict[str, str]:
    result = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"{option} expects K=V, got {item!r}")
        result[name] = value
    return result


def _kms(args: argparse.Namespace) -> Any:
    """The KMS client the options describe, or None when none is described."""
    if not args.kms_type and not args.kms_property:
        return None
    from icecrypt.cli._keys import _kms_from_args

    return _kms_from_args(args)


def _filesystem(location: str) -> tuple[Any, str]:
    """(pyarrow filesystem or None for local, path) for a CLI location."""
    if "://" in location and not location.startswith("file:"):
        import pyarrow.fs as pafs

        return pafs.FileSystem.from_uri(location)
    return None, location


def _load(args: argparse.Namespace, kms: Any, *, check_keys: bool = True) -> Any:
    """The TABLE argument loaded; ``check_keys=False`` (verify, repair) also opens a table
    whose metadata lost keys (KeysLostError otherwise)."""
    from icecrypt.table import EncryptedTable

    # --- a table by catalog identifier (catalog-core) ---
    if args.catalog:
        return _catalog(args, kms, existing=True).load_table(
            args.table, check_keys=check_keys, require_encryption=args.require_encryption,
            table_key_id=args.expect_key_id, require_authenticated_metadata=args.require_authenticated_metadata or None,
        )  # fmt: skip
    # --- end ---
    filesystem, path = _filesystem(args.table)
    return EncryptedTable.load(path, kms=kms, filesystem=filesystem, check_keys=check_keys,
                               location_map=_pairs(args.location_map, "--location-map") or None,
                               require_encryption=args.require_encryption, table_key_id=args.expect_key_id,
                               require_authenticated_metadata=args.require_authenticated_metadata,
                               data_location=args.data_location)  # fmt: skip


# --- catalog helper (catalog-core) ---
def _catalog(args: argparse.Namespace, kms: Any, *, existing: bool = False) -> Any:
    """The catalog the --catalog options describe (KMS from the --kms-* options).
    ``existing``: the command works on a table that must exist already (every command
    but ``table create``), so the catalog must exist too: it never creates a catalog
    database or its tables (scan, inspect, verify... of a mistyped SQLite path made one)."""
    from icecrypt.catalog import load_catalog

    properties = _pairs(args.catalog, "--catalog")
    if existing:
        properties = _existing_catalog(args.catalog_name, properties)
    return load_catalog(args.catalog_name, kms=kms, **properties)


def _existing_catalog(name: str, properties: dict[str, str]) -> dict[str, str]:
    """``properties`` of an SQL catalog opened without creating anything: its tables not
    created (``init_catalog_tables=false``), and its SQLite database file, named by the
    uri or the default under a local warehouse, required to exist (CatalogError
    otherwise; SQLite would create an empty one when connecting)."""
    import os

    from icecrypt.errors import CatalogError

    if str(properties.get("type") or "sql").strip().lower() != "sql":
        return properties
    properties = {**properties, "init_catalog_tables": "false"}
    if not properties.get("uri"):
        if not properties.get("warehouse"):
            return properties  # the catalog says what it needs
        from icecrypt.catalog._sql import DEFAULT_SQLITE_NAME, _local_warehouse_path

        # the catalog's default database, named here so that opening it creates no directory
        path = os.path.join(_local_warehouse_path(properties["warehouse"]), DEFAULT_SQLITE_NAME)
        properties["uri"] = f"sqlite:///{path}"
    path = _sqlite_file(properties["uri"])
    if path is not None and not os.path.isfile(path):
        raise CatalogError(f"catalog {name!r}: the SQLite database {path} does not exist (a command on an existing "
                           "table never creates a catalog; check --catalog uri=... or warehouse=...)")
    return properties


def _sqlite_file(uri: str) -> str | None:
    """The database file an SQLite URL names; None for another database, an in-memory
    one, or an SQLite URI filename (``sqlite:///file:...``)."""
    try:
        from sqlalchemy.engine import make_url

        url = make_url(uri)
    except Exception:  # noqa: BLE001 - no SQLAlchemy, or no URL: the catalog reports it
        return None
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return None
    if url.database.startswith("file:"):
        return None
    return url.database
# --- end catalog helper ---


def _note(args: argparse.Namespace, text: str) -> None:
    if not args.quiet:
        print(text, file=sys.stderr)


def _progress(args: argparse.Namespace, total: int, label: str) -> Any:
    """A progress bar on stderr (terminals only, long work only; never with --quiet)."""
    from icecrypt._progress import Progress

    return Progress(total, label, threshold=1 << 62 if args.quiet else 64 << 20)


# --- schema and partitioning from the command line ------------------------------------------------


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside parentheses (``decimal(10, 2)`` stays whole)."""
    from icecrypt.table.ops.sort_order import split_terms

    return [p for p in split_terms(text) if p]


def parse_schema(text: str) -> Any:
    """A PyIceberg schema from ``'id long required, name string, price decimal(10, 2)'``
    (primitive Iceberg types; ``required`` or ``not null`` marks required columns)."""
    from pydantic import ValidationError
    from pyiceberg.schema import Schema
    from pyiceberg.types import NestedField

    fields = []
    for number, column in enumerate(_split_top_level(text), start=1):
        match = re.fullmatch(r"(\S+)\s+(.+?)(\s+(required|not\s+null))?", column, flags=re.IGNORECASE)
        if match is None:
            raise ValueError(f"--schema: expected 'NAME TYPE [required]', got {column!r}")
        name, type_text, required = match.group(1), match.group(2).strip().lower(), match.group(3) is not None
        try:
            fields.append(NestedField.model_validate({"id": number, "name": name, "type": type_text, "required": required}))
        except ValidationError:
            raise ValueError(f"--schema: unknown type {type_text!r} for column {name!r}") from None
    if not fields:
        raise ValueError("--schema: no columns")
    return Schema(*fields)


def parse_partition(schema: Any, fields: list[str]) -> Any:
    """A partition spec from ``COLUMN`` / ``transform(COLUMN)`` / ``bucket(N, COLUMN)`` /
    ``truncate(W, COLUMN)`` items."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import parse_transform

    result = []
    for number, item in enumerate(fields):
        item = item.strip()
        from icecrypt.table.ops.sort_order import parse_term

        column, transform = parse_term(item)
        name = transform.split("[")[0]
        label = f"{column}_{name}" if name != "identity" else column
        source = schema.find_field(column)
        try:
            parsed = parse_transform(transform)
        except ValueError:
            raise ValueError(f"--partition-by: unknown transform in {item!r}") from None
        result.append(PartitionField(source_id=source.field_id, field_id=1000 + number, transform=parsed, name=label))
    return PartitionSpec(*result)


def _read_input(path: str) -> Any:
    """A pyarrow dataset over one input file (streamed, not loaded whole)."""
    import pyarrow.dataset as ds

    suffix = path.lower().rsplit(".", 1)[-1]
    formats = {"parquet": "parquet", "csv": "csv", "json": "json", "jsonl": "json", "ndjson": "json",
               "arrow": "ipc", "feather": "ipc", "ipc": "ipc"}
    if suffix not in formats:
        raise ValueError(f"{path}: unknown input format (use .parquet, .csv, .json/.jsonl or .arrow)")
    return ds.dataset(path, format=formats[suffix])


# --- handlers ---------------------------------------------------------------------------------------


def _create(args: argparse.Namespace) -> int:
    from icecrypt.table import EncryptedTable

    schema = parse_schema(args.schema) if args.schema else _read_input(args.schema_from).schema
    if not args.schema:
        from icecrypt.table.model.schema import iceberg_schema

        schema = iceberg_schema(schema)
    spec = parse_partition(schema, args.partition_by) if args.partition_by else None
    properties = _pairs(args.property, "--property")
    kms = _kms(args)
    if args.table_key_id and kms is None:
        raise ValueError("an encrypted table (--table-key-id) needs a KMS: --kms-type and --kms-property")
    if args.catalog:  # --- LOCATION is an identifier in a catalog (catalog-core) ---
        catalog = _catalog(args, kms)
        namespace = args.location.rsplit(".", 1)[0] if "." in args.location else args.location
        if not catalog.namespace_exists(namespace):
            catalog.create_namespace(namespace)
        table = catalog.create_table(args.location, schema, table_key_id=args.table_key_id, partition_spec=spec,
                                     properties=properties)
    else:
        filesystem, location = _filesystem(args.location)
        table = EncryptedTable.create(location, schema, kms=kms, table_key_id=args.table_key_id,
                                      partition_spec=spec, properties=properties, filesystem=filesystem)
    state = f"encrypted under {args.table_key_id!r}" if table.encrypted else "plaintext"
    print(f"created {state} table {table.location} ({table.metadata_location})")
    return 0


def _append(args: argparse.Namespace) -> int:
    import os

    table = _load(args, _kms(args))
    target = table.schema
    from icecrypt.table.files.read import arrow_schema

    schema = arrow_schema(target)
    datasets = [_read_input(path) for path in args.files]
    total = sum(os.path.getsize(path) for path in args.files if "://" not in path)
    rows = 0

    def batches(bar: Any) -> Iterator[Any]:
        nonlocal rows
        for path, dataset in zip(args.files, datasets):
            names = [name for name in schema.names if name in dataset.schema.names]
            defaulted = {f.name for f in target.fields if f.write_default is not None}
            missing = [f.name for f in schema if f.name not in names and not f.nullable and f.name not in defaulted]
            if missing:
                raise ValueError(f"{path}: lacks required column(s) {', '.join(missing)}")
            for batch in dataset.to_batches(columns=names):
                rows += batch.num_rows
                yield _conform(batch, schema)
            bar.update(os.path.getsize(path) if "://" not in path else 0)

    options = {"file_format": args.format} if args.format else {}
    with _progress(args, total, "append") as bar:
        snapshot_id = table.append(batches(bar), **options)
    print(f"appended {rows} rows: snapshot {snapshot_id} ({table.metadata_location})")
    return 0


def _conform(batch: Any, schema: Any) -> Any:
    """``batch`` with the table's columns it has, by name, cast to the table's types; the
    append fills the others (a column's ``write-default``, else nulls)."""
    import pyarrow as pa

    fields = [field for field in schema if field.name in batch.schema.names]
    arrays = []
    for field in fields:
        column = batch.column(field.name)
        arrays.append(column if column.type == field.type else column.cast(field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


def _scan(args: argparse.Namespace) -> int:
    import pyarrow as pa

    from icecrypt.table import read_task

    table = _load(args, _kms(args))
    columns = [c.strip() for c in args.columns.split(",")] if args.columns else None
    as_of = None if args.as_of_timestamp is None else parse_time(args.as_of_timestamp, option="--as-of-timestamp",
                                                                 ages=False)
    try:
        scan = table.scan(columns=[] if args.count else columns, row_filter=args.row_filter, snapshot_id=args.snapshot,
                          as_of_timestamp=as_of, branch=args.branch, tag=args.tag)
    except KeyError as exc:  # an unknown snapshot, branch or tag: one line, not a traceback
        raise ValueError(exc.args[0] if exc.args else str(exc)) from None
    if args.count:
        print(sum(b.num_rows for b in scan.to_batches()))
        return 0
    tasks = scan.plan_files()
    schema = scan.arrow_schema
    cache: dict = {}
    remaining = args.limit
    with _progress(args, sum(t.length for t in tasks), "scan") as bar, _sink(args.output, schema) as write:
        for task in tasks:
            for batch in read_task(task, table.filesystem, cache=cache):
                if remaining is not None:
                    batch = batch.slice(0, remaining)
                    remaining -= batch.num_rows
                write(pa.Table.from_batches([batch], schema=schema))
                if remaining == 0:
                    return 0
            bar.update(task.length)
    return 0


class _sink:
    """Writes tables to stdout (CSV) or to a file whose extension names the format.

    The file is written as ``icecrypt decrypt`` writes: decrypted rows go to a temporary
    file of mode 0600 beside the target that takes the target's name only when the scan
    completed (a symlink there is replaced, its target untouched); a failed scan leaves
    the target as it was, and no temporary file.  While the file is written, SIGTERM and
    SIGHUP end the command through the same cleanup (exit status 128 + the signal)
    instead of leaving the temporary file of decrypted rows behind.
    """

    #: signals whose default action would end the process without the cleanup
    SIGNALS = ("SIGTERM", "SIGHUP")

    def __init__(self, output: str | None, schema: Any):
        self.output, self.schema = output, schema
        self.writer: Any = None
        self.atomic: Any = None
        self.header = True
        self.handlers: dict[int, Any] = {}

    def __enter__(self) -> Any:
        import pyarrow as pa
        import pyarrow.csv as pacsv
        import pyarrow.parquet as pq

        from icecrypt._atomic import AtomicFile

        out = self.output
        if out is None:
            return self._stdout_csv
        suffix = out.lower().rsplit(".", 1)[-1]
        if suffix not in ("parquet", "csv", "arrow", "feather", "ipc", "jsonl", "json", "ndjson"):
            raise ValueError(f"{out}: unknown output format (use .parquet, .csv, .jsonl or .arrow)")
        self._catch_signals()
        try:
            self.atomic = AtomicFile(out)
        except BaseException:
            self._restore_signals()
            raise
        self.sink = io.BufferedWriter(self.atomic.file, 1 << 20)
        try:
            if suffix == "parquet":
                self.writer = pq.ParquetWriter(self.sink, self.schema)
            elif suffix == "csv":
                self.writer = pacsv.CSVWriter(self.sink, self.schema)
            elif suffix in ("arrow", "feather", "ipc"):
                self.writer = pa.ipc.new_file(self.sink, self.schema)
            else:
                self.writer = _JsonLines(self.sink)
        except BaseException:
            try:
                self._close(failed=True)
            finally:
                self._restore_signals()
            raise
        return self.writer.write_table

    def _stdout_csv(self, table: Any) -> None:
        import pyarrow.csv as pacsv

        buffer = io.BytesIO()
        pacsv.write_csv(table, buffer, pacsv.WriteOptions(include_header=self.header))
        self.header = False
        if sys.stdout.isatty():  # values from storage on a terminal: controls shown escaped
            sys.stdout.write(buffer.getvalue().decode("utf-8", "backslashreplace"))
        else:
            sys.stdout.buffer.write(buffer.getvalue())

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        if self.atomic is None:
            sys.stdout.flush()
            return
        try:
            self._close(failed=exc_type is not None)
        finally:
            self._restore_signals()

    def _catch_signals(self) -> None:
        """Make SIGTERM and SIGHUP raise SystemExit here (main thread only: elsewhere the
        process's handlers cannot be changed)."""
        import signal
        import threading

        if threading.current_thread() is not threading.main_thread():
            return

        def terminated(signum: int, frame: Any) -> None:
            raise SystemExit(128 + signum)

        for name in self.SIGNALS:
            number = getattr(signal, name, None)
            if number is not None and signal.getsignal(number) == signal.SIG_DFL:
                self.handlers[number] = signal.signal(number, terminated)

    def _restore_signals(self) -> None:
        import signal

        for number, handler in self.handlers.items():
            signal.signal(number, handler)
        self.handlers = {}

    def _close(self, *, failed: bool) -> None:
        """Finish the file and give it the target's name, or (``failed``) remove it."""
        try:
            try:
                if self.writer is not None:
                    self.writer.close()
            finally:
                self.sink.close()
        except BaseException:
            self.atomic.discard()
            if failed:
                return  # the scan's own error is the one to report
            raise
        if failed:
            self.atomic.discard()
        else:
            self.atomic.commit(fsync=False)


class _JsonLines:
    def __init__(self, sink: Any):
        self.file = io.TextIOWrapper(sink, encoding="utf-8", newline="\n")

    def write_table(self, table: Any) -> None:
        for row in table.to_pylist():
            self.file.write(json.dumps(row, default=str, ensure_ascii=False) + "\n")

    def close(self) -> None:
        self.file.flush()


def _inspect(args: argparse.Namespace) -> int:
    table = _load(args, _kms(args))
    result = table.inspect.table(args.name, snapshot_id=args.snapshot)
    if args.columns:
        wanted = [c.strip() for c in args.columns.split(",")]
        unknown = [c for c in wanted if c not in result.column_names]
        if unknown:
            raise ValueError(f"metadata table {args.name} has no column(s) {', '.join(unknown)}; "
                             f"its columns are: {', '.join(result.column_names)}")
        result = result.select(wanted)
    if args.output is not None:
        with _sink(args.output, result.schema) as write:
            write(result)
        return 0
    for row in result.to_pylist():
        # ensure_ascii: control and non-ASCII characters from the metadata come out escaped
        sys.stdout.write(json.dumps(row, default=_json_value, ensure_ascii=True) + "\n")
    return 0


def _json_value(value: Any) -> Any:
    """JSON for what metadata tables hold besides JSON's own types."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    return str(value)  # decimals, UUIDs


def _snapshots(args: argparse.Namespace) -> int:
    table = _load(args, _kms(args))
    current = table.current_snapshot_id
    rows = [
        {
            "snapshot-id": s.snapshot_id,
            "parent-snapshot-id": s.parent_snapshot_id,
            "sequence-number": s.sequence_number,
            "timestamp": datetime.datetime.fromtimestamp(s.timestamp_ms / 1000, datetime.timezone.utc).isoformat(timespec="milliseconds"),
            "operation": s.operation,
            "key-id": s.key_id,
            "total-records": s.summary.get("total-records"),
            "current": s.snapshot_id == current,
        }
        for s in table.snapshots()
    ]
    if args.json:
        json.dump({"table": table.location, "encrypted": table.encrypted, "snapshots": rows}, sys.stdout, indent=2)
        print()
        return 0
    header = ("SNAPSHOT-ID", "SEQ", "TIMESTAMP (UTC)", "OPERATION", "RECORDS", "KEY-ID")
    lines = [header] + [
        (("*" if r["current"] else " ") + str(r["snapshot-id"]), str(r["sequence-number"]), r["timestamp"],
         r["operation"] or "-", r["total-records"] or "-", r["key-id"] or "-")
        for r in rows
    ]
    lines = [tuple(map(safe, line)) for line in lines]  # operation and key id come from storage
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip())
    return 0


def _verify(args: argparse.Namespace) -> int:
    table = _load(args, _kms(args), check_keys=False)  # lost keys are problems to report
    report = table.verify(args.snapshot, progress=lambda total: _progress(args, total, "verify"))
    if args.json:
        import dataclasses

        data = dataclasses.asdict(report)
        data["ok"] = report.ok
        json.dump(data, sys.stdout, indent=2)
        print()
    else:  # one line per problem, whatever its path or message holds
        print(safe(report.summary()))
        for problem in report.problems:
            print(f"  {safe(problem)}")
    if report.ok:
        return 0
    kinds = {p.kind for p in report.problems}
    return next(status for kind, status in VERIFY_EXIT.items() if kind in kinds)


def parse_time(text: str, *, now_ms: int | None = None, option: str = "--older-than", ages: bool = True) -> int:
    """Milliseconds since the epoch from an ISO date/time (UTC unless it says), a
    number of milliseconds, or (``ages``) an age (``7d``, ``12h``, ``30m``, ``45s``)
    before now.  ``option`` names the option in the error."""
    text = text.strip()
    if re.fullmatch(r"\d{10,}", text):
        return int(text)
    age = re.fullmatch(r"(\d+)\s*([dhms])", text) if ages else None
    now = now_ms if now_ms is not None else int(datetime.datetime.now(datetime.timezone.utc).timestamp() * 1000)
    if age:
        seconds = int(age.group(1)) * {"d": 86400, "h": 3600, "m": 60, "s": 1}[age.group(2)]
        return now - seconds * 1000
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        what = "a date/time, milliseconds or age" if ages else "a date/time or milliseconds"
        raise ValueError(f"{option}: not {what}: {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return int(moment.timestamp() * 1000)


def _expire(args: argparse.Namespace) -> int:
    table = _load(args, _kms(args))
    removed = table.expire_snapshots(parse_time(args.older_than))
    removed = list(removed or ())
    print(f"expired {len(removed)} snapshot(s){': ' + ', '.join(map(str, removed)) if removed else ''}")
    return 0


def _rotate_keys(args: argparse.Namespace) -> int:
    if not args.new_kek and not args.new_master_key:
        raise ValueError("nothing to rotate: --no-new-kek needs --new-master-key")
    table = _load(args, _kms(args))
    summary = table.rotate_keys(new_kek=args.new_kek, new_master_key_id=args.new_master_key)
    if args.new_master_key:
        print(f"re-wrapped {len(summary['rewrapped_kek_ids'])} KEK(s) under master key {summary['table_key_id']!r}")
    if summary.get("kek_id"):
        print(f"new KEK {summary['kek_id']}")
    print(f"committed {table.metadata_location}")
    return 0


def _repair(args: argparse.Namespace) -> int:
    table = _load(args, _kms(args), check_keys=False)
    report = table.repair_keys(dry_run=args.dry_run)
    print(_safe_repair_report(report))
    return 0


def _safe_repair_report(report: Any) -> str:
    """The report's text with every name in it (key ids, metadata files: all from
    storage) escaped to one line."""
    import dataclasses

    return str(dataclasses.replace(
        report,
        metadata_location=safe(report.metadata_location),
        restored_key_ids={sid: safe(key_id) for sid, key_id in report.restored_key_ids.items()},
        restored_entries={safe(key_id): safe(source) for key_id, source in report.restored_entries.items()},
        dropped_by=None if report.dropped_by is None else safe(report.dropped_by),
        committed_location=None if report.committed_location is None else safe(report.committed_location),
    ))  # fmt: skip


# --- maintenance (icecrypt.table.maintenance.actions) ---------------------------------------------------


def _authenticate_metadata(args: argparse.Namespace) -> int:
    table = _load(args, _kms(args))
    before = table.metadata_location
    location = table.authenticate_metadata()
    if location is None:
        print(f"{safe(before)}: already authenticated; nothing written")
    else:
        print(f"{safe(before)}: authenticated as {safe(location)}")
    return 0


def _register_maintenance(sub: Any) -> None:
    p = sub.add_parser("rewrite-manifests", help="regroup manifests by partition, new manifests under fresh keys")
    p.add_argument("table")
    p.add_argument("--target-size", type=int, help="bytes per manifest (default commit.manifest.target-size-bytes)")
    _add_common(p)
    p.set_defaults(func=_rewrite_manifests)

    p = sub.add_parser("rewrite-data-files", help="bin-pack small data files (deletes applied) under fresh DEKs")
    p.add_argument("table")
    p.add_argument("--target-file-size", type=int, help="bytes (default write.target-file-size-bytes)")
    p.add_argument("--filter", help="rewrite only files that may hold rows matching this filter")
    p.add_argument("--option", action="append", default=[], metavar="K=V",
                   help="Java's rewrite option, e.g. min-input-files=2, rewrite-all=true (repeatable)")
    p.add_argument("--strategy", choices=("binpack", "sort"), help="binpack (default) or sort (Java's strategies)")
    p.add_argument("--sort-order", help="for --strategy sort: 'id DESC NULLS LAST, name', or 'zorder(id, name)' "
                                        "(default: the table's order)")
    _add_common(p)
    p.set_defaults(func=_rewrite_data_files)

    p = sub.add_parser("rewrite-position-delete-files",
                       help="turn v2-format position-delete files into deletion vectors (rows unchanged)")
    p.add_argument("table")
    p.add_argument("--filter", help="rewrite only delete files of data files that may hold rows matching this filter")
    p.add_argument("--option", action="append", default=[], metavar="K=V",
                   help="Java's option, e.g. rewrite-all=true, min-input-files=2 (repeatable)")
    _add_common(p)
    p.set_defaults(func=_rewrite_position_delete_files)

    p = sub.add_parser("rekey", help="compromise response: re-encrypt what leaked keys protect, rotate the KEK")
    p.add_argument("table")
    p.add_argument("--file", action="append", default=[], help="a file whose DEK leaked (repeatable)")
    p.add_argument("--snapshot", action="append", default=[], type=int, help="a snapshot whose manifest-list key leaked")
    p.add_argument("--kek", action="append", default=[], help="a KEK id that leaked (repeatable)")
    p.add_argument("--all", action="store_true", help="every key of the table leaked")
    p.add_argument("--new-master-key", help="also re-wrap every KEK under this KMS master key")
    p.add_argument("--expire", action="store_true",
                   help="expire every older snapshot, delete their files and the older metadata files")
    _add_common(p)
    p.set_defaults(func=_rekey)

    p = sub.add_parser("add-files", help="add Parquet files under a plaintext table's directory as they are "
                                         "(Iceberg's add_files: one append, partitions from col=value directories)")
    p.add_argument("table")
    p.add_argument("source", nargs="+", help="a directory (its Parquet files, under col=value directories if "
                                             "partitioned) or Parquet files, under the table's location")
    p.add_argument("--partition-filter", action="append", default=[], metavar="COL=VALUE",
                   help="only a directory's files of this partition (repeatable)")
    p.add_argument("--allow-duplicates", action="store_true",
                   help="add a file the current snapshot already holds (its rows then count twice)")
    _add_common(p)
    p.set_defaults(func=_add_files)

    p = sub.add_parser("remove-orphan-files", help="delete files under the table location no metadata references")
    p.add_argument("table")
    p.add_argument("--older-than", help="only files modified before this (default: 3 days ago); as for expire")
    p.add_argument("--dry-run", action="store_true", help="list, do not delete")
    _add_common(p)
    p.set_defaults(func=_remove_orphan_files)


def _add_files(args: argparse.Namespace) -> int:
    import pyarrow.fs as pafs

    from icecrypt.table.ops.add_files import list_files

    table = _load(args, _kms(args))
    wanted = _pairs(args.partition_filter, "--partition-filter")
    files: list[str] = []
    partitions: dict[str, dict[str, str | None]] = {}
    for source in args.source:
        if "://" not in source and not source.startswith("file:"):
            source = os.path.abspath(source)  # the manifests record where the file is, never a relative path
        path = table.fs_path(source, what="add-files source")
        if table.filesystem.get_file_info(path).type == pafs.FileType.Directory:
            for found in list_files(table.filesystem, path, source, None, wanted):
                files.append(found.location)
                if found.partition:
                    partitions[found.location] = found.partition
        elif wanted:
            raise ValueError(f"{source}: --partition-filter selects among a directory's files, not a file")
        else:
            files.append(source)
    result = table.add_files(files, partition_values=partitions, check_duplicate_files=not args.allow_duplicates)
    print(f"added {result.added_files} file(s) in {result.changed_partitions} partition(s); "
          f"snapshot {result.snapshot_id}")
    return 0


def _rewrite_manifests(args: argparse.Namespace) -> int:
    result = _load(args, _kms(args)).rewrite_manifests(target_size=args.target_size)
    print(f"rewrote {result.rewritten_manifests} manifest(s) into {result.added_manifests}; snapshot {result.snapshot_id}")
    return 0


def _rewrite_data_files(args: argparse.Namespace) -> int:
    table = _load(args, _kms(args))
    result = table.rewrite_data_files(args.target_file_size, args.filter, options=_pairs(args.option, "--option"),
                                      strategy=args.strategy, sort_order=args.sort_order)  # fmt: skip
    print(f"rewrote {result.rewritten_data_files} data file(s) into {result.added_data_files}, removed "
          f"{result.removed_delete_files} delete file(s); snapshot {result.snapshot_id}")
    return 0


def _rewrite_position_delete_files(args: argparse.Namespace) -> int:
    table = _load(args, _kms(args))
    result = table.rewrite_position_delete_files(args.filter, _pairs(args.option, "--option"))
    print(f"rewrote {result.rewritten_delete_files} position-delete file(s) into {result.added_delete_files} "
          f"deletion vector(s); snapshot {result.snapshot_id}")
    return 0


def _rekey(args: argparse.Namespace) -> int:
    if not (args.file or args.snapshot or args.kek or args.all):
        raise ValueError("rekey: name what leaked: --file, --snapshot, --kek or --all")
    table = _load(args, _kms(args))
    result = table.rekey(files=args.file, snapshot_ids=args.snapshot, kek_ids=args.kek, everything=args.all,
                         new_master_key_id=args.new_master_key, expire=args.expire)
    rewritten = result.rewrite.rewritten_data_files if result.rewrite else 0
    print(f"retired {len(result.retired_fingerprints)} key(s) and {len(result.retired_kek_ids)} KEK(s); "
          f"rewrote {rewritten} data file(s); new KEK {result.new_kek_id}; "
          f"expired {len(result.expired_snapshot_ids)} snapshot(s)")
    problems = result.check(table)
    for problem in problems:
        print(f"still uses a retired key: {safe(problem)}")
    return 0 if not problems or not args.expire else 2


def _remove_orphan_files(args: argparse.Namespace) -> int:
    table = _load(args, _kms(args))
    older = parse_time(args.older_than) if args.older_than else None
    result = table.remove_orphan_files(older, dry_run=args.dry_run)
    for path in result.orphan_files:
        print(safe(path))  # names found by listing storage: one line each
    verb = "would delete" if args.dry_run else "deleted"
    print(f"{verb} {len(result.orphan_files)} orphan file(s)", file=sys.stderr)
    return 0
