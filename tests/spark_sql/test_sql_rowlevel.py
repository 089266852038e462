"""``UPDATE``, ``MERGE INTO`` (every Spark 4 clause) and ``DELETE FROM`` with conditions
that have no Iceberg row filter form, through the SQL catalog: Spark's copy-on-write
rewrite (``catalog/CopyOnWrite``), checked after every statement against a plain-Python
model of the rows, through SQL and through ``EncryptedTable.scan()``, on encrypted and
plaintext tables, partitioned and not.  Every file a statement leaves is sealed; the
commit replaces exactly the files the scan read; a statement that fails, and one whose
files a concurrent commit changed, leave the table as it was (no version, no file)."""

from __future__ import annotations

import pytest
from conftest import MASTER, data_files, magic

pytestmark = pytest.mark.spark


def _check(cat, name: str, model: dict[int, tuple]) -> None:
    want = sorted(model.values())
    assert cat.rows(f"SELECT id, cat, v FROM {{c}}.{name}") == want
    got = cat.table(name).scan().to_arrow().select(["id", "cat", "v"]).to_pylist()
    assert sorted((r["id"], r["cat"], r["v"]) for r in got) == want


def _create(cat, name: str, encrypted: bool, partitioned: bool, model: dict[int, tuple], extra: str = "") -> None:
    key = f"'encryption.key-id'='{MASTER}'" if encrypted else ""
    props = ", ".join(p for p in (key, extra) if p)
    cat.sql(f"CREATE TABLE {{c}}.{name} (id bigint, cat string, v double) USING iceberg "
            + ("PARTITIONED BY (cat) " if partitioned else "") + (f"TBLPROPERTIES ({props})" if props else ""))
    values = ", ".join(f"({i}, '{c}', {v})" for i, c, v in model.values())
    cat.sql(f"INSERT INTO {{c}}.{name} VALUES {values}")


def _sealed(cat, name: str) -> None:
    root = cat.table(name).location.rstrip("/").removeprefix("file:")
    from pathlib import Path

    for path in Path(root).rglob("*"):
        if path.is_file() and not path.name.endswith((".metadata.json", "version-hint.text")):
            assert magic(path) in (b"PARE", b"AGS1"), path


MOR = "'write.update.mode'='merge-on-read', 'write.merge.mode'='merge-on-read', 'write.delete.mode'='merge-on-read'"


#: each of encrypted / plaintext, partitioned / not, copy-on-write / merge-on-read is in two
#: of the four cases
@pytest.mark.parametrize(("encrypted", "partitioned", "mode"), [
    (True, True, "copy-on-write"), (True, False, "merge-on-read"),
    (False, True, "merge-on-read"), (False, False, "copy-on-write"),
], ids=["encrypted-partitioned-cow", "encrypted-unpartitioned-mor", "plaintext-partitioned-mor",
        "plaintext-unpartitioned-cow"])
def test_update_merge_delete_against_model(cat, new_catalog, encrypted, partitioned, mode):
    name = f"db.rl_{'enc' if encrypted else 'plain'}_{'p' if partitioned else 'u'}"
    model = {i: (i, "abc"[i % 3], float(i)) for i in range(30)}
    mor = mode == "merge-on-read"
    _create(cat, name, encrypted, partitioned, model, MOR if mor else "")
    _check(cat, name, model)
    # merge-on-read removes a data file only when every row of it is deleted
    files = _live_files(cat, name)
    whole = {f: n for f, n, m in cat.rows(f"SELECT _file, count(*), count_if(id BETWEEN 3 AND 6 OR cat = 'c') "
                                          f"FROM {{c}}.{name} GROUP BY _file") if n == m}

    # UPDATE with a condition inside files, and one with a subquery (no Iceberg form)
    cat.sql(f"UPDATE {{c}}.{name} SET v = v * 10 WHERE id BETWEEN 3 AND 6 OR cat = 'c'")
    model = {i: (i, c, v * 10 if 3 <= i <= 6 or c == "c" else v) for i, (_, c, v) in model.items()}
    _check(cat, name, model)
    summary = cat.table(name).current_snapshot().summary
    assert summary["operation"] == "overwrite"
    if mor:  # the 13 updated rows' positions deleted, their new values in new files; no file rewritten
        assert files - _live_files(cat, name) == set(whole)
        assert int(summary.get("added-position-deletes", 0)) + sum(whole.values()) == 13, summary
    cat.sql(f"UPDATE {{c}}.{name} SET cat = upper(cat) WHERE id IN (SELECT 1 UNION SELECT 2)")
    model = {i: (i, c.upper() if i in (1, 2) else c, v) for i, (_, c, v) in model.items()}
    _check(cat, name, model)

    # MERGE INTO with every clause Spark 4 has
    cat.sql("CREATE OR REPLACE TEMP VIEW src AS SELECT * FROM VALUES "
            "(0, 'a', -1.0), (4, 'b', -2.0), (8, 'c', -3.0), (100, 'n', 7.0), (101, 'n', 8.0) AS s(id, cat, v)")
    cat.sql(f"""MERGE INTO {{c}}.{name} t USING src s ON t.id = s.id
                WHEN MATCHED AND s.v = -3.0 THEN DELETE
                WHEN MATCHED THEN UPDATE SET t.v = s.v
                WHEN NOT MATCHED AND s.id = 100 THEN INSERT *
                WHEN NOT MATCHED BY SOURCE AND t.id >= 25 THEN DELETE""")
    source = {0: -1.0, 4: -2.0, 8: -3.0}
    merged = {}
    for i, (_, c, v) in model.items():
        if i in source:
            if source[i] != -3.0:
                merged[i] = (i, c, source[i])
        elif i < 25:
            merged[i] = (i, c, v)
    merged[100] = (100, "n", 7.0)
    model = merged
    _check(cat, name, model)
    cat.sql(f"""MERGE INTO {{c}}.{name} t USING (SELECT 10 AS id, 'z' AS cat, 0.5 AS v) s ON t.id = s.id
                WHEN MATCHED THEN UPDATE SET *
                WHEN NOT MATCHED BY SOURCE AND t.cat = 'C' THEN UPDATE SET t.v = 0.0""")
    model = {i: ((i, "z", 0.5) if i == 10 else (i, c, 0.0) if c == "C" else (i, c, v))
             for i, (_, c, v) in model.items()}
    _check(cat, name, model)

    # DELETE with a condition that has no Iceberg row filter form: copy-on-write too
    cat.sql(f"DELETE FROM {{c}}.{name} WHERE length(cat) = 1 AND id IN (SELECT id FROM src)")
    model = {i: r for i, r in model.items() if not (len(r[1]) == 1 and i in (0, 4, 8, 100, 101))}
    _check(cat, name, model)

    # a statement whose condition prunes every file reads and rewrites nothing: no version
    before = cat.table(name).metadata_location
    cat.sql(f"UPDATE {{c}}.{name} SET v = 0 WHERE id > 100000")
    _check(cat, name, model)
    assert cat.table(name).metadata_location == before
    if mor:
        deletes = [f["file_format"] for f in cat.table(name).inspect.delete_files().to_pylist()]
        assert deletes and set(deletes) == {"PUFFIN"}, deletes  # deletion vectors (format 3)
    if encrypted:
        _sealed(cat, name)


def test_the_commit_replaces_exactly_the_files_the_scan_read(cat):
    """Files the condition prunes (another partition) stay; the files read are gone from
    the new snapshot, their rows all in the new files (the model check)."""
    model = {i: (i, "ab"[i % 2], float(i)) for i in range(40)}
    _create(cat, "db.rl_files", True, True, model)
    before = {t.file.path for t in cat.table("db.rl_files").scan().plan_files()}
    cat.sql("UPDATE {c}.db.rl_files SET v = -v WHERE cat = 'a' AND id < 4")
    model = {i: (i, c, -v if c == "a" and i < 4 else v) for i, (_, c, v) in model.items()}
    _check(cat, "db.rl_files", model)
    after = {t.file.path for t in cat.table("db.rl_files").scan().plan_files()}
    kept = before & after
    assert kept and all("cat=b" in p for p in kept), (before, after)
    assert all("cat=a" in p for p in after - before)


def _summary(cat, name: str) -> dict[str, int]:
    summary = cat.table(name).current_snapshot().summary
    return {k: int(summary.get(k, 0)) for k in ("added-data-files", "deleted-data-files", "added-position-deletes",
                                                 "added-delete-files", "removed-delete-files")}


def _deleted_rows(cat, name: str) -> int:
    """The rows the table's live delete files delete."""
    return sum(d["record_count"] for d in cat.table(name).inspect.delete_files().to_pylist())


def test_merge_on_read_statements_delete_positions_and_rewrite_no_file(cat, monkeypatch):
    """A table whose write.<command>.mode is merge-on-read: UPDATE, MERGE INTO and a DELETE
    with a subquery (Spark's WriteDelta, catalog/MergeOnRead) delete the changed rows by
    their position (_file, _pos) and write only the new rows; no data file is rewritten.
    Positions join the file's existing deletion vector (here one DELETE's own path made)."""
    name = "db.rl_mor"
    model = {i: (i, "ab"[i % 2], float(i)) for i in range(12)}
    _create(cat, name, True, False, model, MOR)
    files = _live_files(cat, name)
    holder = dict(cat.rows(f"SELECT id, _file FROM {{c}}.{name}"))
    cat.sql(f"DELETE FROM {{c}}.{name} WHERE id = 3")  # a deletion vector (DELETE's own path)
    del model[3]
    positions = cat.rows(f"SELECT id, _pos FROM {{c}}.{name} WHERE _file = '{holder[5]}' ORDER BY _pos")
    assert [i for i, _ in positions] == sorted(i for i in model if holder[i] == holder[5])

    cat.sql(f"UPDATE {{c}}.{name} SET v = 99 WHERE id IN (SELECT 5)")
    model[5] = (5, "b", 99.0)
    _check(cat, name, model)  # the deleted row stays deleted: its position is in the new vector too
    joined = int(holder[3] == holder[5])  # the new vector replaces the file's old one, and holds its position
    assert _summary(cat, name) == {"added-data-files": 1, "deleted-data-files": 0, "added-position-deletes": 1 + joined,
                                   "added-delete-files": 1, "removed-delete-files": joined}
    assert files <= _live_files(cat, name)

    cat.sql(f"""MERGE INTO {{c}}.{name} t USING (SELECT * FROM VALUES (0L, 'x', -1.0), (1L, 'x', -2.0),
                (50L, 'n', 5.0) AS s(id, cat, v)) s ON t.id = s.id
                WHEN MATCHED AND s.v = -2.0 THEN DELETE
                WHEN MATCHED THEN UPDATE SET t.v = s.v
                WHEN NOT MATCHED THEN INSERT *""")
    del model[1]
    model[0], model[50] = (0, "a", -1.0), (50, "n", 5.0)
    _check(cat, name, model)
    summary = _summary(cat, name)
    assert summary["deleted-data-files"] == 0 and summary["added-data-files"] >= 1, summary
    assert files <= _live_files(cat, name)
    assert _deleted_rows(cat, name) == 4  # 3, 5, 0 and 1 of the first files

    from icecrypt.spark._sql import write as sql_write

    planned, plan = [], sql_write._plan
    monkeypatch.setattr(sql_write, "_plan", lambda bridge, pending, secret: (
        planned.append((pending.mode, secret is None)), plan(bridge, pending, secret))[1])
    cat.sql(f"DELETE FROM {{c}}.{name} WHERE length(cat) = 1 AND id IN (SELECT 7 UNION SELECT 8)")
    assert planned == [("delta", True)]  # it deletes positions only: no write secret leaves the driver
    del model[7], model[8]
    _check(cat, name, model)
    summary = _summary(cat, name)
    assert summary["added-data-files"] == 0 and summary["deleted-data-files"] == 0, summary
    assert files <= _live_files(cat, name)
    assert _deleted_rows(cat, name) == 6
    # the metadata table position_deletes: each deleted position, by data file (Iceberg's)
    assert cat.rows(f"SELECT count(*), count(DISTINCT file_path, pos) FROM {{c}}.{name}.position_deletes") == [(6, 6)]
    assert {f for (f,) in cat.rows(f"SELECT file_path FROM {{c}}.{name}.position_deletes")} == \
        {holder[i] for i in (3, 5, 0, 1, 7, 8)}
    deletes = cat.table(name).inspect.delete_files().to_pylist()
    assert deletes and {d["file_format"] for d in deletes} == {"PUFFIN"}
    _sealed(cat, name)

    # a mode that is neither: the statement fails naming it, the table stays as it was
    cat.sql(f"ALTER TABLE {{c}}.{name} SET TBLPROPERTIES ('write.update.mode'='sometimes')")
    version = cat.table(name).metadata_location
    with pytest.raises(Exception, match="write.update.mode is sometimes, not copy-on-write or merge-on-read"):
        cat.sql(f"UPDATE {{c}}.{name} SET v = 0 WHERE id IN (SELECT 2)")
    assert cat.table(name).metadata_location == version
    _check(cat, name, model)


def test_a_merge_on_read_statement_racing_a_delete_of_its_rows_fails_and_leaves_nothing(cat):
    """Another writer deletes a row of the file a merge-on-read UPDATE deletes positions in,
    while the UPDATE runs (a Python UDF in the job, through icecrypt's API): the UPDATE's
    commit is a conflict (its vector and the other's would each miss the other's rows), the
    table keeps the other writer's delete only, and the UPDATE leaves no file."""
    from pyspark.sql.functions import udf

    name = "db.rl_mor_race"
    model = {i: (i, "a", float(i)) for i in range(6)}
    _create(cat, name, True, False, model, MOR)
    options, catalog_name = dict(cat.options), cat.name

    @udf("double")
    def meanwhile(v):
        from icecrypt.spark._sql.catalogs import open_catalog

        open_catalog(catalog_name, options).load_table(("db", "rl_mor_race")).delete("id = 1 OR id = 4")
        return v

    cat.spark.udf.register("meanwhile_mor", meanwhile)
    before = data_files(cat.warehouse)
    with pytest.raises(Exception, match="(?i)conflict|concurrent|since"):
        cat.sql(f"UPDATE {{c}}.{name} SET v = meanwhile_mor(v) + 100 WHERE id IN (SELECT 0 UNION SELECT 2 "
                "UNION SELECT 3 UNION SELECT 5)")
    del model[1], model[4]
    _check(cat, name, model)
    table = cat.table(name)
    kept = {table.fs_path(p) for p in _live_files(cat, name)}
    kept |= {table.fs_path(d["file_path"]) for d in table.inspect.delete_files().to_pylist()}
    new = {str(p) for p in data_files(cat.warehouse)} - {str(p) for p in before}
    assert all(p in kept or "/metadata/" in p or p.endswith(".db") for p in new), sorted(new)


def test_failing_statements_leave_the_table_as_it_was(cat):
    model = {i: (i, "ab"[i % 2], float(i)) for i in range(10)}
    _create(cat, "db.rl_fail", True, False, model)
    table = cat.table("db.rl_fail")
    before, files = table.metadata_location, data_files(cat.warehouse)
    bad = [
        "UPDATE {c}.db.rl_fail SET v = CAST(raise_error('boom') AS DOUBLE) WHERE id = 1",  # fails in the executors
        "UPDATE {c}.db.rl_fail SET nope = 1",  # no such column
        "MERGE INTO {c}.db.rl_fail t USING (SELECT 1 AS id UNION ALL SELECT 1) s ON t.id = s.id "
        "WHEN MATCHED THEN UPDATE SET t.v = 0",  # two source rows match one target row
    ]
    for statement in bad:
        with pytest.raises(Exception):
            cat.sql(statement)
        assert cat.table("db.rl_fail").metadata_location == before, statement
        assert data_files(cat.warehouse) == files, statement
    _check(cat, "db.rl_fail", model)


@pytest.mark.parametrize("mode", ["copy-on-write", "merge-on-read"])
def test_rewritten_files_come_back_whole_when_the_condition_matches_one_row_group(cat, mode):
    """A copy-on-write scan hands Parquet no row-group filter: with small row groups, a
    condition that matches rows of one group must still rewrite every row of the file (a
    filtered scan would drop the other groups' rows from the new file: data loss).  A
    merge-on-read scan does prune row groups, and the positions of the rows it reads from a
    later group must still be their positions in the file (a wrong _pos deletes another row)."""
    name = f"db.rl_groups_{mode[:4].replace('-', '')}"
    extra = f", {MOR}" if mode == "merge-on-read" else ""
    cat.sql(f"CREATE TABLE {{c}}.{name} (id bigint, cat string, v double) USING iceberg "
            f"TBLPROPERTIES ('encryption.key-id'='{MASTER}', 'write.parquet.row-group-size-bytes'='2048'{extra})")
    cat.spark.range(4000).selectExpr("id", "'a' AS cat", "CAST(id AS double) AS v") \
        .writeTo(f"{cat.name}.{name}").append()
    model = {i: (i, "a", float(i)) for i in range(4000)}
    offsets = [r["split_offsets"] for r in cat.table(name).inspect.files().to_pylist()]
    assert offsets and all(o is not None and len(o) > 2 for o in offsets), offsets  # several row groups a file
    cat.sql(f"UPDATE {{c}}.{name} SET v = -1 WHERE id = 3999")
    model[3999] = (3999, "a", -1.0)
    _check(cat, name, model)
    cat.sql(f"""MERGE INTO {{c}}.{name} t USING (SELECT 7L AS id) s ON t.id = s.id
                WHEN MATCHED THEN UPDATE SET t.v = 0.5""")
    model[7] = (7, "a", 0.5)
    _check(cat, name, model)
    cat.sql(f"DELETE FROM {{c}}.{name} WHERE id = 2000 AND length(cat) = 1")  # the row-level DELETE
    del model[2000]
    _check(cat, name, model)
    if mode == "merge-on-read":  # three positions deleted, no file rewritten
        assert _deleted_rows(cat, name) == 3
    _sealed(cat, name)


def _live_files(cat, name: str) -> set[str]:
    return {t.file.path for t in cat.table(name).scan().plan_files()}


def test_statements_rewrite_only_the_files_holding_matched_rows(cat):
    """Spark's group filter on _file (the copy-on-write scan is runtime-filterable, as
    Iceberg's): a MERGE, UPDATE or DELETE with no filter on the table's columns reads and
    replaces the files holding rows its condition matches, and no other; the other files
    stay in the table as they were.  A MERGE with WHEN NOT MATCHED BY SOURCE changes rows
    no source row matches, so it still rewrites every file."""
    name = "db.rl_runtime"
    cat.sql(f"CREATE TABLE {{c}}.{name} (id bigint, cat string, v double) USING iceberg "
            f"TBLPROPERTIES ('encryption.key-id'='{MASTER}')")
    model = {}
    for start in range(0, 50, 10):  # five inserts: ten files of five rows (one a Spark task)
        rows = {i: (i, "abc"[i % 3], float(i)) for i in range(start, start + 10)}
        cat.sql(f"INSERT INTO {{c}}.{name} VALUES " + ", ".join(f"({i}, '{c}', {v})" for i, c, v in rows.values()))
        model.update(rows)
    files = _live_files(cat, name)
    assert len(files) >= 5

    # _file: the data file of each row, as the table records it
    by_file = dict(cat.rows(f"SELECT _file, count(*) FROM {{c}}.{name} GROUP BY _file"))
    assert set(by_file) == files and sum(by_file.values()) == 50
    holder = {i: f for f in files for (i,) in cat.rows(f"SELECT id FROM {{c}}.{name} WHERE _file = '{f}'")}
    assert sorted(holder) == sorted(model)

    # a MERGE whose source matches rows of two files (its ON condition: the source's keys only)
    cat.sql("CREATE OR REPLACE TEMP VIEW src_rt AS SELECT * FROM VALUES (3L, 'x', -1.0), (27L, 'x', -2.0), "
            "(99L, 'n', 9.0) AS s(id, cat, v)")
    cat.sql(f"""MERGE INTO {{c}}.{name} t USING src_rt s ON t.id = s.id
                WHEN MATCHED THEN UPDATE SET t.v = s.v WHEN NOT MATCHED THEN INSERT *""")
    model[3], model[27], model[99] = (3, "a", -1.0), (27, "a", -2.0), (99, "n", 9.0)
    _check(cat, name, model)
    after = _live_files(cat, name)
    assert files - after == {holder[3], holder[27]}, "the MERGE replaced files without matched rows"
    summary = cat.table(name).current_snapshot().summary
    assert summary["deleted-data-files"] == "2", summary

    # an UPDATE with a condition that has no Iceberg form (a subquery): the files holding id 41 only
    files = after
    holder = {i: f for f in files for (i,) in cat.rows(f"SELECT id FROM {{c}}.{name} WHERE _file = '{f}'")}
    cat.sql(f"UPDATE {{c}}.{name} SET v = 0.5 WHERE id IN (SELECT 41)")
    model[41] = (41, model[41][1], 0.5)
    _check(cat, name, model)
    after = _live_files(cat, name)
    assert files - after == {holder[41]}

    # the same for a copy-on-write DELETE
    files, gone = after, holder[12]
    cat.sql(f"DELETE FROM {{c}}.{name} WHERE length(cat) = 1 AND id = 12")
    del model[12]
    _check(cat, name, model)
    assert files - _live_files(cat, name) == {gone}

    # WHEN NOT MATCHED BY SOURCE reaches rows of every file: every file is rewritten
    files = _live_files(cat, name)
    cat.sql(f"""MERGE INTO {{c}}.{name} t USING src_rt s ON t.id = s.id
                WHEN MATCHED THEN UPDATE SET t.v = 1.0
                WHEN NOT MATCHED BY SOURCE AND t.id % 10 = 0 THEN UPDATE SET t.v = -9.0""")
    model = {i: (i, c, 1.0 if i in (3, 27, 99) else -9.0 if i % 10 == 0 else v) for i, (_, c, v) in model.items()}
    _check(cat, name, model)
    assert not files & _live_files(cat, name)
    _sealed(cat, name)


def test_the_files_reported_at_commit_must_be_of_those_planned():
    """What the JVM reports at commit is checked against what the write began with: the
    same command and snapshot, and only files the scan planned (the files a copy-on-write
    replaces, the files whose rows a merge-on-read deletes)."""
    from types import SimpleNamespace

    from icecrypt.spark._sql.write import _as_read, _deleted_positions

    planned = {"command": "merge", "snapshot_id": 7, "data_files": ["a", "b", "c"]}
    pending = SimpleNamespace(mode="replace", replaced=planned, what="table db.t")
    assert _as_read(pending, None) == ["a", "b", "c"]
    assert _as_read(pending, {**planned, "data_files": ["c", "a", "a"]}) == ["c", "a"]
    assert _as_read(pending, {**planned, "data_files": []}) == []
    with pytest.raises(ValueError, match="reports reading x, which its scan did not plan"):
        _as_read(pending, {**planned, "data_files": ["a", "x"]})
    for other in ({"command": "update"}, {"snapshot_id": 8}, {"data_files": "a"}):
        with pytest.raises(ValueError, match="not the one it began with"):
            _as_read(pending, {**planned, **other})
    with pytest.raises(ValueError, match="only a row-level write"):
        _as_read(SimpleNamespace(mode="append", replaced=None, what="table db.t"), planned)
    with pytest.raises(ValueError, match="only a merge-on-read write deletes rows"):
        _deleted_positions(pending, ["a", "b", "c"], {"a": [1]})

    delta = SimpleNamespace(mode="delta", replaced=planned, what="table db.t")
    scanned = _as_read(delta, planned)
    assert _deleted_positions(delta, scanned, {"a": [0, 5], "c": [2]}) == {"a": [0, 5], "c": [2]}
    assert _deleted_positions(delta, scanned, None) == {}
    with pytest.raises(ValueError, match="reports deleting rows of x, which its scan did not read"):
        _deleted_positions(delta, scanned, {"a": [1], "x": [0]})
    fewer = _as_read(delta, {**planned, "data_files": ["a"]})  # read fewer than planned
    with pytest.raises(ValueError, match="reports deleting rows of b, which its scan did not read"):
        _deleted_positions(delta, fewer, {"b": [0]})
    from icecrypt.spark._sql.write import _records

    keyless = SimpleNamespace(mode="delta", replaced=planned, what="table db.t", secret=None, schema=None,
                              table=SimpleNamespace(encrypted=True, properties={}))
    with pytest.raises(ValueError, match="planned no rows, yet reports 1 written file"):
        _records(keyless, [["x.parquet", 10, 1, []]])
    for bad in ("1", [1.5], [True], ["2"]):
        with pytest.raises(ValueError, match="malformed row positions for a"):
            _deleted_positions(delta, scanned, {"a": bad})
    with pytest.raises(ValueError, match="not the one it began with"):
        _as_read(delta, {**planned, "snapshot_id": 8})


def _lineage(cat, name: str) -> dict[int, tuple[int, int]]:
    """id -> (_row_id, _last_updated_sequence_number), read through SQL, checked equal to
    what icecrypt's table API reads."""
    got = dict((i, (r, s)) for i, r, s in
               cat.rows(f"SELECT id, _row_id, _last_updated_sequence_number FROM {{c}}.{name}"))
    rows = cat.table(name).scan(columns=["id", "_row_id", "_last_updated_sequence_number"]).to_arrow().to_pylist()
    assert got == {r["id"]: (r["_row_id"], r["_last_updated_sequence_number"]) for r in rows}
    assert None not in {v for pair in got.values() for v in pair}
    assert len({r for r, _ in got.values()}) == len(got), "two rows with one _row_id"
    return got


@pytest.mark.parametrize("mode", ["copy-on-write", "merge-on-read"])
def test_rows_keep_their_lineage_through_update_merge_and_delete(cat, mode):
    """Row lineage (format 3) as Iceberg's runtime keeps it: a row copied into a rewritten
    file or updated keeps its _row_id; an updated row's _last_updated_sequence_number is
    the statement's commit's, a copied row's stays; an inserted row gets a new id.  Spark
    reads the lineage columns with the rows (metadata columns the operation requires) and
    the new files store them under their reserved field ids, as Iceberg Java's do."""
    name = f"db.rl_lineage_{mode[:4].replace('-', '')}"
    model = {i: (i, "ab"[i % 2], float(i)) for i in range(10)}
    _create(cat, name, True, False, model, MOR if mode == "merge-on-read" else "")
    before = _lineage(cat, name)

    def changed(statement: str, updated: set[int], inserted: set[int] = frozenset(), deleted: set[int] = frozenset()):
        nonlocal before
        cat.sql(statement)
        after = _lineage(cat, name)
        sequence = cat.table(name).current_snapshot().sequence_number
        assert set(after) == (set(before) - deleted) | inserted
        for i, (row_id, seq) in after.items():
            if i in inserted:
                assert row_id not in {r for r, _ in before.values()} and seq == sequence, (i, row_id, seq)
            elif i in updated:
                assert (row_id, seq) == (before[i][0], sequence), (i, before[i], row_id, seq)
            else:
                assert (row_id, seq) == before[i], (i, before[i], row_id, seq)
        before = after

    changed(f"UPDATE {{c}}.{name} SET v = -1 WHERE id IN (SELECT 3)", {3})
    changed(f"""MERGE INTO {{c}}.{name} t USING (SELECT * FROM VALUES (5L, 'x', 0.5), (100L, 'n', 1.0)
                AS s(id, cat, v)) s ON t.id = s.id
                WHEN MATCHED THEN UPDATE SET t.v = s.v WHEN NOT MATCHED THEN INSERT *""", {5}, {100})
    changed(f"DELETE FROM {{c}}.{name} WHERE length(cat) = 1 AND id IN (SELECT 7)", set(), deleted={7})
    changed(f"UPDATE {{c}}.{name} SET v = v + 1 WHERE id IN (SELECT 3 UNION SELECT 100)", {3, 100})
    # conditions on the metadata columns: a query, and a DELETE (run as a row-level operation)
    assert cat.rows(f"SELECT id FROM {{c}}.{name} WHERE _row_id = {before[5][0]}") == [(5,)]
    changed(f"DELETE FROM {{c}}.{name} WHERE _row_id = {before[9][0]}", set(), deleted={9})
    model.update({3: (3, "b", 0.0), 5: (5, "b", 0.5), 100: (100, "n", 2.0)})
    del model[7], model[9]
    _check(cat, name, model)
    _sealed(cat, name)
