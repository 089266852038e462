"""Test helpers for Parquet files: sample tables, canonical rows, and the file's crypto
metadata parsed straight from its bytes.

Canonical values follow ``../shared/tables/README.md`` (the form the Java-written tables'
digests use), so rows from pyarrow, from parquet-mr and from the golden tables compare
as plain JSON: null -> None, int -> int, float/double -> 16 hex digits of the binary64
bits, decimal -> plain string keeping the scale, date -> days since epoch, timestamp ->
microseconds since epoch, binary -> lowercase hex, string -> str, bool -> bool.
"""

from __future__ import annotations

import datetime
import decimal
import hashlib
import json
import random
import struct

import pyarrow as pa
import pyarrow.compute as pc

EPOCH_DATE = datetime.date(1970, 1, 1)
#: Decimal arithmetic without rounding (the default context keeps only 28 digits)
EXACT = decimal.Context(prec=80)


def sample_table(n: int = 300, seed: int = 1) -> pa.Table:
    """A flat table of many types, every nullable column with nulls, values that
    exercise signs, scales, extremes, unicode and empty strings."""
    rng = random.Random(seed)

    def maybe(value, p=0.15):
        return None if rng.random() < p else value

    def dec(precision: int, scale: int) -> decimal.Decimal:
        unscaled = rng.randrange(-(10**precision) + 1, 10**precision)
        return decimal.Decimal(unscaled).scaleb(-scale, EXACT)

    ts0 = 1_700_000_000_000_000
    rows = {
        "id": list(range(n)),
        "i8": [maybe(rng.randrange(-128, 128)) for _ in range(n)],
        "i16": [maybe(rng.randrange(-(2**15), 2**15)) for _ in range(n)],
        "i32": [maybe(rng.randrange(-(2**31), 2**31)) for _ in range(n)],
        "i64": [maybe(rng.choice([-(2**63), 2**63 - 1, rng.randrange(-(2**63), 2**63)])) for _ in range(n)],
        "f32": [maybe(struct.unpack("<f", struct.pack("<f", rng.uniform(-1e6, 1e6)))[0]) for _ in range(n)],
        "f64": [maybe(rng.choice([rng.uniform(-1e12, 1e12), 0.0, -0.0, 1e-300, float("inf")])) for _ in range(n)],
        "flag": [maybe(rng.random() < 0.5) for _ in range(n)],
        "name": [maybe(rng.choice(["", "alpha", "béta", "日本語", "x" * rng.randrange(1, 200)])) for _ in range(n)],
        "blob": [maybe(rng.randbytes(rng.randrange(0, 40))) for _ in range(n)],
        "fixed": [maybe(rng.randbytes(16)) for _ in range(n)],
        "price": [maybe(dec(10, 2)) for _ in range(n)],
        "small_dec": [maybe(dec(4, 4)) for _ in range(n)],
        "big_dec": [maybe(dec(38, 10)) for _ in range(n)],
        "day": [maybe(EPOCH_DATE + datetime.timedelta(days=rng.randrange(-30000, 30000))) for _ in range(n)],
        "ts": [maybe(ts0 + rng.randrange(-(10**15), 10**15)) for _ in range(n)],
        "ts_utc": [maybe(ts0 + rng.randrange(-(10**15), 10**15)) for _ in range(n)],
        "ts_ms": [maybe(ts0 // 1000 + rng.randrange(-(10**12), 10**12)) for _ in range(n)],
    }
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            ("i8", pa.int8()),
            ("i16", pa.int16()),
            ("i32", pa.int32()),
            ("i64", pa.int64()),
            ("f32", pa.float32()),
            ("f64", pa.float64()),
            ("flag", pa.bool_()),
            ("name", pa.string()),
            ("blob", pa.binary()),
            ("fixed", pa.binary(16)),
            ("price", pa.decimal128(10, 2)),
            ("small_dec", pa.decimal128(4, 4)),
            ("big_dec", pa.decimal128(38, 10)),
            ("day", pa.date32()),
            ("ts", pa.timestamp("us")),
            ("ts_utc", pa.timestamp("us", tz="UTC")),
            ("ts_ms", pa.timestamp("ms")),
        ]
    )
    return pa.table(rows, schema=schema)


def _canonical_column(column: pa.ChunkedArray) -> list:
    t = column.type
    if pa.types.is_timestamp(t):
        return pc.cast(pc.cast(column, pa.timestamp("us", tz=t.tz)), pa.int64()).to_pylist()
    if pa.types.is_date32(t):
        return pc.cast(column, pa.int32()).to_pylist()
    values = column.to_pylist()
    if pa.types.is_floating(t):
        return [None if v is None else struct.pack(">d", v).hex() for v in values]
    if pa.types.is_decimal(t):
        return [None if v is None else format(v, "f") for v in values]
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return [None if v is None else v.hex() for v in values]
    if pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_string(t) or pa.types.is_large_string(t):
        return values
    raise NotImplementedError(f"no canonical form for {t}")


def canonical_rows(table: pa.Table) -> list[list]:
    """Rows of a flat table as lists of canonical values, in table order."""
    columns = [_canonical_column(table.column(i)) for i in range(table.num_columns)]
    return [list(row) for row in zip(*columns)]


def canonical_lines(rows: list[list]) -> list[str]:
    return [json.dumps(row, separators=(",", ":"), ensure_ascii=True) for row in rows]


def digest(rows: list[list]) -> str:
    """The golden tables' digest: SHA-256 over the sorted canonical lines, each + newline."""
    lines = sorted(canonical_lines(rows))
    return hashlib.sha256("".join(line + "\n" for line in lines).encode("ascii")).hexdigest()


# --- FileCryptoMetaData (Thrift compact protocol) ---------------------------------------


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        b = data[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n, pos
        shift += 7


def _struct(data: bytes, pos: int) -> tuple[dict, int]:
    """One compact-protocol struct holding only bools, binaries and structs: {field id: value}."""
    out: dict = {}
    last = 0
    while True:
        header = data[pos]
        pos += 1
        if header == 0:
            return out, pos
        kind, delta = header & 0x0F, header >> 4
        if delta:
            field = last + delta
        else:
            zz, pos = _varint(data, pos)
            field = (zz >> 1) ^ -(zz & 1)
        last = field
        if kind in (1, 2):
            out[field] = kind == 1
        elif kind == 8:
            length, pos = _varint(data, pos)
            out[field] = data[pos : pos + length]
            pos += length
        elif kind == 12:
            out[field], pos = _struct(data, pos)
        else:
            raise ValueError(f"unexpected thrift compact type {kind} in FileCryptoMetaData")


def file_crypto_metadata(data: bytes) -> dict:
    """The FileCryptoMetaData of an encrypted-footer Parquet file, decoded from its bytes:
    ``algorithm`` (``AES_GCM_V1`` / ``AES_GCM_CTR_V1``), ``aad_prefix`` (stored prefix or
    None), ``aad_file_unique``, ``supply_aad_prefix``, ``key_metadata`` (or None)."""
    if data[-4:] != b"PARE":
        raise ValueError(f"not an encrypted-footer Parquet file (tail magic {data[-4:]!r})")
    footer_length = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - footer_length
    meta, end = _struct(data, start)
    algorithm = meta[1]
    (which,) = algorithm.keys()
    fields = algorithm[which]
    return {
        "algorithm": {1: "AES_GCM_V1", 2: "AES_GCM_CTR_V1"}[which],
        "aad_prefix": fields.get(1),
        "aad_file_unique": fields.get(2),
        "supply_aad_prefix": fields.get(3, False),
        "key_metadata": meta.get(2),
        "span": (start, end),
    }
