"""``CALL cat.system.<procedure>(...)`` through the SQL catalog: Iceberg's snapshot and
maintenance procedures and icecrypt's key procedures, with named and positional arguments
and defaults, on encrypted and plaintext tables.  After every call the output rows are
checked against the table's state through icecrypt's Python API, and the table's rows
(through SQL, a cached query included) against a plain-Python model of them.  Every file a
procedure writes is encrypted; every refusal (unknown procedure or table, a missing or
unsupported argument, a bad snapshot id, a branch for a table) leaves the table as it was:
the same metadata version, no new file."""

from __future__ import annotations

import os
import time

import pyarrow as pa
import pytest
from conftest import MASTER, data_files, magic

from icecrypt.spark._sql.procedures import parse_identifier

pytestmark = pytest.mark.spark


def _create(cat, name: str, encrypted: bool, properties: str = "") -> None:
    props = [f"'encryption.key-id'='{MASTER}'"] if encrypted else []
    if properties:
        props.append(properties)
    tblprops = f" TBLPROPERTIES ({', '.join(props)})" if props else ""
    cat.sql(f"CREATE TABLE {{c}}.{name} (id bigint, cat string) USING iceberg{tblprops}")


def _insert(cat, target: str, rows: list[tuple]) -> None:
    cat.sql(f"INSERT INTO {{c}}.{target} VALUES " + ", ".join(f"({i}, '{c}')" for i, c in rows))


def _call(cat, statement: str) -> list[tuple]:
    return [tuple(r) for r in cat.sql("CALL {c}.system." + statement)]


def _sealed(cat, name: str) -> None:
    """Every data, delete, manifest and manifest-list file of the table is encrypted."""
    root = cat.table(name).location.rstrip("/").removeprefix("file:")
    from pathlib import Path

    files = data_files(Path(root))
    assert files
    for path in files:
        if path.name.endswith((".metadata.json", "version-hint.text")):
            continue
        assert magic(path) in (b"PARE", b"AGS1"), path


def _state(cat, name: str) -> tuple[str, list]:
    """What a refused call must leave alone: the metadata version and the table's files."""
    table = cat.table(name)
    from pathlib import Path

    return table.metadata_location, data_files(Path(table.location.removeprefix("file:")))


@pytest.mark.parametrize("encrypted", [True, False], ids=["encrypted", "plaintext"])
def test_snapshot_procedures_against_model(cat, encrypted):
    name = f"db.snap_{'enc' if encrypted else 'plain'}"
    _create(cat, name, encrypted, "'write.wap.enabled'='true'")
    rows: dict[int, list[tuple]] = {}  # snapshot id -> the table's rows there
    model: list[tuple] = []
    for batch in ([(1, "a"), (2, "b")], [(3, "a")], [(4, "c"), (5, "b")]):
        _insert(cat, name, batch)
        model = sorted(model + batch)
        rows[cat.table(name).current_snapshot_id] = model
    s1, s2, s3 = rows
    cat.sql(f"CACHE TABLE {{c}}.{name}")  # a cached relation must follow every change
    try:
        assert cat.rows(f"SELECT * FROM {{c}}.{name}") == rows[s3]

        # positional arguments
        assert _call(cat, f"rollback_to_snapshot('{name}', {s1})") == [(s3, s1)]
        assert cat.table(name).current_snapshot_id == s1
        assert cat.rows(f"SELECT * FROM {{c}}.{name}") == rows[s1]

        # named arguments, the catalog named in the table argument
        assert _call(cat, f"set_current_snapshot(table => '{{c}}.{name}', snapshot_id => {s3})") == [(s1, s3)]
        assert cat.rows(f"SELECT * FROM {{c}}.{name}") == rows[s3]

        # the newest ancestor committed before the time: s2
        t2 = cat.table(name).snapshot(s2).timestamp_ms
        assert _call(cat, f"rollback_to_timestamp(timestamp => timestamp_millis({t2 + 1}), table => '{name}')") \
            == [(s3, s2)]
        assert cat.table(name).current_snapshot_id == s2
        assert cat.rows(f"SELECT * FROM {{c}}.{name}") == rows[s2]

        # a branch from main's head, one commit on it, main fast-forwarded to it
        with cat.table(name).manage_snapshots() as manage:
            manage.create_branch("dev", s2)
        _insert(cat, f"{name}.branch_dev", [(6, "d")])
        s4 = cat.table(name).snapshot_by_name("dev").snapshot_id
        rows[s4] = sorted(rows[s2] + [(6, "d")])
        assert _call(cat, f"fast_forward('{name}', 'main', 'dev')") == [("main", s2, s4)]
        assert cat.table(name).current_snapshot_id == s4
        assert cat.rows(f"SELECT * FROM {{c}}.{name}") == rows[s4]

        # set_current_snapshot by ref: back to the head of a tag
        with cat.table(name).manage_snapshots() as manage:
            manage.create_tag("first", s1)
        assert _call(cat, f"set_current_snapshot(table => '{name}', ref => 'first')") == [(s4, s1)]
        assert cat.rows(f"SELECT * FROM {{c}}.{name}") == rows[s1]

        # write-audit-publish: a staged append, published by cherrypick_snapshot
        table = cat.table(name)
        staged = table.append(pa.table({"id": pa.array([7], pa.int64()), "cat": ["w"]}), wap_id="audit-1")
        assert cat.table(name).current_snapshot_id == s1
        (source, current), = _call(cat, f"cherrypick_snapshot(snapshot_id => {staged}, table => '{name}')")
        assert source == staged and current == cat.table(name).current_snapshot_id
        rows[current] = sorted(rows[s1] + [(7, "w")])
        assert cat.rows(f"SELECT * FROM {{c}}.{name}") == rows[current]
    finally:
        cat.sql(f"UNCACHE TABLE IF EXISTS {{c}}.{name}")
    if encrypted:
        _sealed(cat, name)


@pytest.mark.parametrize("encrypted", [True, False], ids=["encrypted", "plaintext"])
def test_maintenance_procedures_against_model(cat, encrypted):
    name = f"db.maint_{'enc' if encrypted else 'plain'}"
    _create(cat, name, encrypted, "'write.delete.mode'='merge-on-read'")
    model: list[tuple] = []
    for i in range(4):
        batch = [(10 * i + j, "abc"[j % 3]) for j in range(3)]
        _insert(cat, name, batch)
        model = sorted(model + batch)
    cat.sql(f"DELETE FROM {{c}}.{name} WHERE id = 11")  # a deletion vector
    model = [r for r in model if r[0] != 11]
    table = cat.table(name)
    snapshots_before = len(table.snapshots())
    data_before = table.inspect.data_files().num_rows
    deletes_before = table.inspect.delete_files().num_rows
    assert data_before >= 4 and deletes_before == 1  # Spark writes a file per task

    # compaction, named arguments and an option map; the deletion vector applied
    (rewritten, added, rewritten_bytes, failed, removed_deletes), = _call(
        cat, f"rewrite_data_files(table => '{name}', options => map('rewrite-all', 'true'))")
    table = cat.table(name)
    assert (rewritten, failed, removed_deletes) == (data_before, 0, 1)
    assert added == table.inspect.data_files().num_rows == 1
    assert rewritten_bytes > 0 and table.inspect.delete_files().num_rows == 0
    assert cat.rows(f"SELECT * FROM {{c}}.{name}") == model

    # a table whose position deletes are all deletion vectors: nothing to rewrite (as Java)
    assert _call(cat, f"rewrite_position_delete_files(table => '{name}', options => map('rewrite-all', 'true'))") \
        == [(0, 0, 0, 0)]
    assert cat.table(name).current_snapshot_id == table.current_snapshot_id

    # manifests regrouped, positional
    manifests = len(table.manifests(table.current_snapshot()))
    (rewritten_m, added_m), = _call(cat, f"rewrite_manifests('{name}')")
    table = cat.table(name)
    summary = table.current_snapshot().summary
    assert summary["operation"] == "replace" and 0 < rewritten_m <= manifests
    assert (rewritten_m, added_m) == (int(summary["manifests-replaced"]), int(summary["manifests-created"]))
    assert cat.rows(f"SELECT * FROM {{c}}.{name}") == model

    # expire every snapshot but the current one: the counts are the files that went
    lists = {s.manifest_list for s in table.snapshots()}
    counts, = _call(cat, f"expire_snapshots(table => '{name}', older_than => TIMESTAMP '2999-01-01 00:00:00')")
    table = cat.table(name)
    assert snapshots_before + 2 > 1 and len(table.snapshots()) == 1
    data, positions, equality, manifests_deleted, lists_deleted, stats = counts
    assert lists_deleted == len(lists) - 1
    assert (data, positions, equality, stats) == (data_before, 1, 0, 0)
    assert manifests_deleted > 0
    assert cat.rows(f"SELECT * FROM {{c}}.{name}") == model
    assert _call(cat, f"expire_snapshots('{name}', TIMESTAMP '2999-01-01 00:00:00')") == [(0, 0, 0, 0, 0, 0)]

    # an orphan four days old: listed by a dry run, deleted by a run (default older_than: 3 days)
    root = table.location.rstrip("/").removeprefix("file:")
    orphan = os.path.join(root, "data", "orphan.parquet")
    with open(orphan, "wb") as f:
        f.write(b"not the table's")
    old = time.time() - 4 * 24 * 3600
    os.utime(orphan, (old, old))
    assert _call(cat, f"remove_orphan_files(table => '{name}', dry_run => true)") == [(orphan,)]
    assert os.path.exists(orphan)
    assert _call(cat, f"remove_orphan_files('{name}')") == [(orphan,)]
    assert not os.path.exists(orphan)
    assert cat.rows(f"SELECT * FROM {{c}}.{name}") == model
    assert cat.table(name).verify().ok
    if encrypted:
        _sealed(cat, name)


@pytest.mark.parametrize("encrypted", [True, False], ids=["encrypted", "plaintext"])
def test_rewrite_position_delete_files(cat, encrypted):
    """v2-format position-delete files (a table upgraded from v2 holds them) rewritten into
    deletion vectors; the rows as they were, every new file encrypted."""
    from posdeletes import add_v2_position_deletes

    name = f"db.posdel_{'enc' if encrypted else 'plain'}"
    _create(cat, name, encrypted)
    _insert(cat, name, [(i, "a") for i in range(6)])
    table = cat.table(name)
    rows = table.scan(columns=["id", "_file", "_pos"]).to_arrow().to_pylist()
    gone = {r["_file"]: [] for r in rows}
    for r in rows:
        if r["id"] in (1, 4):
            gone[r["_file"]].append(r["_pos"])
    for path, positions in gone.items():
        if positions:
            add_v2_position_deletes(table, {path: positions})
    model = [(i, "a") for i in range(6) if i not in (1, 4)]
    assert cat.rows(f"SELECT * FROM {{c}}.{name}") == model
    (rewritten, added, rewritten_bytes, added_bytes), = _call(
        cat, f"rewrite_position_delete_files('{name}', map('rewrite-all', 'true'), 'id >= 0')")
    table = cat.table(name)
    assert rewritten == sum(1 for p in gone.values() if p) and added == rewritten
    assert rewritten_bytes > 0 and added_bytes > 0
    assert table.current_snapshot().summary["operation"] == "replace"
    assert all(d.is_dv for t in table.scan().plan_files() for d in t.deletes)
    assert cat.rows(f"SELECT * FROM {{c}}.{name}") == model
    assert table.verify().ok
    assert _call(cat, f"rewrite_position_delete_files('{name}')") == [(0, 0, 0, 0)]
    if encrypted:
        _sealed(cat, name)


def test_key_procedures(cat):
    name = "db.keys_enc"
    _create(cat, name, True)
    _insert(cat, name, [(1, "a"), (2, "b")])
    _insert(cat, name, [(3, "c")])
    model = [(1, "a"), (2, "b"), (3, "c")]
    keks_before = {e["key-id"] for e in cat.table(name).metadata["encryption-keys"]}

    (key_id, kek_id, rewrapped), = _call(cat, f"rotate_keys('{name}')")
    assert key_id == MASTER and rewrapped == [] and kek_id not in keks_before
    assert kek_id in {e["key-id"] for e in cat.table(name).metadata["encryption-keys"]}

    (key_id, kek_id, rewrapped), = _call(cat, f"rotate_keys(table => '{name}', new_master_key_id => 'other', "
                                              "new_kek => false)")
    table = cat.table(name)
    assert key_id == "other" and kek_id is None and rewrapped
    assert table.properties["encryption.key-id"] == "other"
    assert cat.rows(f"SELECT * FROM {{c}}.{name}") == model

    (ok, snapshots, files, size, rows, problems), = _call(cat, f"verify('{name}')")
    assert ok and problems == [] and snapshots == len(table.snapshots()) and files > 0 and size > 0 and rows > 0

    live_files = table.inspect.data_files().num_rows
    (key_id, new_kek, retired, rewritten, added, manifests, expired, removed_meta), = _call(
        cat, f"rekey(table => '{name}', everything => true, expire => true)")
    table = cat.table(name)
    assert key_id == "other" and new_kek and retired and rewritten == live_files and added >= 1 and manifests >= 1
    assert expired >= 1 and len(table.snapshots()) == 1
    assert cat.rows(f"SELECT * FROM {{c}}.{name}") == model
    (ok, *_), = _call(cat, f"verify(table => '{name}', snapshot_id => {table.current_snapshot_id})")
    assert ok
    _sealed(cat, name)


@pytest.fixture(scope="module")
def guarded(cat):
    """An encrypted and a plaintext table with two snapshots, for the refusals."""
    for encrypted in (True, False):
        name = f"db.guard_{'enc' if encrypted else 'plain'}"
        _create(cat, name, encrypted)
        _insert(cat, name, [(1, "a")])
        _insert(cat, name, [(2, "b")])
    return cat


_REFUSALS = [
    ("nope('{t}')", "nope cannot be found"),
    ("rollback_to_snapshot('{t}')", "snapshot_id"),  # a required argument missing (Spark's error)
    ("rollback_to_snapshot(table => '{t}', snapshot_id => 1, typo => 2)", "typo"),
    ("rollback_to_snapshot('db.missing', 1)", "table db.missing does not exist"),
    ("rollback_to_snapshot('{t}', 12345)", "snapshot 12345 is not in the table"),
    ("set_current_snapshot('{t}', {first}, 'main')", "either snapshot_id or ref"),
    ("expire_snapshots(table => '{t}', max_concurrent_deletes => 4)", "argument max_concurrent_deletes is not supported"),
    ("remove_orphan_files(table => '{t}', prefix_listing => true)", "argument prefix_listing is not supported"),
    ("remove_orphan_files(table => '{t}', older_than => current_timestamp())", "at least 24 hours"),
    ("rewrite_data_files(table => '{t}', options => map('partial-progress.enabled', 'true'))",
     "option partial-progress.enabled is not supported"),
    ("rewrite_data_files(table => '{t}', strategy => 'zorder')", "only binpack or sort"),
    ("rewrite_manifests(table => '{t}', spec_id => 0)", "argument spec_id is not supported"),
    ("rewrite_position_delete_files(table => '{t}', options => map('max-size', '1'))",
     "max-size is not an option of rewrite_position_delete_files"),
    ("rewrite_position_delete_files(table => '{t}', where => 'nope = 1')", "nope"),
    ("fast_forward('{t}', 'main', 'nowhere')", "no ref 'nowhere'"),
    ("verify('{t}.branch_main')", "give the table itself"),
    ("rollback_to_snapshot('{t}.snapshots', 1)", "give the table itself"),
    ("expire_snapshots(table => '{t}', retain_last => 0)", "at least 1"),
    ("expire_snapshots(table => '{t}', snapshot_ids => array(12345))", "no such snapshot"),
]
#: the ones run on the plaintext table too (the rest is the same code either way)
_PLAIN = (4, 6, 9)


@pytest.mark.parametrize(("encrypted", "statement", "error"),
                         [(True, *r) for r in _REFUSALS] + [(False, *_REFUSALS[i]) for i in _PLAIN])
def test_refusals_leave_the_table_unchanged(guarded, encrypted, statement, error):
    name = f"db.guard_{'enc' if encrypted else 'plain'}"
    first = guarded.table(name).snapshots()[0].snapshot_id
    before = _state(guarded, name)
    with pytest.raises(Exception) as info:
        _call(guarded, statement.format(t=name, first=first))
    text = str(info.value)
    assert error in text, text
    if "SQLSTATE" not in text:  # not one of Spark's own errors: ours name the procedure and table
        assert f"CALL {guarded.name}.system." in text and ("db.missing" in text or name in text), text
    assert _state(guarded, name) == before
    assert guarded.rows(f"SELECT * FROM {{c}}.{name}") == [(1, "a"), (2, "b")]


def test_key_procedures_refuse_a_plaintext_table(guarded):
    name = "db.guard_plain"
    before = _state(guarded, name)
    for statement in (f"rotate_keys('{name}')", f"rekey(table => '{name}', everything => true)"):
        with pytest.raises(Exception, match="not encrypted"):
            _call(guarded, statement)
    assert _state(guarded, name) == before


def test_procedures_are_listed_and_described(guarded):
    names = {r.procedure_name for r in guarded.sql("SHOW PROCEDURES IN {c}.system")}
    assert names == {"rollback_to_snapshot", "rollback_to_timestamp", "set_current_snapshot", "cherrypick_snapshot",
                     "fast_forward", "publish_changes", "ancestors_of", "expire_snapshots", "remove_orphan_files", "rewrite_data_files",
                     "rewrite_manifests", "rewrite_position_delete_files", "rotate_keys", "rekey", "verify",
                     "alter_table", "register_table", "create_changelog_view", "add_files", "migrate"}
    text = "\n".join(r[0] for r in guarded.sql("DESCRIBE PROCEDURE {c}.system.expire_snapshots"))
    assert "older_than" in text and "retain_last" in text and "refused when given" in text
    # the namespace is case-insensitive, as in Iceberg
    assert [tuple(r) for r in guarded.sql("CALL {c}.SYSTEM.verify('db.guard_enc')")][0][0] is True


def test_parse_identifier():
    assert parse_identifier("db.t") == ("db", "t")
    assert parse_identifier(" cat.db.t ") == ("cat", "db", "t")
    assert parse_identifier("`a.b`.`c``d`") == ("a.b", "c`d")
    for bad in ("", "db..t", "db.`t", "db.t."):
        with pytest.raises(ValueError):
            parse_identifier(bad)


def test_register_table(cat, keystore, tmp_path):
    """register_table adds a table written elsewhere (icecrypt's Python API, encrypted) by
    its metadata file, with Iceberg's output; SQL then reads and writes it; a missing file,
    a taken name or a file that is not metadata registers nothing."""
    from icecrypt.kms.local import LocalKms
    from icecrypt.table import EncryptedTable

    location = tmp_path / "outside"
    written = EncryptedTable.create(str(location), pa.schema([pa.field("id", pa.int64()), pa.field("cat", pa.string())]),
                                    kms=LocalKms(str(keystore)), table_key_id=MASTER)
    written.append(pa.table({"id": pa.array([1, 2, 3], pa.int64()), "cat": ["a", "b", "a"]}))
    metadata = written.metadata_location
    before = set(r[1] for r in cat.sql("SHOW TABLES IN {c}.db"))
    for statement, reason in (
            (f"register_table('db.registered', '{tmp_path}/nothing/v1.metadata.json')", "nothing"),
            (f"register_table(table => 'db.registered', metadata_file => '{location}/data')", "data"),
            ("register_table('db.registered', '')", "metadata_file")):
        with pytest.raises(Exception, match=reason):
            _call(cat, statement)
        assert set(r[1] for r in cat.sql("SHOW TABLES IN {c}.db")) == before
    with pytest.raises(Exception, match="other"):  # the file names another master key
        _call(cat, f"register_table(table => 'db.registered', metadata_file => '{metadata}', table_key_id => 'other')")
    assert set(r[1] for r in cat.sql("SHOW TABLES IN {c}.db")) == before
    out = _call(cat, f"register_table(table => 'db.registered', metadata_file => '{metadata}', "
                     f"table_key_id => '{MASTER}')")
    assert out == [(written.current_snapshot_id, 3, 1)]
    assert cat.rows("SELECT id, cat FROM {c}.db.registered") == [(1, "a"), (2, "b"), (3, "a")]
    _insert(cat, "db.registered", [(4, "c")])
    registered = cat.table("db.registered")
    assert sorted(r["id"] for r in registered.scan().to_arrow().to_pylist()) == [1, 2, 3, 4]
    assert registered.encrypted and registered.metadata["table-uuid"] == written.metadata["table-uuid"]
    _sealed(cat, "db.registered")
    with pytest.raises(Exception, match="already exists|AlreadyExists"):
        _call(cat, f"register_table('db.registered', '{metadata}')")


def test_register_table_refused_by_a_path_catalog(new_catalog, tmp_path):
    paths = new_catalog("hadoop")
    paths.sql("CREATE NAMESPACE {c}.db")
    with pytest.raises(Exception, match="path tables"):
        _call(paths, f"register_table('db.t', '{tmp_path}/v1.metadata.json')")
