"""Damage drills on private copies of the Java tables: every damage is a specific
icecrypt error naming the file (or key) at fault, never a silent or partial read."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import fastavro
import pytest
from tablelib import (
    current_manifests,
    edit_metadata,
    expected,
    flip_byte,
    location_map,
    metadata_path,
    reload,
    rewrite_chain,
    rewrite_manifest_list,
    table_digest,
)

from icecrypt import avro
from icecrypt.errors import (
    AuthenticationError,
    EncryptionKeyNotFoundError,
    FormatError,
    KmsError,
)
from icecrypt.kms.memory import MemoryKms
from icecrypt.table import EncryptedTable, PlaintextFileError

# --- the chain above the data -------------------------------------------------------------------------


def test_rewrite_tool_keeps_the_table_valid(golden_copy):
    """Control for the drills below: an unchanged rewrite through the chain reads back."""
    table, _ = golden_copy("enc_parquet_dek16")
    rewrite_chain(table, 0, lambda entries: entries)
    assert table_digest(reload(table).scan().to_arrow()) == expected("enc_parquet_dek16")["expected"]["digest_sha256"]


def test_flipped_byte_in_a_manifest(golden_copy):
    table, _ = golden_copy("enc_parquet_dek16")
    manifest = current_manifests(table)[0]
    flip_byte(Path(table.fs_path(manifest.path)), 200)
    with pytest.raises(AuthenticationError) as info:
        table.scan().to_arrow()
    assert Path(manifest.path).name in str(info.value)


def test_truncated_manifest(golden_copy):
    table, _ = golden_copy("enc_parquet_dek16")
    manifest = current_manifests(table)[1]
    path = Path(table.fs_path(manifest.path))
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(FormatError, match=Path(manifest.path).name):
        table.scan().to_arrow()


def test_flipped_byte_in_the_manifest_list_spares_older_snapshots(golden_copy):
    table, _ = golden_copy("enc_parquet_dek16")
    first, current = table.snapshots()
    flip_byte(Path(table.fs_path(current.manifest_list)), 50)
    with pytest.raises(AuthenticationError, match=Path(current.manifest_list).name):
        table.scan().to_arrow()
    assert table.scan(snapshot_id=first.snapshot_id).to_arrow().num_rows == 8000


def test_manifest_list_replaced_by_a_plaintext_one(golden_copy):
    table, _ = golden_copy("enc_parquet_dek16")
    snapshot = table.current_snapshot()
    path = Path(table.fs_path(snapshot.manifest_list))
    with avro.read_records(path, table.manifest_list_key_metadata(snapshot)) as r:
        schema, records = r.schema, list(r)
    out = io.BytesIO()
    fastavro.writer(out, fastavro.parse_schema(schema), records)
    path.write_bytes(out.getvalue())
    with pytest.raises(PlaintextFileError, match=f"{path.name}.*plaintext Avro"):
        table.scan().to_arrow()


def test_manifest_without_key_metadata(golden_copy):
    table, _ = golden_copy("enc_parquet_dek16")
    victim = {}

    def strip_key(records):
        victim["path"] = records[0]["manifest_path"]
        records[0]["key_metadata"] = None
        return records

    rewrite_manifest_list(table, strip_key)
    with pytest.raises(PlaintextFileError, match=f"{Path(victim['path']).name}.*no key metadata"):
        reload(table).scan().to_arrow()


# --- keys -----------------------------------------------------------------------------------------------


def test_removed_manifest_list_key(golden_copy):
    table, _ = golden_copy("enc_deletes_dek16")
    snapshot = table.current_snapshot()
    edit_metadata(
        Path(table.metadata_location),
        lambda m: m.update({"encryption-keys": [k for k in m["encryption-keys"] if k["key-id"] != snapshot.key_id]}),
    )
    table = reload(table)
    with pytest.raises(EncryptionKeyNotFoundError) as info:
        table.scan().to_arrow()
    assert snapshot.key_id in str(info.value) and Path(snapshot.manifest_list).name in str(info.value)
    older = table.snapshots()[-2]
    assert table.scan(snapshot_id=older.snapshot_id).to_arrow().num_rows == 7279


def test_removed_kek(golden_copy):
    table, _ = golden_copy("enc_deletes_dek16")
    kek_id = table.encryption_manager.get_key(table.current_snapshot().key_id).encrypted_by_id
    edit_metadata(
        Path(table.metadata_location),
        lambda m: m.update({"encryption-keys": [k for k in m["encryption-keys"] if k["key-id"] != kek_id]}),
    )
    with pytest.raises(EncryptionKeyNotFoundError, match=f"key encryption key '{kek_id}'"):
        reload(table).scan().to_arrow()


def test_tampered_wrapped_manifest_list_key(golden_copy):
    table, _ = golden_copy("enc_parquet_dek16")
    key_id = table.current_snapshot().key_id

    def tamper(metadata: dict) -> None:
        for key in metadata["encryption-keys"]:
            if key["key-id"] == key_id:
                raw = bytearray(base64.b64decode(key["encrypted-key-metadata"]))
                raw[20] ^= 1
                key["encrypted-key-metadata"] = base64.b64encode(bytes(raw)).decode()

    edit_metadata(Path(table.metadata_location), tamper)
    with pytest.raises(AuthenticationError, match="manifest list"):
        reload(table).scan().to_arrow()


def test_wrong_master_key(golden):
    name = "enc_parquet_dek16"
    wrong = MemoryKms({"keyA": b"0123456789abcdef"})
    table = EncryptedTable.load(metadata_path(name), kms=wrong, location_map=location_map(name))
    with pytest.raises(KmsError, match="keyA") as info:
        table.scan().to_arrow()
    assert "manifest list" in str(info.value)


def test_unknown_master_key(golden):
    name = "enc_parquet_dek16"
    table = EncryptedTable.load(metadata_path(name), kms=MemoryKms({"keyB": b"1123456789012345"}), location_map=location_map(name))
    with pytest.raises(KmsError, match="keyA"):
        table.scan().to_arrow()


def test_snapshot_without_key_id(golden_copy):
    table, _ = golden_copy("enc_parquet_dek16")
    current = table.current_snapshot_id

    def drop_key_id(metadata: dict) -> None:
        for snapshot in metadata["snapshots"]:
            if snapshot["snapshot-id"] == current:
                del snapshot["key-id"]

    edit_metadata(Path(table.metadata_location), drop_key_id)
    with pytest.raises(PlaintextFileError, match=f"snapshot {current}.*no key-id"):
        reload(table).scan().to_arrow()


# --- data and delete files ------------------------------------------------------------------------------


def test_missing_data_file(golden_copy):
    table, _ = golden_copy("enc_parquet_dek16")
    task = table.scan().plan_files()[0]
    Path(task.file.fs_path).unlink()
    with pytest.raises(FileNotFoundError, match=Path(task.file.path).name):
        table.scan().to_arrow()


def test_missing_deletion_vector_file(golden_copy):
    table, _ = golden_copy("enc_deletes_dek16")
    dv = next(d for t in table.scan().plan_files() for d in t.deletes if d.file_format == "PUFFIN")
    Path(dv.fs_path).unlink()
    with pytest.raises(FileNotFoundError, match=Path(dv.path).name):
        table.scan().to_arrow()


@pytest.mark.parametrize("offset", [10, 5000, -20])
def test_flipped_byte_in_a_parquet_data_file(golden_copy, offset):
    table, _ = golden_copy("enc_parquet_dek16")
    task = table.scan().plan_files()[0]
    path = Path(task.file.fs_path)
    flip_byte(path, offset % path.stat().st_size)
    with pytest.raises((AuthenticationError, FormatError), match=path.name):
        table.scan().to_arrow()


def test_flipped_byte_in_an_avro_data_file(golden_copy):
    table, _ = golden_copy("enc_avro_dek16")
    task = table.scan().plan_files()[0]
    flip_byte(Path(task.file.fs_path), 70_000)
    with pytest.raises(AuthenticationError, match=Path(task.file.path).name):
        table.scan().to_arrow()


def test_flipped_byte_in_the_deletion_vector(golden_copy):
    table, _ = golden_copy("enc_deletes_dek16")
    dv = next(d for t in table.scan().plan_files() for d in t.deletes if d.file_format == "PUFFIN")
    flip_byte(Path(dv.fs_path), 8 + 12 + dv.content_offset + 10)  # inside the blob's ciphertext
    with pytest.raises(AuthenticationError, match=Path(dv.path).name):
        table.scan().to_arrow()


def test_flipped_byte_in_the_equality_delete_file(golden_copy):
    table, _ = golden_copy("enc_deletes_dek16")
    eq = next(d for t in table.scan().plan_files() for d in t.deletes if d.equality_ids)
    flip_byte(Path(eq.fs_path), 100)
    with pytest.raises((AuthenticationError, FormatError), match=Path(eq.path).name):
        table.scan().to_arrow()


def test_data_file_without_key_metadata(golden_copy):
    table, _ = golden_copy("enc_parquet_dek16")
    victim = {}

    def strip_key(entries):
        victim["path"] = entries[0]["data_file"]["file_path"]
        entries[0]["data_file"]["key_metadata"] = None
        return entries

    rewrite_chain(table, 0, strip_key)
    with pytest.raises(PlaintextFileError, match=f"{Path(victim['path']).name}.*no key metadata"):
        reload(table).scan().to_arrow()


def test_plaintext_data_file_in_an_encrypted_table(golden_copy):
    import pyarrow.parquet as pq

    table, _ = golden_copy("enc_parquet_dek16")
    task = table.scan().plan_files()[0]
    rows = table.scan(row_filter=f"category = '{task.partition[0]}'").to_arrow()
    pq.write_table(rows, task.file.fs_path)  # a plaintext PAR1 file under the encrypted one's name
    with pytest.raises(PlaintextFileError, match=f"{Path(task.file.path).name}.*plaintext Parquet"):
        table.scan().to_arrow()


def test_row_count_mismatch(golden_copy):
    table, _ = golden_copy("enc_parquet_dek16")

    def lie(entries):
        entries[0]["data_file"]["record_count"] += 1
        return entries

    rewrite_chain(table, 0, lie)
    with pytest.raises(FormatError, match="rows"):
        reload(table).scan().to_arrow()
