"""Snapshot producers (append, append_files, overwrite, delete) on the one committer:

* writer processes racing on one table (a path table, an SQLite catalog table) with
  ``commit.retry.num-retries`` 0: every append lands, none is lost or doubled (an
  append cannot conflict; it is retried until ``commit.retry.total-timeout-ms``, not
  capped at num-retries as Java caps it);
* an overwrite or delete racing an append is refused, nothing of it left;
* a commit whose outcome a catalog cannot tell keeps every file the new version names
  (the version may be current), while one that surely did not land leaves nothing;
* PyIceberg reads the lineage the producers wrote.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.table import StaticTable

from icecrypt.catalog import load_catalog
from icecrypt.kms.memory import MemoryKms
from icecrypt.table import EncryptedTable

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("writer", pa.int64())])
WRITERS, APPENDS, ROWS = 4, 5, 2
KMS_PROPERTIES = {
    "encryption.kms-impl": "icecrypt.kms.memory.MemoryKms",
    "encryption.kms.memory.iceberg-test-keys": "true",
}
NO_RETRIES = {"commit.retry.num-retries": "0", "commit.retry.min-wait-ms": "10", "commit.retry.max-wait-ms": "200"}

WORKER = r"""
import json, os, sys, time
import pyarrow as pa
from icecrypt.errors import CommitConflictError

spec = json.loads(sys.argv[1])
if spec["kind"] == "path":
    from icecrypt.kms.memory import MemoryKms
    from icecrypt.table import EncryptedTable
    table = EncryptedTable.load(spec["root"], kms=MemoryKms.with_iceberg_test_keys())
else:
    from icecrypt.catalog import load_catalog
    table = load_catalog("test", **spec["properties"]).load_table("db.t")
deadline = time.monotonic() + 120
while not os.path.exists(spec["go"]):
    if time.monotonic() > deadline:
        sys.exit("start file never appeared")
    time.sleep(0.002)
out = {"committed": [], "refused": []}
for i in range(spec["appends"]):
    start = spec["first_id"] + i * spec["rows"]
    data = pa.table({"id": list(range(start, start + spec["rows"])), "writer": [spec["writer"]] * spec["rows"]})
    try:
        out["committed"].append(table.append(data))
    except CommitConflictError as exc:
        out["refused"].append(str(exc))
print(json.dumps(out))
"""


def _race_processes(tmp_path: Path, spec: dict) -> list[dict]:
    go = tmp_path / "go"
    procs = []
    try:
        for n in range(WRITERS):
            args = {**spec, "go": str(go), "writer": n, "first_id": n * 1000, "appends": APPENDS, "rows": ROWS}
            procs.append(subprocess.Popen([sys.executable, "-c", WORKER, json.dumps(args)],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE))  # fmt: skip
        time.sleep(0.5)
        go.write_text("go")
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err.decode(errors="replace")[-3000:]
            results.append(json.loads(out.decode().strip().splitlines()[-1]))
        return results
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)


def _check_all_landed(table: EncryptedTable, results: list[dict]) -> None:
    assert [r["refused"] for r in results] == [[]] * WRITERS
    committed = [s for r in results for s in r["committed"]]
    assert len(set(committed)) == WRITERS * APPENDS
    assert {s.snapshot_id for s in table.snapshots()} == set(committed)
    ids = sorted(table.scan().to_arrow()["id"].to_pylist())
    assert ids == sorted(n * 1000 + i for n in range(WRITERS) for i in range(APPENDS * ROWS))
    chain = [s.snapshot_id for s in table.snapshots()]
    assert [s.parent_snapshot_id for s in table.snapshots()] == [None, *chain[:-1]]
    assert table.verify().ok
    theirs = StaticTable.from_metadata(table.metadata_location).metadata
    assert [s.snapshot_id for s in theirs.snapshots] == chain
    assert theirs.current_snapshot_id == chain[-1]


@pytest.mark.slow
def test_processes_appending_to_a_path_table_all_land(tmp_path):
    root = str(tmp_path / "t")
    EncryptedTable.create(root, SCHEMA, kms=MemoryKms.with_iceberg_test_keys(), table_key_id="keyA",
                          properties=NO_RETRIES)  # fmt: skip
    results = _race_processes(tmp_path, {"kind": "path", "root": root})
    _check_all_landed(EncryptedTable.load(root, kms=MemoryKms.with_iceberg_test_keys()), results)


@pytest.mark.slow
def test_processes_appending_to_a_catalog_table_all_land(tmp_path):
    properties = {"warehouse": str(tmp_path / "wh"), **KMS_PROPERTIES}
    (tmp_path / "wh").mkdir()
    catalog = load_catalog("test", **properties)
    catalog.create_namespace("db")
    catalog.create_table("db.t", SCHEMA, table_key_id="keyA", properties=NO_RETRIES)
    results = _race_processes(tmp_path, {"kind": "catalog", "properties": properties})
    _check_all_landed(catalog.load_table("db.t"), results)


# --- a catalog that cannot tell -----------------------------------------------------------------


class _Flaky:
    """A catalog store whose swap fails after (``land``) or before it swaps, and which
    then cannot say what its current version is."""

    def __init__(self, store, *, land: bool, blind: bool):
        self.store, self.land, self.blind, self.armed = store, land, blind, True

    def __getattr__(self, name):
        return getattr(self.store, name)

    def current(self):
        if self.armed and self.blind and self.tripped:
            raise ConnectionError("catalog unreachable")
        return self.store.current()

    tripped = False

    def swap(self, expected, new, **kwargs):
        if self.armed:
            self.tripped = True
            if self.land:
                self.store.swap(expected, new, **kwargs)
            raise ConnectionError("connection lost during the swap")
        return self.store.swap(expected, new, **kwargs)


def _catalog_table(tmp_path: Path):
    properties = {"warehouse": str(tmp_path / "wh"), **KMS_PROPERTIES}
    (tmp_path / "wh").mkdir()
    catalog = load_catalog("test", **properties)
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", SCHEMA, table_key_id="keyA")
    table.append(pa.table({"id": [1, 2, 3], "writer": [0, 0, 0]}))
    return catalog, table


def _write_once(table: EncryptedTable, operation: str) -> None:
    if operation == "append":
        table.append(pa.table({"id": [4], "writer": [1]}))
    elif operation == "overwrite":
        table.overwrite(pa.table({"id": [9], "writer": [1]}))
    else:
        table.delete("id = 2")


def _files(root: Path) -> set[str]:
    return {str(p) for p in root.rglob("*") if p.is_file() and p.suffix in (".parquet", ".avro", ".json")}


@pytest.mark.parametrize("operation", ["append", "overwrite", "delete"])
def test_unknown_outcome_keeps_every_file(tmp_path, operation):
    catalog, table = _catalog_table(tmp_path)
    table.metadata_store = flaky = _Flaky(table.metadata_store, land=True, blind=True)
    with pytest.raises(ConnectionError):
        _write_once(table, operation)
    flaky.armed = False
    # the swap did land: the new version is current, and every file it names is there
    after = catalog.load_table("db.t")
    assert len(after.snapshots()) == 2
    assert after.verify().ok
    expected = {"append": [1, 2, 3, 4], "overwrite": [9], "delete": [1, 3]}[operation]
    assert sorted(after.scan().to_arrow()["id"].to_pylist()) == expected


@pytest.mark.parametrize("operation", ["append", "overwrite", "delete"])
def test_a_swap_that_surely_failed_leaves_nothing(tmp_path, operation):
    catalog, table = _catalog_table(tmp_path)
    before = _files(tmp_path / "wh")
    table.metadata_store = _Flaky(table.metadata_store, land=False, blind=False)
    with pytest.raises(ConnectionError):
        _write_once(table, operation)
    assert _files(tmp_path / "wh") == before
    assert len(catalog.load_table("db.t").snapshots()) == 1


# --- an interrupt once the version landed ---------------------------------------------------------


@pytest.mark.parametrize("kind", ["path", "catalog"])
@pytest.mark.parametrize("operation", ["append", "overwrite", "delete"])
def test_an_interrupt_after_the_version_landed_keeps_every_file(tmp_path, monkeypatch, kind, operation):
    """A KeyboardInterrupt raised right after the new version file is in place (here:
    in the metadata housekeeping that follows every commit, path table or catalog) is
    no failed commit: the version is current, so neither the committer nor the
    operation deletes the manifest list, manifests or data files it names."""
    from icecrypt.table.commit import store

    if kind == "path":
        table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=MemoryKms.with_iceberg_test_keys(),
                                      table_key_id="keyA")  # fmt: skip
        table.append(pa.table({"id": [1, 2, 3], "writer": [0, 0, 0]}))

        def reload():
            return EncryptedTable.load(str(tmp_path / "t"), kms=MemoryKms.with_iceberg_test_keys())
    else:
        catalog, table = _catalog_table(tmp_path)

        def reload():
            return catalog.load_table("db.t")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(store, "_after_commit", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _write_once(table, operation)
    monkeypatch.undo()
    after = reload()
    assert len(after.snapshots()) == 2
    assert after.verify().ok
    expected = {"append": [1, 2, 3, 4], "overwrite": [9], "delete": [1, 3]}[operation]
    assert sorted(after.scan().to_arrow()["id"].to_pylist()) == expected
    after.append(pa.table({"id": [5], "writer": [2]}))  # the table takes the next commit
    assert len(reload().snapshots()) == 3


def test_an_interrupt_before_the_version_landed_leaves_nothing(tmp_path, monkeypatch):
    """The same interrupt before the version file is written: nothing of the append is left."""
    from icecrypt.table.commit import store

    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=MemoryKms.with_iceberg_test_keys(),
                                  table_key_id="keyA")  # fmt: skip
    table.append(pa.table({"id": [1, 2, 3], "writer": [0, 0, 0]}))
    before = _files(tmp_path / "t")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(store, "_create_exclusive", interrupted)
    with pytest.raises(KeyboardInterrupt):
        table.append(pa.table({"id": [4], "writer": [1]}))
    monkeypatch.undo()
    assert _files(tmp_path / "t") == before
    assert len(EncryptedTable.load(str(tmp_path / "t"), kms=MemoryKms.with_iceberg_test_keys()).snapshots()) == 1
