"""Fuzz harness: the Avro container reader inside AGS1 (``icecrypt.avro``: header,
metadata map, sync markers, block counts and sizes, codecs, records and Arrow batches).

The reader decrypts before it decodes, so mutated *ciphertext* never reaches the Avro
decoder (the AGS1 harness covers that layer).  Here the input is ``split byte |
plaintext Avro``: the plaintext is sealed under a fixed fuzz key into a file and read
back through the real decrypting reader, so every mutation reaches the decoder.  Each
input is read three ways: ``read_records`` (iterated), ``read`` (Arrow), and
``read_split`` of the byte range the split byte picks.  Seeds: the plaintext of the
Java tables' manifests, manifest lists and Avro data files (decrypted from
``../shared/tables`` in place) and containers written here with every codec fastavro
has (null, deflate, bzip2, xz, snappy and zstandard when installed), empty and
multi-block.

Oracle: only ``icecrypt.DecryptionError`` (``FormatError``: a malformed container) may
be raised; never another exception (fastavro's or a codec's included), and no input
runs longer than the time bound (a block count no data backs must not spin).
"""

from __future__ import annotations

import io
from functools import lru_cache

import fastavro

from fuzzlib import Input, fixed_bytes, table_plaintexts, write_file

from icecrypt import DecryptionError, ags1, avro
from icecrypt.keys import StandardKeyMetadata

ALLOWED = (DecryptionError,)
KEY = fixed_bytes("avro-key", 16)
AAD = fixed_bytes("avro-aad", 16)

_SCHEMA = {
    "type": "record",
    "name": "row",
    "fields": [
        {"name": "id", "type": "long", "field-id": 1},
        {"name": "name", "type": ["null", "string"], "field-id": 2},
        {"name": "tags", "type": {"type": "array", "items": "int"}, "field-id": 3},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}, "field-id": 4},
    ],
}


def _container(codec: str, rows: int, sync_interval: int = 16000) -> bytes:
    out = io.BytesIO()
    records = [{"id": i, "name": None if i % 3 else f"n{i}", "tags": list(range(i % 4)), "day": i} for i in range(rows)]
    fastavro.writer(out, _SCHEMA, records, codec=codec, sync_interval=sync_interval, sync_marker=fixed_bytes("sync", 16))
    return out.getvalue()


@lru_cache(maxsize=None)
def _seed_plaintexts() -> tuple[bytes, ...]:
    plain = table_plaintexts()
    out = plain["manifest_lists"][:2] + plain["manifests"][:2] + plain["avro_data"]
    for codec in ("null", "deflate", "bzip2", "xz", "snappy", "zstandard"):
        try:
            out.append(_container(codec, 50, 300))
        except (ValueError, ImportError):
            continue  # codec library not installed
    out.append(_container("null", 0))
    return tuple(out)


def seeds() -> list[bytes]:
    return [b"\x00" + p for p in _seed_plaintexts()] + [b"\x07" + _seed_plaintexts()[-2]]


def _seal(plain: bytes) -> tuple[str, StandardKeyMetadata]:
    ciphertext = ags1.encrypt(plain, KEY, AAD)
    return write_file("fuzz.avro", ciphertext), StandardKeyMetadata(KEY, AAD, len(ciphertext))


def check(data: bytes) -> None:
    inp = Input(data)
    split = inp.u8()
    plain = inp.rest()
    path, km = _seal(plain)
    with avro.read_records(path, km) as records:
        for _ in records:
            pass
    avro.read(path, km)
    start = (split & 0x0F) * max(1, len(plain) // 16)
    length = ((split >> 4) + 1) * max(1, len(plain) // 16)
    for _ in avro.read_split(path, km, start, length):
        pass
