"""rewrite_position_delete_files: v2-format position-delete files of a format-version 3
table rewritten into deletion vectors, as Iceberg Java's ``rewritePositionDeletes`` does.

icecrypt (like Java on v3) writes deletion vectors only; a v2-format file is what a table
upgraded from v2 still holds (``posdeletes.add_v2_position_deletes`` commits one)."""

from __future__ import annotations

import pytest
from test_write_roundtrip import CATEGORY, SCHEMA, assert_all_encrypted, digest, make_rows

from posdeletes import add_v2_position_deletes, v2_files

from icecrypt import CommitConflictError
from icecrypt.table import EncryptedTable


def _by_partition(deletes: dict[str, list[int]]) -> dict[str, dict[str, list[int]]]:
    """``deletes`` split by the partition directory of each data file (a v2 file applies
    within its partition only)."""
    out: dict[str, dict[str, list[int]]] = {}
    for path, positions in deletes.items():
        out.setdefault(path.split("/")[-2], {})[path] = positions
    return out


def _files(table: EncryptedTable) -> dict[str, list]:
    """Data file path -> its delete files, as a scan plans them."""
    return {t.file.path: list(t.deletes) for t in table.scan().plan_files()}


def _ids(table: EncryptedTable) -> list[int]:
    return sorted(table.scan(columns=["id"]).to_arrow()["id"].to_pylist())


@pytest.fixture
def table(tmp_path, kms) -> EncryptedTable:
    """Two appends into two partitions (four data files), then a deletion vector on one."""
    t = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA", partition_spec=CATEGORY)
    t.append(make_rows(0, 100))
    t.append(make_rows(100, 200))
    t.delete("id in (0, 2, 4)")
    return t


def _positions_of(table: EncryptedTable, ids: list[int]) -> dict[str, list[int]]:
    """The (file, position) of each row id (read with _file and _pos)."""
    rows = table.scan(columns=["id", "_file", "_pos"]).to_arrow().to_pylist()
    out: dict[str, list[int]] = {}
    for row in rows:
        if row["id"] in ids:
            out.setdefault(row["_file"], []).append(row["_pos"])
    return out


def test_a_table_of_deletion_vectors_has_nothing_to_rewrite(table):
    before = table.current_snapshot_id
    result = table.rewrite_position_delete_files(options={"rewrite-all": "true"})
    assert (result.snapshot_id, result.rewritten_delete_files, result.added_delete_files) == (before, 0, 0)
    assert table.current_snapshot_id == before
    empty = EncryptedTable.create(str(table.location) + "-empty", SCHEMA, kms=table.kms, table_key_id="keyA")
    assert empty.rewrite_position_delete_files().snapshot_id is None


def test_v2_files_become_deletion_vectors_and_the_rows_stay_as_they_were(table, tmp_path):
    """Rows 150.. are in the second append's files (no vector yet): their v2 deletes
    become vectors.  Row 10 is in a file of the first append, which has a vector: a v2
    row for it is ignored by readers (the vector holds every position delete of its
    file), before the rewrite and after it."""
    targets = _positions_of(table, [150, 151, 152, 160, 161])
    stale = _positions_of(table, [10])
    assert len(targets) >= 2 and not set(targets) & set(stale)
    rows_before = _ids(table)
    v2 = []
    for part, files in _by_partition(targets).items():
        same = {p: n for p, n in stale.items() if p.split("/")[-2] == part}
        v2.append(add_v2_position_deletes(table, {**files, **same}, partition_of=min(files)))
    # one more file in a partition that has one, deleting a row the first also deletes
    first = min(targets)
    v2.append(add_v2_position_deletes(table, {first: targets[first][:1]}))
    visible = sorted(set(rows_before) - {150, 151, 152, 160, 161})
    assert _ids(table) == visible and 10 in visible
    live_before = digest(table.scan().to_arrow())
    snapshots = len(table.snapshots())
    dvs_before = {p: [d.path for d in ds] for p, ds in _files(table).items() if any(d.is_dv for d in ds)}

    # Java's planner: a partition's few small files are fewer than min-input-files (5)
    assert table.rewrite_position_delete_files().rewritten_delete_files == 0
    assert len(table.snapshots()) == snapshots

    result = table.rewrite_position_delete_files(options={"rewrite-all": "true"})
    assert result.snapshot_id == table.current_snapshot_id and len(table.snapshots()) == snapshots + 1
    plan = _files(table)
    for path, deletes in plan.items():  # no v2 file left; at most one vector per data file
        assert all(d.is_dv for d in deletes) and len(deletes) <= 1, path
    assert not v2_files(table)
    assert {p for p, d in plan.items() if d} == set(targets) | set(dvs_before)
    assert {p: [d.path for d in plan[p]] for p in dvs_before} == dvs_before  # those vectors untouched
    assert result.rewritten_delete_files == len(v2) and result.added_delete_files == len(targets)
    assert result.rewritten_bytes == sum(r["file_size_in_bytes"] for r in v2) and result.added_bytes > 0
    assert _ids(table) == visible and digest(table.scan().to_arrow()) == live_before
    summary = table.current_snapshot().summary
    assert summary["operation"] == "replace"
    assert summary["total-records"] == "200" and summary["total-position-deletes"] == str(3 + 5)
    report = table.verify()
    assert report.ok, report.problems
    assert_all_encrypted(tmp_path / "t")
    reloaded = EncryptedTable.load(table.location, kms=table.kms)
    assert _ids(reloaded) == visible
    # the snapshot before the rewrite still reads as it did (through its v2 files)
    previous = reloaded.scan(snapshot_id=reloaded.snapshots()[-2].snapshot_id, columns=["id"]).to_arrow()
    assert sorted(previous["id"].to_pylist()) == visible
    # and now there is nothing left to rewrite
    again = reloaded.rewrite_position_delete_files(options={"rewrite-all": "true"})
    assert again.snapshot_id == reloaded.current_snapshot_id and again.rewritten_delete_files == 0


def test_dangling_deletes_are_dropped(table):
    path, positions = sorted(_positions_of(table, list(range(150, 200))).items())[0]
    add_v2_position_deletes(table, {path: positions[:2], "s3://elsewhere/gone.parquet": [0, 1, 2]})
    rows = _ids(table)
    result = table.rewrite_position_delete_files(options={"rewrite-all": "true"})
    assert result.rewritten_delete_files >= 1 and result.added_delete_files == 1
    assert _ids(table) == rows
    assert table.current_snapshot().summary["total-position-deletes"] == str(3 + 2)  # the gone file's 3 dropped


def test_filter_and_min_input_files(table):
    parts = _by_partition(_positions_of(table, list(range(0, 200, 7))))
    assert len(parts) >= 2
    added = {}
    for part, files in sorted(parts.items()):
        added[part] = [add_v2_position_deletes(table, {p: [n]}) for p, ns in files.items() for n in ns[:3]]
    rows = _ids(table)
    # min-input-files 2, only the partition the filter names
    part = sorted(parts)[0]
    value = part.split("=", 1)[1]
    result = table.rewrite_position_delete_files(f"category = '{value}'", {"min-input-files": "2"})
    assert result.rewritten_delete_files >= len(added[part])
    left = v2_files(table)
    assert not left & {r["file_path"] for r in added[part]}
    assert left == {r["file_path"] for other, records in added.items() if other != part for r in records}
    assert _ids(table) == rows


@pytest.mark.parametrize("options, message", [
    ({"no-such-option": "1"}, "no-such-option is not an option"),
    ({"rewrite-all": "yes"}, "rewrite-all: 'yes' is not true or false"),
    ({"min-input-files": "0"}, "min-input-files: 0 is out of range"),
    ({"target-file-size-bytes": "big"}, "target-file-size-bytes: 'big' is not a whole number"),
    ({"rewrite-job-order": "random"}, "rewrite-job-order: 'random' is not one of"),
])  # fmt: skip
def test_bad_options_are_refused_and_nothing_changes(table, options, message):
    add_v2_position_deletes(table, _positions_of(table, [30]))
    before = table.current_snapshot_id
    with pytest.raises(ValueError, match=message):
        table.rewrite_position_delete_files(options=options)
    assert table.refresh().current_snapshot_id == before


def test_a_bad_filter_is_refused_on_any_table(table):
    before = table.current_snapshot_id
    with pytest.raises(ValueError, match="nope"):
        table.rewrite_position_delete_files("nope = 1")
    assert table.refresh().current_snapshot_id == before


def test_a_concurrent_commit_is_a_conflict_and_leaves_nothing(table, tmp_path, monkeypatch):
    add_v2_position_deletes(table, _positions_of(table, [40, 41]))
    from icecrypt.table.maintenance import actions

    real = actions._positions
    other = EncryptedTable.load(table.location, kms=table.kms)

    def racing(*args, **kwargs):
        if not getattr(racing, "done", False):
            racing.done = True
            other.append(make_rows(500, 510))  # a writer commits while the rewrite reads
        return real(*args, **kwargs)

    monkeypatch.setattr(actions, "_positions", racing)
    files_before = {p for p in (tmp_path / "t").rglob("*") if p.is_file()}
    with pytest.raises(CommitConflictError):
        table.rewrite_position_delete_files(options={"rewrite-all": "true"})
    table.refresh()
    assert table.current_snapshot().summary["operation"] == "append"
    left = {p for p in (tmp_path / "t").rglob("*") if p.is_file()} - files_before
    # only the racing append's own files are new: no Puffin file, manifest or list of the rewrite
    assert not [p for p in left if p.suffix == ".puffin"]
    assert table.verify().ok


def test_cli(table, capfd):
    """``icecrypt table rewrite-position-delete-files``: a refused option changes nothing;
    a run rewrites and says what it did."""
    from icecrypt.cli import main

    memory = ["--kms-type", "memory", "--kms-property", "encryption.kms.memory.iceberg-test-keys=true"]
    add_v2_position_deletes(table, _positions_of(table, [170, 171]))
    rows, before = _ids(table), table.current_snapshot_id
    command = ["table", "rewrite-position-delete-files", table.location, *memory]
    assert main([*command, "--option", "rewrite-all=yes"]) != 0
    assert "rewrite-all: 'yes' is not true or false" in capfd.readouterr().err
    assert table.refresh().current_snapshot_id == before
    assert main([*command, "--option", "rewrite-all=true"]) == 0
    out = capfd.readouterr().out
    assert "rewrote 1 position-delete file(s) into 1 deletion vector(s)" in out
    assert table.refresh().current_snapshot_id != before and not v2_files(table) and _ids(table) == rows
