"""Reads never follow a symbolic link out of the table (issue 16, item 16 through a link).

Path confinement is lexical: ``data/x.parquet`` lies inside the table whatever the file
is.  An attacker who can write a plaintext table's storage replaces a data file (or the
whole ``data`` directory) with a link to a file elsewhere -- another table's payroll it
cannot read itself -- and waits for the victim's ``scan()`` to read it, or for
``rewrite_data_files`` to copy its rows into a new file inside the table.  On the local
filesystem every read now resolves the path and refuses one whose real path leaves the
table's roots (PathOutsideTableError naming the file); a link that stays inside reads."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pyarrow as pa
import pytest

from icecrypt import PathOutsideTableError
from icecrypt.table import EncryptedTable

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string())])


def _rows(start: int, n: int) -> pa.Table:
    return pa.table({"id": list(range(start, start + n)), "name": [f"r{i}" for i in range(start, start + n)]})


def _plain_table(tmp_path: Path) -> EncryptedTable:
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=None, table_key_id=None)
    table.append(_rows(0, 5))
    return table


def _data_file(table: EncryptedTable) -> Path:
    return Path(next(iter(table.scan().plan_files())).file.fs_path)


def _tree(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def _outside(tmp_path: Path) -> Path:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    return elsewhere


def test_a_symlinked_data_file_pointing_outside_is_refused(tmp_path):
    table = _plain_table(tmp_path)
    data = _data_file(table)
    payroll = _outside(tmp_path) / "payroll.parquet"
    shutil.move(data, payroll)  # the rows now live outside; the table names a link to them
    os.symlink(payroll, data)
    before_outside, before_table = _tree(payroll.parent), _tree(tmp_path / "t" / "metadata")
    victim = EncryptedTable.load(str(tmp_path / "t"))
    with pytest.raises(PathOutsideTableError, match=data.name) as caught:
        victim.scan().to_arrow()
    assert str(payroll) in str(caught.value) and caught.value.location.endswith(data.name)
    with pytest.raises(PathOutsideTableError, match=data.name):
        victim.rewrite_data_files(options={"rewrite-all": "true"})
    assert _tree(payroll.parent) == before_outside
    assert _tree(tmp_path / "t" / "metadata") == before_table  # nothing committed
    assert [p for p in (tmp_path / "t" / "data").rglob("*") if p.is_file() and not p.is_symlink()] == []


def test_a_symlinked_data_directory_pointing_outside_is_refused(tmp_path):
    table = _plain_table(tmp_path)
    data = _data_file(table)
    elsewhere = _outside(tmp_path) / "data"
    shutil.move(tmp_path / "t" / "data", elsewhere)
    os.symlink(elsewhere, tmp_path / "t" / "data")
    before = _tree(elsewhere)
    victim = EncryptedTable.load(str(tmp_path / "t"))
    with pytest.raises(PathOutsideTableError, match=data.name):
        victim.scan().to_arrow()
    with pytest.raises(PathOutsideTableError, match=data.name):
        victim.rewrite_data_files(options={"rewrite-all": "true"})
    with pytest.raises(PathOutsideTableError):  # nor are new files written through the link
        victim.append(_rows(10, 2))
    assert _tree(elsewhere) == before


def test_a_symlink_that_stays_inside_the_table_still_reads(tmp_path):
    table = _plain_table(tmp_path)
    data = _data_file(table)
    moved = tmp_path / "t" / "data" / "moved" / "real.parquet"
    moved.parent.mkdir()
    shutil.move(data, moved)
    os.symlink(moved, data)
    loaded = EncryptedTable.load(str(tmp_path / "t"))
    assert sorted(loaded.scan().to_arrow()["id"].to_pylist()) == list(range(5))
    # a table reached through a link to its own directory reads too (the roots are resolved)
    os.symlink(tmp_path / "t", tmp_path / "alias")
    aliased = EncryptedTable.load(str(tmp_path / "alias"))
    assert sorted(aliased.scan().to_arrow()["id"].to_pylist()) == list(range(5))


def test_allowed_locations_let_a_link_lead_there(tmp_path):
    table = _plain_table(tmp_path)
    data = _data_file(table)
    shared = _outside(tmp_path) / "shared"
    shared.mkdir()
    shutil.move(data, shared / "lookup.parquet")
    os.symlink(shared / "lookup.parquet", data)
    with pytest.raises(PathOutsideTableError):
        EncryptedTable.load(str(tmp_path / "t")).scan().to_arrow()
    allowed = EncryptedTable.load(str(tmp_path / "t"), allowed_locations=[str(shared)])
    assert sorted(allowed.scan().to_arrow()["id"].to_pylist()) == list(range(5))


def test_a_symlinked_manifest_list_and_manifest_pointing_outside_are_refused(tmp_path):
    """The same for the Avro files a scan reads first: a manifest list or manifest that is
    a link out of the table is never opened (a crafted one could name anything)."""
    table = _plain_table(tmp_path)
    elsewhere = _outside(tmp_path)
    manifest_list = Path(table.fs_path(table.current_snapshot().manifest_list))
    shutil.move(manifest_list, elsewhere / manifest_list.name)
    os.symlink(elsewhere / manifest_list.name, manifest_list)
    with pytest.raises(PathOutsideTableError, match=manifest_list.name):
        EncryptedTable.load(str(tmp_path / "t")).scan().to_arrow()
    os.unlink(manifest_list)
    shutil.move(elsewhere / manifest_list.name, manifest_list)
    manifests = [p for p in (tmp_path / "t" / "metadata").glob("*.avro") if p.name != manifest_list.name]
    for manifest in manifests:
        shutil.move(manifest, elsewhere / manifest.name)
        os.symlink(elsewhere / manifest.name, manifest)
    with pytest.raises(PathOutsideTableError, match=manifests[0].name):
        EncryptedTable.load(str(tmp_path / "t")).scan().to_arrow()


def test_a_linked_file_beside_checked_ones_is_refused_and_a_new_scan_looks_again(tmp_path):
    """Planning looks at each directory once per scan (the files of a table share a few),
    but at every file: a link among plain files of a checked directory is refused, and a
    directory swapped for a link after one scan is refused by the next."""
    table = _plain_table(tmp_path)
    table.append(_rows(5, 5))
    files = sorted(Path(t.file.fs_path) for t in table.scan().plan_files())
    assert len(files) == 2 and files[0].parent == files[1].parent
    payroll = _outside(tmp_path) / "payroll.parquet"
    shutil.move(files[1], payroll)
    os.symlink(payroll, files[1])
    with pytest.raises(PathOutsideTableError, match=files[1].name):
        EncryptedTable.load(str(tmp_path / "t")).scan().plan_files()
    os.unlink(files[1])
    shutil.move(payroll, files[1])
    victim = EncryptedTable.load(str(tmp_path / "t"))
    assert len(victim.scan().plan_files()) == 2  # the directory is checked, and kept for this scan
    elsewhere = tmp_path / "elsewhere" / "data"
    shutil.move(tmp_path / "t" / "data", elsewhere)
    os.symlink(elsewhere, tmp_path / "t" / "data")
    with pytest.raises(PathOutsideTableError):
        victim.scan().plan_files()  # the same table object, a new scan: looked at again
