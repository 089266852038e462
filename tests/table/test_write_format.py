"""The bytes and structures the write path produces, compared with what Iceberg Java
wrote in ../shared/tables: manifest and manifest-list Avro schemas (names, field ids,
types, docs, record names), their header metadata, the Puffin deletion-vector layout,
and the exclusive-create commit protocol."""

from __future__ import annotations

import io
import json
import posixpath
import struct
import zlib

import fastavro
import numpy as np
import pyarrow.fs as pafs
import pytest
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from vectorlib import TABLES_DIR

from icecrypt import FormatError, ags1
from icecrypt.keys import StandardKeyMetadata
from icecrypt.table.commit import store as _commit
from icecrypt.table.files.manifest_write import manifest_entry_struct, manifest_list_struct
from icecrypt.table.files.write_dv import DeletionVector, decode_dv, encode_dv, puffin_file
from icecrypt.table.model.schema import (
    partition_struct,
    schema_to_json,
    spec_fields_to_json,
    struct_to_avro,
    struct_to_json,
)

JAVA_TABLES = ("enc_parquet_dek16", "enc_avro_dek16", "enc_deletes_dek16")


def _keys(table: str) -> dict:
    return json.loads((TABLES_DIR / table / "keys.json").read_text(encoding="utf-8"))


def _decrypt(table: str, uri: str, key_metadata_hex: str) -> bytes:
    prefix = f"s3://icecrypt-golden/{table}/"
    assert uri.startswith(prefix)
    km = StandardKeyMetadata.decode(bytes.fromhex(key_metadata_hex))
    data = (TABLES_DIR / table / uri[len(prefix) :]).read_bytes()
    return ags1.decrypt(data, km.encryption_key, km.aad_prefix, length=km.file_length)


def _java_metadata(table: str) -> dict:
    expected = json.loads((TABLES_DIR / table / "expected.json").read_text(encoding="utf-8"))
    return json.loads((TABLES_DIR / table / expected["metadata_location"]).read_text(encoding="utf-8"))


@pytest.mark.parametrize("table", JAVA_TABLES)
def test_manifest_list_schema_is_javas(table):
    ours_avro = struct_to_avro(manifest_list_struct(), "manifest_file")
    ours_iceberg = struct_to_json(manifest_list_struct(), schema_id=0)
    for snapshot in _keys(table)["snapshots"]:
        data = _decrypt(table, snapshot["manifest_list"], snapshot["manifest_list_key_metadata"]["key_metadata_hex"])
        reader = fastavro.reader(io.BytesIO(data))
        assert json.loads(reader.metadata["avro.schema"]) == ours_avro
        assert json.loads(reader.metadata["iceberg.schema"]) == ours_iceberg
        assert {"snapshot-id", "parent-snapshot-id", "sequence-number", "first-row-id", "format-version"} <= set(
            reader.metadata
        )


@pytest.mark.parametrize("table", JAVA_TABLES)
def test_manifest_schema_and_header_are_javas(table):
    metadata = _java_metadata(table)
    schema = Schema.model_validate(metadata["schemas"][0])
    spec = PartitionSpec.model_validate(metadata["partition-specs"][0])
    entry = manifest_entry_struct(partition_struct(spec, schema))
    seen = 0
    for snapshot in _keys(table)["snapshots"]:
        for manifest in snapshot["manifests"]:
            data = _decrypt(table, manifest["path"], manifest["key_metadata"]["key_metadata_hex"])
            header = fastavro.reader(io.BytesIO(data)).metadata
            assert json.loads(header["avro.schema"]) == struct_to_avro(entry, "manifest_entry")
            assert json.loads(header["iceberg.schema"]) == struct_to_json(entry, schema_id=0)
            assert json.loads(header["schema"]) == schema_to_json(schema)
            assert json.loads(header["partition-spec"]) == spec_fields_to_json(spec)
            assert header["partition-spec-id"] == str(spec.spec_id)
            assert header["format-version"] == "3"
            assert header["content"] in ("data", "deletes")
            seen += 1
    assert seen


# --- deletion vectors -----------------------------------------------------------------------

DELETES = "enc_deletes_dek16"


def _java_puffin() -> bytes:
    """The decrypted Puffin file (one DV) of the Java table."""
    for snapshot in _keys(DELETES)["snapshots"]:
        for manifest in snapshot["manifests"]:
            for entry in manifest["entries"]:
                if entry["format"] == "PUFFIN":
                    return _decrypt(DELETES, entry["path"], entry["key_metadata"]["key_metadata_hex"])
    raise AssertionError("no DV in the Java table")


def test_puffin_dv_layout_is_javas():
    java = _java_puffin()
    footer_start = java.rindex(b"PFA1", 0, len(java) - 4)
    footer = json.loads(java[footer_start + 4 : -12])
    blob_meta = footer["blobs"][0]
    referenced = blob_meta["properties"]["referenced-data-file"]
    java_positions = decode_dv(java[blob_meta["offset"] : blob_meta["offset"] + blob_meta["length"]])
    # the golden table's DV deletes positions p % 10 == 3 of a 4000-row file
    assert np.array_equal(java_positions, np.arange(3, 4000, 10))

    ours, placements = puffin_file([DeletionVector(referenced, java_positions)])
    assert placements[0].offset == blob_meta["offset"] and placements[0].length == blob_meta["length"]
    # blob bytes identical; footer identical except the writer's name
    assert ours[: footer_start + 4] == java[: footer_start + 4]
    ours_footer = json.loads(ours[footer_start + 4 : -12])
    assert ours_footer["blobs"] == footer["blobs"]
    assert list(ours_footer) == list(footer) and list(ours_footer["properties"]) == ["created-by"]
    assert ours[-12:-8] == struct.pack("<I", len(ours) - 12 - footer_start - 4)
    assert ours[-8:] == java[-8:] == b"\0\0\0\0PFA1"


def test_dv_agrees_with_the_read_path():
    from icecrypt.table.files.deletes import decode_deletion_vector

    rng = np.random.default_rng(7)
    positions = np.unique(np.concatenate([
        rng.integers(0, 1 << 20, 5000), np.arange(70000, 140000), [(1 << 32) + 5, (5 << 32) + 9],
    ]))  # fmt: skip
    blob = encode_dv(positions)
    assert np.array_equal(decode_dv(blob), positions)
    assert np.array_equal(np.asarray(decode_deletion_vector(blob, "x"), dtype=np.int64), positions)


def test_dv_damage_is_detected():
    blob = bytearray(encode_dv(np.arange(0, 100, 3)))
    blob[12] ^= 1
    with pytest.raises(FormatError, match="CRC"):
        decode_dv(bytes(blob), name="dv")
    body = bytes(encode_dv([1, 2]))
    assert zlib.crc32(body[4:-4]) == struct.unpack(">I", body[-4:])[0]
    with pytest.raises(FormatError):
        decode_dv(body[:-1])


# --- commit protocol ----------------------------------------------------------------------------


def _meta(n: int) -> dict:
    return {"format-version": 3, "n": n}


def test_commit_is_exclusive(tmp_path):
    fs = pafs.LocalFileSystem()
    metadata_dir = str(tmp_path / "metadata")
    first = _commit.create_table_metadata(fs, metadata_dir, _meta(1))
    with pytest.raises(FileExistsError):
        _commit.create_table_metadata(fs, metadata_dir, _meta(1))
    second = _commit.commit_metadata(fs, first, _meta(2))
    assert posixpath.basename(second) == "v2.metadata.json"
    # another writer working from v1 must not replace v2
    with pytest.raises(_commit.VersionExistsError):
        _commit.commit_metadata(fs, first, _meta(99))
    assert _commit.read_metadata(fs, second) == _meta(2)
    assert (tmp_path / "metadata" / "version-hint.text").read_text() == "2"
    assert sorted(p.name for p in (tmp_path / "metadata").iterdir()) == [
        "v1.metadata.json", "v2.metadata.json", "version-hint.text",
    ]  # fmt: skip


def test_latest_version_probes_past_a_stale_hint(tmp_path):
    fs = pafs.LocalFileSystem()
    first = _commit.create_table_metadata(fs, str(tmp_path / "metadata"), _meta(1))
    second = _commit.commit_metadata(fs, first, _meta(2))
    third = _commit.commit_metadata(fs, second, _meta(3))
    (tmp_path / "metadata" / "version-hint.text").write_text("1")  # a writer died before its hint
    assert _commit.latest_metadata_location(fs, first) == third
    (tmp_path / "metadata" / "version-hint.text").unlink()
    assert _commit.latest_metadata_location(fs, first) == third
    assert _commit.latest_metadata_location(fs, third) == third


def test_java_named_metadata_continues_with_hadoop_versions(tmp_path):
    fs = pafs.LocalFileSystem()
    (tmp_path / "metadata").mkdir()
    java = tmp_path / "metadata" / "00004-4b30dcda-58ab-4b6b-bb98-dc3ce8524e36.metadata.json"
    java.write_text(json.dumps(_meta(4)))
    assert _commit.version_of(str(java)) == 4
    # (a commit logs its base, as every write path does: that is what makes v5 follow it)
    committed = _commit.commit_metadata(fs, str(java), {**_meta(5), "metadata-log": [{"metadata-file": str(java)}]})
    assert posixpath.basename(committed) == "v5.metadata.json"
    assert _commit.latest_metadata_location(fs, str(java)) == committed
    with pytest.raises(ValueError):
        _commit.version_of("/x/metadata.json")


def test_metadata_json_is_compact_and_ordered():
    payload = _commit.serialize_metadata({"b": 1, "a": [1, 2], "é": "ü"})
    assert payload == '{"b":1,"a":[1,2],"é":"ü"}'.encode()


# --- partition transforms ---------------------------------------------------------------------


def _internal(values: list, source_type) -> list:
    from icecrypt.table.files.manifest_write import to_internal

    return [to_internal(v, source_type) for v in values]


def test_vectorized_transforms_match_pyiceberg():
    """Arrow-vectorized transforms agree with PyIceberg's scalar ones (which follow the
    spec), including negative timestamps and dates, where floor division matters."""
    import decimal

    import pyarrow as pa
    from pyiceberg.transforms import (
        BucketTransform,
        DayTransform,
        HourTransform,
        IdentityTransform,
        MonthTransform,
        TruncateTransform,
        VoidTransform,
        YearTransform,
    )
    from pyiceberg.types import (
        BinaryType,
        DateType,
        DecimalType,
        IntegerType,
        LongType,
        StringType,
        TimestampNanoType,
        TimestampType,
        TimestamptzType,
    )

    from icecrypt.table.files.write_data import _transform_array

    micros = [-86_400_000_001, -3_600_000_000, -1, 0, 1, 3_599_999_999, 1_700_000_000_123_456, None]
    columns = {
        TimestampType(): pa.array(micros, pa.timestamp("us")),
        TimestamptzType(): pa.array(micros, pa.timestamp("us", tz="UTC")),
        TimestampNanoType(): pa.array([None if m is None else m * 1000 + 7 for m in micros], pa.timestamp("ns")),
        DateType(): pa.array([-400, -1, 0, 1, 19_000, None], pa.date32()),
        IntegerType(): pa.array([-11, -10, -1, 0, 9, 10, None], pa.int32()),
        LongType(): pa.array([-(2**40) - 3, -7, 0, 7, 2**40 + 3, None], pa.int64()),
        StringType(): pa.array(["", "a", "héllo", "日本語テキスト", None]),
        BinaryType(): pa.array([b"", b"\x00\x01\x02\x03", None]),
        DecimalType(9, 2): pa.array([decimal.Decimal("-1.05"), decimal.Decimal("123.45"), None], pa.decimal128(9, 2)),
    }  # fmt: skip
    transforms = [IdentityTransform(), VoidTransform(), BucketTransform(7), TruncateTransform(3), YearTransform(),
                  MonthTransform(), DayTransform(), HourTransform()]  # fmt: skip
    checked = 0
    for source_type, values in columns.items():
        for transform in transforms:
            if not transform.can_transform(source_type):
                continue
            expected = [None if v is None else transform.transform(source_type)(v) for v in _internal(values.to_pylist(), source_type)]
            result_type = transform.result_type(source_type)
            got = _internal(_transform_array(transform, source_type, values).to_pylist(), result_type)
            assert got == expected, (transform, source_type)
            checked += 1
    assert checked >= 30
