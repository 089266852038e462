"""Key metadata without ``file_length`` is refused by the write and maintenance paths as
reads refuse it (issue 16, item 11; SPEC.md 1.4: without the trusted length an AGS1
stream cut at a block boundary authenticates).  Each case: the operation raises a
FormatError naming the file, and nothing is written."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType
from tablelib import edit_metadata, reload, rewrite_chain, rewrite_manifest_list

from icecrypt.errors import FormatError
from icecrypt.keys import KEY_TIMESTAMP, StandardKeyMetadata, wrap_key_metadata
from icecrypt.table import EncryptedTable

SCHEMA = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "s", StringType()))


def rows(first: int, n: int = 10) -> pa.Table:
    return pa.table({"id": pa.array(range(first, first + n), pa.int64()), "s": [f"v{i}" for i in range(n)]})


@pytest.fixture
def table(tmp_path, kms) -> EncryptedTable:
    t = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA",
                              properties={"write.format.default": "avro"})  # fmt: skip
    for i in range(3):
        t.append(rows(10 * i))
    return t


def without_length(raw: bytes) -> bytes:
    """The same key and AAD prefix in Iceberg 1.10's layout (no ``file_length``)."""
    km = StandardKeyMetadata.decode(raw)
    return StandardKeyMetadata(km.encryption_key, km.aad_prefix, None).encode()


def files(table: EncryptedTable) -> dict[str, bytes]:
    root = Path(table.location)
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


OPERATIONS = {
    "append": lambda t: t.append(rows(100)),
    "overwrite": lambda t: t.overwrite(rows(100)),
    "delete": lambda t: t.delete("id < 3"),
    "rewrite_manifests": lambda t: t.rewrite_manifests(force=True),
    "rewrite_data_files": lambda t: t.rewrite_data_files(options={"rewrite-all": "true"}),
    "expire_snapshots": lambda t: t.expire_snapshots(int(time.time() * 1000) + 60_000),
    "rekey": lambda t: t.rekey(everything=True),
}


def assert_refused(table: EncryptedTable, operation: str, names: str) -> None:
    before = files(table)
    with pytest.raises(FormatError, match="no file_length") as caught:
        OPERATIONS[operation](table)
    assert names in str(caught.value)
    assert files(table) == before  # nothing written, nothing deleted


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_manifest_without_file_length(table, operation):
    """A manifest-list entry whose manifest key metadata lacks file_length."""
    manifest = {}

    def strip(records: list[dict]) -> list[dict]:
        manifest["path"] = records[0]["manifest_path"]
        records[0]["key_metadata"] = without_length(records[0]["key_metadata"])
        return records

    rewrite_manifest_list(table, strip)
    table = reload(table)
    with pytest.raises(FormatError, match="no file_length"):  # as reads refuse it
        table.scan().to_arrow()
    assert_refused(table, operation, manifest["path"])


@pytest.mark.parametrize("operation", ["append", "delete", "rewrite_data_files"])
def test_manifest_list_without_file_length(table, operation):
    """The current snapshot's manifest-list key metadata, re-wrapped without file_length."""
    snapshot = table.current_snapshot()
    manager = table.encryption_manager
    list_km = table.manifest_list_key_metadata(snapshot)
    kek_entry = manager.get_key(manager.get_key(snapshot.key_id).encrypted_by_id)
    kek = table.kms.unwrap_key(kek_entry.encrypted_key_metadata, manager.table_key_id)
    short = StandardKeyMetadata(list_km.encryption_key, list_km.aad_prefix, None)
    wrapped = wrap_key_metadata(kek, kek_entry.properties[KEY_TIMESTAMP], short)

    def rewrap(metadata: dict) -> None:
        for key in metadata["encryption-keys"]:
            if key["key-id"] == snapshot.key_id:
                key["encrypted-key-metadata"] = base64.b64encode(wrapped).decode("ascii")

    edit_metadata(Path(table.metadata_location), rewrap)  # as a Java 1.10 writer leaves it: no authenticator
    table = reload(table)
    assert_refused(table, operation, snapshot.manifest_list)


@pytest.mark.parametrize("operation", ["delete", "rewrite_data_files", "rewrite_manifests"])
def test_avro_data_file_without_file_length(table, operation):
    """A data file entry (an AGS1 Avro data file) whose key metadata lacks file_length."""
    data_file = {}

    def strip(entries: list[dict]) -> list[dict]:
        entry = entries[0]["data_file"]
        data_file["path"] = entry["file_path"]
        entry["key_metadata"] = without_length(entry["key_metadata"])
        return entries

    rewrite_chain(table, 0, strip)
    table = reload(table)
    with pytest.raises(FormatError, match="no file_length"):
        table.scan().to_arrow()
    assert_refused(table, operation, data_file["path"])


def test_parquet_data_files_need_no_file_length(tmp_path, kms):
    """Parquet carries its own lengths (modular encryption): a Parquet data file's key
    metadata without file_length is read and rewritten as before."""
    t = EncryptedTable.create(str(tmp_path / "p"), SCHEMA, kms=kms, table_key_id="keyA")
    t.append(rows(0))
    t.append(rows(10))

    def strip(entries: list[dict]) -> list[dict]:
        for entry in entries:
            entry["data_file"]["key_metadata"] = without_length(entry["data_file"]["key_metadata"])
        return entries

    rewrite_chain(t, 0, strip)
    t = reload(t)
    t.delete("id = 1")
    t.rewrite_data_files(options={"rewrite-all": "true"})
    assert sorted(t.scan().to_arrow().column("id").to_pylist()) == [i for i in range(20) if i != 1]
