"""icecrypt.parquet round trips: types, writer options, keys, and the on-disk layout
Iceberg Java writes (PARE, AES_GCM_V1, AAD prefix supplied but not stored, no footer
key metadata)."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from parquet_rows import canonical_rows, file_crypto_metadata, sample_table

import icecrypt
from icecrypt import parquet as ip
from icecrypt.keys import EncryptionManager, StandardKeyMetadata
from icecrypt.kms import create_kms_client

TABLE = sample_table(300)


def test_write_returns_key_metadata_with_file_length(tmp_path):
    path = tmp_path / "t.parquet"
    km = ip.write_table(TABLE, path)
    assert isinstance(km, StandardKeyMetadata)
    assert km.key_length == 16 and len(km.aad_prefix) == 16
    assert km.file_length == path.stat().st_size
    back = ip.read_table(path, km)
    assert back.equals(TABLE)
    assert back.schema == TABLE.schema
    assert canonical_rows(back) == canonical_rows(TABLE)


def test_layout_is_icebergs(tmp_path):
    """PARE at both ends, AES_GCM_V1, prefix supplied and not stored, 8-byte file-unique
    AAD, no footer key metadata; neither key nor prefix appears in the file."""
    path = tmp_path / "t.parquet"
    km = ip.write_table(TABLE, path)
    data = path.read_bytes()
    assert data[:4] == b"PARE" and data[-4:] == b"PARE"
    meta = file_crypto_metadata(data)
    assert meta["algorithm"] == "AES_GCM_V1"
    assert meta["aad_prefix"] is None
    assert meta["supply_aad_prefix"] is True
    assert len(meta["aad_file_unique"]) == 8
    assert meta["key_metadata"] is None
    assert km.aad_prefix not in data and km.encryption_key not in data
    assert b"alpha" not in data and b"big_dec" not in data  # neither values nor schema in clear


def test_plain_pyarrow_cannot_read_it(tmp_path):
    path = tmp_path / "t.parquet"
    ip.write_table(TABLE, path)
    with pytest.raises(OSError, match="no decryption found"):
        pq.read_table(path)


def test_each_file_gets_fresh_keys(tmp_path):
    kms = [ip.write_table(TABLE, tmp_path / f"{i}.parquet") for i in range(3)]
    assert len({k.encryption_key for k in kms}) == 3
    assert len({k.aad_prefix for k in kms}) == 3
    # and the same key metadata written twice still gives different files (aad_file_unique, nonces)
    a = ip.write_table(TABLE, tmp_path / "a.parquet", key_metadata=kms[0])
    b = ip.write_table(TABLE, tmp_path / "b.parquet", key_metadata=kms[0])
    assert a.encryption_key == b.encryption_key
    assert (tmp_path / "a.parquet").read_bytes() != (tmp_path / "b.parquet").read_bytes()


@pytest.mark.parametrize("key_length", [16, 24, 32])
def test_key_lengths(tmp_path, key_length):
    path = tmp_path / "t.parquet"
    km = ip.write_table(TABLE, path, key_length=key_length)
    assert km.key_length == key_length
    assert ip.read_table(path, km).equals(TABLE)


def test_manager_sized_keys(tmp_path):
    kms = create_kms_client({"encryption.kms-type": "memory"})
    manager = EncryptionManager(kms, "keyA", data_key_length=32)
    path = tmp_path / "t.parquet"
    km = ip.write_table(TABLE, path, manager=manager)
    assert km.key_length == 32 and len(km.aad_prefix) == 16
    assert ip.read_table(path, km).equals(TABLE)


def test_given_key_metadata_as_object_or_bytes(tmp_path):
    given = StandardKeyMetadata(os.urandom(16), os.urandom(16), file_length=999)
    km = ip.write_table(TABLE, tmp_path / "a.parquet", key_metadata=given.encode())
    assert (km.encryption_key, km.aad_prefix) == (given.encryption_key, given.aad_prefix)
    assert km.file_length == (tmp_path / "a.parquet").stat().st_size  # the stale 999 is replaced
    assert ip.read_table(tmp_path / "a.parquet", km.encode()).equals(TABLE)
    assert ip.read_table(str(tmp_path / "a.parquet"), km).equals(TABLE)


def test_key_metadata_without_file_length_reads(tmp_path):
    path = tmp_path / "t.parquet"
    km = ip.write_table(TABLE, path)
    assert ip.read_table(path, km.with_file_length(None)).equals(TABLE)


def test_no_aad_prefix(tmp_path):
    """Iceberg always uses a prefix, but key metadata without one is valid: the file is
    then encrypted with the file-unique AAD only, and a prefix at read time is refused."""
    path = tmp_path / "t.parquet"
    km = ip.write_table(TABLE, path, key_metadata=StandardKeyMetadata(os.urandom(16)))
    assert km.aad_prefix is None
    assert ip.read_table(path, km).equals(TABLE)
    assert file_crypto_metadata(path.read_bytes())["supply_aad_prefix"] is False
    with pytest.raises(icecrypt.AuthenticationError, match="encrypted without one"):
        ip.read_table(path, StandardKeyMetadata(km.encryption_key, os.urandom(16)))


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"compression": "snappy"},
        {"compression": "gzip", "compression_level": 9},
        {"compression": "lz4"},
        {"compression": "none"},
        {"compression": "zstd", "compression_level": 9, "use_dictionary": False},
        {"row_group_size": 64, "data_page_size": 512},
        {"data_page_version": "1.0", "write_page_index": True, "write_statistics": False},
        {"version": "1.0", "use_byte_stream_split": ["f32", "f64"], "use_dictionary": ["name"]},
        {"write_page_checksum": True, "store_schema": False, "max_rows_per_page": 50},
    ],
    ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "defaults",
)
def test_writer_options(tmp_path, options):
    path = tmp_path / "t.parquet"
    km = ip.write_table(TABLE, path, **options)
    back = ip.read_table(path, km)
    assert canonical_rows(back) == canonical_rows(TABLE)
    with ip.open_file(path, km) as f:
        meta = f.metadata
        codec = {"none": "UNCOMPRESSED"}.get(options.get("compression"), options.get("compression", "zstd").upper())
        assert meta.row_group(0).column(0).compression == codec
        if "row_group_size" in options:
            assert meta.num_row_groups == -(-TABLE.num_rows // options["row_group_size"])


def test_default_compression_is_zstd(tmp_path):
    path = tmp_path / "t.parquet"
    km = ip.write_table(TABLE, path)
    with ip.open_file(path, km) as f:
        codecs = {f.metadata.row_group(0).column(i).compression for i in range(TABLE.num_columns)}
    assert codecs == {"ZSTD"}


def test_nested_and_dictionary_types(tmp_path):
    table = pa.table(
        {
            "tags": pa.array([["a", "b"], None, [], ["c"]], pa.list_(pa.string())),
            "point": pa.array([{"x": 1, "y": 2.5}, None, {"x": None, "y": 0.0}, {"x": 3, "y": -1.0}],
                              pa.struct([("x", pa.int32()), ("y", pa.float64())])),
            "attrs": pa.array([[("k", 1)], [], None, [("a", 2), ("b", 3)]], pa.map_(pa.string(), pa.int64())),
            "cat": pa.array(["u", "v", "u", None]).dictionary_encode(),
            "big": pa.array([1, None, -1, 2**40], pa.decimal256(60, 3)),
            "t": pa.array([0, 1, None, 86_399_999_999], pa.time64("us")),
        }
    )
    path = tmp_path / "t.parquet"
    km = ip.write_table(table, path)
    assert ip.read_table(path, km).equals(table)


def test_field_ids_are_written(tmp_path):
    """Iceberg reads columns by field id: PARQUET:field_id metadata reaches the file."""
    schema = pa.schema([pa.field("id", pa.int64(), False, metadata={b"PARQUET:field_id": b"1"}),
                        pa.field("name", pa.string(), metadata={b"PARQUET:field_id": b"7"})])
    table = pa.table({"id": [1, 2], "name": ["a", None]}, schema=schema)
    path = tmp_path / "t.parquet"
    km = ip.write_table(table, path)
    with ip.open_file(path, km) as f:
        arrow = f.schema_arrow
    assert arrow.field("id").metadata[b"PARQUET:field_id"] == b"1"
    assert arrow.field("name").metadata[b"PARQUET:field_id"] == b"7"


def test_empty_table(tmp_path):
    path = tmp_path / "t.parquet"
    km = ip.write_table(TABLE.slice(0, 0), path)
    back = ip.read_table(path, km)
    assert back.num_rows == 0 and back.schema == TABLE.schema


def test_record_batch_input(tmp_path):
    batch = TABLE.to_batches()[0]
    path = tmp_path / "t.parquet"
    km = ip.write_table(batch, path)
    assert ip.read_table(path, km).equals(pa.Table.from_batches([batch]))
    with pytest.raises(TypeError, match="Table or RecordBatch"):
        ip.write_table({"a": [1]}, tmp_path / "x.parquet")


def test_columns_and_filters(tmp_path):
    path = tmp_path / "t.parquet"
    km = ip.write_table(TABLE, path, row_group_size=50)
    assert ip.read_table(path, km, columns=["name", "id"]).column_names == ["name", "id"]
    dnf = ip.read_table(path, km, filters=[("id", ">=", 120), ("id", "<", 130)])
    assert dnf.column("id").to_pylist() == list(range(120, 130))
    expr = ip.read_table(path, km, columns=["id"], filters=pc.field("flag") == True)
    assert expr.column("id").to_pylist() == TABLE.filter(pc.field("flag") == True).column("id").to_pylist()


def test_open_file_row_groups_and_batches(tmp_path):
    path = tmp_path / "t.parquet"
    km = ip.write_table(TABLE, path, row_group_size=100)
    with ip.open_file(path, km) as f:
        assert isinstance(f, pq.ParquetFile)
        assert f.num_row_groups == 3
        assert f.metadata.num_rows == 300
        assert f.schema_arrow == TABLE.schema
        assert f.read_row_group(1).equals(TABLE.slice(100, 100))
        assert f.read_row_groups([0, 2], columns=["id"]).column("id").to_pylist() == (
            list(range(100)) + list(range(200, 300))
        )
        batches = list(f.iter_batches(batch_size=64, row_groups=[2], columns=["id", "name"]))
        assert pa.Table.from_batches(batches).equals(TABLE.select(["id", "name"]).slice(200, 100))
        assert f.read().equals(TABLE)
        assert f.scan_contents() == 300
    assert f.closed


def test_open_writer_streams_batches(tmp_path):
    path = tmp_path / "t.parquet"
    with ip.open_writer(path, TABLE.schema) as w:
        assert w.key_metadata.file_length is None
        for batch in TABLE.to_batches(max_chunksize=70):
            w.write_batch(batch)
        w.write(TABLE.slice(0, 10))
        assert not path.exists()  # only published on close
    km = w.key_metadata
    assert km.file_length == path.stat().st_size
    assert w.close() is km  # closing again returns the same key metadata
    with ip.open_file(path, km) as f:
        assert f.num_row_groups == 6
    assert canonical_rows(ip.read_table(path, km)) == canonical_rows(pa.concat_tables([TABLE, TABLE.slice(0, 10)]))
    with pytest.raises(ValueError, match="closed"):
        w.write_table(TABLE)


def test_writer_refuses_encryption_properties_option(tmp_path):
    with pytest.raises(TypeError, match="encryption_properties"):
        ip.write_table(TABLE, tmp_path / "t.parquet", encryption_properties=None)
    with pytest.raises(ValueError, match="at most one"):
        ip.write_table(TABLE, tmp_path / "t.parquet", key_length=32, key_metadata=StandardKeyMetadata(os.urandom(16)))
    with pytest.raises(ValueError, match="key_length"):
        ip.write_table(TABLE, tmp_path / "t.parquet", key_length=20)
    with pytest.raises(ValueError, match="cannot read pyarrow's encrypted version 2.0 data pages"):
        ip.write_table(TABLE, tmp_path / "t.parquet", data_page_version="2.0")
    with pytest.raises(ValueError, match="version 2.0"):
        ip.open_writer(tmp_path / "t.parquet", TABLE.schema, data_page_version="2.0")
    assert os.listdir(tmp_path) == []


def test_properties_helpers_roundtrip_with_plain_pyarrow(tmp_path):
    """encryption_properties / decryption_properties are ordinary pyarrow objects."""
    km = StandardKeyMetadata(os.urandom(32), os.urandom(16))
    path = tmp_path / "t.parquet"
    pq.write_table(TABLE, path, encryption_properties=ip.encryption_properties(km))
    assert pq.read_table(path, decryption_properties=ip.decryption_properties(km.encode())).equals(TABLE)
    assert ip.read_table(path, km).equals(TABLE)
