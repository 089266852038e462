"""Where writers put new files: ``write.data.path``, ``write.metadata.path``,
``write.object-storage.enabled`` and ``write.object-storage.partitioned-paths``, as Iceberg
Java's ``LocationProviders`` and ``BaseMetastoreTableOperations`` place them, for every
writer (append, overwrite, delete, row-level update, rewrite, cherry-pick, rewrite of
manifests, rekey, encrypt in place), and maintenance that covers those roots and only
those.

Known answers are what Iceberg Java (apache/iceberg @7f879b1) returned for the same
table locations, properties and file names; the per-file check recomputes Java's
definition independently (Murmur3-32 of the file name, 20 low bits as 4/4/4/8 binary
directories)."""

from __future__ import annotations

import os
import posixpath
from pathlib import Path

import mmh3
import pyarrow as pa
import pytest
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType

from icecrypt.table import EncryptedTable
from icecrypt.table.files.layout import WriteLayout

SCHEMA = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "category", StringType(), required=False))
BY_CATEGORY = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "category"))
OBJECT_STORAGE = {"write.object-storage.enabled": "true"}


@pytest.mark.parametrize(
    ("location", "properties", "name", "partition", "java"),
    [
        ("s3://b/db/t", OBJECT_STORAGE, "f.parquet", "", "s3://b/db/t/data/0111/1111/1110/11001100/f.parquet"),
        ("s3://b/db/t", OBJECT_STORAGE, "00000-1-abc-00001.parquet", "category=N%2FA",
         "s3://b/db/t/data/0000/1010/1110/01101010/category=N%2FA/00000-1-abc-00001.parquet"),
        ("s3://b/db/t", {**OBJECT_STORAGE, "write.object-storage.partitioned-paths": "false"},
         "00000-1-abc-00001.parquet", "category=N%2FA", "s3://b/db/t/data/1010/1010/1100/01111010-00000-1-abc-00001.parquet"),
        ("s3://b/db/t", {**OBJECT_STORAGE, "write.data.path": "s3://other/prefix"}, "00000-1-abc-00001.parquet",
         "category=a", "s3://other/prefix/0011/0101/1010/11100000/db/t/category=a/00000-1-abc-00001.parquet"),
        ("s3://b/db/t", {"write.data.path": "s3://other/prefix"}, "00000-1-abc-00001.parquet", "category=a",
         "s3://other/prefix/category=a/00000-1-abc-00001.parquet"),
        ("s3://b/t", {**OBJECT_STORAGE, "write.data.path": "s3://other/prefix"}, "x.parquet", "",
         "s3://other/prefix/1110/1000/1010/11100100//t/x.parquet"),
        ("/tmp/wh/db/t", {"write.object-storage.enabled": "TRUE"}, "\u00e9\u00e9.parquet", "",
         "/tmp/wh/db/t/data/0000/0010/1101/11100110/\u00e9\u00e9.parquet"),
        ("/tmp/wh/db/t", {**OBJECT_STORAGE, "write.data.path": "/tmp/wh/db/tother"}, "y.parquet", "category=a",
         "/tmp/wh/db/tother/1100/0011/0001/01100111/category=a/y.parquet"),
        ("s3://b/t", {}, "f", "", "s3://b/t/data/f"),
    ],
)
def test_data_locations_are_javas(location, properties, name, partition, java):
    data_path = properties.get("write.data.path")
    assert WriteLayout.of(location, properties, data_path=data_path).data_file(name, partition) == java


@pytest.mark.parametrize(
    ("properties", "message"),
    [({"write.folder-storage.path": "s3://x"}, "deprecated"),
     ({**OBJECT_STORAGE, "write.object-storage.path": "s3://x"}, "deprecated"),
     ({"write.location-provider.impl": "com.example.Provider"}, "Java class")],
)
def test_layouts_java_refuses_are_refused_before_anything_is_written(tmp_path, kms, properties, message):
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA", partition_spec=BY_CATEGORY,
                                  properties=properties)  # fmt: skip
    before = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    with pytest.raises(ValueError, match=message):
        table.append(_rows())
    assert sorted(p for p in tmp_path.rglob("*") if p.is_file()) == before
    # Java reads write.object-storage.path only with the object-storage layout, and neither
    # legacy property once write.data.path is set
    WriteLayout.of("s3://b/t", {"write.object-storage.path": "s3://x"})
    WriteLayout.of("s3://b/t", {"write.folder-storage.path": "s3://x"}, data_path="s3://b/d")


def test_a_path_table_cannot_relocate_its_metadata(tmp_path, kms):
    """As Java's HadoopTableOperations: neither created nor committed with it."""
    with pytest.raises(ValueError, match="cannot relocate its metadata"):
        EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA",
                              properties={"write.metadata.path": str(tmp_path / "t" / "meta")})  # fmt: skip
    assert not (tmp_path / "t").exists()


# --- every writer, on a table with the object-storage layout and write.data.path ------------------------


def _rows(start: int = 0, n: int = 6) -> pa.Table:
    ids = list(range(start, start + n))
    return pa.table({"id": pa.array(ids, pa.int64()), "category": [["a", "N/A", None][i % 3] for i in ids]})


def java_data_location(root: str, location: str, relative: str, *, partitioned_paths: bool = True) -> str:
    """Java's object-storage location of a file (``relative``: partition directories and
    name), from its definition: Murmur3-32 of ``relative``, its low 20 bits."""
    bits = format(mmh3.hash(relative.encode(), 0, signed=False) & 0xFFFFF, "020b")
    hashed = f"{bits[:4]}/{bits[4:8]}/{bits[8:12]}/{bits[12:]}"
    if not root.startswith(location):
        parts = location.rstrip("/").split("/")
        return f"{root}/{hashed}/{parts[-2]}/{parts[-1]}/{relative}"
    return f"{root}/{hashed}/{relative}" if partitioned_paths else f"{root}/{hashed}-{relative}"


def _check_layout(table: EncryptedTable, root: str) -> None:
    """Every file the table references lies where Java would have put it."""
    files = table.inspect.all_files().to_pylist() if hasattr(table.inspect, "all_files") else table.inspect.files().to_pylist()
    assert files
    for entry in files:
        path = entry["file_path"]
        assert path.startswith(root + "/"), path
        name = posixpath.basename(path)
        directories = [p for p in path[len(root) + 1 :].split("/")[:-1] if "=" in p]
        relative = "/".join([*directories, name]) if name.endswith(".parquet") else name
        assert path == java_data_location(root, table.location, relative), path


@pytest.fixture
def object_store_table(tmp_path, kms):
    data_root = str(tmp_path / "bucket2" / "prefix")
    table = EncryptedTable.create(str(tmp_path / "wh" / "db" / "t"), SCHEMA, kms=kms, table_key_id="keyA",
                                  partition_spec=BY_CATEGORY,
                                  properties={**OBJECT_STORAGE, "write.data.path": data_root})  # fmt: skip
    return table, data_root


def test_every_writer_honours_the_layout(object_store_table, tmp_path):
    table, root = object_store_table
    table.append(_rows(0))
    table.overwrite(_rows(0, 9))
    table.delete("id = 4")  # a deletion vector: a Puffin file, unpartitioned as Java writes them
    table.update({"category": "'b/c'"}, "id = 5")
    table.rewrite_data_files(options={"rewrite-all": "true"})
    table.rewrite_manifests()
    table.rekey()
    table = table.refresh()
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == [0, 1, 2, 3, 5, 6, 7, 8]
    assert table.verify().ok
    _check_layout(table, root)
    assert not (tmp_path / "wh" / "db" / "t" / "data").exists()  # nothing under <location>/data
    for manifest in table.manifests(table.current_snapshot()):
        assert manifest.path.startswith(f"{table.location}/metadata/")
    # orphan removal walks the data root too (and only the roots)
    stray, outside = Path(root) / "0000" / "stray.parquet", tmp_path / "bucket2" / "stray.parquet"
    for path in (stray, outside):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
        os.utime(path, (1, 1))
    assert table.remove_orphan_files(dry_run=True).orphan_files == [str(stray)]
    # expiry deletes what the old snapshots wrote under the data root
    before = {str(p) for p in Path(root).rglob("*.parquet")}
    table.expire_snapshots(2**62)
    after = {str(p) for p in Path(root).rglob("*.parquet")}
    assert after < before and all(p.startswith(root) for p in after)


def test_flat_object_storage_and_a_data_path_inside_the_table(tmp_path, kms):
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA", partition_spec=BY_CATEGORY,
                                  properties={**OBJECT_STORAGE, "write.object-storage.partitioned-paths": "false"})
    table.append(_rows())
    root = f"{table.location}/data"
    for entry in table.inspect.files().to_pylist():
        name = posixpath.basename(entry["file_path"])[len("01100111-"):]
        assert entry["file_path"] == java_data_location(root, table.location, name, partitioned_paths=False)
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == list(range(6))


def test_encrypt_in_place_honours_the_data_path(tmp_path, kms):
    from icecrypt.table import encrypt_table

    data_root = str(tmp_path / "elsewhere")
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id=None, partition_spec=BY_CATEGORY,
                                  properties={"write.data.path": data_root})  # fmt: skip
    table.append(_rows())
    assert not (tmp_path / "t" / "data").exists()
    result = encrypt_table(table, kms=kms, table_key_id="keyA")
    converted = result.table.refresh()
    assert converted.encrypted and sorted(converted.scan().to_arrow().column("id").to_pylist()) == list(range(6))
    for entry in converted.inspect.files().to_pylist():
        assert entry["file_path"].startswith(data_root + "/category="), entry["file_path"]
    assert not (tmp_path / "t" / "data").exists()


def test_a_catalog_table_writes_manifests_under_write_metadata_path(tmp_path, kms):
    from icecrypt.catalog import load_catalog

    catalog = load_catalog("test", warehouse=str(tmp_path / "wh"), kms=kms)
    catalog.create_namespace("db")
    meta, data = tmp_path / "wh" / "db" / "t" / "metaroot", tmp_path / "wh" / "db" / "t" / "dataroot"
    table = catalog.create_table("db.t", SCHEMA, table_key_id="keyA",
                                 properties={"write.metadata.path": str(meta), "write.data.path": str(data)})
    table.append(_rows())
    table.delete("id = 1")
    table = table.refresh()
    snapshot = table.current_snapshot()
    assert snapshot.manifest_list.startswith(f"{meta}/snap-")
    assert all(m.path.startswith(f"{meta}/") for m in table.manifests(snapshot))
    assert all(e["file_path"].startswith(f"{data}/") for e in table.inspect.files().to_pylist())
    assert not (tmp_path / "wh" / "db" / "t" / "data").exists()
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == [0, 2, 3, 4, 5] and table.verify().ok
