"""The SQL catalog over an object-store warehouse (moto's S3 server on 127.0.0.1): tables
are created in S3 and served through icecrypt's ``icecrypt.iceberg`` source, named by the
same catalog (its pins and KMS); reads, appends, whole-table overwrites, time travel,
metadata tables, the procedures and the row-level statements (copy-on-write through the
source) work; every object written is encrypted; what is refused fails clearly and
changes nothing."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def s3cat(new_catalog, moto_server, tmp_path_factory):
    bucket = f"sqlwh-{uuid.uuid4().hex[:10]}"
    client = moto_server.boto3_client("s3")
    client.create_bucket(Bucket=bucket)
    catalog = new_catalog(
        "sql", warehouse=f"s3://{bucket}/warehouse",  # type: ignore[arg-type]
        uri=f"sqlite:///{tmp_path_factory.mktemp('s3cat') / 'catalog.db'}",
        **{"s3.endpoint": moto_server.endpoint, "s3.access-key-id": moto_server.access_key_id,
           "s3.secret-access-key": moto_server.secret_access_key, "s3.region": moto_server.region})
    catalog.sql("CREATE NAMESPACE {c}.db")
    catalog.bucket = bucket
    catalog.client = client
    return catalog


def _objects(cat, prefix: str) -> dict[str, bytes]:
    out = {}
    for page in cat.client.get_paginator("list_objects_v2").paginate(Bucket=cat.bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            if item["Key"].endswith("/"):  # a directory marker (pyarrow's create_dir)
                continue
            out[item["Key"]] = cat.client.get_object(Bucket=cat.bucket, Key=item["Key"])["Body"].read()
    return out


def test_create_insert_select_on_s3(s3cat):
    cat = s3cat
    cat.sql("CREATE TABLE {c}.db.orders (id bigint, status string, amount double) USING iceberg "
            "PARTITIONED BY (status) TBLPROPERTIES ('encryption.key-id'='master')")
    cat.sql("INSERT INTO {c}.db.orders VALUES (1, 'new', 10.0), (2, 'paid', 5.5), (3, 'new', 1.25)")
    cat.spark.createDataFrame([(4, "paid", 2.0)], "id bigint, status string, amount double") \
        .writeTo(f"{cat.name}.db.orders").append()
    assert cat.rows("SELECT * FROM {c}.db.orders") == [(1, "new", 10.0), (2, "paid", 5.5), (3, "new", 1.25),
                                                       (4, "paid", 2.0)]
    assert cat.rows("SELECT status, sum(amount) FROM {c}.db.orders WHERE id > 1 GROUP BY status") == [
        ("new", 1.25), ("paid", 7.5)]
    table = cat.table("db.orders")
    assert table.location.startswith(f"s3://{cat.bucket}/warehouse/db/orders")
    assert table.encrypted
    assert sorted(table.scan().to_arrow()["id"].to_pylist()) == [1, 2, 3, 4]
    objects = _objects(cat, "warehouse/db/orders/")
    data = {k: v for k, v in objects.items() if "/data/" in k}
    assert data and all(v[:4] == b"PARE" for v in data.values()), sorted(data)
    manifests = {k: v for k, v in objects.items() if k.endswith(".avro")}
    assert manifests and all(v[:4] == b"AGS1" for v in manifests.values())


def test_time_travel_metadata_tables_and_procedures_on_s3(s3cat):
    cat = s3cat
    cat.sql("CREATE TABLE {c}.db.events (id bigint, s string) USING iceberg TBLPROPERTIES ('encryption.key-id'='master')")
    cat.sql("INSERT INTO {c}.db.events VALUES (1, 'a')")
    first = cat.table("db.events").current_snapshot_id
    cat.sql("INSERT INTO {c}.db.events VALUES (2, 'b')")
    assert cat.rows(f"SELECT id FROM {{c}}.db.events VERSION AS OF {first}") == [(1,)]
    assert cat.rows(f"SELECT id FROM {{c}}.db.events.snapshot_id_{first}") == [(1,)]
    assert cat.rows("SELECT count(*) FROM {c}.db.events.snapshots") == [(2,)]
    cat.sql("INSERT OVERWRITE {c}.db.events VALUES (9, 'z')")
    assert cat.rows("SELECT * FROM {c}.db.events") == [(9, "z")]
    assert cat.rows(f"CALL {{c}}.system.rollback_to_snapshot('db.events', {first})")[0][1] == first
    assert cat.rows("SELECT * FROM {c}.db.events") == [(1, "a")]
    assert cat.rows("CALL {c}.system.verify(table => 'db.events')")[0][0] is True
    with pytest.raises(Exception) as info:
        cat.sql(f"INSERT INTO {{c}}.db.events VERSION AS OF {first} VALUES (3, 'c')")
    assert info.value is not None


def test_delete_from_by_a_filter_on_s3(s3cat):
    cat = s3cat
    cat.sql("CREATE TABLE {c}.db.deletes (id bigint, s string) USING iceberg PARTITIONED BY (s) "
            "TBLPROPERTIES ('encryption.key-id'='master')")
    cat.sql("INSERT INTO {c}.db.deletes VALUES (1, 'a'), (2, 'b'), (3, 'a')")
    cat.sql("DELETE FROM {c}.db.deletes WHERE id = 3 OR s = 'b'")
    assert cat.rows("SELECT * FROM {c}.db.deletes") == [(1, "a")]
    assert cat.table("db.deletes").snapshots()[-1].operation in ("delete", "overwrite")
    data = {k: v for k, v in _objects(cat, "warehouse/db/deletes/").items() if "/data/" in k}
    assert data and all(v[:4] == b"PARE" for v in data.values())


def _data_objects(cat, table: str) -> dict[str, bytes]:
    return {k: v for k, v in _objects(cat, f"warehouse/db/{table}/").items() if "/data/" in k}


def test_update_delete_and_merge_on_s3(s3cat):
    """UPDATE, a row-level DELETE and MERGE INTO (every clause) on a table on S3: each one
    snapshot that replaces the files holding matched rows (copy-on-write through
    icecrypt.iceberg), every object written encrypted, the table API reading the same rows."""
    cat = s3cat
    cat.sql("CREATE TABLE {c}.db.changes (id bigint, s string, n int) USING iceberg PARTITIONED BY (s) "
            "TBLPROPERTIES ('encryption.key-id'='master')")
    cat.sql("INSERT INTO {c}.db.changes VALUES (1, 'a', 10), (2, 'b', 20), (3, 'a', 30), (4, 'c', 40)")
    model = {1: ("a", 10), 2: ("b", 20), 3: ("a", 30), 4: ("c", 40)}

    def check() -> None:
        want = sorted((k, *v) for k, v in model.items())
        assert cat.rows("SELECT * FROM {c}.db.changes ORDER BY id") == want
        got = cat.table("db.changes").scan().to_arrow()
        assert sorted(zip(got["id"].to_pylist(), got["s"].to_pylist(), got["n"].to_pylist())) == want
        data = _data_objects(cat, "changes")
        assert data and all(v[:4] == b"PARE" for v in data.values()), sorted(data)

    def one_snapshot(statement: str) -> None:
        before = len(cat.table("db.changes").snapshots())
        cat.sql(statement)
        snapshots = cat.table("db.changes").snapshots()
        assert len(snapshots) == before + 1, statement
        assert snapshots[-1].operation in ("overwrite", "delete"), statement

    def files() -> set[str]:
        return {row["file_path"] for row in cat.table("db.changes").inspect.files().to_pylist()}

    before = files()
    one_snapshot("UPDATE {c}.db.changes SET n = n + 1 WHERE s = 'b'")
    model[2] = ("b", 21)
    check()
    after = files()  # only partition b's file was read and replaced (the condition prunes files)
    assert len(before - after) == 1 and len(after - before) == 1 and "s=b" in next(iter(before - after))
    one_snapshot("UPDATE {c}.db.changes SET s = 'c' WHERE id = 1")
    model[1] = ("c", 10)
    check()
    def file_of(id_: int) -> str:
        return cat.rows(f"SELECT _file FROM {{c}}.db.changes WHERE id = {id_}")[0][0]

    before, holder = files(), file_of(3)
    one_snapshot("DELETE FROM {c}.db.changes WHERE id + n = 33")  # no row filter form: row-level
    del model[3]
    check()
    # Spark's runtime group filter found the one file holding the row: only it was replaced
    assert before - files() == {holder}, (before, files())
    before, holders = files(), {file_of(2), file_of(4)}
    one_snapshot("MERGE INTO {c}.db.changes t USING (SELECT * FROM VALUES (2, 'b', 0), (5, 'e', 50) AS u(id, s, n)) u "
                 "ON t.id = u.id WHEN MATCHED AND u.n = 0 THEN UPDATE SET n = t.n * 2 "
                 "WHEN NOT MATCHED THEN INSERT * WHEN NOT MATCHED BY SOURCE AND t.s = 'c' AND t.id = 4 THEN DELETE")
    model[2] = ("b", 42)
    model[5] = ("e", 50)
    del model[4]
    check()
    # the files of the changed rows (2; 4, deleted by NOT MATCHED BY SOURCE) were read and replaced (with
    # the NOT MATCHED BY SOURCE condition, Spark's group filter keeps every file of partition c)
    assert holders <= before - files(), (before, files(), holders)
    # a MERGE whose matches are in one file (the join condition selects no file statically): that file only
    before, holder = files(), file_of(5)
    one_snapshot("MERGE INTO {c}.db.changes t USING (SELECT 5L AS id) u ON t.id = u.id "
                 "WHEN MATCHED THEN UPDATE SET n = 51")
    model[5] = ("e", 51)
    check()
    assert before - files() == {holder}, (before, files())
    # a condition that no file can match (by the files' column bounds) reads and commits nothing
    before = cat.table("db.changes").metadata_location
    cat.sql("UPDATE {c}.db.changes SET n = 0 WHERE id = 99")
    assert cat.table("db.changes").metadata_location == before
    # one without an Iceberg row filter form: the runtime group filter finds no file to rewrite
    cat.sql("DELETE FROM {c}.db.changes WHERE id + n = -1")
    cat.sql("MERGE INTO {c}.db.changes t USING (SELECT 99 AS id) u ON t.id = u.id WHEN MATCHED THEN DELETE")
    assert cat.table("db.changes").metadata_location == before
    check()


def test_row_level_statements_on_an_empty_table_on_s3(s3cat):
    """A table without a snapshot: UPDATE and DELETE commit nothing, MERGE inserts."""
    cat = s3cat
    cat.sql("CREATE TABLE {c}.db.empty (id bigint, s string) USING iceberg TBLPROPERTIES ('encryption.key-id'='master')")
    cat.sql("UPDATE {c}.db.empty SET s = 'x' WHERE id = 1")
    cat.sql("DELETE FROM {c}.db.empty WHERE id + 1 = 2")
    assert cat.table("db.empty").snapshots() == []
    cat.sql("MERGE INTO {c}.db.empty t USING (SELECT 1 AS id, 'new' AS s) u ON t.id = u.id "
            "WHEN MATCHED THEN DELETE WHEN NOT MATCHED THEN INSERT *")
    assert cat.rows("SELECT * FROM {c}.db.empty") == [(1, "new")]
    assert len(cat.table("db.empty").snapshots()) == 1


def test_a_failed_merge_on_s3_changes_nothing(s3cat):
    """A MERGE whose source matches one target row twice fails (Spark's cardinality check)
    and leaves the table and its objects as they were."""
    cat = s3cat
    cat.sql("CREATE TABLE {c}.db.failing (id bigint, s string) USING iceberg TBLPROPERTIES ('encryption.key-id'='master')")
    cat.sql("INSERT INTO {c}.db.failing VALUES (1, 'a'), (2, 'b')")
    before, objects = cat.table("db.failing").metadata_location, set(_objects(cat, "warehouse/db/failing/"))
    with pytest.raises(Exception) as info:
        cat.sql("MERGE INTO {c}.db.failing t USING (SELECT * FROM VALUES (1, 'x'), (1, 'y') AS u(id, s)) u "
                "ON t.id = u.id WHEN MATCHED THEN UPDATE SET s = u.s")
    assert "match" in str(info.value).lower()
    assert cat.table("db.failing").metadata_location == before
    assert set(_objects(cat, "warehouse/db/failing/")) == objects
    assert cat.rows("SELECT * FROM {c}.db.failing") == [(1, "a"), (2, "b")]


def test_row_level_statements_keep_row_lineage_on_s3(s3cat):
    """The rewritten rows keep their _row_id; an updated row takes the new commit's sequence
    number, a copied one keeps its own; an inserted row gets a new id (as on local tables and
    in Iceberg).  SQL reads the lineage columns as the table API does."""
    cat = s3cat
    cat.sql("CREATE TABLE {c}.db.lineage (id bigint, s string) USING iceberg TBLPROPERTIES ('encryption.key-id'='master')")
    cat.sql("INSERT INTO {c}.db.lineage VALUES (1, 'a'), (2, 'b')")
    query = "SELECT id, s, _row_id, _last_updated_sequence_number FROM {c}.db.lineage ORDER BY id"
    first = cat.rows(query)
    assert [r[2] for r in first] == [0, 1] and {r[3] for r in first} == {1}
    cat.sql("UPDATE {c}.db.lineage SET s = 'x' WHERE id = 1")
    cat.sql("MERGE INTO {c}.db.lineage t USING (SELECT 3 AS id, 'c' AS s) u ON t.id = u.id "
            "WHEN NOT MATCHED THEN INSERT *")
    got = cat.rows(query)
    sequence = cat.table("db.lineage").snapshots()[-1].sequence_number
    assert got[:2] == [(1, "x", 0, sequence - 1), (2, "b", 1, 1)], got
    assert got[2][:2] == (3, "c") and got[2][2] >= 2 and got[2][3] == sequence, got
    api = cat.table("db.lineage").scan(columns=["id", "s", "_row_id", "_last_updated_sequence_number"]).to_arrow()
    assert sorted(zip(*(api[c].to_pylist() for c in api.column_names))) == got
    # on a branch: the branch changes, main does not
    cat.sql("ALTER TABLE {c}.db.lineage CREATE BRANCH dev")
    cat.sql("UPDATE {c}.db.lineage.branch_dev SET s = 'dev' WHERE id = 2")
    assert cat.rows("SELECT id, s FROM {c}.db.lineage.branch_dev ORDER BY id") == [(1, "x"), (2, "dev"), (3, "c")]
    assert cat.rows("SELECT id, s FROM {c}.db.lineage ORDER BY id") == [(1, "x"), (2, "b"), (3, "c")]


def test_metadata_columns_on_s3(s3cat):
    """_file, _pos, _spec_id and _deleted read on S3 as the table API reads them; with
    _deleted selected, a row a deletion vector removed is read and marked (as Iceberg)."""
    cat = s3cat
    cat.sql("CREATE TABLE {c}.db.meta (id bigint, s string) USING iceberg TBLPROPERTIES "
            "('encryption.key-id'='master', 'write.delete.mode'='merge-on-read')")
    cat.sql("INSERT INTO {c}.db.meta VALUES (1, 'a'), (2, 'b'), (3, 'c')")
    cat.sql("DELETE FROM {c}.db.meta WHERE id = 2")
    assert cat.rows("SELECT id FROM {c}.db.meta ORDER BY id") == [(1,), (3,)]
    assert cat.rows("SELECT id, _deleted FROM {c}.db.meta ORDER BY id") == [(1, False), (2, True), (3, False)]
    got = cat.rows("SELECT id, _file, _pos, _spec_id FROM {c}.db.meta ORDER BY id")
    api = cat.table("db.meta").scan(columns=["id", "_file", "_pos", "_spec_id"]).to_arrow()
    assert got == sorted(zip(*(api[c].to_pylist() for c in api.column_names)))
    assert all(r[1].startswith(f"s3://{cat.bucket}/") and r[3] == 0 for r in got), got
    assert cat.rows("SELECT count(*) FROM {c}.db.meta WHERE _deleted") == [(1,)]
    # one query, the table read twice with other columns: each read as asked (Spark's Python
    # source provider keeps its first read plan: each scan has its own)
    assert cat.rows("SELECT a.id, b._pos, b._deleted FROM {c}.db.meta a JOIN {c}.db.meta b ON a.id = b.id "
                    "ORDER BY a.id") == [(1, got[0][2], False), (3, got[1][2], False)]
    assert cat.rows("SELECT (SELECT count(*) FROM {c}.db.meta), count(*) FROM {c}.db.meta WHERE _deleted") == [(2, 1)]


def test_plaintext_tables_on_s3(s3cat):
    """A table without encryption.key-id on S3 (the catalog has a KMS): INSERT, CTAS, UPDATE
    and MERGE work and write plain Parquet (before: every write failed, the source taking
    the table for an encrypted one without keys)."""
    cat = s3cat
    cat.sql("CREATE TABLE {c}.db.plain (id bigint, s string) USING iceberg")
    cat.sql("INSERT INTO {c}.db.plain VALUES (1, 'a'), (2, 'b')")
    cat.sql("CREATE TABLE {c}.db.plain_copy USING iceberg AS SELECT * FROM {c}.db.plain WHERE id = 2")
    cat.sql("UPDATE {c}.db.plain SET s = 'x' WHERE id = 1")
    cat.sql("MERGE INTO {c}.db.plain t USING {c}.db.plain_copy u ON t.id = u.id "
            "WHEN MATCHED THEN DELETE WHEN NOT MATCHED BY SOURCE THEN UPDATE SET s = concat(t.s, '!')")
    assert cat.rows("SELECT * FROM {c}.db.plain") == [(1, "x!")]
    assert cat.rows("SELECT * FROM {c}.db.plain_copy") == [(2, "b")]
    assert not cat.table("db.plain").encrypted
    for name in ("plain", "plain_copy"):
        data = _data_objects(cat, name)
        assert data and all(v[:4] == b"PAR1" for v in data.values()), sorted(data)


def test_partition_overwrite_is_refused_on_s3(s3cat):
    cat = s3cat
    cat.sql("CREATE TABLE IF NOT EXISTS {c}.db.rowlevel (id bigint, s string) USING iceberg PARTITIONED BY (s) "
            "TBLPROPERTIES ('encryption.key-id'='master')")
    cat.sql("INSERT INTO {c}.db.rowlevel VALUES (1, 'a'), (2, 'b')")
    before = cat.table("db.rowlevel").metadata_location
    with pytest.raises(Exception) as info:
        cat.sql("INSERT OVERWRITE {c}.db.rowlevel PARTITION (s = 'a') SELECT 5")
    text = str(info.value).lower()
    assert "rowlevel" in text and "not support" in text, text
    assert cat.table("db.rowlevel").metadata_location == before
    assert cat.rows("SELECT * FROM {c}.db.rowlevel") == [(1, "a"), (2, "b")]


def test_python_and_sql_agree_on_s3(s3cat):
    cat = s3cat
    cat.sql("CREATE TABLE {c}.db.mixed (id bigint, s string) USING iceberg TBLPROPERTIES ('encryption.key-id'='master')")
    table = cat.table("db.mixed")
    table.append(pa.table({"id": pa.array([5, 6], pa.int64()), "s": ["five", "six"]}))
    cat.sql("INSERT INTO {c}.db.mixed VALUES (7, 'seven')")
    assert cat.rows("SELECT * FROM {c}.db.mixed") == [(5, "five"), (6, "six"), (7, "seven")]
    got = cat.table("db.mixed").scan().to_arrow()
    assert sorted(zip(got["id"].to_pylist(), got["s"].to_pylist())) == [(5, "five"), (6, "six"), (7, "seven")]


def test_streaming_into_and_out_of_s3(s3cat, tmp_path):
    cat = s3cat
    cat.sql("CREATE TABLE {c}.db.stream_src (id bigint, s string) USING iceberg TBLPROPERTIES ('encryption.key-id'='master')")
    cat.sql("CREATE TABLE {c}.db.stream_dst (id bigint, s string) USING iceberg TBLPROPERTIES ('encryption.key-id'='master')")
    cat.sql("INSERT INTO {c}.db.stream_src VALUES (1, 'a'), (2, 'b')")
    cat.sql("INSERT INTO {c}.db.stream_src VALUES (3, 'c')")

    def run() -> None:
        query = (cat.spark.readStream.table(f"{cat.name}.db.stream_src").writeStream
                 .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True)
                 .toTable(f"{cat.name}.db.stream_dst"))
        query.awaitTermination()

    run()
    assert cat.rows("SELECT * FROM {c}.db.stream_dst") == [(1, "a"), (2, "b"), (3, "c")]
    cat.sql("INSERT INTO {c}.db.stream_src VALUES (4, 'd')")
    run()  # restarted from its checkpoint: only the new snapshot's rows
    assert cat.rows("SELECT * FROM {c}.db.stream_dst") == [(1, "a"), (2, "b"), (3, "c"), (4, "d")]
    data = {k: v for k, v in _objects(cat, "warehouse/db/stream_dst/").items() if "/data/" in k}
    assert data and all(v[:4] == b"PARE" for v in data.values())


def test_ctas_on_s3_and_a_failed_one_leaves_nothing(s3cat):
    cat = s3cat
    cat.sql("CREATE TABLE {c}.db.ctas USING iceberg PARTITIONED BY (s) TBLPROPERTIES ('encryption.key-id'='master') "
            "AS SELECT id, concat('v', id % 2) AS s FROM range(5)")
    assert cat.rows("SELECT * FROM {c}.db.ctas") == [(0, "v0"), (1, "v1"), (2, "v0"), (3, "v1"), (4, "v0")]
    assert cat.table("db.ctas").encrypted and len(cat.table("db.ctas").snapshots()) == 1
    cat.spark.createDataFrame([(7, "x")], "id bigint, s string").writeTo(f"{cat.name}.db.ctas_v2") \
        .tableProperty("encryption.key-id", "master").create()
    assert cat.rows("SELECT * FROM {c}.db.ctas_v2") == [(7, "x")]
    # a query that fails in its tasks: the statement fails, and no table (nor object) is left
    with pytest.raises(Exception) as info:
        cat.sql("CREATE TABLE {c}.db.ctas_failed USING iceberg TBLPROPERTIES ('encryption.key-id'='master') "
                "AS SELECT id, CAST(IF(id < 3, id, raise_error('no ids above 2')) AS string) AS s FROM range(5)")
    assert "no ids above 2" in str(info.value)
    assert not cat.icecrypt().table_exists(("db", "ctas_failed"))
    assert not _objects(cat, "warehouse/db/ctas_failed/")
    # a location that holds files already: refused before anything is created
    with pytest.raises(Exception) as info:
        cat.sql(f"CREATE TABLE {{c}}.db.ctas_taken USING iceberg LOCATION 's3://{cat.bucket}/warehouse/db/ctas' "
                "AS SELECT 1 AS id")
    assert "needs an empty location" in str(info.value)
    assert not cat.icecrypt().table_exists(("db", "ctas_taken"))
    # REPLACE on an object store is refused, the table as it was
    before = cat.table("db.ctas").metadata_location
    for statement in ("REPLACE TABLE {c}.db.ctas USING iceberg AS SELECT 1 AS id",
                      "CREATE OR REPLACE TABLE {c}.db.ctas USING iceberg AS SELECT 1 AS id"):
        with pytest.raises(Exception) as info:
            cat.sql(statement)
        assert "object store is not supported" in str(info.value), statement
    assert cat.table("db.ctas").metadata_location == before


@pytest.mark.parametrize("raw, options", [
    ("{", {}),
    ("[]", {}),
    ('{"command": "drop", "snapshot_id": 1, "filters": [], "files": null, "read": true}', {}),
    ('{"command": "update", "snapshot_id": "1", "filters": [], "files": null, "read": true}', {}),
    ('{"command": "update", "snapshot_id": 1, "filters": {}, "files": null, "read": true}', {}),
    ('{"command": "update", "snapshot_id": 1, "filters": [], "files": "a", "read": true}', {}),
    ('{"command": "update", "snapshot_id": 1, "filters": [], "files": [1], "read": true}', {}),
    ('{"command": "update", "snapshot_id": 1, "filters": [], "files": null, "read": 1}', {}),
    ('{"command": "update", "snapshot_id": 1, "filters": [], "read": true}', {}),
    ('{"command": "update", "snapshot_id": 1, "filters": [], "files": null, "read": null}', {}),
    ('{"command": "update", "snapshot_id": 1, "filters": [], "files": null, "read": true}', {"filter": "id > 1"}),
    ('{"command": "merge", "snapshot_id": 1, "filters": [], "files": null, "read": true}', {"wap-id": "w1"}),
])
def test_a_malformed_or_misplaced_rewrite_option_is_refused(raw, options):
    """The rewrite option (set by the catalog's JVM half) is checked before anything is read
    or written, naming the table."""
    from icecrypt.spark._iceberg import Rewrite

    with pytest.raises(ValueError, match="table db.t"):
        Rewrite(raw, options, "db.t")


def test_a_file_the_group_filter_found_outside_the_snapshot_is_a_conflict(s3cat):
    """Spark's runtime group filter reads the table as it stands; a file it reports that the
    statement's snapshot does not hold (a commit came between) fails the read and the
    commit, rather than leaving that file's rows unchanged."""
    import json

    from icecrypt.errors import CommitConflictError
    from icecrypt.spark._iceberg import Rewrite

    cat = s3cat
    cat.sql("CREATE TABLE {c}.db.raced (id bigint) USING iceberg TBLPROPERTIES ('encryption.key-id'='master')")
    cat.sql("INSERT INTO {c}.db.raced VALUES (1)")
    table = cat.table("db.raced")
    snapshot = table.current_snapshot_id
    old = {row["file_path"] for row in table.inspect.files().to_pylist()}
    table.append(pa.table({"id": pa.array([2], pa.int64())}))  # the commit that comes between
    new = {row["file_path"] for row in cat.table("db.raced").inspect.files().to_pylist()} - old

    def rewrite(files):
        return Rewrite(json.dumps({"command": "update", "snapshot_id": snapshot, "filters": [], "files": files,
                                   "read": True}), {}, "db.raced")

    table = cat.table("db.raced")
    assert [t.file.path for t in rewrite(sorted(old)).tasks(table, None)] == sorted(old)
    with pytest.raises(CommitConflictError, match="run it again"):
        rewrite(sorted(old | new)).tasks(table, None)
    with pytest.raises(CommitConflictError, match="does not hold"):
        rewrite(sorted(new)).files(table)


@pytest.mark.parametrize("isolation", ["serializable", "snapshot"])
def test_a_commit_between_an_update_on_s3_and_its_commit(s3cat, tmp_path, isolation):
    """End to end, a copy-on-write UPDATE through the source while another writer commits:
    a Python UDF in the statement's own tasks appends a row the UPDATE's condition matches
    (once, from whichever task runs it first). Under serializable isolation the UPDATE then
    fails as a conflict and leaves the table with the other writer's row and its own rows
    as they were, and no object of its own; under snapshot isolation it commits on top,
    and the other writer's row stays as that writer wrote it."""
    import os

    from pyspark.sql.functions import udf

    cat = s3cat
    name = f"db.raced_{isolation}"
    cat.sql(f"CREATE TABLE {{c}}.{name} (id bigint, s string) USING iceberg TBLPROPERTIES "
            f"('encryption.key-id'='master', 'write.update.isolation-level'='{isolation}')")
    cat.sql(f"INSERT INTO {{c}}.{name} VALUES (1, 'a'), (2, 'b')")
    marker, catalog_name, options = str(tmp_path / "raced"), cat.name, dict(cat.options)
    identifier = tuple(name.split("."))

    @udf("string")
    def racer(value):
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return value + "!"
        import pyarrow as pa

        from icecrypt.spark._sql.catalogs import open_catalog

        table = open_catalog(catalog_name, options).load_table(identifier)
        table.append(pa.table({"id": pa.array([1], pa.int64()), "s": ["other"]}))
        return value + "!"

    cat.spark.udf.register(f"racer_{isolation}", racer)
    before = set(_objects(cat, f"warehouse/{name.replace('.', '/')}/"))
    statement = f"UPDATE {{c}}.{name} SET s = racer_{isolation}(s) WHERE id = 1"
    if isolation == "serializable":
        with pytest.raises(Exception) as info:
            cat.sql(statement)
        assert "conflict" in str(info.value).lower() or "concurrent" in str(info.value).lower(), str(info.value)
        assert cat.rows(f"SELECT * FROM {{c}}.{name}") == [(1, "a"), (1, "other"), (2, "b")]
        table = cat.table(name)
        referenced = {row["file_path"] for row in table.inspect.all_files().to_pylist()}
        left = {key for key in set(_objects(cat, f"warehouse/{name.replace('.', '/')}/")) - before
                if "/data/" in key and not any(path.endswith(key) for path in referenced)}
        assert not left, left  # the UPDATE's own files were removed
    else:
        cat.sql(statement)
        assert cat.rows(f"SELECT * FROM {{c}}.{name}") == [(1, "a!"), (1, "other"), (2, "b")]
    assert os.path.exists(marker)
    assert cat.table(name).verify().ok


def test_add_files_on_s3(s3cat):
    """add_files on a plaintext table in S3: Parquet objects under the table's location,
    in col=value prefixes, added as they are; the rows read back through SQL (the
    icecrypt.iceberg source reads them by name) and scan()."""
    import io

    import pyarrow.parquet as pq

    cat = s3cat
    cat.sql("CREATE TABLE {c}.db.landed (id bigint, region string) USING iceberg PARTITIONED BY (region)")
    location = cat.table("db.landed").location.rstrip("/")
    prefix = location.removeprefix(f"s3://{cat.bucket}/")
    for region, ids in (("eu", [1, 2]), ("us", [3])):
        sink = io.BytesIO()
        pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), sink)
        cat.client.put_object(Bucket=cat.bucket, Key=f"{prefix}/landing/region={region}/part-0.parquet",
                              Body=sink.getvalue())
    rows = cat.sql(f"CALL {{c}}.system.add_files('db.landed', '`parquet`.`{location}/landing`')")
    assert [tuple(r) for r in rows] == [(2, 2)]
    assert cat.rows("SELECT * FROM {c}.db.landed") == [(1, "eu"), (2, "eu"), (3, "us")]
    assert cat.rows("SELECT id FROM {c}.db.landed WHERE region = 'us'") == [(3,)]
    scanned = sorted((r["id"], r["region"]) for r in cat.table("db.landed").scan().to_arrow().to_pylist())
    assert scanned == [(1, "eu"), (2, "eu"), (3, "us")]
