"""Iceberg's Spark documentation, walked through on the SQL catalog: the statements of its
pages (spark-getting-started, spark-ddl, spark-queries, spark-writes, spark-procedures)
as a reader of those pages types them, with the catalog's name for ``prod``/``local`` and
names and values filled in where the pages write ``...``.  Each page runs on an encrypted
table, the getting-started and writes pages on a plaintext one too, and after every step
the rows are checked against a plain-Python model, through SQL and through
``EncryptedTable.scan()``.

The statements of Iceberg's SQL extensions (``ALTER TABLE ... ADD/DROP/REPLACE PARTITION
FIELD``, ``WRITE ORDERED BY``, ``SET/DROP IDENTIFIER FIELDS``, ``CREATE/REPLACE/DROP
BRANCH/TAG``) run through icecrypt's session extension, and are refused where Iceberg
refuses them, leaving the table as it was; the DDL page's views are Spark 4's own view
statements on the catalog (``test_views``).
"""

from __future__ import annotations

import collections
import datetime
import time

import pytest
from conftest import MASTER, magic

pytestmark = pytest.mark.spark

UTC = datetime.timezone.utc
ENCRYPTION = [pytest.param(True, id="encrypted"), pytest.param(False, id="plaintext")]
WAP = "'write.wap.enabled'='true'"


def _properties(encrypted: bool, extra: str = "") -> str:
    props = ", ".join(p for p in (f"'encryption.key-id'='{MASTER}'" if encrypted else "", extra) if p)
    return f"TBLPROPERTIES ({props})" if props else ""


def _same(cat, name: str, columns: str, want: list[tuple]) -> None:
    """The table's rows (``columns``) through SQL and through the table API equal ``want``."""
    want = sorted(want, key=repr)
    assert sorted(cat.rows(f"SELECT {columns} FROM {{c}}.{name}"), key=repr) == want
    names = [c.strip() for c in columns.split(",")]
    got = cat.table(name).scan().to_arrow().select(names).to_pylist()
    assert sorted((tuple(_naive(r[n]) for n in names) for r in got), key=repr) == want


def _naive(value):
    """A timestamptz value as the session (UTC) shows it to SQL: naive."""
    if isinstance(value, datetime.datetime) and value.tzinfo is not None:
        return value.astimezone(UTC).replace(tzinfo=None)
    return value


def _sealed(cat, name: str) -> None:
    from pathlib import Path

    root = Path(cat.table(name).location.removeprefix("file:"))
    files = [p for p in root.rglob("*") if p.is_file() and not p.name.endswith((".metadata.json", ".text"))]
    assert files and all(magic(p) in (b"PARE", b"AGS1") for p in files), root


@pytest.mark.parametrize("encrypted", ENCRYPTION)
def test_getting_started(cat, encrypted):
    t = f"db.gs_{'enc' if encrypted else 'plain'}"
    cat.sql(f"CREATE TABLE {{c}}.{t} (id bigint, data string) USING iceberg {_properties(encrypted)}")
    # the page's `source` and `updates` tables: Spark's own, as temporary views here
    cat.sql("CREATE OR REPLACE TEMP VIEW source AS SELECT * FROM VALUES (10L, 'd'), (11L, 'ee') AS s(id, data)")
    cat.sql("CREATE OR REPLACE TEMP VIEW updates AS SELECT * FROM VALUES (1L, 'x'), (2L, 'x'), (4L, 'z') AS u(id, data)")
    cat.sql(f"INSERT INTO {{c}}.{t} VALUES (1, 'a'), (2, 'b'), (3, 'c')")
    model = {1: "a", 2: "b", 3: "c"}
    _same(cat, t, "id, data", list(model.items()))
    cat.sql(f"INSERT INTO {{c}}.{t} SELECT id, data FROM source WHERE length(data) = 1")
    model[10] = "d"
    _same(cat, t, "id, data", list(model.items()))
    cat.sql(f"""MERGE INTO {{c}}.{t} t USING (SELECT * FROM updates) u ON t.id = u.id
                WHEN MATCHED THEN UPDATE SET t.data = u.data
                WHEN NOT MATCHED THEN INSERT *""")
    model.update({1: "x", 2: "x", 4: "z"})
    _same(cat, t, "id, data", list(model.items()))
    counts = cat.rows(f"SELECT count(1) as count, data FROM {{c}}.{t} GROUP BY data")
    assert sorted(counts) == sorted((n, d) for d, n in collections.Counter(model.values()).items())
    snapshots = cat.sql(f"SELECT * FROM {{c}}.{t}.snapshots")
    assert [r.operation for r in sorted(snapshots, key=lambda r: r.committed_at)] == ["append", "append", "overwrite"]
    if encrypted:
        _sealed(cat, t)


def test_ddl(cat):
    sample = "db.ddl_sample"
    cat.sql(f"""CREATE TABLE {{c}}.{sample} (
                    id bigint NOT NULL COMMENT 'unique id',
                    data string)
                USING iceberg {_properties(True)}""")
    described = {r.col_name: (r.data_type, r.comment) for r in cat.sql(f"DESCRIBE {{c}}.{sample}")}
    assert described["id"] == ("bigint", "unique id")
    assert cat.table(sample).schema.find_field("id").required
    cat.sql(f"DROP TABLE {{c}}.{sample}")
    cat.sql(f"CREATE TABLE {{c}}.{sample} (id bigint, data string, category string) USING iceberg "
            f"PARTITIONED BY (category) {_properties(True)}")
    assert [str(f.transform) for f in cat.table(sample).spec.fields] == ["identity"]
    cat.sql(f"DROP TABLE {{c}}.{sample} PURGE")
    cat.sql(f"""CREATE TABLE {{c}}.{sample} (id bigint, data string, category string, ts timestamp)
                USING iceberg PARTITIONED BY (bucket(16, id), days(ts), category) {_properties(True)}""")
    assert [str(f.transform) for f in cat.table(sample).spec.fields] == ["bucket[16]", "day", "identity"]
    rows = [(i, f"d{i}", "ab"[i % 2], datetime.datetime(2024, 1, 1 + i)) for i in range(4)]
    cat.sql(f"INSERT INTO {{c}}.{sample} VALUES "
            + ", ".join(f"({i}, '{d}', '{c}', TIMESTAMP '{ts:%Y-%m-%d %H:%M:%S}')" for i, d, c, ts in rows))

    # CREATE TABLE ... AS SELECT, REPLACE TABLE ... AS SELECT, CREATE OR REPLACE
    ctas = "db.ddl_ctas"
    cat.sql(f"""CREATE TABLE {{c}}.{ctas} USING iceberg PARTITIONED BY (part)
                TBLPROPERTIES ('key'='value', 'encryption.key-id'='{MASTER}')
                AS SELECT id, data, category AS part FROM {{c}}.{sample}""")
    _same(cat, ctas, "id, data, part", [(i, d, c) for i, d, c, _ in rows])
    assert cat.table(ctas).properties["key"] == "value"
    cat.sql(f"""REPLACE TABLE {{c}}.{ctas} USING iceberg PARTITIONED BY (part) TBLPROPERTIES ('key'='value')
                AS SELECT id, data, category AS part FROM {{c}}.{sample} WHERE id < 2""")
    _same(cat, ctas, "id, data, part", [(i, d, c) for i, d, c, _ in rows if i < 2])
    cat.sql(f"CREATE OR REPLACE TABLE {{c}}.{ctas} USING iceberg PARTITIONED BY (part) "
            f"AS SELECT id, upper(data) AS data, category AS part FROM {{c}}.{sample}")
    _same(cat, ctas, "id, data, part", [(i, d.upper(), c) for i, d, c, _ in rows])
    assert len(cat.table(ctas).snapshots()) == 3  # a replace keeps the table's history
    _sealed(cat, ctas)
    location = cat.table(ctas).location.removeprefix("file:")
    cat.sql(f"DROP TABLE {{c}}.{ctas} PURGE")
    from pathlib import Path

    assert not [p for p in Path(location).rglob("*") if p.is_file()]

    # renames and properties
    cat.sql(f"ALTER TABLE {{c}}.{sample} RENAME TO {{c}}.db.ddl_new_name")
    cat.sql(f"ALTER TABLE {{c}}.db.ddl_new_name RENAME TO {{c}}.{sample}")
    cat.sql(f"ALTER TABLE {{c}}.{sample} SET TBLPROPERTIES ('read.split.target-size'='268435456')")
    assert cat.table(sample).properties["read.split.target-size"] == "268435456"
    cat.sql(f"ALTER TABLE {{c}}.{sample} UNSET TBLPROPERTIES ('read.split.target-size')")
    assert "read.split.target-size" not in cat.table(sample).properties
    cat.sql(f"ALTER TABLE {{c}}.{sample} SET TBLPROPERTIES ('comment' = 'A table comment.')")
    assert cat.table(sample).properties["comment"] == "A table comment."

    # columns: added (nested too), placed, renamed, widened, commented, moved, dropped
    for statement in [
        "ADD COLUMNS (new_column string comment 'new_column docs')",
        "ADD COLUMN point struct<x: double, y: double>",
        "ADD COLUMN point.z double",
        "ADD COLUMN points array<struct<x: double, y: double>>",
        "ADD COLUMN points.element.z double",
        "ADD COLUMN pairs map<struct<x: int>, struct<a: int>>",
        "ADD COLUMN pairs.value.b int",
        "ADD COLUMN measurement float",
        "ADD COLUMN other_column bigint AFTER measurement",
        "ADD COLUMN point.first bigint FIRST",
        "RENAME COLUMN data TO payload",
        "RENAME COLUMN point.x TO latitude",
        "ALTER COLUMN measurement TYPE double",
        "ALTER COLUMN measurement COMMENT 'unit is kilobytes per second'",
        "ALTER COLUMN measurement FIRST",
        "ALTER COLUMN point.z AFTER latitude",
        "ALTER COLUMN id DROP NOT NULL",
        "DROP COLUMN new_column",
        "DROP COLUMN point.y",
    ]:
        cat.sql(f"ALTER TABLE {{c}}.{sample} {statement}")
    schema = cat.table(sample).schema
    assert [f.name for f in schema.fields] == [
        "measurement", "id", "payload", "category", "ts", "point", "points", "pairs", "other_column"]
    assert [f.name for f in schema.find_field("point").field_type.fields] == ["first", "latitude", "z"]
    assert str(schema.find_field("measurement").field_type) == "double"
    assert schema.find_field("measurement").doc == "unit is kilobytes per second"
    assert not schema.find_field("id").required
    _same(cat, sample, "id, payload, category, measurement", [(i, d, c, None) for i, d, c, _ in rows])

    # Iceberg's SQL extensions (the session extension hands them to the procedure alter_table)
    for statement in [
        f"ALTER TABLE {{c}}.{sample} DROP PARTITION FIELD category",
        f"ALTER TABLE {{c}}.{sample} REPLACE PARTITION FIELD ts_day WITH day(ts) AS day_of_ts",
        f"ALTER TABLE {{c}}.{sample} WRITE ORDERED BY category, id",
        f"ALTER TABLE {{c}}.{sample} WRITE DISTRIBUTED BY PARTITION LOCALLY ORDERED BY category, id",
        f"ALTER TABLE {{c}}.{sample} CREATE BRANCH `audit-branch`",
        f"ALTER TABLE {{c}}.{sample} CREATE TAG `historical-tag` RETAIN 365 DAYS",
    ]:
        cat.sql(statement)
    table = cat.table(sample)
    assert [(f.name, str(f.transform)) for f in table.spec.fields] == [("id_bucket", "bucket[16]"),
                                                                      ("day_of_ts", "day")]
    order = next(o for o in table.metadata["sort-orders"] if o["order-id"] == table.metadata["default-sort-order-id"])
    assert [(table.schema.find_column_name(f["source-id"]), f["direction"]) for f in order["fields"]] == [
        ("category", "asc"), ("id", "asc")]
    assert table.properties["write.distribution-mode"] == "hash"
    head = table.current_snapshot_id
    assert table.metadata["refs"]["audit-branch"] == {"snapshot-id": head, "type": "branch"}
    assert table.metadata["refs"]["historical-tag"] == {"snapshot-id": head, "type": "tag",
                                                        "max-ref-age-ms": 365 * 86_400_000}
    _same(cat, sample, "id, payload, category, measurement", [(i, d, c, None) for i, d, c, _ in rows])
    # ... refused where Iceberg refuses them (a field the spec has; an optional identifier
    # field); nothing changed (views: test_views)
    before = cat.table(sample).metadata_location
    for statement, reason in [
        (f"ALTER TABLE {{c}}.{sample} ADD PARTITION FIELD bucket(16, id)", "id_bucket"),
        (f"ALTER TABLE {{c}}.{sample} SET IDENTIFIER FIELDS id", "required"),
    ]:
        with pytest.raises(Exception, match=reason):
            cat.sql(statement)
        assert cat.table(sample).metadata_location == before, statement
    _sealed(cat, sample)


def test_queries(cat):
    orders = "db.q_orders"
    cat.sql(f"CREATE TABLE {{c}}.{orders} (id BIGINT, status STRING) USING iceberg {_properties(True)}")
    cat.sql(f"INSERT INTO {{c}}.{orders} VALUES (1, 'NEW'), (2, 'PAID')")
    s1 = cat.table(orders).current_snapshot()
    time.sleep(1.1)  # S2 in a later second than S1, for TIMESTAMP AS OF <seconds>
    cat.sql(f"ALTER TABLE {{c}}.{orders} ADD COLUMN total DOUBLE")
    cat.sql(f"INSERT INTO {{c}}.{orders} VALUES (3, 'PAID', 100.0)")
    s2 = cat.table(orders).current_snapshot()
    s1_rows, s2_rows = [(1, "NEW"), (2, "PAID")], [(1, "NEW", None), (2, "PAID", None), (3, "PAID", 100.0)]
    committed = datetime.datetime.fromtimestamp(s1.timestamp_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    seconds = s1.timestamp_ms // 1000 + 1
    assert seconds * 1000 <= s2.timestamp_ms
    # the snapshot's schema for a snapshot id or a time; the table's for a branch; a tag's snapshot's
    for clause in [f"VERSION AS OF {s1.snapshot_id}", f"FOR SYSTEM_VERSION AS OF {s1.snapshot_id}",
                   f"TIMESTAMP AS OF '{committed}'", f"FOR SYSTEM_TIME AS OF '{committed}'",
                   f"TIMESTAMP AS OF {seconds}", f"FOR SYSTEM_TIME AS OF {seconds}"]:
        assert cat.rows(f"SELECT * FROM {{c}}.{orders} {clause}") == s1_rows, clause
    assert cat.rows(f"SELECT * FROM {{c}}.{orders}") == s2_rows
    # the page's ALTER TABLE ... CREATE BRANCH/TAG (an extension statement): the table API
    with cat.table(orders).manage_snapshots() as manage:
        manage.create_branch("audit_branch", s1.snapshot_id).create_tag("first_load", s1.snapshot_id)
    for query in ["VERSION AS OF 'audit_branch'", "FOR SYSTEM_VERSION AS OF 'audit_branch'"]:
        assert cat.rows(f"SELECT * FROM {{c}}.{orders} {query}") == [(1, "NEW", None), (2, "PAID", None)]
    assert cat.rows(f"SELECT * FROM {{c}}.{orders}.`branch_audit_branch`") == [(1, "NEW", None), (2, "PAID", None)]
    assert cat.rows(f"SELECT * FROM {{c}}.{orders} VERSION AS OF 'first_load'") == s1_rows
    assert cat.rows(f"SELECT * FROM {{c}}.{orders}.`tag_first_load`") == s1_rows

    # metadata tables, each as the table API inspects it
    table = cat.table(orders)
    snapshot_ids = {s.snapshot_id for s in table.snapshots()}
    assert {r.snapshot_id for r in cat.sql(f"SELECT * FROM {{c}}.{orders}.history")} == snapshot_ids
    assert {r.snapshot_id for r in cat.sql(f"SELECT * FROM {{c}}.{orders}.snapshots")} == snapshot_ids
    joined = cat.sql(f"""select h.made_current_at, s.operation, h.snapshot_id, h.is_current_ancestor,
                                s.summary['spark.app.id']
                         from {{c}}.{orders}.history h
                         join {{c}}.{orders}.snapshots s on h.snapshot_id = s.snapshot_id
                         order by made_current_at""")
    assert [(r.snapshot_id, r.operation, r.is_current_ancestor) for r in joined] == [
        (s1.snapshot_id, "append", True), (s2.snapshot_id, "append", True)]
    for name in ["metadata_log_entries", "entries", "all_entries", "files", "manifests", "partitions",
                 "all_data_files", "all_delete_files", "all_manifests", "refs"]:
        got = cat.spark.table(f"{cat.name}.{orders}.{name}").count()
        assert got == table.inspect.table(name).num_rows, name
    assert {r.name for r in cat.sql(f"SELECT * FROM {{c}}.{orders}.refs")} == {"main", "audit_branch", "first_load"}
    files = cat.sql(f"SELECT key_metadata FROM {{c}}.{orders}.files")
    assert len(files) == len(list(table.scan().plan_files()))
    assert all(isinstance(r.key_metadata, str) and len(r.key_metadata) == 16 for r in files)  # fingerprints
    assert len(cat.sql(f"SELECT * FROM {{c}}.{orders}.manifests TIMESTAMP AS OF '{committed}'")) == 1


@pytest.mark.parametrize("encrypted", ENCRYPTION)
def test_writes(cat, encrypted):
    suffix = "enc" if encrypted else "plain"
    logs = f"db.w_logs_{suffix}"
    cat.sql(f"""CREATE TABLE {{c}}.{logs} (
                    uuid string NOT NULL,
                    level string NOT NULL,
                    ts timestamp NOT NULL,
                    message string)
                USING iceberg
                PARTITIONED BY (level, hours(ts)) {_properties(encrypted)}""")

    def day(d: int, h: int) -> datetime.datetime:
        return datetime.datetime(2020, 7, d, h)

    first = [("u1", "INFO", day(1, 10), "m1"), ("u1", "INFO", day(1, 10), "m1"), ("u2", "WARN", day(1, 11), "m2"),
             ("u3", "INFO", day(2, 10), "m3"), ("u4", "ERROR", day(3, 9), "m4")]
    cat.sql(f"INSERT INTO {{c}}.{logs} VALUES "
            + ", ".join(f"('{u}', '{lv}', TIMESTAMP '{ts:%Y-%m-%d %H:%M:%S}', '{m}')" for u, lv, ts, m in first))
    model = list(first)
    _same(cat, logs, "uuid, level, ts, message", model)
    # dynamic overwrite: the day's duplicates collapse, the other partitions stay
    cat.spark.conf.set("spark.sql.sources.partitionOverwriteMode", "dynamic")
    try:
        cat.sql(f"""INSERT OVERWRITE {{c}}.{logs}
                    SELECT uuid, first(level), first(ts), first(message)
                    FROM {{c}}.{logs}
                    WHERE cast(ts as date) = '2020-07-01'
                    GROUP BY uuid""")
    finally:
        cat.spark.conf.unset("spark.sql.sources.partitionOverwriteMode")
    model = [r for r in model if r[2].day != 1] + [("u1", "INFO", day(1, 10), "m1"), ("u2", "WARN", day(1, 11), "m2")]
    _same(cat, logs, "uuid, level, ts, message", model)
    # a static partition: every INFO row replaced (the page's SELECT, without the static column)
    cat.sql(f"""INSERT OVERWRITE {{c}}.{logs}
                PARTITION (level = 'INFO')
                SELECT uuid, first(ts), concat(first(message), '!')
                FROM {{c}}.{logs}
                WHERE level = 'INFO'
                GROUP BY uuid""")
    model = [(u, lv, ts, m + "!" if lv == "INFO" else m) for u, lv, ts, m in model]
    _same(cat, logs, "uuid, level, ts, message", model)
    cat.sql(f"DELETE FROM {{c}}.{logs} WHERE ts >= '2020-07-03 00:00:00' and ts < '2020-08-01 00:00:00'")
    model = [r for r in model if r[2] < day(3, 0)]
    _same(cat, logs, "uuid, level, ts, message", model)
    cat.sql(f"UPDATE {{c}}.{logs} SET message = 'late' WHERE ts >= '2020-07-02 00:00:00' and ts < '2020-07-03 00:00:00'")
    model = [(u, lv, ts, "late" if ts.day == 2 else m) for u, lv, ts, m in model]
    _same(cat, logs, "uuid, level, ts, message", model)

    # UPDATE and DELETE with subqueries, correlated too
    events, good = f"db.w_all_events_{suffix}", f"db.w_good_events_{suffix}"
    cat.sql(f"CREATE TABLE {{c}}.{events} (id bigint, session_time bigint, ignored boolean) USING iceberg "
            f"{_properties(encrypted)}")
    cat.sql(f"CREATE TABLE {{c}}.{good} (id bigint, session_time bigint) USING iceberg {_properties(encrypted)}")
    cat.sql(f"INSERT INTO {{c}}.{events} VALUES (1, 5, false), (2, 15, false), (3, 25, false)")
    cat.sql(f"INSERT INTO {{c}}.{good} VALUES (9, 10)")
    cat.sql(f"""UPDATE {{c}}.{events} SET session_time = 0, ignored = true
                WHERE session_time < (SELECT min(session_time) FROM {{c}}.{good})""")
    _same(cat, events, "id, session_time, ignored", [(1, 0, True), (2, 15, False), (3, 25, False)])
    cat.sql(f"DELETE FROM {{c}}.{events} WHERE session_time < (SELECT min(session_time) FROM {{c}}.{good})")
    _same(cat, events, "id, session_time, ignored", [(2, 15, False), (3, 25, False)])
    orders, returned = f"db.w_orders_{suffix}", f"db.w_returned_{suffix}"
    cat.sql(f"CREATE TABLE {{c}}.{orders} (oid bigint, order_status string) USING iceberg {_properties(encrypted)}")
    cat.sql(f"CREATE TABLE {{c}}.{returned} (oid bigint) USING iceberg {_properties(encrypted)}")
    cat.sql(f"INSERT INTO {{c}}.{orders} VALUES (1, 'new'), (2, 'new'), (3, 'new')")
    cat.sql(f"INSERT INTO {{c}}.{returned} VALUES (2), (3)")
    cat.sql(f"""UPDATE {{c}}.{orders} AS t1 SET order_status = 'returned'
                WHERE EXISTS (SELECT oid FROM {{c}}.{returned} WHERE t1.oid = oid)""")
    _same(cat, orders, "oid, order_status", [(1, "new"), (2, "returned"), (3, "returned")])
    cat.sql(f"DELETE FROM {{c}}.{returned} WHERE oid = 3")
    cat.sql(f"DELETE FROM {{c}}.{orders} AS t1 WHERE EXISTS (SELECT oid FROM {{c}}.{returned} WHERE t1.oid = oid)")
    _same(cat, orders, "oid, order_status", [(1, "new"), (3, "returned")])

    # the page's MERGE INTO, every clause
    target = f"db.w_target_{suffix}"
    cat.sql(f"CREATE TABLE {{c}}.{target} (id bigint, count bigint, status string) USING iceberg "
            f"{_properties(encrypted)}")
    cat.sql(f"INSERT INTO {{c}}.{target} VALUES (1, 5, 'ok'), (2, null, 'ok'), (3, 7, 'ok'), (4, 1, 'ok')")
    cat.sql("""CREATE OR REPLACE TEMP VIEW changes AS SELECT * FROM VALUES
               (1L, 'delete', TIMESTAMP '2020-01-01 00:00:00'), (2L, 'increment', TIMESTAMP '2020-01-01 00:00:00'),
               (3L, 'increment', TIMESTAMP '2020-01-01 00:00:00'), (5L, 'insert', TIMESTAMP '2020-01-01 00:00:00'),
               (6L, 'insert', TIMESTAMP '2010-01-01 00:00:00') AS s(id, op, event_time)""")
    cat.sql(f"""MERGE INTO {{c}}.{target} t
                USING (SELECT * FROM changes) s
                ON t.id = s.id
                WHEN MATCHED AND s.op = 'delete' THEN DELETE
                WHEN MATCHED AND t.count IS NULL AND s.op = 'increment' THEN UPDATE SET t.count = 0
                WHEN MATCHED AND s.op = 'increment' THEN UPDATE SET t.count = t.count + 1
                WHEN NOT MATCHED AND s.event_time > TIMESTAMP '2015-01-01 00:00:00' THEN INSERT (id, count)
                    VALUES (s.id, 1)
                WHEN NOT MATCHED BY SOURCE THEN UPDATE SET status = 'invalid'""")
    _same(cat, target, "id, count, status", [(2, 0, "ok"), (3, 8, "ok"), (4, 1, "invalid"), (5, 1, None)])

    # writes to a branch: by identifier, and through the session's WAP branch
    branched = f"db.w_branch_{suffix}"
    cat.sql(f"CREATE TABLE {{c}}.{branched} (id bigint, val string) USING iceberg "
            f"{_properties(encrypted, WAP)}")
    cat.sql(f"INSERT INTO {{c}}.{branched} VALUES (1, 'a')")
    with cat.table(branched).manage_snapshots() as manage:
        manage.create_branch("audit", cat.table(branched).current_snapshot_id)
    audit = f"{branched}.branch_audit"
    cat.sql(f"INSERT INTO {{c}}.{audit} VALUES (1, 'a'), (2, 'b')")
    cat.sql(f"""MERGE INTO {{c}}.{audit} t USING (SELECT 2L AS id, 'z' AS val) s ON t.id = s.id
                WHEN MATCHED THEN UPDATE SET t.val = s.val""")
    cat.sql(f"UPDATE {{c}}.{audit} AS t1 SET val = 'c' WHERE id = 2")
    cat.sql(f"DELETE FROM {{c}}.{audit} WHERE id = 1")
    assert cat.rows(f"SELECT * FROM {{c}}.{audit}") == [(2, "c")]
    _same(cat, branched, "id, val", [(1, "a")])  # main untouched
    cat.spark.conf.set("spark.wap.branch", "audit")
    try:
        cat.sql(f"INSERT INTO {{c}}.{branched} VALUES (3, 'c')")
        assert cat.rows(f"SELECT * FROM {{c}}.{branched}") == [(2, "c"), (3, "c")]  # reads the WAP branch too
    finally:
        cat.spark.conf.unset("spark.wap.branch")
    _same(cat, branched, "id, val", [(1, "a")])
    assert cat.rows(f"SELECT * FROM {{c}}.{audit}") == [(2, "c"), (3, "c")]
    cat.sql(f"CALL {{c}}.system.fast_forward('{branched}', 'main', 'audit')")
    _same(cat, branched, "id, val", [(2, "c"), (3, "c")])

    # DataFrameWriterV2, the page's calls
    from pyspark.sql import functions as F

    df = cat.spark.createDataFrame([(7, "q")], "id bigint, val string")
    df.writeTo(f"{cat.name}.{audit}").append()
    df.writeTo(f"{cat.name}.{branched}").append()
    _same(cat, branched, "id, val", [(2, "c"), (3, "c"), (7, "q")])
    assert cat.rows(f"SELECT * FROM {{c}}.{audit}") == [(2, "c"), (3, "c"), (7, "q")]
    cat.spark.createDataFrame([(8, "q")], "id bigint, val string").writeTo(f"{cat.name}.{branched}").overwrite(
        F.col("val") == "q")
    _same(cat, branched, "id, val", [(2, "c"), (3, "c"), (8, "q")])
    created = f"db.w_created_{suffix}"
    frame = cat.spark.createDataFrame([("INFO", datetime.datetime(2020, 7, 1, 1), "m")], "level string, ts timestamp, "
                                                                                         "message string")
    writer = frame.writeTo(f"{cat.name}.{created}").using("iceberg")
    if encrypted:
        writer = writer.tableProperty("encryption.key-id", MASTER)
    writer.create()
    _same(cat, created, "level, message", [("INFO", "m")])
    writer = frame.writeTo(f"{cat.name}.{created}").tableProperty("write.format.default", "parquet") \
        .partitionedBy(F.col("level"), F.days(F.col("ts")))
    if encrypted:
        writer = writer.tableProperty("encryption.key-id", MASTER)
    writer.createOrReplace()
    assert [str(f.transform) for f in cat.table(created).spec.fields] == ["identity", "day"]
    frame.unionByName(frame.withColumn("level", F.lit("WARN"))).writeTo(f"{cat.name}.{created}").overwritePartitions()
    frame.withColumn("message", F.lit("n")).writeTo(f"{cat.name}.{created}").overwritePartitions()
    _same(cat, created, "level, message", [("INFO", "n"), ("WARN", "m")])
    frame.withColumn("level", F.lit("WARN")).writeTo(f"{cat.name}.{created}").overwrite(F.col("level") == "WARN")
    _same(cat, created, "level, message", [("INFO", "n"), ("WARN", "m")])
    if encrypted:
        for name in (logs, events, orders, target, branched, created):
            _sealed(cat, name)


def test_write_audit_publish_with_a_wap_id(cat):
    """``spark.wap.id``: an append is staged (committed, not current), then published by
    ``publish_changes``; other writes refuse to be staged; the session setting applies only
    to tables with write.wap.enabled=true."""
    t = "db.wap_ids"
    cat.sql(f"CREATE TABLE {{c}}.{t} (id bigint) USING iceberg {_properties(True, WAP)}")
    cat.sql(f"CREATE TABLE {{c}}.db.wap_off (id bigint) USING iceberg {_properties(True)}")
    cat.sql(f"INSERT INTO {{c}}.{t} VALUES (1)")
    cat.spark.conf.set("spark.wap.id", "wap-1")
    try:
        cat.sql(f"INSERT INTO {{c}}.{t} VALUES (2)")
        cat.sql("INSERT INTO {c}.db.wap_off VALUES (5)")  # not enabled: an ordinary append
        before = cat.table(t).metadata_location
        for statement in [f"DELETE FROM {{c}}.{t} WHERE id = 1", f"UPDATE {{c}}.{t} SET id = 0 WHERE id = 1",
                          f"INSERT OVERWRITE {{c}}.{t} VALUES (9)"]:
            with pytest.raises(Exception, match="spark.wap.id"):
                cat.sql(statement)
            assert cat.table(t).metadata_location == before, statement
        cat.spark.conf.set("spark.wap.branch", "b")
        with pytest.raises(Exception, match="cannot set both spark.wap.id"):
            cat.sql(f"SELECT * FROM {{c}}.{t}")
        cat.spark.conf.unset("spark.wap.branch")
    finally:
        cat.spark.conf.unset("spark.wap.id")
        cat.spark.conf.unset("spark.wap.branch")
    _same(cat, t, "id", [(1,)])
    _same(cat, "db.wap_off", "id", [(5,)])
    staged = [s for s in cat.table(t).snapshots() if s.summary.get("wap.id") == "wap-1"]
    assert len(staged) == 1
    assert cat.rows(f"SELECT * FROM {{c}}.{t} VERSION AS OF {staged[0].snapshot_id}") == [(1,), (2,)]
    assert cat.rows(f"CALL {{c}}.system.publish_changes('{t}', 'wap-1')")[0][0] == staged[0].snapshot_id
    _same(cat, t, "id", [(1,), (2,)])
    ancestors = cat.rows(f"CALL {{c}}.system.ancestors_of('{t}')")
    table = cat.table(t)
    chain, snapshot = [], table.current_snapshot()
    while snapshot is not None:
        chain.append((snapshot.snapshot_id, snapshot.timestamp_ms))
        snapshot = table.snapshot(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id else None
    assert sorted(ancestors) == sorted(chain) and len(chain) == 2
    with pytest.raises(Exception, match="no snapshot was staged with wap.id 'nope'"):
        cat.sql(f"CALL {{c}}.system.publish_changes('{t}', 'nope')")


def test_procedures(cat):
    t = "db.p_sample"
    cat.sql(f"CREATE TABLE {{c}}.{t} (id bigint, name string) USING iceberg {_properties(True)}")
    for i in range(3):
        cat.sql(f"INSERT INTO {{c}}.{t} VALUES ({i}, 'n{i}')")
    table = cat.table(t)
    ids = [s.snapshot_id for s in sorted(table.snapshots(), key=lambda s: s.sequence_number)]
    # named arguments in any order, positional ones in order
    cat.sql(f"CALL {{c}}.system.rollback_to_snapshot(snapshot_id => {ids[1]}, table => '{t}')")
    _same(cat, t, "id, name", [(0, "n0"), (1, "n1")])
    cat.sql(f"CALL {{c}}.system.set_current_snapshot('{t}', {ids[2]})")
    _same(cat, t, "id, name", [(0, "n0"), (1, "n1"), (2, "n2")])
    cat.sql(f"CALL {{c}}.system.rollback_to_timestamp('{t}', TIMESTAMP '2999-06-30 00:00:00.000')")
    _same(cat, t, "id, name", [(0, "n0"), (1, "n1"), (2, "n2")])  # the newest ancestor before then: the current
    cat.sql(f"CALL {{c}}.system.rollback_to_snapshot('{t}', {ids[0]})")
    cat.sql(f"CALL {{c}}.system.cherrypick_snapshot(snapshot_id => {ids[1]}, table => '{t}')")
    _same(cat, t, "id, name", [(0, "n0"), (1, "n1")])
    with cat.table(t).manage_snapshots() as manage:
        manage.create_branch("audit-branch", ids[2])
    cat.sql(f"CALL {{c}}.system.set_current_snapshot(table => '{t}', ref => 'audit-branch')")
    _same(cat, t, "id, name", [(0, "n0"), (1, "n1"), (2, "n2")])
    cat.sql(f"INSERT INTO {{c}}.{t}.`branch_audit-branch` VALUES (3, 'n3')")
    cat.sql(f"CALL {{c}}.system.fast_forward('{t}', 'main', 'audit-branch')")
    _same(cat, t, "id, name", [(0, "n0"), (1, "n1"), (2, "n2"), (3, "n3")])
    cat.sql(f"CALL {{c}}.system.rewrite_data_files('{t}')")
    cat.sql(f"CALL {{c}}.system.rewrite_data_files(table => '{t}', strategy => 'sort', "
            "sort_order => 'id DESC NULLS LAST,name ASC NULLS FIRST')")
    cat.sql(f"CALL {{c}}.system.rewrite_data_files(table => '{t}', strategy => 'sort', sort_order => 'zorder(id,name)')")
    cat.sql(f"CALL {{c}}.system.rewrite_data_files(table => '{t}', options => map('min-input-files', '2'))")
    cat.sql(f"CALL {{c}}.system.rewrite_data_files(table => '{t}', where => 'id = 3 and name = \\'n3\\'')")
    cat.sql(f"CALL {{c}}.system.rewrite_manifests('{t}')")
    # the page's rewrite_position_delete_files calls: a table of deletion vectors (v3) has none to rewrite
    for call in (f"'{t}'", f"table => '{t}', options => map('rewrite-all', 'true')",
                 f"table => '{t}', options => map('min-input-files', '2')"):
        assert cat.rows(f"CALL {{c}}.system.rewrite_position_delete_files({call})") == [(0, 0, 0, 0)]
    _same(cat, t, "id, name", [(0, "n0"), (1, "n1"), (2, "n2"), (3, "n3")])
    assert cat.rows(f"CALL {{c}}.system.remove_orphan_files(table => '{t}', dry_run => true)") == []
    # the page's expire_snapshots: by age keeping the last 100 (positional), then one by id
    table = cat.table(t)
    refs = table.metadata["refs"]
    heads = {refs["main"]["snapshot-id"], refs["audit-branch"]["snapshot-id"]}
    by_id = {s.snapshot_id: s for s in table.snapshots()}
    lines = set()
    for head in heads:
        while head in by_id:
            lines.add(head)
            head = by_id[head].parent_snapshot_id
    cat.sql(f"CALL {{c}}.system.expire_snapshots('{t}', TIMESTAMP '2999-06-30 00:00:00.000', 100)")
    assert {s.snapshot_id for s in cat.table(t).snapshots()} == lines  # every ancestor of a branch head
    one = min(lines - heads, key=lambda i: by_id[i].sequence_number)
    cat.sql(f"CALL {{c}}.system.expire_snapshots(table => '{t}', snapshot_ids => ARRAY({one}))")
    assert {s.snapshot_id for s in cat.table(t).snapshots()} == lines - {one}
    _same(cat, t, "id, name", [(0, "n0"), (1, "n1"), (2, "n2"), (3, "n3")])
    kept = heads
    cat.sql(f"CALL {{c}}.system.expire_snapshots('{t}', TIMESTAMP '2999-06-30 00:00:00.000')")
    assert {s.snapshot_id for s in cat.table(t).snapshots()} == kept  # the heads of main and the branch
    _same(cat, t, "id, name", [(0, "n0"), (1, "n1"), (2, "n2"), (3, "n3")])
    _sealed(cat, t)


def test_views(cat):
    """The DDL page's "Iceberg views in Spark" statements, on an encrypted table."""
    t = "db.view_base"
    cat.sql(f"CREATE TABLE {{c}}.{t} (id bigint, zip string) USING iceberg {_properties(True)}")
    cat.sql(f"INSERT INTO {{c}}.{t} VALUES (1, '10115'), (2, '80331')")
    cat.sql(f"CREATE VIEW {{c}}.db.v_all AS SELECT * FROM {{c}}.{t}")
    cat.sql(f"CREATE VIEW IF NOT EXISTS {{c}}.db.v_all AS SELECT * FROM {{c}}.{t}")
    assert cat.rows("SELECT * FROM {c}.db.v_all") == [(1, "10115"), (2, "80331")]
    cat.sql(f"CREATE VIEW {{c}}.db.v_zip (ID COMMENT 'Unique ID', ZIP COMMENT 'Zipcode') COMMENT 'View Comment' "
            f"TBLPROPERTIES ('key1'='val1', 'key2'='val2') AS SELECT id, zip FROM {{c}}.{t}")
    described = {r.col_name: (r.data_type, r.comment) for r in cat.sql("DESCRIBE {c}.db.v_zip")}
    assert described["ID"] == ("bigint", "Unique ID") and described["ZIP"] == ("string", "Zipcode")
    properties = dict(tuple(r) for r in cat.sql("SHOW TBLPROPERTIES {c}.db.v_zip"))
    assert properties["key1"] == "val1" and properties["key2"] == "val2"
    assert {"ID", "ZIP"} <= {r[0] for r in cat.sql("DESCRIBE EXTENDED {c}.db.v_zip")}
    assert "COMMENT 'View Comment'" in cat.sql("SHOW CREATE TABLE {c}.db.v_zip")[0][0]
    cat.sql(f"CREATE OR REPLACE VIEW {{c}}.db.v_zip (updated_id COMMENT 'updated ID') "
            f"TBLPROPERTIES ('key1' = 'new_val1') AS SELECT id FROM {{c}}.{t}")
    assert cat.rows("SELECT updated_id FROM {c}.db.v_zip") == [(1,), (2,)]
    cat.sql("ALTER VIEW {c}.db.v_zip SET TBLPROPERTIES ('key1' = 'val1', 'key2' = 'val2')")
    cat.sql("ALTER VIEW {c}.db.v_zip UNSET TBLPROPERTIES ('key2')")
    properties = dict(tuple(r) for r in cat.sql("SHOW TBLPROPERTIES {c}.db.v_zip"))
    assert properties.get("key1") == "val1" and "key2" not in properties
    assert {r.viewName for r in cat.sql("SHOW VIEWS IN {c}.db")} >= {"v_all", "v_zip"}
    assert {r.viewName for r in cat.sql("SHOW VIEWS IN {c}.db LIKE 'v_z*'")} == {"v_zip"}
    cat.sql("ALTER VIEW {c}.db.v_zip RENAME TO {c}.db.v_renamed")
    assert cat.rows("SELECT * FROM {c}.db.v_renamed") == [(1,), (2,)]
    cat.sql("DROP VIEW {c}.db.v_renamed")
    cat.sql("DROP VIEW IF EXISTS {c}.db.v_renamed")
    cat.sql("DROP VIEW {c}.db.v_all")
    assert not [r for r in cat.sql("SHOW VIEWS IN {c}.db") if r.viewName in ("v_all", "v_zip", "v_renamed")]
    _same(cat, t, "id, zip", [(1, "10115"), (2, "80331")])


def test_changelog_view(cat):
    """The procedures page's ``create_changelog_view`` calls (a snapshot range, a time
    range with a view name, identifier columns, net changes up to a snapshot) and its
    query of the view."""
    t = "db.tbl"
    cat.sql(f"CREATE TABLE {{c}}.{t} (id bigint, name string) USING iceberg {_properties(True)}")
    cat.sql(f"INSERT INTO {{c}}.{t} SELECT /*+ REPARTITION(1) */ * FROM VALUES (1, 'Alice'), (2, 'Bob') AS v(id, name)")
    cat.sql(f"UPDATE {{c}}.{t} SET name = 'Carol' WHERE id = 1")
    cat.sql(f"INSERT INTO {{c}}.{t} VALUES (3, 'Dave')")
    table = cat.table(t)
    snaps = sorted(table.snapshots(), key=lambda s: s.sequence_number)
    ids = [s.snapshot_id for s in snaps]
    got = cat.rows(f"CALL {{c}}.system.create_changelog_view(table => '{t}', "
                   f"options => map('start-snapshot-id', '{ids[0]}', 'end-snapshot-id', '{ids[1]}'))")
    assert got == [("`tbl_changes`",)]
    assert cat.rows("SELECT id, name, _change_type, _change_ordinal FROM tbl_changes") == [
        (1, "Alice", "DELETE", 0), (1, "Carol", "INSERT", 0)]  # Bob's carry-over removed
    start, end = snaps[1].timestamp_ms - 1, snaps[2].timestamp_ms
    cat.sql(f"CALL {{c}}.system.create_changelog_view(table => '{t}', "
            f"options => map('start-timestamp', '{start}', 'end-timestamp', '{end}'), "
            "changelog_view => 'my_changelog_view')")
    assert {r[0] for r in cat.rows("SELECT id FROM my_changelog_view")} == {1, 3}
    cat.sql(f"CALL {{c}}.system.create_changelog_view(table => '{t}', "
            f"options => map('start-snapshot-id', '{ids[0]}', 'end-snapshot-id', '{ids[1]}'), "
            "identifier_columns => array('id', 'name'))")
    assert cat.rows("SELECT id, name, _change_type FROM tbl_changes") == [(1, "Alice", "DELETE"), (1, "Carol", "INSERT")]
    cat.sql(f"CALL {{c}}.system.create_changelog_view(table => '{t}', identifier_columns => array('id'))")
    assert cat.rows("SELECT id, name, _change_type FROM tbl_changes WHERE _change_type LIKE 'UPDATE%'") == [
        (1, "Alice", "UPDATE_BEFORE"), (1, "Carol", "UPDATE_AFTER")]
    cat.sql(f"CALL {{c}}.system.create_changelog_view(table => '{t}', options => map('end-snapshot-id', '{ids[2]}'), "
            "net_changes => true)")
    assert cat.rows("SELECT id, name, _change_type FROM tbl_changes") == [
        (1, "Carol", "INSERT"), (2, "Bob", "INSERT"), (3, "Dave", "INSERT")]
    assert cat.rows("SELECT * FROM tbl_changes WHERE _change_type = 'INSERT' AND id = 3 ORDER BY _change_ordinal") == [
        (3, "Dave", "INSERT", 2, ids[2])]
    assert [s.snapshot_id for s in cat.table(t).snapshots()] == [s.snapshot_id for s in snaps]  # nothing committed
    _sealed(cat, t)
