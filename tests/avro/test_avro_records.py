"""read_records / write_records: the manifests and manifest lists Iceberg Java wrote,
and round trips of records through encrypted Avro files."""

from __future__ import annotations

import io
import json
import os

import fastavro
import pytest
from avrohelpers import TABLES, avro_files, expected_json, local_path
from vectorlib import TABLES_DIR

import icecrypt
from icecrypt import ags1, avro
from icecrypt.avro._container import Plaintext, iter_blocks, read_header
from icecrypt.keys import EncryptionManager, StandardKeyMetadata
from icecrypt.kms.memory import MemoryKms

MANIFEST_HEADER_KEYS = {"schema", "partition-spec", "partition-spec-id", "format-version", "content"}
MANIFEST_LIST_HEADER_KEYS = {"snapshot-id", "sequence-number", "format-version", "parent-snapshot-id"}


def _golden(kind: str):
    return [
        pytest.param(table, uri, id=f"{table}-{uri.rsplit('/', 1)[1][:24]}")
        for table in TABLES
        for uri, f in avro_files(table).items()
        if f["kind"] == kind
    ]


@pytest.mark.parametrize(("table", "uri"), _golden("manifest_list"))
def test_java_manifest_lists(table, uri):
    f = avro_files(table)[uri]
    snap = f["info"]
    with avro.read_records(local_path(table, uri), f["key_metadata"]) as records:
        rows = list(records)
        assert records.codec == "deflate"  # what Java writes for manifest lists
        assert MANIFEST_LIST_HEADER_KEYS <= records.metadata.keys()
        assert records.metadata["snapshot-id"] == str(snap["snapshot_id"]).encode()
        assert records.metadata["format-version"] == b"3"
        fields = {field["name"]: field for field in records.schema["fields"]}
        assert fields["key_metadata"]["field-id"] == 519
    assert [r["manifest_path"] for r in rows] == [m["path"] for m in snap["manifests"]]
    for row, manifest in zip(rows, snap["manifests"]):
        assert row["manifest_length"] == manifest["manifest_length"]
        assert row["key_metadata"] == bytes.fromhex(manifest["key_metadata"]["key_metadata_hex"])
        assert row["added_snapshot_id"] == manifest["added_snapshot_id"]


@pytest.mark.parametrize(("table", "uri"), _golden("manifest"))
def test_java_manifests(table, uri):
    f = avro_files(table)[uri]
    manifest = f["info"]
    assert os.path.getsize(local_path(table, uri)) == manifest["manifest_length"]
    with avro.read_records(local_path(table, uri), StandardKeyMetadata.decode(f["key_metadata"])) as records:
        rows = list(records)
        assert records.codec == "deflate"
        assert MANIFEST_HEADER_KEYS <= records.metadata.keys()
        assert json.loads(records.metadata["schema"])["type"] == "struct"
        assert records.metadata["content"] in (b"data", b"deletes")
        partition = records.schema["fields"][4]["type"]["fields"][3]
        assert partition["field-id"] == 102
    assert [r["data_file"]["file_path"] for r in rows] == [e["path"] for e in manifest["entries"]]
    for row, entry in zip(rows, manifest["entries"]):
        data_file = row["data_file"]
        assert data_file["record_count"] == entry["record_count"]
        assert data_file["file_size_in_bytes"] == entry["file_size_in_bytes"]
        assert data_file["file_format"] == entry["format"]
        assert data_file["key_metadata"] == bytes.fromhex(entry["key_metadata"]["key_metadata_hex"])


def test_key_chain_from_table_metadata():
    """Table metadata -> KMS (keyA) -> KEK -> manifest list -> manifests -> Avro data
    files: every snapshot's row count as Java recorded it."""
    table = "enc_avro_dek16"
    expected = expected_json(table)
    metadata = json.loads((TABLES_DIR / table / expected["metadata_location"]).read_text())
    manager = EncryptionManager.from_table_metadata(MemoryKms.with_iceberg_test_keys(), metadata)
    counts = {}
    for snap in metadata["snapshots"]:
        km = manager.unwrap_manifest_list_key_metadata(snap["key-id"])
        rows = 0
        with avro.read_records(local_path(table, snap["manifest-list"]), km) as manifest_list:
            manifests = [(m["manifest_path"], m["key_metadata"]) for m in manifest_list]
        for path, manifest_km in manifests:
            with avro.read_records(local_path(table, path), manifest_km) as entries:
                for entry in entries:
                    if entry["status"] == 2:
                        continue
                    data_file = entry["data_file"]
                    with avro.read_records(local_path(table, data_file["file_path"]), data_file["key_metadata"]) as data:
                        n = sum(1 for _ in data)
                    assert n == data_file["record_count"]
                    rows += n
        counts[snap["snapshot-id"]] = rows
    assert counts == {s["snapshot_id"]: s["expected_row_count"] for s in expected["snapshots"]}


def _java_manifest():
    table = "enc_avro_dek16"
    uri, f = next((u, f) for u, f in avro_files(table).items() if f["kind"] == "manifest")
    with avro.read_records(local_path(table, uri), f["key_metadata"]) as records:
        return records.schema, records.metadata, list(records)


def test_write_records_round_trip(tmp_path):
    schema, metadata, rows = _java_manifest()
    extra = {k: v for k, v in metadata.items() if not k.startswith("avro.")}
    path = tmp_path / "m0.avro"
    km = avro.write_records(path, schema, rows, metadata=extra)
    assert km.key_length == 16 and len(km.aad_prefix) == 16
    assert km.file_length == path.stat().st_size
    with avro.read_records(path, km.encode()) as back:
        assert list(back) == rows
        assert back.schema == schema  # field-id and every attribute kept
        assert back.codec == "deflate"  # Iceberg Java's manifest codec is the default
        for key, value in extra.items():
            assert back.metadata[key] == value
    # independently of icecrypt.avro: an AGS1 stream holding an ordinary Avro container
    plain = ags1.decrypt(path.read_bytes(), km.encryption_key, km.aad_prefix, km.file_length)
    assert plain[:4] == b"Obj\x01"
    assert list(fastavro.reader(io.BytesIO(plain))) == rows


def test_write_records_keys(tmp_path):
    schema = {"type": "record", "name": "r", "fields": [{"name": "x", "type": "long", "field-id": 1}]}
    rows = [{"x": i} for i in range(10)]
    km32 = avro.write_records(tmp_path / "a.avro", schema, rows, key_length=32, codec="null")
    assert km32.key_length == 32
    given = StandardKeyMetadata(bytes(range(24)), b"p" * 16, file_length=1)
    km = avro.write_records(tmp_path / "b.avro", schema, rows, key_metadata=given.encode())
    assert km.encryption_key == given.encryption_key and km.aad_prefix == given.aad_prefix
    assert km.file_length == (tmp_path / "b.avro").stat().st_size
    assert [r["x"] for r in avro.read_records(tmp_path / "b.avro", km)] == list(range(10))
    km2 = avro.write_records(tmp_path / "c.avro", schema, rows)
    assert km2.encryption_key != km.encryption_key and km2.aad_prefix != km32.aad_prefix
    with pytest.raises(ValueError, match="key length"):
        avro.write_records(tmp_path / "d.avro", schema, rows, key_length=20)
    assert not (tmp_path / "d.avro").exists()


def test_write_records_is_atomic(tmp_path):
    schema = {"type": "record", "name": "r", "fields": [{"name": "x", "type": "long"}]}

    def rows():
        for i in range(200_000):  # several AGS1 blocks are written before the failure
            yield {"x": i * 1_000_003}
        raise RuntimeError("producer failed")

    path = tmp_path / "m.avro"
    with pytest.raises(RuntimeError, match="producer failed"):
        avro.write_records(path, schema, rows(), codec="null")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="m.avro"):
        avro.write_records(path, schema, [{"x": "not a long"}])
    assert list(tmp_path.iterdir()) == []


def test_write_records_metadata_checks(tmp_path):
    schema = {"type": "record", "name": "r", "fields": [{"name": "x", "type": "long"}]}
    km = avro.write_records(tmp_path / "m.avro", schema, [], metadata={"content": b"data", "x": "y"})
    with avro.read_records(tmp_path / "m.avro", km) as records:
        assert list(records) == []
        assert records.metadata["content"] == b"data" and records.metadata["x"] == b"y"
    with pytest.raises(ValueError, match="reserved"):
        avro.write_records(tmp_path / "n.avro", schema, [], metadata={"avro.codec": "null"})
    with pytest.raises(ValueError, match="invalid Avro schema"):
        avro.write_records(tmp_path / "n.avro", {"type": "record"}, [])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.avro"]


def test_read_records_raw_values(tmp_path):
    schema = {"type": "record", "name": "p", "fields": [
        {"name": "d", "type": {"type": "int", "logicalType": "date"}, "field-id": 1000},
        {"name": "t", "type": {"type": "long", "logicalType": "timestamp-micros", "adjust-to-utc": False}},
    ]}
    km = avro.write_records(tmp_path / "p.avro", schema, [{"d": 19000, "t": 1_700_000_000_000_001}])
    (converted,) = avro.read_records(tmp_path / "p.avro", km)
    assert str(converted["d"]) == "2022-01-08"
    (raw,) = avro.read_records(tmp_path / "p.avro", km, raw=True)
    assert raw == {"d": 19000, "t": 1_700_000_000_000_001}


def test_read_records_is_reiterable_and_lazy(tmp_path):
    schema = {"type": "record", "name": "r", "fields": [{"name": "x", "type": "long"}]}
    km = avro.write_records(tmp_path / "m.avro", schema, ({"x": i} for i in range(300_000)), codec="null")
    stats = avro.ReadStats()
    records = avro.read_records(tmp_path / "m.avro", km, stats=stats)
    assert stats.blocks == [0]  # the header only
    it = iter(records)
    assert next(it) == {"x": 0}
    assert stats.blocks == [0]
    assert sum(1 for _ in it) == 299_999
    assert sorted(set(stats.blocks)) == list(range(ags1.plaintext_length(km.file_length) // ags1.PLAIN_BLOCK_SIZE + 1))
    assert [r["x"] for r in records][:3] == [0, 1, 2]
    records.close()


def test_read_records_errors(tmp_path):
    table = "enc_avro_dek16"
    uri, f = next((u, f) for u, f in avro_files(table).items() if f["kind"] == "manifest")
    path = local_path(table, uri)
    km = StandardKeyMetadata.decode(f["key_metadata"])
    wrong_key = StandardKeyMetadata(bytes(16), km.aad_prefix, km.file_length)
    with pytest.raises(icecrypt.AuthenticationError, match=path.name):
        avro.read_records(path, wrong_key)
    with pytest.raises(icecrypt.AuthenticationError, match=path.name):
        avro.read_records(path, StandardKeyMetadata(km.encryption_key, b"x" * 16, km.file_length))
    with pytest.raises(icecrypt.FormatError, match=path.name):  # trusted length disagrees
        avro.read_records(path, km.with_file_length(km.file_length - 1))
    truncated = tmp_path / "truncated.avro"
    truncated.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(icecrypt.FormatError, match="truncated.avro"):
        avro.read_records(truncated, km)
    with pytest.raises(ValueError, match="no key metadata"):
        avro.read_records(path, None)
    with pytest.raises(icecrypt.FormatError, match=path.name):
        avro.read_records(path, b"\x05garbage")
    # a plaintext Avro file where an encrypted one is expected
    plain = tmp_path / "plain.avro"
    plain.write_bytes(ags1.decrypt(path.read_bytes(), km.encryption_key, km.aad_prefix, km.file_length))
    with pytest.raises(icecrypt.FormatError, match="plain.avro"):
        avro.read_records(plain, km.with_file_length(None))


def _blocks_without_sync(path, km):
    with Plaintext(path, km) as plain:
        header = read_header(plain)
        return header, [raw[:-16] for raw in iter_blocks(plain, header, header.end)]


@pytest.mark.parametrize("kind", ["manifest", "manifest_list"])
def test_rewritten_java_manifests_have_java_blocks(tmp_path, kind):
    """Java's records written again with Java's schema: every Avro block (records encoded,
    deflated at Java's level) is byte-identical to the block Java wrote."""
    for table in TABLES:
        for uri, f in avro_files(table).items():
            if f["kind"] != kind:
                continue
            java_km = StandardKeyMetadata.decode(f["key_metadata"])
            with avro.read_records(local_path(table, uri), java_km, raw=True) as records:
                schema, metadata, rows = records.schema, records.metadata, list(records)
            extra = {k: v for k, v in metadata.items() if not k.startswith("avro.")}
            km = avro.write_records(tmp_path / "again.avro", schema, rows, metadata=extra)
            java_header, java_blocks = _blocks_without_sync(local_path(table, uri), java_km)
            header, blocks = _blocks_without_sync(tmp_path / "again.avro", km)
            assert blocks == java_blocks
            assert header.codec == java_header.codec == "deflate"
            assert {k: v for k, v in header.metadata.items() if k != "avro.schema"} == \
                {k: v for k, v in java_header.metadata.items() if k != "avro.schema"}
