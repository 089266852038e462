"""Conflict detection of row-level changes, as Java's: a change that lost a race is
re-applied to the newer version only when nothing conflicting was committed since the
snapshot it was planned on; otherwise CommitConflictError, nothing committed, its files
removed.  Includes two real processes racing on one path table."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from test_rowlevel_model import SCHEMA, _props, _rows
from test_write_commit import _race

from icecrypt import CommitConflictError
from icecrypt.kms.memory import MemoryKms
from icecrypt.table import EncryptedTable
from icecrypt.table.ops import write as _write

MODES = ("copy-on-write", "merge-on-read")


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def _table(tmp_path, kms, mode, **props) -> tuple[EncryptedTable, EncryptedTable, Path]:
    root = tmp_path / "t"
    table = EncryptedTable.create(str(root), SCHEMA, kms=kms, table_key_id="keyA",
                                  properties={**_props(mode), "commit.retry.min-wait-ms": "1", **props})  # fmt: skip
    table.append(_rows(range(10)))
    return table, EncryptedTable.load(str(root), kms=kms), root


@pytest.mark.parametrize("mode", MODES)
def test_update_is_reapplied_over_an_append_that_does_not_conflict(tmp_path, kms, monkeypatch, mode):
    table, rival, _ = _table(tmp_path, kms, mode)
    _race(monkeypatch, lambda: rival.append(_rows([100, 101])))
    table.update({"n": pc.field("n") + 1}, where="id < 5")
    rows = {r["id"]: r["n"] for r in table.refresh().scan().to_arrow().to_pylist()}
    assert rows == {**{i: 1 for i in range(5)}, **{i: 0 for i in range(5, 10)}, 100: 0, 101: 0}  # nothing lost
    chain = [s["summary"]["operation"] for s in table.metadata["snapshots"]]
    assert chain == ["append", "append", "overwrite"]


@pytest.mark.parametrize("mode", MODES)
def test_serializable_refuses_a_new_matching_row_and_snapshot_isolation_takes_it(tmp_path, kms, monkeypatch, mode):
    table, rival, root = _table(tmp_path, kms, mode)
    # the rival appends a row the update's filter matches: serializable isolation refuses
    _race(monkeypatch, lambda: rival.append(_rows([3])))
    before = _files(root)
    with pytest.raises(CommitConflictError, match="serializable isolation") as info:
        table.update({"v": "x"}, where="id < 5")
    assert "added data file" in str(info.value) and "id" in str(info.value)
    rival.refresh()
    assert table.refresh().current_snapshot_id == rival.current_snapshot_id  # nothing of the update landed
    assert [s["summary"]["operation"] for s in table.metadata["snapshots"]] == ["append", "append"]
    # the update's files are gone: what is new is the rival's (one data file, one
    # manifest, one manifest list, its metadata version)
    added = _files(root) - before
    assert sum(f.startswith("data/") for f in added) == 1, added
    assert sum(f.endswith(".avro") for f in added) == 2, added
    # snapshot isolation: the same race commits; the new row was not seen, so stays as written
    table.update_properties().set("write.update.isolation-level", "snapshot").commit()
    rival.refresh()
    _race(monkeypatch, lambda: rival.append(_rows([4])))
    table.update({"v": "x"}, where="id < 5")
    rows = sorted((r["id"], r["v"]) for r in table.refresh().scan().to_arrow().to_pylist() if r["id"] < 5)
    assert rows == [(0, "x"), (1, "x"), (2, "x"), (3, "x"), (3, "x"), (4, "r4"), (4, "x")]


@pytest.mark.parametrize("level", ["serializable", "snapshot"])
@pytest.mark.parametrize("mode", MODES)
def test_a_concurrent_delete_of_the_same_file_conflicts_at_both_levels(tmp_path, kms, monkeypatch, mode, level):
    table, rival, root = _table(tmp_path, kms, mode)
    # in merge-on-read the rival's delete adds a DV for the file; in copy-on-write it removes the file
    _race(monkeypatch, lambda: rival.delete("id = 7"))
    before = _files(root)
    expected = "added delete file" if mode == "merge-on-read" else "removed data file|added data file"
    with pytest.raises(CommitConflictError, match=expected) as info:
        table.update({"n": 1}, where="id = 2", isolation_level=level)
    assert "nothing was committed" in str(info.value)
    rows = {r["id"]: r["n"] for r in table.refresh().scan().to_arrow().to_pylist()}
    assert 7 not in rows and rows[2] == 0  # the delete stands, the update did not land
    # the update's data file or DV, manifests and manifest lists were removed: what is
    # new is the rival's (its DV, or its rewritten file)
    assert sum(f.startswith("data/") for f in _files(root) - before) == 1


@pytest.mark.parametrize("mode", MODES)
def test_a_file_removed_by_a_concurrent_compaction_conflicts(tmp_path, kms, monkeypatch, mode):
    table, rival, _ = _table(tmp_path, kms, mode)
    table.append(_rows(range(10, 20)))
    rival.refresh()
    _race(monkeypatch, lambda: rival.rewrite_data_files(options={"rewrite-all": "true", "min-input-files": "1"}))
    with pytest.raises(CommitConflictError, match="removed data file"):
        table.delete("id = 3") if mode == "copy-on-write" else table.upsert(_rows([3], v="new"), ["id"])


def test_upsert_against_a_concurrent_append_of_other_keys_is_reapplied(tmp_path, kms, monkeypatch):
    table, rival, _ = _table(tmp_path, kms, "merge-on-read")
    _race(monkeypatch, lambda: rival.append(_rows([500])))  # outside the source's keys' range
    result = table.upsert(_rows([1, 2, 20], v="u"), ["id"])
    assert (result.rows_updated, result.rows_inserted) == (2, 1)
    ids = sorted(table.refresh().scan().to_arrow().column("id").to_pylist())
    assert ids == sorted([*range(10), 20, 500])


def test_a_concurrent_upsert_of_the_same_key_never_duplicates_it(tmp_path, kms, monkeypatch):
    """Both upserts plan an insert of key 42: the second must not add a duplicate."""
    table, rival, _ = _table(tmp_path, kms, "merge-on-read")
    _race(monkeypatch, lambda: rival.upsert(_rows([42], v="rival"), ["id"]))
    with pytest.raises(CommitConflictError, match="serializable isolation"):
        table.upsert(_rows([42], v="mine"), ["id"])
    assert [r["v"] for r in table.refresh().scan(row_filter="id = 42").to_arrow().to_pylist()] == ["rival42"]


def test_history_rolled_back_under_the_change_conflicts(tmp_path, kms, monkeypatch):
    table, rival, _ = _table(tmp_path, kms, "copy-on-write")
    first = table.current_snapshot_id
    table.append(_rows([50]))
    rival.refresh()
    _race(monkeypatch, lambda: rival.manage_snapshots().rollback_to_snapshot(first).commit())
    with pytest.raises(CommitConflictError, match="no longer an ancestor"):
        table.update({"v": "x"}, where="id = 50")


# --- two processes ------------------------------------------------------------------------------


def _worker(location: str, barrier, results, name: str) -> None:  # runs in a forked process
    """Plan an increment of row 1's counter, wait for the other process to have planned
    too, then commit (no retry by the caller)."""
    kms = MemoryKms.with_iceberg_test_keys()
    table = EncryptedTable.load(location, kms=kms)
    original = _write._commit_change

    def after_barrier(*args, **kwargs):
        barrier.wait(timeout=60)
        return original(*args, **kwargs)

    _write._commit_change = after_barrier
    try:
        table.update({"n": pc.field("n") + 1}, where="id = 1")
        results.put((name, "committed"))
    except CommitConflictError as exc:
        results.put((name, f"conflict: {exc}"))
    except Exception as exc:  # noqa: BLE001 - reported to the test
        results.put((name, f"error: {type(exc).__name__}: {exc}"))


@pytest.mark.parametrize("mode", MODES)
def test_two_processes_updating_one_row_never_lose_an_update(tmp_path, kms, mode):
    table, _, root = _table(tmp_path, kms, mode)
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(2)
    results = context.Queue()
    workers = [context.Process(target=_worker, args=(str(root), barrier, results, n)) for n in ("a", "b")]
    for w in workers:
        w.start()
    outcome = dict(results.get(timeout=120) for _ in workers)
    for w in workers:
        w.join(60)
    assert sorted(v.split(":")[0] for v in outcome.values()) == ["committed", "conflict"], outcome
    rows = {r["id"]: r["n"] for r in table.refresh().scan().to_arrow().to_pylist()}
    assert rows[1] == 1 and len(rows) == 10  # one increment landed, none was lost silently
    assert [s["summary"]["operation"] for s in table.metadata["snapshots"]][-1] in ("overwrite", "delete")
    assert len(table.metadata["snapshots"]) == 2


def test_dynamic_partition_overwrite_conflicts_with_new_data_in_its_partitions(tmp_path, kms, monkeypatch):
    from test_rowlevel_model import BY_P

    root = tmp_path / "p"
    table = EncryptedTable.create(str(root), SCHEMA, kms=kms, table_key_id="keyA", partition_spec=BY_P)
    table.append(_rows(range(9)))
    rival = EncryptedTable.load(str(root), kms=kms)
    _race(monkeypatch, lambda: rival.append(_rows([30])))  # p = 0: a partition being replaced
    with pytest.raises(CommitConflictError, match="partitions it replaces"):
        table.dynamic_partition_overwrite(_rows([3, 6], v="new"))
    _race(monkeypatch, lambda: rival.refresh().append(_rows([31])))  # p = 1: not replaced
    table.dynamic_partition_overwrite(_rows([3, 6], v="new"))
    rows = sorted((r["id"], r["v"]) for r in table.refresh().scan().to_arrow().to_pylist())
    assert [r for r in rows if r[0] % 3 == 0] == [(3, "new3"), (6, "new6")]
    assert {r[0] for r in rows if r[0] % 3} == {1, 2, 4, 5, 7, 8, 31}
    assert table.current_snapshot().summary["operation"] == "overwrite"


def test_unpartitioned_dynamic_overwrite_replaces_the_table(tmp_path, kms):
    table = EncryptedTable.create(str(tmp_path / "u"), SCHEMA, kms=kms, table_key_id="keyA")
    table.append(_rows(range(5)))
    table.dynamic_partition_overwrite(_rows([9]))
    assert table.scan().to_arrow().column("id").to_pylist() == [9]
    assert pa.types.is_int64(table.scan().to_arrow().schema.field("id").type)


def test_a_branch_is_validated_on_its_own_history(tmp_path, kms, monkeypatch):
    """A commit to main does not move the branch being changed (taken as planned); one to
    the branch that deletes from a touched file conflicts."""
    table, rival, _ = _table(tmp_path, kms, "merge-on-read")
    table.manage_snapshots().create_branch("dev", table.current_snapshot_id).commit()
    rival.refresh()
    _race(monkeypatch, lambda: rival.append(_rows([3])))  # to main: matches the filter, another branch
    table.update({"v": "x"}, where="id < 5", branch="dev")
    assert sorted(r["id"] for r in table.scan(branch="dev", row_filter="v = 'x'").to_arrow().to_pylist()) == [0, 1, 2, 3, 4]
    rival.refresh()
    _race(monkeypatch, lambda: rival.delete("id = 8", branch="dev"))
    with pytest.raises(CommitConflictError, match="added delete file"):
        table.update({"v": "y"}, where="id = 7", branch="dev")


@pytest.mark.parametrize("transform", ["identity", "day"])
def test_dynamic_partition_overwrite_of_a_date_partition(tmp_path, kms, transform):
    """A date partition value (identity of a date, day of a timestamp) reads back from the
    manifest as a date but is a day count when the new rows are split: the partition the
    new rows fall in is replaced, the other kept (before, no partition matched and the
    old rows stayed beside the new)."""
    import datetime

    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import DayTransform, IdentityTransform

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("d", pa.date32()),
                        pa.field("ts", pa.timestamp("us"))])  # fmt: skip
    source, part = (2, IdentityTransform()) if transform == "identity" else (3, DayTransform())
    spec = PartitionSpec(PartitionField(source_id=source, field_id=1000, transform=part, name="p"))
    table = EncryptedTable.create(str(tmp_path / "t"), schema, kms=kms, table_key_id="keyA", partition_spec=spec)
    days = [datetime.date(2024, 1, 1), datetime.date(2024, 1, 1), datetime.date(2024, 3, 9)]

    def rows(ids, when):
        return pa.table({"id": pa.array(ids, pa.int64()), "d": pa.array(when, pa.date32()),
                         "ts": pa.array([datetime.datetime.combine(w, datetime.time(13)) for w in when], pa.timestamp("us"))})  # fmt: skip

    table.append(rows([1, 2, 3], days))
    table.dynamic_partition_overwrite(rows([9], days[:1]))
    assert sorted(table.refresh().scan().to_arrow().column("id").to_pylist()) == [3, 9]
    assert table.refresh().current_snapshot().summary["changed-partition-count"] == "1"
