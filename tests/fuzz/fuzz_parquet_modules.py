"""Fuzz harness: ``authenticate_modules``, what ``verify()`` adds to a full read of an
encrypted Parquet file (the leading magic, the footer decrypted here, and the GCM tag of
every column index, offset index and bloom filter module the footer points to).

Input: ``mode | payload``.  Mode 0: the payload is a whole file, checked with a fixed
key metadata (seeds: files the Python writer wrote with page indexes, one and several
row groups, nulls and dictionaries).  Mode 1: the payload is the plaintext footer
(``FileMetaData``) that the harness seals under the same key into the first seed's
file in place of its own, so that mutations reach the parser of the decrypted footer
and module offsets and lengths pointing anywhere.  Mode 2: the payload is a whole file
checked with the key metadata of the equality-delete file parquet-mr wrote for the Java
table ``enc_deletes_dek16`` (``../shared/tables``).

Oracle: only ``icecrypt.DecryptionError`` (``FormatError``, ``AuthenticationError``)
may be raised; never another exception, no hang; a file that passes reports a
non-negative count of modules, and the unmodified seeds pass.
"""

from __future__ import annotations

import struct

import pyarrow as pa

from fuzzlib import Finding, Input, fixed_bytes, java_tables, workdir

from icecrypt import DecryptionError
from icecrypt import parquet as ip
from icecrypt._gcm import GcmKey
from icecrypt._parquet_modules import _Compact, authenticate_modules
from icecrypt.keys import StandardKeyMetadata

ALLOWED = (DecryptionError,)
KEY = fixed_bytes("parquet-modules-key", 16)
AAD = fixed_bytes("parquet-modules-aad", 16)
_OURS: list[bytes] = []
_JAVA: list[tuple[bytes, StandardKeyMetadata]] = []


def _ours() -> list[bytes]:
    if not _OURS:
        table = pa.table({
            "id": pa.array(range(300), pa.int64()),
            "name": pa.array([None if i % 7 == 0 else f"n{i % 5}" for i in range(300)]),
            "amount": pa.array([i / 3 for i in range(300)]),
        })
        for n, rows in enumerate((300, 40)):
            path = workdir() / f"seed-{n}.parquet"
            km = StandardKeyMetadata(KEY, AAD)
            ip.write_table(table.slice(0, rows), path, key_metadata=km, write_page_index=True, row_group_size=128)
            _OURS.append(path.read_bytes())
    return _OURS


def _java() -> list[tuple[bytes, StandardKeyMetadata]]:
    if not _JAVA:
        for table in java_tables():
            for task in table.scan().plan_files():
                for delete in task.deletes:
                    if delete.path.endswith(".parquet") and all(delete.path != p for p, _ in _JAVA):
                        with open(delete.fs_path, "rb") as f:
                            _JAVA.append((f.read(), StandardKeyMetadata.decode(delete.key_metadata)))
    return _JAVA


def _split(data: bytes) -> tuple[bytes, bytes, bytes]:
    """A seed file's body (up to its crypto metadata), crypto metadata and sealed footer."""
    (length,) = struct.unpack_from("<I", data, len(data) - 8)
    start = len(data) - 8 - length
    region = data[start:-8]
    end = _crypto_length(region)
    return data[:start], region[:end], region[end:]


def _crypto_length(region: bytes) -> int:
    reader = _Compact(region)
    reader.struct()
    return reader.pos


def _file_aad(crypto: bytes) -> bytes:
    return AAD + _Compact(crypto).struct()[1][1][2]


def seeds() -> list[bytes]:
    out = [b"\x00" + data for data in _ours()]
    _, crypto, sealed = _split(_ours()[0])
    out.append(b"\x01" + GcmKey(KEY).open(sealed[4:], _file_aad(crypto) + b"\x00"))
    out.extend(b"\x02" + data for data, _ in _java()[:1])
    return out


def check(data: bytes) -> None:
    inp = Input(data)
    mode = inp.u8() % 3
    payload = inp.rest()
    km = StandardKeyMetadata(KEY, AAD)
    if mode == 1:
        body, crypto, _ = _split(_ours()[0])
        module = GcmKey(KEY).seal(payload, _file_aad(crypto) + b"\x00")
        tail = crypto + struct.pack("<I", len(module)) + module
        payload = body + tail + struct.pack("<I", len(tail)) + b"PARE"
    elif mode == 2:
        km = _java()[0][1]
    count = authenticate_modules(pa.BufferReader(payload), km, "fuzz.parquet")
    if not isinstance(count, int) or count < 0:
        raise Finding(f"authenticate_modules returned {count!r}")
