"""Streaming planning: ``TableScan.plan_tasks()`` reads the delete manifests first, then
the data manifests one at a time (a bounded read-ahead window on object stores), and
yields exactly the plan ``plan_files()`` returns."""

from __future__ import annotations

import gc
import tracemalloc

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from icecrypt.table import EncryptedTable
from icecrypt.table.read import scan as _scan

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("s", pa.string())])


def _rows(i: int, n: int = 3) -> pa.Table:
    return pa.table({"id": pa.array(range(n * i, n * i + n), pa.int64()), "s": [f"r{i}"] * n})


@pytest.fixture
def many_manifests(tmp_path, kms):
    """An encrypted table of 14 appends, one manifest each (merging off), with a
    position delete and an equality delete in the middle."""
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA",
                                  properties={"commit.manifest-merge.enabled": "false"})
    for i in range(12):
        table.append(_rows(i))
    table.delete("id = 4")
    table.append(_rows(12))
    table.append(_rows(13))
    return table


def _key(task):
    return (task.file.path, task.start, task.length, tuple(d.path for d in task.deletes))


def test_streamed_plan_is_the_listed_plan(many_manifests):
    listed = many_manifests.scan().plan_files()
    fresh = many_manifests.scan()
    streamed = list(fresh.plan_tasks())
    assert [_key(t) for t in streamed] == [_key(t) for t in listed]
    assert fresh.metrics.tasks == len(listed) and fresh.metrics.manifests >= 14
    assert sorted(many_manifests.scan().to_batches().read_all().column("id").to_pylist()) == \
        [i for i in range(42) if i != 4]


def test_streamed_plan_with_filters_and_metrics(many_manifests):
    scan = many_manifests.scan(row_filter="id >= 30")
    tasks = list(scan.plan_tasks())
    listed = many_manifests.scan(row_filter="id >= 30").plan_files()
    assert [_key(t) for t in tasks] == [_key(t) for t in listed]
    assert scan.metrics.data_files_skipped > 0 and scan.metrics.tasks == len(tasks)


def test_read_ahead_window_on_a_non_local_filesystem(many_manifests, monkeypatch):
    """A SubTreeFileSystem is not a LocalFileSystem: manifests are fetched ahead in the
    pool, never more than the window at once, and an abandoned iterator cancels the rest."""
    table = EncryptedTable.load(many_manifests.metadata_location, kms=many_manifests.kms,
                                filesystem=pafs.SubTreeFileSystem("/", pafs.LocalFileSystem()))
    assert not isinstance(table.filesystem, pafs.LocalFileSystem)
    in_flight = peak = 0
    real = _scan.read_manifest

    def counting(*args, **kwargs):
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        try:
            return list(real(*args, **kwargs))
        finally:
            in_flight -= 1

    monkeypatch.setattr(_scan, "read_manifest", counting)
    monkeypatch.setattr(_scan, "_MANIFEST_THREADS", 3)
    assert [_key(t) for t in table.scan().plan_tasks()] == [_key(t) for t in many_manifests.scan().plan_files()]
    assert 1 <= peak <= 3
    it = table.scan().plan_tasks()
    next(it)
    it.close()  # pending fetches are cancelled or finish; nothing raises


def test_streaming_holds_one_manifest_not_the_plan(tmp_path, kms):
    """Iterating the streamed plan of many files allocates less at peak than holding it."""
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA",
                                  properties={"commit.manifest-merge.enabled": "false"})
    for i in range(30):
        table.append(_rows(i, 1))
    table.scan().plan_files()  # warm: imports, the KEK cache, the manifest list
    gc.collect()
    tracemalloc.start()
    try:
        for _ in table.scan().plan_tasks():
            pass
        _, streamed_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        tasks = table.scan().plan_files()
        _, listed_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(tasks) == 30
    assert streamed_peak < listed_peak
