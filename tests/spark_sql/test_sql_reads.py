"""The SQL catalog's reads: filters (pushed to the scan's planning and to Parquet, always
re-evaluated) against a Python model, projection, time travel (VERSION / TIMESTAMP AS
OF, ``branch_`` / ``tag_`` / ``snapshot_id_`` / ``at_timestamp_`` identifiers), metadata
tables, deletes (deletion vectors, equality deletes), schema evolution, the tables
Iceberg Java wrote (../shared/tables) equal to ``EncryptedTable.scan()``, and no key in
any plan."""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import random

import pyarrow as pa
import pytest
from table.tablelib import GOLDEN_PREFIX, TABLE_NAMES, expected, table_digest
from vectorlib import TABLES_DIR

pytestmark = pytest.mark.spark

UTC = datetime.timezone.utc


@pytest.fixture(scope="module")
def events(cat):
    """A partitioned, encrypted table of 3000 random rows in three appends, and the rows."""
    rng = random.Random(11)
    rows = []
    for i in range(3000):
        rows.append((i, rng.choice(["a", "b", "c", None]), None if i % 13 == 0 else rng.randint(-100, 100),
                     datetime.date(2023, 12, 25) + datetime.timedelta(days=rng.randint(0, 20)),
                     decimal.Decimal(rng.randint(-10**6, 10**6)).scaleb(-2),
                     rng.choice(["apple", "apricot", "banana", "blue", ""]),
                     None if i % 17 == 0 else rng.random() * 100))
    schema = "id bigint, cat string, n int, d date, amount decimal(10,2), word string, x double"
    cat.sql(f"CREATE TABLE {{c}}.db.events ({schema}) USING iceberg PARTITIONED BY (cat, months(d)) "
            "TBLPROPERTIES ('encryption.key-id'='master', 'write.parquet.row-group-size-bytes'='4096')")
    for part in range(3):
        chunk = rows[part * 1000:(part + 1) * 1000]
        cat.spark.createDataFrame(chunk, schema).writeTo(f"{cat.name}.db.events").append()
    return rows


COLUMNS = ["id", "cat", "n", "d", "amount", "word", "x"]


@pytest.mark.parametrize("where, keep", [
    ("id = 17", lambda r: r[0] == 17),
    ("id < 100 AND n > 0", lambda r: r[0] < 100 and r[2] is not None and r[2] > 0),
    ("cat = 'a' OR n IS NULL", lambda r: r[1] == "a" or r[2] is None),
    ("cat IS NULL", lambda r: r[1] is None),
    ("NOT (cat = 'b')", lambda r: r[1] is not None and r[1] != "b"),
    ("n IN (1, 2, 3, -100)", lambda r: r[2] in (1, 2, 3, -100)),
    ("d >= DATE '2024-01-10' AND d < DATE '2024-01-12'",
     lambda r: datetime.date(2024, 1, 10) <= r[3] < datetime.date(2024, 1, 12)),
    ("amount > 9000.00", lambda r: r[4] > decimal.Decimal("9000.00")),
    ("word LIKE 'ap%'", lambda r: r[5].startswith("ap")),
    ("x > 99.5", lambda r: r[6] is not None and r[6] > 99.5),
    ("3000 > id AND id >= 2990", lambda r: 2990 <= r[0] < 3000),
    ("cat <=> NULL", lambda r: r[1] is None),
    ("id = 5 OR id = 2995", lambda r: r[0] in (5, 2995)),
])
def test_filters_against_model(cat, events, where, keep):
    got = cat.rows(f"SELECT * FROM {{c}}.db.events WHERE {where}")
    want = sorted((r for r in events if keep(r)), key=lambda r: r[0])
    assert [g[0] for g in sorted(got, key=lambda g: g[0])] == [w[0] for w in want]
    assert sorted(got, key=lambda g: g[0]) == [tuple(w) for w in want]


def test_pruning_and_projection(cat, events):
    plan = cat.sql("EXPLAIN SELECT id FROM {c}.db.events WHERE cat = 'a' AND d < DATE '2024-01-01'")[0][0]
    files = int(plan.split("files=")[1].split(",")[0].split("]")[0])
    total = int(cat.sql("EXPLAIN SELECT id FROM {c}.db.events")[0][0].split("files=")[1].split("]")[0])
    assert 0 < files < total  # partition pruning (cat, months(d)) happened in planning
    assert cat.rows("SELECT count(*), sum(n), max(amount) FROM {c}.db.events") == [
        (3000, sum(r[2] for r in events if r[2] is not None), max(r[4] for r in events))]
    assert cat.rows("SELECT cat, count(*) FROM {c}.db.events GROUP BY cat") == sorted(
        ((c, sum(1 for r in events if r[1] == c)) for c in ("a", "b", "c", None)),
        key=lambda t: (t[0] is not None, t[0] or ""))


def test_scan_equals_python_scan(cat, events):
    table = cat.table("db.events")
    want = table.scan().to_arrow().sort_by("id").to_pylist()
    got = [r.asDict() for r in cat.spark.table(f"{cat.name}.db.events").orderBy("id").collect()]
    assert got == want


def test_deletes_are_applied(cat, events):
    """Deletion vectors written by icecrypt's Python API: the SQL scan gives the live rows."""
    cat.sql("CREATE TABLE {c}.db.deleted USING iceberg TBLPROPERTIES ('encryption.key-id'='master', "
            "'write.delete.mode'='merge-on-read') AS SELECT * FROM {c}.db.events")
    table = cat.table("db.deleted")
    table.delete("n < -50 or id = 42")
    live = [r for r in events if not ((r[2] is not None and r[2] < -50) or r[0] == 42)]
    assert cat.rows("SELECT count(*) FROM {c}.db.deleted") == [(len(live),)]
    assert [r[0] for r in cat.rows("SELECT id FROM {c}.db.deleted WHERE cat = 'a'")] == sorted(
        r[0] for r in live if r[1] == "a")
    assert any(f["content"] != 0 for f in cat.table("db.deleted").inspect.delete_files().to_pylist())


def test_time_travel(cat):
    cat.sql("CREATE TABLE {c}.db.travel (id bigint, s string) USING iceberg TBLPROPERTIES ('encryption.key-id'='master')")
    cat.sql("INSERT INTO {c}.db.travel VALUES (1, 'one')")
    table = cat.table("db.travel")
    first = table.current_snapshot_id
    cat.sql("ALTER TABLE {c}.db.travel ADD COLUMN extra int")
    cat.sql("INSERT INTO {c}.db.travel VALUES (2, 'two', 2)")
    table = cat.table("db.travel")
    with table.manage_snapshots() as manage:
        manage.create_tag("v1", first).create_branch("audit", first)
    assert cat.rows(f"SELECT * FROM {{c}}.db.travel VERSION AS OF {first}") == [(1, "one")]  # the old schema
    assert cat.rows("SELECT * FROM {c}.db.travel VERSION AS OF 'v1'") == [(1, "one")]
    assert cat.rows(f"SELECT * FROM {{c}}.db.travel.snapshot_id_{first}") == [(1, "one")]
    assert cat.rows("SELECT * FROM {c}.db.travel.tag_v1") == [(1, "one")]
    assert cat.rows("SELECT * FROM {c}.db.travel.branch_audit") == [(1, "one", None)]  # current schema
    assert cat.rows("SELECT * FROM {c}.db.travel VERSION AS OF 'audit'") == [(1, "one", None)]
    committed = table.snapshot(first).timestamp_ms
    moment = datetime.datetime.fromtimestamp(committed / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    assert cat.rows(f"SELECT id FROM {{c}}.db.travel TIMESTAMP AS OF '{moment}'") == [(1,)]
    assert cat.rows(f"SELECT id FROM {{c}}.db.travel.at_timestamp_{committed}") == [(1,)]
    # writes to a branch, through its identifier
    cat.sql("INSERT INTO {c}.db.travel.branch_audit VALUES (10, 'ten', null)")
    assert cat.rows("SELECT id FROM {c}.db.travel.branch_audit") == [(1,), (10,)]
    assert cat.rows("SELECT id FROM {c}.db.travel") == [(1,), (2,)]
    for statement, reason in [
        ("SELECT * FROM {c}.db.travel VERSION AS OF 123", "no snapshot 123"),
        ("SELECT * FROM {c}.db.travel VERSION AS OF 'nope'", "no branch or tag 'nope'"),
        ("SELECT * FROM {c}.db.travel TIMESTAMP AS OF '1999-01-01 00:00:00'", "no snapshot as of"),
        ("INSERT INTO {c}.db.travel.tag_v1 VALUES (3, 'x')", "does not support append"),
    ]:
        with pytest.raises(Exception) as info:
            cat.sql(statement)
        assert reason in str(info.value), statement


def test_metadata_tables(cat, events):
    from icecrypt.table import METADATA_TABLES

    table = cat.table("db.events")
    for name in METADATA_TABLES:
        got = cat.spark.table(f"{cat.name}.db.events.{name}").toArrow()
        want = table.inspect.table(name)
        assert got.num_rows == want.num_rows, name
        assert got.column_names == want.column_names, name
    files = cat.sql("SELECT key_metadata, file_path FROM {c}.db.events.files")
    fingerprints = {r[0] for r in files}
    assert all(isinstance(f, str) and len(f) == 16 for f in fingerprints)
    first = table.snapshots()[0].snapshot_id
    assert cat.rows(f"SELECT count(*) FROM {{c}}.db.events.files VERSION AS OF {first}") == [
        (table.inspect.files(snapshot_id=first).num_rows,)]
    assert [r[0] for r in cat.rows("SELECT operation FROM {c}.db.events.snapshots")] == ["append"] * 3


def test_no_key_in_any_plan(cat, events):
    """Neither EXPLAIN (every mode) nor the table's properties show a data key."""
    table = cat.table("db.events")
    secrets = set()
    for task in table.scan().plan_files():
        km = task.file.key()
        secrets |= {base64.b64encode(km.encryption_key).decode(), km.encryption_key.hex(),
                    base64.b64encode(km.aad_prefix).decode()}
    frame = cat.spark.sql(f"SELECT * FROM {cat.name}.db.events WHERE n > 3")
    shown = [frame._jdf.queryExecution().toString(), *(r[0] for r in cat.sql(
        "EXPLAIN EXTENDED SELECT * FROM {c}.db.events WHERE n > 3")),
        *(r[0] for r in cat.sql("EXPLAIN FORMATTED SELECT * FROM {c}.db.events WHERE n > 3")),
        json.dumps([tuple(r) for r in cat.sql("SHOW TBLPROPERTIES {c}.db.events")]),
        json.dumps([tuple(r) for r in cat.sql("DESCRIBE TABLE EXTENDED {c}.db.events")])]
    frame.collect()
    for text in shown:
        assert "icecrypt.secret" not in text or "redacted" in text.lower()
        assert not any(s in text for s in secrets)


def test_schema_evolution_renames_swap(cat):
    """Two columns swap names: reads (and pruning by Parquet statistics) follow field ids."""
    cat.sql("CREATE TABLE {c}.db.swapped (a int, b int) USING iceberg TBLPROPERTIES ('encryption.key-id'='master')")
    cat.sql("INSERT INTO {c}.db.swapped SELECT CAST(id AS INT), CAST(id + 1000 AS INT) FROM range(100)")
    cat.sql("ALTER TABLE {c}.db.swapped RENAME COLUMN a TO tmp")
    cat.sql("ALTER TABLE {c}.db.swapped RENAME COLUMN b TO a")
    cat.sql("ALTER TABLE {c}.db.swapped RENAME COLUMN tmp TO b")
    assert cat.rows("SELECT b, a FROM {c}.db.swapped WHERE a = 1005") == [(5, 1005)]
    assert cat.rows("SELECT count(*) FROM {c}.db.swapped WHERE b < 10") == [(10,)]
    cat.sql("ALTER TABLE {c}.db.swapped ALTER COLUMN b TYPE bigint")
    assert cat.rows("SELECT sum(b) FROM {c}.db.swapped WHERE b >= 90") == [(sum(range(90, 100)),)]


def test_unreadable_column_says_so(cat):
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, UUIDType

    catalog = cat.icecrypt()
    catalog.create_table(("db", "uuids"), Schema(NestedField(1, "id", LongType()), NestedField(2, "u", UUIDType())),
                         table_key_id="master")
    import uuid

    catalog.load_table(("db", "uuids")).append(pa.table({"id": [1], "u": pa.array([uuid.uuid4().bytes],
                                                                                   pa.binary(16))}))
    assert cat.rows("SELECT id FROM {c}.db.uuids") == [(1,)]
    with pytest.raises(Exception, match="column u is a uuid column"):
        cat.sql("SELECT * FROM {c}.db.uuids")
    with pytest.raises(Exception, match="Spark's Parquet writer cannot write this table"):
        cat.sql("INSERT INTO {c}.db.uuids VALUES (2, 'x')")


def test_initial_default_columns(cat):
    """A column added with a default for the rows written before (format v3): Spark's
    Parquet reader gives those rows the default (Spark's EXISTS_DEFAULT); a nested field's
    default, which Spark's defaults cannot hold, makes its column refused, saying why."""
    from pyiceberg.types import IntegerType, LongType, NestedField, StructType

    cat.sql("CREATE TABLE {c}.db.defaults (id bigint) USING iceberg TBLPROPERTIES ('encryption.key-id'='master')")
    cat.sql("INSERT INTO {c}.db.defaults VALUES (1)")
    with cat.table("db.defaults").update_schema() as update:
        update.add_column("d", LongType(), default_value=7)
        update.add_column("s", StructType(NestedField(100, "x", IntegerType(), required=False)))
    with cat.table("db.defaults").update_schema() as update:
        update.add_column(("s", "y"), IntegerType(), default_value=5)
    assert [(r["id"], r["d"]) for r in cat.table("db.defaults").scan().to_arrow().to_pylist()] == [(1, 7)]
    assert cat.rows("SELECT id, d FROM {c}.db.defaults") == [(1, 7)]
    with pytest.raises(Exception, match="column s.y is a column with an initial-default value Spark cannot hold"):
        cat.sql("SELECT s FROM {c}.db.defaults")


def test_name_mapped_tables(cat):
    """A plaintext table with a name mapping is read by column name (its files written
    with field ids read the same); an encrypted one is refused, saying why."""
    mapping = """'schema.name-mapping.default'='[{"field-id": 1, "names": ["id"]}]'"""
    cat.sql("CREATE TABLE {c}.db.mapped (id bigint) USING iceberg")
    cat.sql("INSERT INTO {c}.db.mapped VALUES (1)")
    cat.sql(f"ALTER TABLE {{c}}.db.mapped SET TBLPROPERTIES ({mapping})")
    assert cat.rows("SELECT * FROM {c}.db.mapped") == [(1,)]
    cat.sql("CREATE TABLE {c}.db.mapped_enc (id bigint) USING iceberg TBLPROPERTIES ('encryption.key-id'='master')")
    cat.sql("INSERT INTO {c}.db.mapped_enc VALUES (1)")
    cat.sql(f"ALTER TABLE {{c}}.db.mapped_enc SET TBLPROPERTIES ({mapping})")
    with pytest.raises(Exception, match="name mapping .* and is encrypted"):
        cat.sql("SELECT * FROM {c}.db.mapped_enc")


def test_options_are_refused_clearly(cat):
    cat.sql("CREATE TABLE {c}.db.opts (id bigint) USING iceberg")
    with pytest.raises(Exception, match="read option split-size is not supported"):
        cat.spark.read.option("split-size", "1").table(f"{cat.name}.db.opts").collect()
    frame = cat.spark.createDataFrame([(1,)], "id bigint")
    with pytest.raises(Exception, match="write option fanout-enabled is not supported"):
        frame.writeTo(f"{cat.name}.db.opts").option("fanout-enabled", "true").append()
    assert cat.rows("SELECT * FROM {c}.db.opts") == []


def test_empty_table(cat):
    cat.sql("CREATE TABLE {c}.db.empty (id int) USING iceberg TBLPROPERTIES ('encryption.key-id'='master')")
    assert cat.rows("SELECT * FROM {c}.db.empty") == []
    assert cat.rows("SELECT count(*) FROM {c}.db.empty.snapshots") == [(0,)]


# --- the tables Iceberg Java wrote ------------------------------------------------------------------


@pytest.fixture(scope="module")
def golden(new_catalog):
    """A hadoop catalog over ../shared (read in place), the tables' recorded
    s3://icecrypt-golden/<name> locations mapped to their folders; Iceberg's test KMS."""
    return new_catalog("hadoop", warehouse=TABLES_DIR.parent, **{
        "location-map": json.dumps({GOLDEN_PREFIX.rstrip("/"): str(TABLES_DIR)}),
        "encryption.kms-type": "memory", "encryption.kms.memory.iceberg-test-keys": "true"})


@pytest.mark.parametrize("name", [n for n in TABLE_NAMES if n != "enc_avro_dek16"])
def test_java_tables(golden, name):
    identifier = f"{TABLES_DIR.name}.{name}"
    table = golden.table(identifier)
    want = table.scan().to_arrow()
    got = golden.spark.table(f"{golden.name}.{identifier}").toArrow()
    assert got.num_rows == want.num_rows == expected(name)["expected"]["row_count"]
    assert table_digest(got) == table_digest(want) == expected(name)["expected"]["digest_sha256"]
    for snapshot in expected(name)["snapshots"]:
        rows = golden.spark.sql(f"SELECT * FROM {golden.name}.{identifier} VERSION AS OF {snapshot['snapshot_id']}")
        assert table_digest(rows.toArrow()) == snapshot["expected_digest_sha256"]


def test_java_avro_table_is_refused_clearly(golden):
    with pytest.raises(Exception, match="is avro: the SQL catalog reads Parquet data files only"):
        golden.sql(f"SELECT * FROM {{c}}.{TABLES_DIR.name}.enc_avro_dek16")


def test_spec_id_and_partition_metadata_columns(cat):
    """_spec_id and _partition, as Iceberg's Spark runtime gives them: the file's spec id
    and its partition over every spec's fields (null where the file's spec lacks one),
    equal to what icecrypt's table API reads; in projections, filters and aggregates."""
    name = "db.meta_spec"
    cat.sql(f"CREATE TABLE {{c}}.{name} (id BIGINT, cat STRING, d DATE, amt DECIMAL(10, 2), ok BOOLEAN) "
            "USING iceberg PARTITIONED BY (bucket(4, id), cat)")
    cat.sql(f"INSERT INTO {{c}}.{name} VALUES (1, 'a', DATE'2024-01-02', 10.25, true), "
            "(2, 'b', DATE'2024-03-04', -3.50, false), (3, NULL, NULL, NULL, NULL)")
    with cat.table(name).update_spec() as update:
        update.remove_field("cat").add_field("d", "day").add_field("amt", "truncate[100]").add_identity("ok")
    cat.sql(f"INSERT INTO {{c}}.{name} VALUES (4, 'a', DATE'2024-05-06', 123.45, true), (5, 'c', NULL, NULL, false)")

    got = cat.rows(f"SELECT id, _spec_id, _partition FROM {{c}}.{name}")
    table = cat.table(name)
    want = sorted((r["id"], r["_spec_id"], r["_partition"]) for r in
                  table.scan(columns=["id", "_spec_id", "_partition"]).to_arrow().to_pylist())
    assert [(i, s, p.asDict()) for i, s, p in got] == want
    assert {s for _, s, _ in got} == {0, 1}
    fields = [f.name for f in cat.spark.table(f"{cat.name}.{name}").select("_partition").schema[0].dataType.fields]
    assert fields == ["id_bucket", "cat", "d_day", "amt_trunc_100", "ok"]  # every spec's fields, by field id
    assert cat.rows(f"SELECT id FROM {{c}}.{name} WHERE _spec_id = 1") == [(4,), (5,)]
    assert cat.rows(f"SELECT _partition.cat, count(*) FROM {{c}}.{name} GROUP BY _partition.cat") == \
        [(None, 3), ("a", 1), ("b", 1)]
    # the row-based reader (Spark's vectorized one is the default) gives the same values
    cat.spark.conf.set("spark.sql.parquet.enableVectorizedReader", "false")
    try:
        assert cat.rows(f"SELECT id, _spec_id, _partition FROM {{c}}.{name}") == got
    finally:
        cat.spark.conf.unset("spark.sql.parquet.enableVectorizedReader")
    # with the row lineage columns (the reader's rows are mapped)
    lineage = cat.rows(f"SELECT id, _partition, _spec_id, _row_id FROM {{c}}.{name}")
    assert [(i, p, s) for i, p, s, _ in lineage] == [(i, p, s) for i, s, p in got]
    # an unpartitioned table: spec 0, an empty _partition (as Iceberg gives it)
    cat.sql(f"CREATE TABLE {{c}}.{name}_flat (id BIGINT) USING iceberg")
    cat.sql(f"INSERT INTO {{c}}.{name}_flat VALUES (7)")
    assert [(i, s, p.asDict()) for i, s, p in cat.rows(f"SELECT id, _spec_id, _partition FROM {{c}}.{name}_flat")] \
        == [(7, 0, {})]


def _marked(rows) -> list[tuple]:
    return sorted((r[0], bool(r[1])) for r in rows)


@pytest.mark.parametrize("vectorized", [True, False], ids=["batches", "rows"])
def test_deleted_metadata_column(cat, vectorized):
    """_deleted, as Iceberg's Spark runtime gives it: asked for, the scan gives every row
    of its files, the deleted ones (deletion vectors of merge-on-read deletes) marked true;
    equal to icecrypt's table API; without it the deleted rows stay hidden."""
    name = f"db.marked_{'batches' if vectorized else 'rows'}"
    cat.sql(f"CREATE TABLE {{c}}.{name} (id bigint, cat string) USING iceberg "
            "TBLPROPERTIES ('encryption.key-id'='master', 'write.delete.mode'='merge-on-read')")
    import pyarrow as pa

    table = cat.table(name)  # two files, each with a row left after the delete
    table.append(pa.table({"id": pa.array([1, 2, 3], pa.int64()), "cat": ["a", "b", "a"]}))
    table.append(pa.table({"id": pa.array([4, 5], pa.int64()), "cat": ["b", "a"]}))
    cat.sql(f"DELETE FROM {{c}}.{name} WHERE id IN (2, 5)")
    cat.spark.conf.set("spark.sql.parquet.enableVectorizedReader", str(vectorized).lower())
    try:
        got = _marked(cat.sql(f"SELECT id, _deleted FROM {{c}}.{name}"))
        assert got == [(1, False), (2, True), (3, False), (4, False), (5, True)]
        assert cat.rows(f"SELECT id FROM {{c}}.{name} WHERE _deleted") == [(2,), (5,)]
        positions = cat.rows(f"SELECT id, _pos, _deleted, _file IS NOT NULL FROM {{c}}.{name}")
        assert [(r[0], r[1], r[2]) for r in positions] == [(1, 0, False), (2, 1, True), (3, 2, False), (4, 0, False),
                                                          (5, 1, True)]
        assert cat.rows(f"SELECT id FROM {{c}}.{name}") == [(1,), (3,), (4,)]
    finally:
        cat.spark.conf.unset("spark.sql.parquet.enableVectorizedReader")
    ours = cat.table(name).scan(columns=["id", "_deleted"]).to_arrow().to_pylist()
    assert _marked((r["id"], r["_deleted"]) for r in ours) == got


@pytest.mark.parametrize("name", [n for n in TABLE_NAMES if n != "enc_avro_dek16"])
def test_deleted_metadata_column_of_java_tables(golden, name):
    identifier = f"{TABLES_DIR.name}.{name}"
    table = golden.table(identifier)
    fields = [f.name for f in table.schema.fields]
    ours = table.scan(columns=[*fields, "_deleted"]).to_arrow().to_pylist()
    got = golden.sql(f"SELECT {', '.join(fields)}, _deleted FROM {{c}}.{identifier}")
    assert sorted(map(repr, (tuple(r) for r in got))) == sorted(map(repr, (tuple(r.values()) for r in ours)))
    assert sum(1 for r in got if not r[-1]) == expected(name)["expected"]["row_count"]
