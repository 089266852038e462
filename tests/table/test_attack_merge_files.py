"""``rowlevel.merge_files`` (what the driver of ``icecrypt.spark.merge`` commits: data files
written on executors, files to remove, row positions to delete): places that are not the
table's are refused with nothing committed and the job's files deleted, and new deletes
join the rows a file has deleted already."""

from __future__ import annotations

import pytest
from test_attack_rowlevel_files import _exists, _refused, _table
from test_rowlevel_model import _rows

from icecrypt import CommitConflictError
from icecrypt.errors import FormatError
from icecrypt.table.ops.rowlevel import merge_files
from icecrypt.table.ops.write import write_files


def _places(table) -> dict[int, tuple[str, int]]:
    rows = table.scan(columns=["id", "_file", "_pos"]).to_arrow().to_pylist()
    return {r["id"]: (r["_file"], r["_pos"]) for r in rows}


def test_places_that_are_not_the_tables_are_refused(tmp_path, kms):
    table = _table(tmp_path, kms)
    path, pos = _places(table)[4]
    count = next(t.file.record_count for t in table.scan().plan_files() if t.file.path == path)

    _refused(table, write_files(table, _rows([200])), ValueError, "outside the data file's",
             lambda t, f: merge_files(t, f, deleted_positions={path: [pos, count]}))  # fmt: skip
    _refused(table, write_files(table, _rows([201])), CommitConflictError, "not a live data file",
             lambda t, f: merge_files(t, f, removed=[path + ".forged"]))  # fmt: skip
    stripped = write_files(table, _rows([202]))
    stripped[0]["key_metadata"] = None  # an encrypted table's data file without its key
    _refused(table, stripped, FormatError, "must have key metadata",
             lambda t, f: merge_files(t, f, deleted_positions={path: [pos]}))  # fmt: skip


def test_new_deletes_join_the_files_deletes(tmp_path, kms):
    table = _table(tmp_path, kms)
    table.update_properties().set("write.delete.mode", "merge-on-read").commit()
    places = _places(table)
    assert places[1][0] == places[4][0]  # same partition, same file
    table.delete("id = 1")  # a DV on that file
    added = write_files(table, _rows([400]))
    merge_files(table, added, deleted_positions={places[4][0]: [places[4][1]]},
                start_snapshot_id=table.current_snapshot_id)  # fmt: skip
    ids = set(table.refresh().scan().to_arrow()["id"].to_pylist())
    assert ids == (set(range(12)) - {1, 4}) | {400}  # row 1 stays deleted
    assert all(_exists(f) for f in added) and table.verify().ok
    with pytest.raises(CommitConflictError):  # planned before the merge, which gave that file a new DV since
        merge_files(table, [], deleted_positions={places[7][0]: [places[7][1]]},
                    start_snapshot_id=table.snapshots()[1].snapshot_id)

