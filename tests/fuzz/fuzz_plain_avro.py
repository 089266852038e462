"""Fuzz harness: the Avro files of a *plaintext* table, read as the table layer reads
them (no decryption in front: every byte of the input reaches the decoder): a manifest
list (``read_manifest_list``), a manifest (``read_manifest``) or an Avro data file (the
checked reader the scan uses, ``_AvroFile.unencrypted``: records and Arrow batches).
These went straight to fastavro before; now they pass the schema check and the per-block
budgets of ``icecrypt.avro._guard`` as an encrypted table's files do.

Input: ``kind | Avro file``.  ``kind % 3``: 0 a manifest list, 1 a manifest of a
plaintext table written here at start-up (its partition spec and schema are used),
2 an Avro data file.  Seeds: that table's manifest list and manifest, the plaintext
of the Java tables' manifest lists, manifests and Avro data files, and crafted files
(a recursive schema with a block of ``0x02``, an ``array<null>`` declaring 2×10⁸
items, a deflate block of zeros, a block count no bytes back).

Oracle: only ``icecrypt.DecryptionError`` (``FormatError``) may be raised; never
another exception (fastavro's, a codec's, ``RecursionError``, ``MemoryError``), no
crash and no hang; and what reads is well-formed for a plaintext table: no manifest or
file comes with key metadata.
"""

from __future__ import annotations

import io
import json
import zlib
from functools import lru_cache

import fastavro
import pyarrow as pa

from fuzzlib import Finding, Input, table_plaintexts, workdir, write_file

from icecrypt import DecryptionError
from icecrypt.avro._container import _zigzag
from icecrypt.avro import _AvroFile
from icecrypt.table import EncryptedTable, Locations
from icecrypt.table.files.manifest import ManifestFile, read_manifest, read_manifest_list

ALLOWED = (DecryptionError,)
_SYNC = bytes(range(16))


def _container(schema: dict, blocks: list[tuple[int, bytes]], codec: str = "null") -> bytes:
    meta = {b"avro.schema": json.dumps(schema).encode(), b"avro.codec": codec.encode()}
    out = bytearray(b"Obj\x01" + _zigzag(len(meta)))
    for key, value in meta.items():
        out += _zigzag(len(key)) + key + _zigzag(len(value)) + value
    out += _zigzag(0) + _SYNC
    for count, data in blocks:
        out += _zigzag(count) + _zigzag(len(data)) + data + _SYNC
    return bytes(out)


@lru_cache(maxsize=None)
def _table() -> EncryptedTable:
    location = str(workdir() / "plain-table")
    schema = pa.schema([("id", pa.int64()), ("s", pa.string())])
    table = EncryptedTable.create(location, schema, kms=None, table_key_id=None)
    table.append(pa.table({"id": [1, 2, 3], "s": ["a", "b", "a"]}))
    return EncryptedTable.load(location)


def _crafted() -> list[bytes]:
    recursive = {"type": "record", "name": "R", "fields": [{"name": "next", "type": ["null", "R"]}]}
    nulls = {"type": "record", "name": "r", "fields": [{"name": "a", "type": {"type": "array", "items": "null"}}]}
    longs = {"type": "record", "name": "r", "fields": [{"name": "x", "type": "long"}, {"name": "a", "type": {"type": "array", "items": "int"}}]}
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    zeros = packer.compress(bytes(1 << 20)) + packer.flush()
    return [
        _container(recursive, [(1, b"\x02" * 2000)]),
        _container(nulls, [(1, _zigzag(200_000_000) + _zigzag(0))]),
        _container(longs, [(1 << 40, zeros)], "deflate"),
        _container(longs, [(3, b"\x02\x04\x02\x04\x00\x04\x02\x02\x00\x06\x00")]),
    ]


@lru_cache(maxsize=None)
def _seed_files() -> tuple[tuple[int, bytes], ...]:
    table = _table()
    snapshot = table.current_snapshot()
    with open(table.fs_path(snapshot.manifest_list), "rb") as f:
        out = [(0, f.read())]
    for manifest in table.manifests(snapshot):
        with open(table.fs_path(manifest.path), "rb") as f:
            out.append((1, f.read()))
    plain = table_plaintexts()
    out += [(0, p) for p in plain["manifest_lists"][:2]] + [(1, p) for p in plain["manifests"][:2]]
    out += [(2, p) for p in plain["avro_data"][:2]]
    rows = io.BytesIO()
    fastavro.writer(rows, {"type": "record", "name": "r", "fields": [{"name": "id", "type": "long"}, {"name": "m", "type": {"type": "map", "values": "string"}}]},
                    [{"id": i, "m": {"k": str(i)}} for i in range(40)], codec="deflate", sync_interval=200)
    out.append((2, rows.getvalue()))
    out += [(kind, data) for data in _crafted() for kind in (0, 2)]
    return tuple(out)


def seeds() -> list[bytes]:
    return [bytes((kind,)) + data for kind, data in _seed_files()]


def check(data: bytes) -> None:
    inp = Input(data)
    kind = inp.u8() % 3
    payload = inp.rest()
    path = write_file("fuzz-plain.avro", payload)
    locations = Locations()
    if kind == 0:
        for manifest in read_manifest_list(path, locations, None, encrypted=False):
            if manifest.key_metadata is not None:
                raise Finding(f"manifest {manifest.path!r} of a plaintext table read with key metadata")
        return
    if kind == 1:
        table = _table()
        manifest = ManifestFile(
            path=path, length=len(payload), spec_id=table.spec.spec_id, content=0, sequence_number=1,
            min_sequence_number=0, added_snapshot_id=1, partitions=None, key_metadata=None, first_row_id=None, record={},
        )
        for entry in read_manifest(manifest, locations, table.specs, table.schema, encrypted=False):
            if entry.file.key_metadata is not None:
                raise Finding(f"file {entry.file.file_path!r} of a plaintext table read with key metadata")
        return
    with _AvroFile.unencrypted(path) as f:
        for _ in f.records():
            pass
        for _ in f.batches(None, 1000):
            pass
