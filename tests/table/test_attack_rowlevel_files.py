"""The files-based row-level overwrites (what the Spark writer's driver commits: data
files written by ``write_files`` on executors): forged or unfit records, a bad filter and
a conflict since the job's start are refused, nothing is committed and the job's data
files are deleted."""

from __future__ import annotations

import os

import pytest
from test_rowlevel_model import BY_P, SCHEMA, _rows

from icecrypt import CommitConflictError
from icecrypt.errors import FormatError
from icecrypt.table import EncryptedTable
from icecrypt.table.ops.rowlevel import dynamic_partition_overwrite_files, overwrite_files_by_filter
from icecrypt.table.ops.write import write_files


def _table(tmp_path, kms) -> EncryptedTable:
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA", partition_spec=BY_P,
                                  properties={"commit.retry.min-wait-ms": "1"})  # fmt: skip
    table.append(_rows(range(12)))
    return table


def _exists(record: dict) -> bool:
    path = record["file_path"]
    return os.path.exists(path[len("file://"):] if path.startswith("file://") else path)


def _refused(table: EncryptedTable, files: list[dict], error, match: str, call) -> None:
    head = table.refresh().current_snapshot_id
    assert all(_exists(f) for f in files)
    with pytest.raises(error, match=match):
        call(table, files)
    assert table.refresh().current_snapshot_id == head  # nothing committed
    assert not any(_exists(f) for f in files)  # the job's files are deleted


def test_a_bad_filter_deletes_the_job_files(tmp_path, kms):
    table = _table(tmp_path, kms)
    _refused(table, write_files(table, _rows(range(100, 104))), ValueError, "no_such_column",
             lambda t, f: overwrite_files_by_filter(t, f, "no_such_column = 1"))  # fmt: skip


@pytest.mark.parametrize("dynamic", [False, True])
def test_forged_records_are_refused(tmp_path, kms, dynamic):
    table = _table(tmp_path, kms)

    def call(t, f):
        return dynamic_partition_overwrite_files(t, f) if dynamic else overwrite_files_by_filter(t, f, "p = 1")

    stripped = write_files(table, _rows([101, 104]))  # one partition, p = 2
    stripped[0]["key_metadata"] = None  # an encrypted table's data file without its key
    _refused(table, stripped, FormatError, "must have key metadata", call)

    as_deletes = write_files(table, _rows([101, 104]))
    as_deletes[0]["content"] = 1  # posing as a delete file
    _refused(table, as_deletes, ValueError, "data files only", call)


def test_dynamic_overwrite_refuses_files_of_another_spec(tmp_path, kms):
    table = _table(tmp_path, kms)
    files = write_files(table, _rows([101, 104]))
    files[0]["partition"] = {"q": 2}
    _refused(table, files, ValueError, r"partition fields \['q'\].*nothing was committed",
             lambda t, f: dynamic_partition_overwrite_files(t, f))  # fmt: skip


@pytest.mark.parametrize("isolation", ["serializable", "snapshot"])
def test_commits_since_the_job_started_are_validated(tmp_path, kms, isolation):
    """An append to a replaced partition after the job started: a conflict under
    serializable isolation, replaced under snapshot isolation."""
    table = _table(tmp_path, kms)
    start = table.current_snapshot_id
    files = write_files(table, _rows([101, 104]))  # p = 2
    EncryptedTable.load(table.location, kms=kms).append(_rows([200, 203]))  # p = 2 and p = 2
    if isolation == "serializable":
        _refused(table, files, CommitConflictError, "partitions it replaces",
                 lambda t, f: dynamic_partition_overwrite_files(t, f, start_snapshot_id=start))  # fmt: skip
        return
    dynamic_partition_overwrite_files(table, files, start_snapshot_id=start, isolation_level="snapshot")
    rows = table.refresh().scan().to_arrow()
    assert sorted(i for i, p in zip(rows["id"].to_pylist(), rows["p"].to_pylist()) if p == 2) == [101, 104]
    assert sorted(rows["id"].to_pylist()) == sorted([i for i in range(12) if i % 3 != 2] + [101, 104])


def test_a_start_snapshot_that_is_not_an_ancestor_is_a_conflict(tmp_path, kms):
    table = _table(tmp_path, kms)
    files = write_files(table, _rows([101]))
    _refused(table, files, CommitConflictError, "no longer an ancestor of the head of 'main'",
             lambda t, f: overwrite_files_by_filter(t, f, "id = 1", start_snapshot_id=12345))  # fmt: skip
