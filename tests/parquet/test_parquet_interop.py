"""Interop with parquet-mr (parquet-java 1.17, the library Iceberg Java uses) in both
directions, through the shared Spark driver JVM, with the encryption properties Iceberg
builds (SPEC.md section 5)."""

from __future__ import annotations

import datetime
import decimal
import os
import random
import struct

import pyarrow as pa
import pytest
from parquet_mr import encryption_type, read_rows, write_rows
from parquet_rows import EXACT, canonical_rows, file_crypto_metadata, sample_table

import icecrypt
from icecrypt import parquet as ip
from icecrypt._parquet_modules import authenticate_modules
from icecrypt.keys import StandardKeyMetadata

pytestmark = pytest.mark.spark

TABLE = sample_table(120, seed=3)


def java_error_text(exc: BaseException) -> str:
    """py4j's error with the Java exception (and its causes) as text."""
    java = getattr(exc, "java_exception", None)
    return f"{exc} {java.toString() if java is not None else ''}"


# --- written here, read by parquet-mr ------------------------------------------------------


@pytest.mark.parametrize(
    ("key_length", "options"),
    [
        (16, {}),
        (24, {"compression": "snappy", "row_group_size": 50}),
        (32, {"compression": "gzip", "use_dictionary": False, "store_decimal_as_integer": True, "data_page_size": 256}),
        (16, {"compression": "none", "write_page_index": True, "row_group_size": 7}),
    ],
    ids=["aes128-defaults", "aes192-snappy", "aes256-gzip-intdecimals", "aes128-plain-pageindex"],
)
def test_parquet_mr_reads_our_files(jvm, tmp_path, key_length, options):
    path = tmp_path / "ours.parquet"
    km = ip.write_table(TABLE, path, key_length=key_length, **options)
    names, rows = read_rows(jvm, path, km.encryption_key, km.aad_prefix)
    assert names == TABLE.column_names
    assert len(rows) == TABLE.num_rows
    assert rows == canonical_rows(TABLE)
    assert encryption_type(jvm, path, km.encryption_key, km.aad_prefix) == "ENCRYPTED_FOOTER"


def test_parquet_mr_refuses_wrong_or_missing_aad_prefix(jvm, tmp_path):
    path = tmp_path / "ours.parquet"
    km = ip.write_table(TABLE, path)
    with pytest.raises(Exception) as info:
        read_rows(jvm, path, km.encryption_key, os.urandom(16))
    assert "TagVerificationException" in java_error_text(info.value)
    with pytest.raises(Exception) as info:
        read_rows(jvm, path, os.urandom(16), km.aad_prefix)
    assert "TagVerificationException" in java_error_text(info.value)
    with pytest.raises(Exception) as info:
        read_rows(jvm, path, km.encryption_key, None)
    assert "AAD prefix" in java_error_text(info.value) and "not stored in file" in java_error_text(info.value)


# --- written by parquet-mr the way Iceberg does, read here -----------------------------------

ICEBERG_LIKE_SCHEMA = """
message table {
  required int64 id = 1;
  required binary category (STRING) = 2;
  required int32 qty = 3;
  required double amount = 4;
  required int64 ts (TIMESTAMP(MICROS,false)) = 5;
  required int32 event_date (DATE) = 6;
  optional binary note (STRING) = 7;
  optional int64 price (DECIMAL(10,2)) = 8;
  optional boolean flag = 9;
  optional fixed_len_byte_array(16) big (DECIMAL(38,6)) = 10;
  optional int64 ts_utc (TIMESTAMP(MICROS,true)) = 11;
  optional binary payload = 12;
}
"""


def java_rows(n: int, seed: int = 5) -> list[dict]:
    rng = random.Random(seed)

    def maybe(v):
        return None if rng.random() < 0.2 else v

    return [
        {
            "id": i * 7919 - 5_000_000_000,
            "category": rng.choice(["alpha", "beta", "gamma", "ünïcode"]),
            "qty": rng.randrange(-(2**31), 2**31),
            "amount": rng.uniform(-1e9, 1e9),
            "ts": 1_700_000_000_000_000 + rng.randrange(-(10**14), 10**14),
            "event_date": rng.randrange(-20000, 30000),
            "note": maybe("note-" + "x" * rng.randrange(0, 50)),
            "price": maybe(decimal.Decimal(rng.randrange(-(10**10) + 1, 10**10)).scaleb(-2, EXACT)),
            "flag": maybe(rng.random() < 0.5),
            "big": maybe(decimal.Decimal(rng.randrange(-(10**38) + 1, 10**38)).scaleb(-6, EXACT)),
            "ts_utc": maybe(rng.randrange(-(10**15), 10**16)),
            "payload": maybe(rng.randbytes(rng.randrange(0, 30))),
        }
        for i in range(n)
    ]


def expected_canonical(rows: list[dict]) -> list[list]:
    """The canonical rows (see parquet_rows) of ``java_rows``, computed independently."""
    out = []
    for r in rows:
        out.append(
            [
                r["id"], r["category"], r["qty"], struct.pack(">d", r["amount"]).hex(), r["ts"], r["event_date"],
                r["note"],
                None if r["price"] is None else format(r["price"], "f"),
                r["flag"],
                None if r["big"] is None else format(r["big"], "f"),
                r["ts_utc"],
                None if r["payload"] is None else r["payload"].hex(),
            ]
        )
    return out


@pytest.fixture(scope="module", params=[16, 32], ids=["aes128", "aes256"])
def java_file(request, jvm, tmp_path_factory):
    """A file parquet-mr wrote with Iceberg's encryption properties: its path, key
    metadata (with file_length, as Iceberg records it) and rows."""
    dek, aad = os.urandom(request.param), os.urandom(16)
    rows = java_rows(150)
    path = tmp_path_factory.mktemp("java") / "java.parquet"
    write_rows(jvm, path, ICEBERG_LIKE_SCHEMA, rows, dek, aad, row_group_size=4096, page_size=1024)
    return path, StandardKeyMetadata(dek, aad, path.stat().st_size), rows


def test_we_read_parquet_mr_files(jvm, java_file):
    path, km, rows = java_file
    data = path.read_bytes()
    assert data[:4] == data[-4:] == b"PARE"
    meta = file_crypto_metadata(data)
    assert meta["algorithm"] == "AES_GCM_V1" and meta["aad_prefix"] is None and meta["supply_aad_prefix"] is True
    assert meta["key_metadata"] is None and km.aad_prefix not in data

    table = ip.read_table(path, km)
    assert canonical_rows(table) == expected_canonical(rows)
    # parquet-mr agrees with itself on what it wrote
    assert read_rows(jvm, path, km.encryption_key, km.aad_prefix)[1] == expected_canonical(rows)

    schema = table.schema
    assert schema.field("ts").type == pa.timestamp("us")
    assert schema.field("ts_utc").type == pa.timestamp("us", tz="UTC")
    assert schema.field("event_date").type == pa.date32()
    assert schema.field("price").type == pa.decimal128(10, 2)
    assert schema.field("big").type == pa.decimal128(38, 6)
    assert not schema.field("id").nullable and schema.field("note").nullable
    assert [schema.field(i).metadata[b"PARQUET:field_id"] for i in range(len(schema))] == [
        str(i).encode() for i in range(1, 13)
    ]
    assert table.column("event_date")[0].as_py() == datetime.date(1970, 1, 1) + datetime.timedelta(days=rows[0]["event_date"])


def test_we_read_parquet_mr_row_groups(java_file):
    path, km, rows = java_file
    with ip.open_file(path, km) as f:
        assert f.num_row_groups > 1
        parts = [f.read_row_group(i) for i in range(f.num_row_groups)]
        batches = list(f.iter_batches(batch_size=17, columns=["id"]))
    assert canonical_rows(pa.concat_tables(parts)) == expected_canonical(rows)
    assert pa.Table.from_batches(batches).column("id").to_pylist() == [r["id"] for r in rows]
    few = ip.read_table(path, km, columns=["id", "note"], filters=[("qty", ">", 0)])
    assert few.column("id").to_pylist() == [r["id"] for r in rows if r["qty"] > 0]


def test_parquet_mr_files_need_the_right_aad_prefix(java_file):
    path, km, _ = java_file
    with pytest.raises(icecrypt.AuthenticationError, match="key metadata has none"):
        ip.read_table(path, StandardKeyMetadata(km.encryption_key, None, km.file_length))
    with pytest.raises(icecrypt.AuthenticationError, match="GCM tag check failed"):
        ip.read_table(path, StandardKeyMetadata(km.encryption_key, os.urandom(16), km.file_length))
    with pytest.raises(icecrypt.AuthenticationError, match="GCM tag check failed"):
        ip.open_file(path, StandardKeyMetadata(os.urandom(km.key_length), km.aad_prefix, km.file_length))


def test_parquet_mr_files_outside_icebergs_layout(jvm, tmp_path):
    """Valid Parquet that Iceberg does not write: no AAD prefix at all, or a prefix
    stored in the file (which must then equal the key metadata's)."""
    dek, aad = os.urandom(16), os.urandom(16)
    rows = java_rows(20)
    bare = tmp_path / "bare.parquet"
    write_rows(jvm, bare, ICEBERG_LIKE_SCHEMA, rows, dek, None)
    assert canonical_rows(ip.read_table(bare, StandardKeyMetadata(dek))) == expected_canonical(rows)
    with pytest.raises(icecrypt.AuthenticationError, match="encrypted without one"):
        ip.read_table(bare, StandardKeyMetadata(dek, aad))

    stored = tmp_path / "stored.parquet"
    write_rows(jvm, stored, ICEBERG_LIKE_SCHEMA, rows, dek, aad, store_aad_prefix=True)
    assert file_crypto_metadata(stored.read_bytes())["aad_prefix"] == aad
    assert canonical_rows(ip.read_table(stored, StandardKeyMetadata(dek, aad))) == expected_canonical(rows)
    with pytest.raises(icecrypt.AuthenticationError, match="not the key metadata's"):
        ip.read_table(stored, StandardKeyMetadata(dek, os.urandom(16)))
    assert authenticate_modules(pa.BufferReader(stored.read_bytes()), StandardKeyMetadata(dek, aad), "stored") > 0
    with pytest.raises(icecrypt.FormatError, match="not the key metadata's"):
        authenticate_modules(pa.BufferReader(stored.read_bytes()), StandardKeyMetadata(dek, os.urandom(16)), "stored")

    signed = tmp_path / "signed.parquet"
    write_rows(jvm, signed, ICEBERG_LIKE_SCHEMA, rows, dek, aad, plaintext_footer=True)
    assert signed.read_bytes()[-4:] == b"PAR1"  # footer in clear, signed, columns encrypted
    assert canonical_rows(ip.read_table(signed, StandardKeyMetadata(dek, aad))) == expected_canonical(rows)
    with pytest.raises(icecrypt.AuthenticationError, match="footer signature check failed"):
        ip.read_table(signed, StandardKeyMetadata(os.urandom(16), aad))
    with pytest.raises(icecrypt.AuthenticationError, match="footer signature check failed"):
        ip.open_file(signed, StandardKeyMetadata(dek, os.urandom(16)))


def test_parquet_mr_version2_pages_fail_closed(jvm, tmp_path):
    """parquet-mr leaves the levels of encrypted V2 data pages in clear and Arrow expects
    them inside the encrypted module: pyarrow cannot read such pages of optional columns.
    The read must fail as a DecryptionError, never return rows.  (Iceberg writes V1.)"""
    dek, aad = os.urandom(16), os.urandom(16)
    rows = java_rows(40)
    path = tmp_path / "v2.parquet"
    write_rows(jvm, path, ICEBERG_LIKE_SCHEMA, rows, dek, aad, writer_version="PARQUET_2_0")
    assert read_rows(jvm, path, dek, aad)[1] == expected_canonical(rows)
    km = StandardKeyMetadata(dek, aad, path.stat().st_size)
    with pytest.raises(icecrypt.DecryptionError):
        ip.read_table(path, km)
    # required columns have no levels, and read
    assert ip.read_table(path, km, columns=["id", "qty"]).column("id").to_pylist() == [r["id"] for r in rows]


def _read_every_row_group(data: bytes, km: StandardKeyMetadata) -> None:
    with ip.EncryptedParquetFile(pa.BufferReader(data), "tampered.parquet", km) as f:
        for i in range(f.num_row_groups):
            f.read_row_group(i)


def test_every_byte_of_a_parquet_mr_file_is_authenticated(jvm, tmp_path):
    """parquet-mr writes a column index and an offset index for every column chunk, and
    bloom filters when asked, all encrypted; Arrow reads none of them.  Reading every row
    group and then ``authenticate_modules`` (what ``verify()`` does) catches a flip of any
    byte of the file; reading the row groups alone does not."""
    dek, aad = os.urandom(16), os.urandom(16)
    path = tmp_path / "indexed.parquet"
    write_rows(
        jvm, path, ICEBERG_LIKE_SCHEMA, java_rows(12), dek, aad, row_group_size=1024, page_size=256,
        bloom_filter_columns=["id", "qty"],
    )
    data = path.read_bytes()
    km = StandardKeyMetadata(dek, aad, len(data))
    with ip.open_file(path, km) as f:
        groups = f.num_row_groups
        columns = f.metadata.num_columns
        assert all(f.metadata.row_group(g).column(c).has_column_index for g in range(groups) for c in range(columns))
        blooms = [f.metadata.row_group(g).column(c).bloom_filter_offset for g in range(groups) for c in (0, 2)]
        assert None not in blooms
    assert authenticate_modules(pa.BufferReader(data), km, "indexed.parquet") == groups * (2 * columns + 2 * 2)

    unseen_by_arrow = 0
    for position in range(len(data)):
        damaged = bytearray(data)
        damaged[position] ^= 0x01
        try:
            _read_every_row_group(bytes(damaged), km)
        except icecrypt.DecryptionError:
            continue
        unseen_by_arrow += 1
        with pytest.raises(icecrypt.DecryptionError, match="indexed.parquet"):
            authenticate_modules(pa.BufferReader(bytes(damaged)), km, "indexed.parquet")
    assert unseen_by_arrow > 100  # the page indexes, bloom filters and leading magic


def test_module_authentication_names_the_module(jvm, tmp_path):
    dek, aad = os.urandom(16), os.urandom(16)
    path = tmp_path / "named.parquet"
    write_rows(jvm, path, ICEBERG_LIKE_SCHEMA, java_rows(10), dek, aad, bloom_filter_columns=["qty"])
    data = path.read_bytes()
    km = StandardKeyMetadata(dek, aad, len(data))
    with ip.open_file(path, km) as f:
        chunk = f.metadata.row_group(0).column(2)
        bloom = chunk.bloom_filter_offset
    # the column index of the first chunk lies after the last data page; the bloom filter where the footer says
    for position, what in ((bloom + 20, "bloom filter of column 'qty' of row group 0"),):
        damaged = bytearray(data)
        damaged[position] ^= 0x01
        with pytest.raises(icecrypt.AuthenticationError, match=f"named.parquet: the {what}: GCM tag check failed"):
            authenticate_modules(pa.BufferReader(bytes(damaged)), km, "named.parquet")
    with pytest.raises(icecrypt.AuthenticationError, match="the footer: GCM tag check failed"):
        authenticate_modules(pa.BufferReader(data), StandardKeyMetadata(dek, os.urandom(16)), "named.parquet")
    with pytest.raises(icecrypt.FormatError, match="no PARE magic"):
        authenticate_modules(pa.BufferReader(b"PAR1" + data[4:]), km, "named.parquet")
    only_crypto_metadata = b"PARE" + bytes([0x1C, 0x1C, 0, 0, 0]) + struct.pack("<I", 5) + b"PARE"  # no footer
    for garbage in (data[:4] + os.urandom(200) + data[-8:], data[:-12] + b"\xff\xff\xff\x7f" + data[-8:],
                    only_crypto_metadata):
        with pytest.raises(icecrypt.DecryptionError, match="named.parquet"):
            authenticate_modules(pa.BufferReader(garbage), km, "named.parquet")
