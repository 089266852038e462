"""The SQL catalog's writes, checked after every step against a plain-Python model of the
rows, through SQL and through ``EncryptedTable.scan()``: INSERT INTO, INSERT OVERWRITE
(whole table, static PARTITION, dynamic), DataFrameWriterV2 (append, overwrite(condition),
overwritePartitions, create, createOrReplace), CREATE / REPLACE TABLE ... AS SELECT.
Every file a write leaves is encrypted (PARE data files, AGS1 metadata); partition values
are Iceberg's (the same as icecrypt's own writer computes); a failed write leaves no file
and no version; PyIceberg reads what SQL wrote to a plaintext table."""

from __future__ import annotations

import datetime
import decimal
import random

import pyarrow as pa
import pytest
from conftest import MASTER, data_files, magic
from pyspark.sql import functions as F

pytestmark = pytest.mark.spark

UTC = datetime.timezone.utc
SCHEMA = "id bigint, cat string, ts timestamp, amount decimal(10,2)"


def _row(i: int, cat: str) -> tuple:
    return (i, cat, datetime.datetime(2024, 1, 1 + i % 5, i % 24), decimal.Decimal(i * 7 - 30).scaleb(-2))


def _values(rows: list[tuple]) -> str:
    return ", ".join(f"({i}, '{c}', TIMESTAMP '{t:%Y-%m-%d %H:%M:%S}', {a})" for i, c, t, a in rows)


def _scan_rows(catalog, identifier: str) -> list[tuple]:
    table = catalog.table(identifier)
    rows = table.scan().to_arrow().to_pylist()
    out = []
    for r in rows:
        ts = r["ts"].astimezone(UTC).replace(tzinfo=None) if r["ts"] is not None else None
        out.append((r["id"], r["cat"], ts, r["amount"]))
    return sorted(out)


def _check(catalog, identifier: str, model: dict[int, tuple]) -> None:
    want = sorted(model.values())
    assert catalog.rows(f"SELECT * FROM {{c}}.{identifier}") == want
    assert _scan_rows(catalog, identifier) == want


@pytest.mark.parametrize("encrypted", [True, False], ids=["encrypted", "plaintext"])
def test_writes_against_model(cat, encrypted):
    name = f"db.model_{'enc' if encrypted else 'plain'}"
    props = "TBLPROPERTIES ('encryption.key-id'='master')" if encrypted else ""
    cat.sql(f"CREATE TABLE {{c}}.{name} ({SCHEMA}) USING iceberg PARTITIONED BY (cat, days(ts)) {props}")
    model: dict[int, tuple] = {}
    spark = cat.spark

    first = [_row(i, "a" if i % 2 else "b") for i in range(10)]
    cat.sql(f"INSERT INTO {{c}}.{name} VALUES {_values(first)}")
    model.update({r[0]: r for r in first})
    _check(cat, name, model)

    more = [_row(i, "c") for i in range(10, 14)]
    spark.createDataFrame(more, SCHEMA).writeTo(f"{cat.name}.{name}").append()
    model.update({r[0]: r for r in more})
    _check(cat, name, model)

    # static overwrite of one partition (identity column)
    replaced = [(100, "a", datetime.datetime(2024, 3, 1), decimal.Decimal("1.00"))]
    cat.sql(f"INSERT OVERWRITE {{c}}.{name} PARTITION (cat = 'a') "
            f"SELECT 100, TIMESTAMP '2024-03-01 00:00:00', 1.00")
    model = {k: v for k, v in model.items() if v[1] != "a"} | {100: replaced[0]}
    _check(cat, name, model)

    # dynamic overwrite: the partitions (cat, day) the new rows fall in
    dynamic = [(200, "b", datetime.datetime(2024, 1, 1, 5), decimal.Decimal("2.00"))]
    spark.conf.set("spark.sql.sources.partitionOverwriteMode", "dynamic")
    try:
        cat.sql(f"INSERT OVERWRITE {{c}}.{name} VALUES {_values(dynamic)}")
    finally:
        spark.conf.unset("spark.sql.sources.partitionOverwriteMode")
    day = datetime.date(2024, 1, 1)
    model = {k: v for k, v in model.items() if not (v[1] == "b" and v[2].date() == day)} | {200: dynamic[0]}
    _check(cat, name, model)

    # overwritePartitions: the (cat, day) partitions of the frame
    frame = [(300, "c", datetime.datetime(2024, 1, 2, 1), decimal.Decimal("3.00"))]
    spark.createDataFrame(frame, SCHEMA).writeTo(f"{cat.name}.{name}").overwritePartitions()
    model = {k: v for k, v in model.items()
             if not (v[1] == "c" and v[2].date() == datetime.date(2024, 1, 2))} | {300: frame[0]}
    _check(cat, name, model)

    # overwrite(condition): the rows matching it go, the frame's come
    frame = [(400, "d", datetime.datetime(2024, 2, 1), decimal.Decimal("-4.00"))]
    spark.createDataFrame(frame, SCHEMA).writeTo(f"{cat.name}.{name}").overwrite(F.col("id") < 12)
    model = {k: v for k, v in model.items() if not k < 12} | {400: frame[0]}
    _check(cat, name, model)

    # INSERT OVERWRITE of the whole table (static mode)
    last = [_row(500, "e")]
    cat.sql(f"INSERT OVERWRITE {{c}}.{name} VALUES {_values(last)}")
    model = {500: last[0]}
    _check(cat, name, model)

    table = cat.table(name)
    assert table.encrypted == encrypted
    assert len(table.snapshots()) == 7
    location = table.fs_path(table.location)
    files = [p for p in data_files(cat.warehouse) if str(p).startswith(location + "/")]
    for path in files:
        head = magic(path)
        if path.suffix == ".parquet":
            assert head == (b"PARE" if encrypted else b"PAR1"), path
        elif path.name.endswith(".avro") and encrypted:
            assert head == b"AGS1", path
    assert not [p for p in files if p.name.endswith(".crc") or p.name.startswith(".")]


def _internal(value, field_type):
    from icecrypt.table.files.manifest_write import to_internal

    return to_internal(value, field_type)


def _expected_partitions(table, rows: list[dict]) -> dict:
    """Partition -> row count, by PyIceberg's transforms (Iceberg's reference semantics)."""
    schema = table.schema
    counts: dict = {}
    for row in rows:
        key = []
        for field in table.spec.fields:
            source = schema.find_field(field.source_id)
            value = _internal(row[source.name], source.field_type)
            result_type = field.transform.result_type(source.field_type)
            key.append((field.name, _internal(field.transform.transform(source.field_type)(value), result_type)))
        counts[tuple(key)] = counts.get(tuple(key), 0) + 1
    return counts


def _written_partitions(table) -> dict:
    files = table.inspect.files()
    partition_type = table.spec.partition_type(table.schema)
    counts: dict = {}
    for partition, n in zip(files.column("partition").to_pylist(), files.column("record_count").to_pylist()):
        key = tuple((f.name, _internal(partition[f.name], f.field_type)) for f in partition_type.fields)
        counts[key] = counts.get(key, 0) + n
    return counts


def test_partition_values_are_icebergs(cat):
    """Partition values of every transform computed by the JVM writer are PyIceberg's (and
    icecrypt's own writer's): negative numbers, dates before 1970, multi-byte strings,
    binaries whose base64 holds '/'."""
    rng = random.Random(5)
    rows = []
    for i in range(100):
        rows.append({
            "i": rng.randint(-2**31, 2**31 - 1) if i % 3 else rng.randint(-50, 50),
            "l": rng.randint(-2**63, 2**63 - 1) if i % 4 else rng.randint(-1000, 1000),
            "s": "".join(rng.choice("aé€😀z/") for _ in range(rng.randint(0, 6))),
            "d": datetime.date(1970, 1, 1) + datetime.timedelta(days=rng.randint(-40000, 40000)),
            "ts": datetime.datetime(1970, 1, 1, tzinfo=UTC) + datetime.timedelta(
                microseconds=rng.randint(-2**52, 2**52)),
            "dec": decimal.Decimal(rng.randint(-10**8, 10**8)).scaleb(-2),
            "b": bytes(rng.randrange(256) for _ in range(rng.randint(0, 5))),
        })
    arrow = pa.Table.from_pylist(rows, schema=pa.schema([
        ("i", pa.int32()), ("l", pa.int64()), ("s", pa.string()), ("d", pa.date32()),
        ("ts", pa.timestamp("us", tz="UTC")), ("dec", pa.decimal128(10, 2)), ("b", pa.binary())]))
    columns = "i int, l bigint, s string, d date, ts timestamp, dec decimal(10,2), b binary"
    specs = {
        "buckets": "bucket(7, i), bucket(5, l), bucket(3, s), bucket(4, d), bucket(6, ts), bucket(9, dec), bucket(2, b)",
        "truncs": "truncate(10, i), truncate(100, l), truncate(2, s), truncate(50, dec), truncate(2, b)",
        "times": "years(d), months(ts), hours(ts)",
        "days": "days(d), months(d), years(ts), days(ts)",
        "identities": "i, s, d, ts, dec, b",
    }
    for label, spec in specs.items():
        name = f"db.pv_{label}"
        cat.sql(f"CREATE TABLE {{c}}.{name} ({columns}) USING iceberg PARTITIONED BY ({spec}) "
                "TBLPROPERTIES ('encryption.key-id'='master')")
        cat.spark.createDataFrame(rows, columns).writeTo(f"{cat.name}.{name}").append()
        table = cat.table(name)
        assert _written_partitions(table) == _expected_partitions(table, rows), label
        # and the rows read back through SQL (paths with every kind of value are readable)
        assert cat.rows(f"SELECT count(*), sum(i), count(DISTINCT b) FROM {{c}}.{name}") == [
            (len(rows), sum(r["i"] for r in rows), len({r["b"] for r in rows}))]
        # icecrypt's own writer agrees on the values and on the directories (Java's
        # partitionToPath: a '/' in a value is %2F, timestamps in ISO form with +00:00)
        cat.sql(f"CREATE TABLE {{c}}.{name}_py ({columns}) USING iceberg PARTITIONED BY ({spec}) "
                "TBLPROPERTIES ('encryption.key-id'='master')")
        python = cat.table(f"{name}_py")
        python.append(arrow)
        assert _written_partitions(cat.table(f"{name}_py")) == _written_partitions(table), label
        assert _directories(cat.table(f"{name}_py")) == _directories(table), label


def _directories(table) -> set[str]:
    """The partition directories of ``table``'s data files, relative to its data root."""
    root = table.location.rstrip("/") + "/data/"
    paths = table.inspect.files().column("file_path").to_pylist()
    assert all(p.startswith(root) for p in paths)
    return {p[len(root):].rsplit("/", 1)[0] for p in paths}


def test_types_and_field_ids(cat):
    """Nested types, written by Spark's writer with field ids on list elements and map
    keys and values: icecrypt's reader (by id) reads them back."""
    cat.sql("CREATE TABLE {c}.db.nested (id int, tags array<string>, m map<string, struct<x: int, y: array<int>>>, "
            "st struct<a: int, inner: struct<b: string>>, flag boolean, f float, d double, dt date, "
            "tn timestamp_ntz, bin binary) USING iceberg TBLPROPERTIES ('encryption.key-id'='master')")
    cat.sql("INSERT INTO {c}.db.nested VALUES "
            "(1, array('a', null), map('k', named_struct('x', 1, 'y', array(1, 2))), "
            "named_struct('a', 1, 'inner', named_struct('b', 'q')), true, 1.5, 2.5, DATE '1960-02-29', "
            "TIMESTAMP_NTZ '1969-12-31 23:59:59.999999', X'00ff'), "
            "(2, null, null, null, null, null, null, null, null, null)")
    got = cat.table("db.nested").scan().to_arrow().sort_by("id").to_pylist()
    assert got[0]["tags"] == ["a", None]
    assert dict(got[0]["m"]) == {"k": {"x": 1, "y": [1, 2]}}
    assert got[0]["st"] == {"a": 1, "inner": {"b": "q"}}
    assert got[0]["dt"] == datetime.date(1960, 2, 29) and got[0]["bin"] == b"\x00\xff"
    assert got[0]["tn"] == datetime.datetime(1969, 12, 31, 23, 59, 59, 999999)
    assert all(v is None for k, v in got[1].items() if k != "id")
    assert cat.rows("SELECT id, tags[0], m['k'].y[1], st.inner.b FROM {c}.db.nested") == [
        (1, "a", 2, "q"), (2, None, None, None)]
    # every Parquet field of the files carries its Iceberg field id, list elements and map
    # keys and values included
    from icecrypt.parquet import open_file

    table = cat.table("db.nested")
    expected_ids = {f.field_id for f in _all_fields(table.schema)}
    for task in table.scan().plan_files():
        with open_file(task.file.fs_path, task.file.key(), filesystem=table.filesystem) as opened:
            found = set(_parquet_ids(opened.metadata.schema.to_arrow_schema()))
        assert found == expected_ids


def _all_fields(schema) -> list:
    from icecrypt.spark._native import _fields

    return list(_fields(schema))


def _parquet_ids(schema: pa.Schema) -> list[int]:
    """Every field id of an Arrow schema read from a Parquet file, nested fields included."""
    out = []

    def walk(field: pa.Field) -> None:
        if field.metadata and b"PARQUET:field_id" in field.metadata:
            out.append(int(field.metadata[b"PARQUET:field_id"]))
        t = field.type
        if pa.types.is_struct(t):
            for child in t:
                walk(child)
        elif pa.types.is_list(t) or pa.types.is_large_list(t):
            walk(t.value_field)
        elif pa.types.is_map(t):
            walk(t.key_field)
            walk(t.item_field)

    for f in schema:
        walk(f)
    return out


def test_ctas_and_rtas(cat):
    cat.sql("CREATE TABLE {c}.db.source (id bigint, v string) USING iceberg")
    cat.sql("INSERT INTO {c}.db.source VALUES (1, 'x'), (2, 'y'), (3, 'z')")
    cat.sql("CREATE TABLE {c}.db.copy USING iceberg PARTITIONED BY (bucket(2, id)) "
            "TBLPROPERTIES ('encryption.key-id'='master') AS SELECT id, v FROM {c}.db.source WHERE id < 3")
    table = cat.table("db.copy")
    assert table.encrypted and len(table.snapshots()) == 1
    assert cat.rows("SELECT * FROM {c}.db.copy") == [(1, "x"), (2, "y")]
    first = table.current_snapshot_id
    cat.sql("CREATE OR REPLACE TABLE {c}.db.copy USING iceberg TBLPROPERTIES ('encryption.key-id'='master') "
            "AS SELECT v AS name, id * 10 AS id FROM {c}.db.source")
    table = cat.table("db.copy")
    assert [f.name for f in table.schema.fields] == ["name", "id"]
    assert cat.rows("SELECT * FROM {c}.db.copy") == [("x", 10), ("y", 20), ("z", 30)]
    assert first in {s.snapshot_id for s in table.snapshots()}  # history kept
    # `id`, which the first spec partitioned by (bucket), can go, as in Java: that spec stays
    # with the history, and its snapshot still reads with its own schema; the replacement is
    # unsorted, as Java's, so the order's column can go too
    cat.sql("ALTER TABLE {c}.db.copy WRITE ORDERED BY name")
    cat.sql("REPLACE TABLE {c}.db.copy (k int) USING iceberg TBLPROPERTIES ('encryption.key-id'='master')")
    assert cat.rows("SELECT * FROM {c}.db.copy") == []
    table = cat.table("db.copy")
    assert [f.name for f in table.schema.fields] == ["k"] and len(table.specs) == 2
    assert table.metadata["default-sort-order-id"] == 0
    cat.sql("INSERT INTO {c}.db.copy VALUES (5)")
    assert cat.rows("SELECT * FROM {c}.db.copy") == [(5,)]
    assert cat.rows(f"SELECT * FROM {{c}}.db.copy VERSION AS OF {first}") == [(1, "x"), (2, "y")]
    assert cat.table("db.copy").verify().ok
    cat.sql("REPLACE TABLE {c}.db.source (k int) USING iceberg")
    assert cat.rows("SELECT * FROM {c}.db.source") == []
    assert [f.name for f in cat.table("db.source").schema.fields] == ["k"]
    df = cat.spark.createDataFrame([(7, "seven")], "n int, s string")
    df.writeTo(f"{cat.name}.db.v2").tableProperty("encryption.key-id", MASTER).partitionedBy(F.col("n")).create()
    df.writeTo(f"{cat.name}.db.v2").createOrReplace()
    assert cat.rows("SELECT * FROM {c}.db.v2") == [(7, "seven")]
    assert cat.table("db.v2").encrypted


def test_ctas_and_rtas_on_path_tables(new_catalog):
    """A hadoop catalog's CTAS publishes v1.metadata.json with the rows, an RTAS the next
    version; the staged files become the new version's ancestors, and maintenance that
    checks the version lineage finds one."""
    from icecrypt.table.commit.store import check_unambiguous

    catalog = new_catalog("hadoop")
    catalog.sql("CREATE NAMESPACE {c}.db")
    catalog.sql("CREATE TABLE {c}.db.p USING iceberg TBLPROPERTIES ('encryption.key-id'='master') "
                "AS SELECT id, CAST(id AS STRING) AS s FROM range(5)")
    table = catalog.table("db.p")
    assert table.metadata_location.endswith("/v1.metadata.json") and len(table.snapshots()) == 1
    catalog.sql("CREATE OR REPLACE TABLE {c}.db.p USING iceberg TBLPROPERTIES ('encryption.key-id'='master') "
                "AS SELECT id * 2 AS id, 'x' AS tag FROM range(3)")
    table = catalog.table("db.p")
    assert table.metadata_location.endswith("/v2.metadata.json")
    assert catalog.rows("SELECT * FROM {c}.db.p") == [(0, "x"), (2, "x"), (4, "x")]
    check_unambiguous(table.filesystem, table.metadata_location, table.metadata)
    assert table.scan().to_arrow().num_rows == 3 and len(table.snapshots()) == 2


@pytest.mark.parametrize("kind", ["sql", "hadoop"])
def test_failed_ctas_creates_nothing(new_catalog, kind):
    catalog = new_catalog(kind)
    catalog.sql("CREATE NAMESPACE {c}.db")
    before = data_files(catalog.warehouse)
    with pytest.raises(Exception, match="boom"):
        catalog.sql("CREATE TABLE {c}.db.never USING iceberg TBLPROPERTIES ('encryption.key-id'='master') AS "
                    "SELECT id, CASE WHEN id = 5000 THEN raise_error('boom') ELSE id END AS v FROM range(10000)")
    assert catalog.rows("SHOW TABLES IN {c}.db") == []
    assert data_files(catalog.warehouse) == before
    assert catalog.rows("SHOW NAMESPACES IN {c}") == [("db",)]


def test_failed_insert_leaves_nothing(cat):
    cat.sql("CREATE TABLE {c}.db.guarded (id bigint, v bigint) USING iceberg PARTITIONED BY (bucket(3, id)) "
            "TBLPROPERTIES ('encryption.key-id'='master')")
    cat.sql("INSERT INTO {c}.db.guarded VALUES (1, 1)")
    table = cat.table("db.guarded")
    before_files = data_files(cat.warehouse)
    before = table.metadata_location
    with pytest.raises(Exception, match="boom"):
        cat.sql("INSERT INTO {c}.db.guarded SELECT id, CASE WHEN id = 7777 THEN raise_error('boom') ELSE id END "
                "FROM range(20000)")
    assert cat.table("db.guarded").metadata_location == before
    assert data_files(cat.warehouse) == before_files
    assert cat.rows("SELECT * FROM {c}.db.guarded") == [(1, 1)]


def test_not_null_column(cat):
    cat.sql("CREATE TABLE {c}.db.required (id bigint NOT NULL, v string) USING iceberg")
    with pytest.raises(Exception, match="NOT NULL|null"):
        cat.sql("INSERT INTO {c}.db.required VALUES (NULL, 'x')")
    assert cat.rows("SELECT * FROM {c}.db.required") == []


def test_pyiceberg_reads_a_sql_written_table(new_catalog):
    pytest.importorskip("pyiceberg.catalog.sql")
    from pyiceberg.catalog.sql import SqlCatalog as PyIcebergSql

    catalog = new_catalog("sql")
    catalog.sql("CREATE NAMESPACE {c}.db")
    catalog.sql("CREATE TABLE {c}.db.shared (id bigint, name string, tags array<string>) USING iceberg "
                "PARTITIONED BY (bucket(4, id))")
    catalog.sql("INSERT INTO {c}.db.shared VALUES (1, 'a', array('x')), (2, 'b', array()), (3, null, null)")
    pyiceberg = PyIcebergSql(catalog.name, uri=f"sqlite:///{catalog.warehouse}/catalog.db",
                             warehouse=str(catalog.warehouse))
    rows = pyiceberg.load_table("db.shared").scan().to_arrow().sort_by("id").to_pylist()
    assert rows == [{"id": 1, "name": "a", "tags": ["x"]}, {"id": 2, "name": "b", "tags": []},
                    {"id": 3, "name": None, "tags": None}]


def test_sorted_table(cat):
    cat.sql("CREATE TABLE {c}.db.sorted (id bigint, k int) USING iceberg TBLPROPERTIES ('encryption.key-id'='master')")
    table = cat.table("db.sorted")
    with table.replace_sort_order() as order:
        order.desc("k")
    cat.sql("INSERT INTO {c}.db.sorted SELECT id, CAST(id % 97 AS INT) FROM range(2000)")
    table = cat.table("db.sorted")
    entries = table.inspect.files()
    assert set(entries.column("sort_order_id").to_pylist()) == {table.metadata["default-sort-order-id"]}
    rows = table.scan().to_arrow()
    assert rows.num_rows == 2000
    for task in table.scan().plan_files():  # each file's rows in the table's order
        from icecrypt.table import read_task

        ks = [k for b in read_task(task, table.filesystem) for k in b.column("k").to_pylist()]
        assert ks == sorted(ks, reverse=True)


def test_concurrent_commit_is_a_conflict(cat):
    """A dynamic overwrite validates from the snapshot the statement read (Java's
    serializable isolation): another writer's append into a partition it replaces, made
    while the statement runs (by a Python UDF in the job, through icecrypt's API), fails
    the statement and leaves only that append."""
    from pyspark.sql.functions import udf

    cat.sql("CREATE TABLE {c}.db.raced (id bigint, cat string) USING iceberg PARTITIONED BY (cat) "
            "TBLPROPERTIES ('encryption.key-id'='master')")
    cat.sql("INSERT INTO {c}.db.raced VALUES (1, 'a'), (2, 'b')")
    options = dict(cat.options)
    name = cat.name

    @udf("bigint")
    def meanwhile(i):
        import pyarrow as pa

        from icecrypt.spark._sql.catalogs import open_catalog

        table = open_catalog(name, options).load_table(("db", "raced"))
        table.append(pa.table({"id": pa.array([99], pa.int64()), "cat": ["a"]}))
        return i

    cat.spark.udf.register("meanwhile", meanwhile)
    before = {f["file_path"] for f in cat.table("db.raced").inspect.files().to_pylist()}
    cat.spark.conf.set("spark.sql.sources.partitionOverwriteMode", "dynamic")
    try:
        with pytest.raises(Exception, match="(?i)conflict|concurrent|since"):
            cat.sql("INSERT OVERWRITE {c}.db.raced SELECT meanwhile(id) + 10, 'a' FROM range(1)")
    finally:
        cat.spark.conf.unset("spark.sql.sources.partitionOverwriteMode")
    assert cat.rows("SELECT * FROM {c}.db.raced") == [(1, "a"), (2, "b"), (99, "a")]
    after = {f["file_path"] for f in cat.table("db.raced").inspect.files().to_pylist()}
    assert len(after - before) == 1  # the other writer's file; none of the failed statement's
    location = cat.table("db.raced").fs_path(cat.table("db.raced").location)
    on_disk = {str(p) for p in data_files(cat.warehouse) if str(p).startswith(location) and p.suffix == ".parquet"}
    assert on_disk == {cat.table("db.raced").fs_path(p) for p in after}


def test_max_records_per_file(cat):
    """spark.sql.files.maxRecordsPerFile rolls files as for Spark's own file writers."""
    cat.sql("CREATE TABLE {c}.db.rolled (id bigint) USING iceberg TBLPROPERTIES ('encryption.key-id'='master')")
    cat.spark.conf.set("spark.sql.files.maxRecordsPerFile", "30")
    try:
        cat.sql("INSERT INTO {c}.db.rolled SELECT id FROM range(0, 100, 1, 1)")
    finally:
        cat.spark.conf.unset("spark.sql.files.maxRecordsPerFile")
    counts = sorted(cat.table("db.rolled").inspect.files().column("record_count").to_pylist())
    assert counts == [10, 30, 30, 30]
    assert cat.rows("SELECT count(*), sum(id) FROM {c}.db.rolled") == [(100, sum(range(100)))]
