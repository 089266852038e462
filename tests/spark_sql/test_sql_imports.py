"""``CALL cat.system.add_files(...)``: Parquet files Spark wrote (a directory, and a table of
Spark's session catalog) added to a plaintext table as they are, partitioned by their
``col=value`` directories; the rows read back through SQL and ``EncryptedTable.scan()``
equal a plain-Python model after every call.  Every refusal (an encrypted table, files
outside the table, a duplicate, a foreign format, a bad filter) leaves the table as it was:
the same metadata version, and the caller's files all still there."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import MASTER, data_files

pytestmark = pytest.mark.spark


def _call(cat, statement: str) -> list[tuple]:
    return [tuple(r) for r in cat.sql("CALL {c}.system." + statement)]


def _root(cat, name: str) -> Path:
    return Path(cat.table(name).location.removeprefix("file:"))


def _write(spark, rows: list[tuple], path: Path, *, partitioned: bool = True) -> None:
    frame = spark.createDataFrame(rows, "id bigint, region string")
    writer = frame.coalesce(1).write.mode("append")
    (writer.partitionBy("region") if partitioned else writer).parquet(str(path))


def _scan(cat, name: str) -> list[tuple]:
    rows = cat.table(name).scan().to_arrow().to_pylist()
    return sorted((r["id"], r["region"]) for r in rows)


def test_add_files_from_a_directory_and_from_a_session_table(cat):
    spark = cat.spark
    name = "db.imported"
    cat.sql(f"CREATE TABLE {{c}}.{name} (id bigint, region string) USING iceberg PARTITIONED BY (region)")
    landing = _root(cat, name) / "landing"
    eu, us = [(1, "eu"), (2, "eu")], [(3, "us"), (4, None)]
    _write(spark, eu + us, landing)

    # one partition, by the filter; then the others
    source = f"`parquet`.`{landing}`"
    assert _call(cat, f"add_files(table => '{name}', source_table => '{source}', "
                      "partition_filter => map('region', 'eu'))") == [(1, 1)]
    assert cat.rows(f"SELECT * FROM {{c}}.{name}") == eu
    with pytest.raises(Exception, match="already data files of the table"):
        _call(cat, f"add_files('{name}', '{source}')")
    assert cat.rows(f"SELECT * FROM {{c}}.{name}") == eu
    assert _call(cat, f"add_files('{name}', '{source}', map('region', 'us'))") == [(1, 1)]
    assert _call(cat, f"add_files('{name}', '{source}', map('region', '__HIVE_DEFAULT_PARTITION__'))") == [(1, 1)]
    assert cat.rows(f"SELECT * FROM {{c}}.{name}") == eu + us
    assert _scan(cat, name) == eu + us
    # pruned by the partition the directory gave; the files are recorded where they are
    assert cat.rows(f"SELECT id FROM {{c}}.{name} WHERE region = 'us'") == [(3,)]
    paths = [r[0] for r in cat.sql(f"SELECT file_path FROM {{c}}.{name}.files")]
    assert len(paths) == 3 and all("/landing/region=" in p for p in paths)
    # the table is written as usual after the import, and reads the old files by name
    cat.sql(f"INSERT INTO {{c}}.{name} VALUES (5, 'eu')")
    cat.sql(f"DELETE FROM {{c}}.{name} WHERE id = 2")
    assert cat.rows(f"SELECT * FROM {{c}}.{name} WHERE region = 'eu'") == [(1, "eu"), (5, "eu")]

    # a table of Spark's session catalog, external, under the Iceberg table's directory
    other = "db.from_table"
    cat.sql(f"CREATE TABLE {{c}}.{other} (id bigint, region string) USING iceberg PARTITIONED BY (region)")
    src_dir = _root(cat, other) / "src"
    spark.sql(f"CREATE TABLE spark_catalog.default.import_src (id bigint, region string) USING parquet "
              f"PARTITIONED BY (region) LOCATION '{src_dir}'")
    try:
        spark.sql("INSERT INTO spark_catalog.default.import_src VALUES (7, 'eu'), (8, 'us'), (9, 'us')")
        assert _call(cat, f"add_files('{other}', 'default.import_src')") == [(2, 2)]
        assert cat.rows(f"SELECT * FROM {{c}}.{other}") == [(7, "eu"), (8, "us"), (9, "us")]
        assert _scan(cat, other) == [(7, "eu"), (8, "us"), (9, "us")]
    finally:
        spark.sql("DROP TABLE spark_catalog.default.import_src")


def test_an_unpartitioned_source_into_a_partitioned_table_takes_partitions_from_statistics(cat):
    spark = cat.spark
    name = "db.by_stats"
    cat.sql(f"CREATE TABLE {{c}}.{name} (id bigint, region string) USING iceberg PARTITIONED BY (region)")
    landing = _root(cat, name) / "flat"
    _write(spark, [(1, "eu"), (2, "eu")], landing, partitioned=False)
    assert _call(cat, f"add_files('{name}', '`parquet`.`{landing}`')") == [(1, 1)]
    assert cat.rows(f"SELECT * FROM {{c}}.{name} WHERE region = 'eu'") == [(1, "eu"), (2, "eu")]
    # a file whose rows span two partitions cannot be one data file of the table
    _write(spark, [(3, "eu"), (4, "us")], landing, partitioned=False)
    before = cat.table(name).metadata_location
    with pytest.raises(Exception, match="more than one partition value"):
        _call(cat, f"add_files(table => '{name}', source_table => '`parquet`.`{landing}`', "
                   "check_duplicate_files => false)")
    assert cat.table(name).metadata_location == before


@pytest.fixture(scope="module")
def guarded(cat):
    """A plaintext and an encrypted table, with files Spark wrote under each, and a
    directory outside both."""
    cat.sql("CREATE TABLE {c}.db.add_plain (id bigint, region string) USING iceberg")
    cat.sql(f"CREATE TABLE {{c}}.db.add_enc (id bigint, region string) USING iceberg "
            f"TBLPROPERTIES ('encryption.key-id'='{MASTER}')")
    for name in ("db.add_plain", "db.add_enc"):
        cat.sql(f"INSERT INTO {{c}}.{name} VALUES (1, 'a')")
        _write(cat.spark, [(2, "b")], _root(cat, name) / "landing", partitioned=False)
    outside = cat.warehouse / "outside"
    _write(cat.spark, [(2, "b")], outside, partitioned=False)
    (_root(cat, "db.add_plain") / "landing" / "notes.txt").write_text("not parquet")
    return cat


@pytest.mark.parametrize(("name", "arguments", "error"), [
    ("db.add_enc", "'`parquet`.`{root}/landing`'", "the table is encrypted"),
    ("db.add_plain", "'`parquet`.`{outside}`'", "lies outside table"),
    ("db.add_plain", "'`orc`.`{root}/landing`'", "only Parquet files can be added"),
    ("db.add_plain", "'`parquet`.`{root}/nowhere`'", "not a directory"),
    ("db.add_plain", "'`parquet`.`{root}/landing`'", "notes.txt: not a Parquet file"),
    ("db.add_plain", "'default.no_such_table'", "no such table in Spark's session catalog"),
    ("db.add_plain", "'`parquet`.`{root}/landing`', map('region', 'x')", "not partitioned by"),
])  # fmt: skip
def test_refusals_leave_the_table_and_the_files_as_they_were(guarded, name, arguments, error):
    root = _root(guarded, name)
    arguments = arguments.format(root=root, outside=guarded.warehouse / "outside")
    before = guarded.table(name).metadata_location, data_files(root), data_files(guarded.warehouse / "outside")
    with pytest.raises(Exception) as info:
        _call(guarded, f"add_files('{name}', {arguments})")
    text = str(info.value)
    assert error in text and f"CALL {guarded.name}.system.add_files" in text, text
    after = guarded.table(name).metadata_location, data_files(root), data_files(guarded.warehouse / "outside")
    assert after == before
    assert guarded.rows(f"SELECT * FROM {{c}}.{name}") == [(1, "a")]


@pytest.mark.parametrize("vectorized", [True, False], ids=["batches", "rows"])
def test_row_level_sql_and_metadata_columns_on_added_files(cat, vectorized):
    """The added files (no field ids, no partition column) under UPDATE, MERGE INTO and
    DELETE, copy-on-write and merge-on-read, read as batches and as rows; _file, _pos and
    the row lineage columns of their rows; the changelog of the import."""
    spark = cat.spark
    name = f"db.rowlevel_{'batches' if vectorized else 'rows'}"
    cat.sql(f"CREATE TABLE {{c}}.{name} (id bigint, region string) USING iceberg PARTITIONED BY (region) "
            "TBLPROPERTIES ('write.delete.mode'='merge-on-read', 'write.update.mode'='copy-on-write', "
            "'write.merge.mode'='merge-on-read')")
    landing = _root(cat, name) / "landing"
    model = {1: "eu", 2: "eu", 3: "us", 4: "us"}
    _write(spark, sorted(model.items(), key=lambda r: r[0]), landing)
    spark.conf.set("spark.sql.parquet.enableVectorizedReader", str(vectorized).lower())
    try:
        _call(cat, f"add_files('{name}', '`parquet`.`{landing}`')")
        snapshot = cat.table(name).current_snapshot_id
        rows = cat.rows(f"SELECT id, region, _pos, _row_id, _file FROM {{c}}.{name}")
        assert [(r[0], r[1]) for r in rows] == sorted(model.items())
        assert sorted(r[3] for r in rows) == [0, 1, 2, 3] and {r[2] for r in rows} == {0, 1}
        assert all(f"/landing/region={r[1]}/" in r[4] for r in rows)
        changes = cat.rows(f"SELECT id, region, _change_type FROM {{c}}.{name}.changes")
        assert changes == [(i, r, "INSERT") for i, r in sorted(model.items())]

        cat.sql(f"UPDATE {{c}}.{name} SET id = id + 10 WHERE id = 1")
        model[11] = model.pop(1)
        cat.sql(f"DELETE FROM {{c}}.{name} WHERE id = 3")
        del model[3]
        spark.createDataFrame([(2, "eu"), (5, "us")], "id bigint, region string").createOrReplaceTempView("src")
        cat.sql(f"MERGE INTO {{c}}.{name} t USING src s ON t.id = s.id "
                "WHEN MATCHED THEN UPDATE SET t.region = 'eu-2' WHEN NOT MATCHED THEN INSERT *")
        model[2] = "eu-2"
        model[5] = "us"
        expected = sorted(model.items())
        assert cat.rows(f"SELECT * FROM {{c}}.{name}") == expected
        assert _scan(cat, name) == expected
        assert cat.rows(f"SELECT id FROM {{c}}.{name} WHERE region = 'us'") == [(4,), (5,)]
        assert cat.rows(f"SELECT * FROM {{c}}.{name} VERSION AS OF {snapshot}") == [(1, "eu"), (2, "eu"), (3, "us"),
                                                                                     (4, "us")]
    finally:
        spark.conf.unset("spark.sql.parquet.enableVectorizedReader")


def test_a_renamed_column_of_a_table_with_a_name_mapping_is_refused_by_sql(cat):
    name = "db.renamed"
    cat.sql(f"CREATE TABLE {{c}}.{name} (id bigint, region string) USING iceberg")
    landing = _root(cat, name) / "landing"
    _write(cat.spark, [(1, "eu")], landing, partitioned=False)
    _call(cat, f"add_files('{name}', '`parquet`.`{landing}`')")
    cat.sql(f"ALTER TABLE {{c}}.{name} RENAME COLUMN region TO area")
    with pytest.raises(Exception, match="was renamed to 'area'.*reads such a table's files by name"):
        cat.sql(f"SELECT * FROM {{c}}.{name}")
    # icecrypt's Python reader maps each file's names through the mapping
    assert [tuple(r.values()) for r in cat.table(name).scan().to_arrow().to_pylist()] == [(1, "eu")]


def _source(spark, name: str, rows: list[tuple], location: Path | None) -> None:
    where = f" LOCATION '{location}'" if location is not None else ""
    spark.sql(f"CREATE TABLE spark_catalog.{name} (id bigint, v double, region string) USING parquet "
              f"PARTITIONED BY (region){where}")
    spark.createDataFrame(rows, "id bigint, v double, region string").write.insertInto(f"spark_catalog.{name}")


def test_migrate_a_table_of_sparks_session_catalog(cat, tmp_path):
    spark = cat.spark
    spark.sql("CREATE DATABASE IF NOT EXISTS spark_catalog.migdb")
    cat.sql("CREATE NAMESPACE IF NOT EXISTS {c}.migdb")
    rows = [(1, 0.5, "eu"), (2, None, "eu"), (3, 1.5, "us"), (4, 2.5, None)]
    location = tmp_path / "external_src"
    _source(spark, "migdb.ext", rows, location)
    try:
        # refused before anything is done: an encrypted target, a taken backup name
        for call, error in ((f"migrate('migdb.ext', map('encryption.key-id', '{MASTER}'))", "cannot be encrypted"),
                            ("migrate(table => 'migdb.ext', backup_table_name => 'migdb.ext')", "must name a new table")):
            with pytest.raises(Exception, match=error):
                _call(cat, call)
            assert not (location / "metadata").exists()
            assert spark.sql("SHOW TABLES IN {c}.migdb".replace("{c}", cat.name)).count() == 0

        assert _call(cat, "migrate(table => 'migdb.ext', properties => map('owner', 'etl'), "
                          "backup_table_name => 'migdb.ext_backup')") == [(3,)]
        name = "migdb.ext"
        table = cat.table(name)
        assert table.properties["owner"] == "etl" and "schema.name-mapping.default" in table.properties
        assert not table.encrypted and table.location.removeprefix("file:").rstrip("/").endswith(str(location))
        assert [f.name for f in table.spec.fields] == ["region"]
        assert cat.rows(f"SELECT * FROM {{c}}.{name}") == sorted(rows)
        assert cat.rows(f"SELECT id FROM {{c}}.{name} WHERE region IS NULL") == [(4,)]
        # the source was renamed (its files stay); the new table is written as any other
        assert not spark.catalog.tableExists("spark_catalog.migdb.ext")
        assert spark.catalog.tableExists("spark_catalog.migdb.ext_backup")
        cat.sql(f"INSERT INTO {{c}}.{name} VALUES (5, 3.5, 'us')")
        cat.sql(f"UPDATE {{c}}.{name} SET v = 9.0 WHERE id = 1")
        expected = sorted([(1, 9.0, "eu"), *rows[1:], (5, 3.5, "us")])
        assert cat.rows(f"SELECT * FROM {{c}}.{name}") == expected
        scanned = sorted(tuple(r.values()) for r in cat.table(name).scan().to_arrow().to_pylist())
        assert scanned == expected
    finally:
        spark.sql("DROP TABLE IF EXISTS spark_catalog.migdb.ext_backup")
        spark.sql("DROP TABLE IF EXISTS spark_catalog.migdb.ext")


def test_migrate_refuses_to_move_a_managed_table_and_rolls_back_a_failed_import(cat, tmp_path):
    spark = cat.spark
    spark.sql("CREATE DATABASE IF NOT EXISTS spark_catalog.migdb")
    cat.sql("CREATE NAMESPACE IF NOT EXISTS {c}.migdb")
    rows = [(1, 0.5, "eu"), (2, 1.5, "us")]
    _source(spark, "migdb.managed", rows, None)
    bad = tmp_path / "bad_src"
    _source(spark, "migdb.bad", rows, bad)
    try:
        with pytest.raises(Exception, match="managed table .* would move or delete the files"):
            _call(cat, "migrate(table => 'migdb.managed', drop_backup => true)")
        assert spark.catalog.tableExists("spark_catalog.migdb.managed")
        # a file the import cannot take: nothing is left of the new table
        next((bad / "region=eu").glob("*.parquet")).with_name("stray.parquet").write_bytes(b"not parquet")
        with pytest.raises(Exception, match="stray.parquet: not a Parquet file"):
            _call(cat, "migrate('migdb.bad')")
        assert not (bad / "metadata").exists()
        assert spark.sql("SHOW TABLES IN {c}.migdb".replace("{c}", cat.name)).filter("tableName = 'bad'").count() == 0
        assert spark.catalog.tableExists("spark_catalog.migdb.bad")
        # without a backup step a managed table migrates; the source stays as it was
        assert _call(cat, "migrate('migdb.managed')") == [(2,)]
        assert cat.rows("SELECT * FROM {c}.migdb.managed") == rows
        assert spark.catalog.tableExists("spark_catalog.migdb.managed")
    finally:
        spark.sql("DROP TABLE IF EXISTS spark_catalog.migdb.bad")
        spark.sql("DROP TABLE IF EXISTS spark_catalog.migdb.managed")


@pytest.mark.parametrize("encoding", ["INT96", "TIMESTAMP_MICROS"])
def test_spark_timestamps_are_added_as_the_tables_timestamps(cat, encoding):
    """Spark writes a timestamp as INT96 by default (an instant Arrow reads as
    nanoseconds): added to a ``timestamp`` (Iceberg timestamptz) column, it reads back
    the same through SQL and ``scan()``; so does a TIMESTAMP_NTZ column."""
    import datetime

    spark = cat.spark
    name = f"db.times_{encoding.lower()}"
    cat.sql(f"CREATE TABLE {{c}}.{name} (id bigint, ts timestamp, ntz timestamp_ntz) USING iceberg")
    landing = _root(cat, name) / "landing"
    spark.conf.set("spark.sql.parquet.outputTimestampType", encoding)
    try:
        spark.sql("SELECT 1L AS id, TIMESTAMP '2026-05-01 10:00:00.123456' AS ts, "
                  "TIMESTAMP_NTZ '2026-05-01 10:00:00.654321' AS ntz").write.parquet(str(landing))
    finally:
        spark.conf.unset("spark.sql.parquet.outputTimestampType")
    assert _call(cat, f"add_files('{name}', '`parquet`.`{landing}`')") == [(1, None)]
    expected = spark.sql("SELECT 1L, TIMESTAMP '2026-05-01 10:00:00.123456', "
                         "TIMESTAMP_NTZ '2026-05-01 10:00:00.654321'").collect()
    assert cat.sql(f"SELECT * FROM {{c}}.{name}") == expected
    row = cat.table(name).scan().to_arrow().to_pylist()[0]
    assert row["ntz"] == datetime.datetime(2026, 5, 1, 10, 0, 0, 654321)
    assert row["ts"].timestamp() == expected[0][1].timestamp()


@pytest.mark.parametrize("name, arguments", [
    ("snapshot", "'default.src', 'db.snap'"),
    ("compute_table_stats", "table => 'db.a'"),
    ("rewrite_table_path", "table => 'db.a', source_prefix => 's3://a', target_prefix => 's3://b'"),
])
def test_iceberg_procedures_not_offered_say_why(cat, name, arguments):
    """A CALL written for Iceberg's runtime binds, and is refused saying why (not Spark's
    "routine not found"); SHOW PROCEDURES does not list them."""
    with pytest.raises(Exception) as info:
        cat.sql(f"CALL {{c}}.system.{name}({arguments})")
    text = str(info.value)
    assert f"Iceberg's procedure system.{name} is not offered:" in text and cat.name in text, text
    assert name not in {r.procedure_name for r in cat.sql("SHOW PROCEDURES IN {c}.system")}
