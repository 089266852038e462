"""Attacks on the decoders of what a table's storage holds (issue 16, items 9, 13 and 14):
crafted Avro manifest lists, manifests and data files, deletion vectors and gzip
``metadata.json``, written by someone who can write the storage but has no key.

Each input must end in a clear error naming the file, never in a crash of the process
(the crashing inputs run in a child process, so a segmentation fault fails the test
instead of killing the suite) nor in memory out of proportion to the input: the child
reports its peak RSS, which must stay within :data:`CEILING` of what it had after
importing the modules (measured, never timed).  Plaintext tables go through the same
checks as encrypted ones.
"""

from __future__ import annotations

import gzip
import json
import os
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import fastavro
import numpy as np
import pyarrow as pa
import pytest

from icecrypt import FormatError
from icecrypt.avro._container import _zigzag as _long
from icecrypt.table import EncryptedTable
from icecrypt.table.files.deletes import DV_MAGIC, decode_deletion_vector

SRC = Path(__file__).resolve().parents[2] / "src"
#: the most a crafted input may add to a child's peak RSS
CEILING = 300 << 20
#: the child's address-space limit: a decoder without bounds fails there (MemoryError)
#: instead of taking the machine's memory
ADDRESS_LIMIT = 6 << 30

SYNC = bytes(range(16))
RECURSIVE = {"type": "record", "name": "R", "fields": [{"name": "next", "type": ["null", "R"]}]}


# --- crafting ---------------------------------------------------------------------------------------


def _bytes(data: bytes) -> bytes:
    return _long(len(data)) + data


def container(schema: dict, blocks: list[tuple[int, bytes]], codec: str = "null") -> bytes:
    """An Avro container file with the given (count, stored data) blocks, as an
    attacker writes it (no encoder checks anything)."""
    meta = {b"avro.schema": json.dumps(schema).encode(), b"avro.codec": codec.encode()}
    out = bytearray(b"Obj\x01" + _long(len(meta)))
    for key, value in meta.items():
        out += _bytes(key) + _bytes(value)
    out += _long(0) + SYNC
    for count, data in blocks:
        out += _long(count) + _long(len(data)) + data + SYNC
    return bytes(out)


def deflate_zeros(n: int) -> bytes:
    """``n`` zero bytes, raw-deflated (Avro's deflate codec), made chunk by chunk."""
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    chunk = bytes(min(n, 1 << 20))
    parts = [packer.compress(chunk) for _ in range(n // len(chunk))]
    return b"".join(parts) + packer.flush()


def plaintext_table(tmp_path: Path) -> EncryptedTable:
    table = EncryptedTable.create(str(tmp_path / "t"), pa.schema([("id", pa.int64()), ("s", pa.string())]), kms=None, table_key_id=None)
    table.append(pa.table({"id": [1, 2, 3], "s": ["a", "b", "c"]}))
    return EncryptedTable.load(str(tmp_path / "t"))


def manifest_list_path(table: EncryptedTable) -> Path:
    return Path(table.fs_path(table.current_snapshot().manifest_list))


def with_avro_data_file(table: EncryptedTable, data: bytes) -> Path:
    """Point the plaintext table's one data file entry at a new Avro file of ``data``
    (the manifest rewritten in place, as an attacker would)."""
    manifest = table.manifests(table.current_snapshot())[0]
    mpath = Path(table.fs_path(manifest.path))
    with open(mpath, "rb") as f:
        reader = fastavro.reader(f)
        schema, meta, entries = reader.writer_schema, reader.metadata, list(reader)
    path = Path(table.fs_path(table.location)) / "data" / "crafted.avro"
    path.write_bytes(data)
    entries[0]["data_file"].update(file_path=str(path), file_format="AVRO", file_size_in_bytes=len(data), split_offsets=None)
    with open(mpath, "wb") as f:
        fastavro.writer(f, fastavro.parse_schema(schema), entries, metadata={k: v for k, v in meta.items() if not k.startswith("avro.")})
    return path


def overlapping_dv(runs: int = 64) -> bytes:
    """A 291-byte ``deletion-vector-v1`` blob: one run container whose ``runs`` runs all
    cover the whole container (each asks for 65,536 values)."""
    bitmap = struct.pack("<I", 12347) + b"\x01" + struct.pack("<HH", 0, 0xFFFF)
    bitmap += struct.pack("<H", runs) + struct.pack("<HH", 0, 0xFFFF) * runs
    body = DV_MAGIC + struct.pack("<Q", 1) + struct.pack("<I", 0) + bitmap
    return struct.pack(">I", len(body)) + body + struct.pack(">I", zlib.crc32(body))


# --- the child process ------------------------------------------------------------------------------

_CHILD = """
import json, resource, sys, traceback
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
import numpy, pyarrow, fastavro
import icecrypt, icecrypt.avro, icecrypt.table, icecrypt.table.files.deletes, icecrypt.cli
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
error = None
try:
{body}
except BaseException as exc:
    error = type(exc).__name__ + ": " + str(exc)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"error": error, "grew": (peak - base) * 1024}}))
"""


def run_child(body: str, *args: str) -> dict:
    """Run ``body`` (Python, indented into a try block) in a child process; its outcome
    (``error``: the exception it ended in, ``grew``: peak RSS above the baseline).  A
    child killed by a signal (a segmentation fault) fails the test."""
    code = _CHILD.format(limit=ADDRESS_LIMIT, body=textwrap.indent(textwrap.dedent(body), "    "))
    env = dict(os.environ, PYTHONPATH=str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, f"the child died (status {proc.returncode}): {proc.stderr[-2000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_refused(outcome: dict, *fragments: str) -> None:
    error = outcome["error"]
    assert error is not None and error.startswith("FormatError"), error
    for fragment in fragments:
        assert fragment in error, error
    assert outcome["grew"] < CEILING, f"peak RSS grew by {outcome['grew'] >> 20} MiB"


# --- item 13: a recursive schema ------------------------------------------------------------------------


@pytest.fixture
def recursive_table(tmp_path):
    """A plaintext table whose manifest list has a recursive schema and one block of
    100,000 bytes of 0x02 (each "the next record follows"): fastavro recursed until the
    stack overflowed."""
    table = plaintext_table(tmp_path)
    path = manifest_list_path(table)
    path.write_bytes(container(RECURSIVE, [(1, b"\x02" * 100_000)]))
    return table, path


@pytest.mark.parametrize("operation", ["scan", "verify"])
def test_recursive_manifest_list_is_refused(recursive_table, operation):
    table, path = recursive_table
    body = {
        "scan": "icecrypt.table.EncryptedTable.load(sys.argv[1]).scan().to_arrow()",
        "verify": "r = icecrypt.table.EncryptedTable.load(sys.argv[1]).verify()\nraise icecrypt.FormatError(str([p.message for p in r.problems]))",
    }[operation]
    assert_refused(run_child(body, table.location), str(path), "recursive Avro type 'R'")


def test_recursive_manifest_list_cli_verify(recursive_table):
    """``icecrypt table verify`` reports the file and exits non-zero; it does not crash."""
    table, path = recursive_table
    env = dict(os.environ, PYTHONPATH=str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "icecrypt", "table", "verify", table.location],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode > 0, (proc.returncode, proc.stderr[-2000:])
    output = proc.stdout + proc.stderr
    assert "recursive Avro type 'R'" in output and path.name in output, output[-2000:]


def test_recursive_schema_in_an_encrypted_file(tmp_path):
    """The encrypted reader (a manifest list, an Avro data file) refuses it the same way."""
    plain = container(RECURSIVE, [(1, b"\x02" * 100_000)])
    from icecrypt import ags1
    from icecrypt.keys import StandardKeyMetadata

    key, aad = os.urandom(16), os.urandom(16)
    ciphertext = ags1.encrypt(plain, key, aad)
    (tmp_path / "r.avro").write_bytes(ciphertext)
    km = StandardKeyMetadata(key, aad, len(ciphertext)).encode().hex()
    body = """
        km = icecrypt.keys.StandardKeyMetadata.decode(bytes.fromhex(sys.argv[2]))
        with icecrypt.avro.read_records(sys.argv[1], km) as records:
            list(records)
    """
    assert_refused(run_child(body, str(tmp_path / "r.avro"), km), "r.avro", "recursive Avro type 'R'")


# --- item 14: Avro without a budget ------------------------------------------------------------------------


@pytest.mark.slow
def test_zero_filled_deflate_manifest_list(tmp_path):
    """A ~1 MB manifest list of one deflate block inflating to 1 GiB of zeros (a scan
    took 4.2 GB for a 2 MB one): refused at the block cap, no more memory than that."""
    table = plaintext_table(tmp_path)
    path = manifest_list_path(table)
    with open(path, "rb") as f:
        schema = fastavro.reader(f).writer_schema
    path.write_bytes(container(schema, [(1 << 40, deflate_zeros(1 << 30))], codec="deflate"))
    outcome = run_child("icecrypt.table.EncryptedTable.load(sys.argv[1]).scan().to_arrow()", table.location)
    assert_refused(outcome, str(path), "inflates to more than")


def test_many_inflating_blocks_of_a_manifest_list(tmp_path):
    """Blocks that each stay under the cap but together inflate far beyond the file's
    size are refused too (the table code keeps a manifest list's records)."""
    table = plaintext_table(tmp_path)
    path = manifest_list_path(table)
    with open(path, "rb") as f:
        schema = fastavro.reader(f).writer_schema
    width = 16  # bytes of a manifest list record of zeros (every field takes one byte)
    block = deflate_zeros(256 << 10)
    path.write_bytes(container(schema, [((256 << 10) // width, block)] * 100, codec="deflate"))
    outcome = run_child("icecrypt.table.EncryptedTable.load(sys.argv[1]).scan().to_arrow()", table.location)
    assert_refused(outcome, str(path), "times its size")


ARRAY_OF_NULLS = {"type": "record", "name": "r", "fields": [{"name": "a", "type": {"type": "array", "items": "null"}}]}


def test_array_of_nulls_as_manifest_list(tmp_path):
    """A 178-byte file declaring an array<null> of 2×10⁸ items (1.6 GB): a manifest list
    never has that type."""
    table = plaintext_table(tmp_path)
    path = manifest_list_path(table)
    data = container(ARRAY_OF_NULLS, [(1, _long(200_000_000) + _long(0))])
    assert len(data) < 200
    path.write_bytes(data)
    outcome = run_child("icecrypt.table.EncryptedTable.load(sys.argv[1]).scan().to_arrow()", table.location)
    assert_refused(outcome, str(path), "type null outside a union")


def test_array_of_nulls_as_avro_data_file(tmp_path):
    """The same file as a plaintext table's Avro data file (any non-recursive schema may
    be data): the items are counted against the block's budget before one is decoded."""
    table = plaintext_table(tmp_path)
    schema = {"type": "record", "name": "r", "fields": [
        {"name": "id", "type": "long", "field-id": 1},
        {"name": "s", "type": ["null", "string"], "field-id": 2},
        {"name": "a", "type": {"type": "array", "items": "null", "element-id": 4}, "field-id": 3},
    ]}
    path = with_avro_data_file(table, container(schema, [(1, b"\x00\x00" + _long(200_000_000) + _long(0))]))
    outcome = run_child("icecrypt.table.EncryptedTable.load(sys.argv[1]).scan().to_arrow()", table.location)
    assert_refused(outcome, path.name, "decodes to more than")


def test_array_item_counts_are_checked_without_a_child(tmp_path):
    """In process: the item count of an array of nulls is refused, as is a block count
    no bytes back and a block of records of no width beyond the budget; an array count
    of items that take bytes ends at the block's end (fastavro reads no further)."""
    from icecrypt.avro import _AvroFile

    cases = [
        (ARRAY_OF_NULLS, [(1, _long(200_000_000) + _long(0))], "more than"),
        ({"type": "record", "name": "r", "fields": [{"name": "x", "type": "long"}]}, [(1 << 60, b"\x00" * 10)], "cannot fit"),
        ({"type": "record", "name": "r", "fields": [{"name": "x", "type": "null"}]}, [(1 << 40, b"")], "no width"),
        ({"type": "record", "name": "r", "fields": [{"name": "a", "type": {"type": "array", "items": "int"}}]},
         [(1, _long(1 << 40) + b"\x00" * 100)], "cannot decode"),
    ]
    for i, (schema, blocks, message) in enumerate(cases):
        path = tmp_path / f"c{i}.avro"
        path.write_bytes(container(schema, blocks))
        with pytest.raises(FormatError, match=f"c{i}.avro: .*{message}"), _AvroFile.unencrypted(str(path)) as f:
            list(f.records())


def test_block_stored_above_the_cap_is_refused_before_it_is_read(tmp_path):
    """A block's declared stored size is compared with the cap before its bytes are
    read (an uncompressed 70 MiB block of a data file)."""
    schema = {"type": "record", "name": "r", "fields": [{"name": "s", "type": "string"}]}
    path = tmp_path / "big.avro"
    path.write_bytes(container(schema, [(1, _long(70 << 20) + b"x" * (70 << 20))]))
    from icecrypt.avro import _AvroFile

    with pytest.raises(FormatError, match=r"big.avro: Avro block at offset \d+ refused: \d+ bytes stored"), \
            _AvroFile.unencrypted(str(path)) as f:
        list(f.records())


def test_unexpected_types_in_a_manifest_list(tmp_path):
    """A manifest list's schema may only hold what Iceberg writes there."""
    table = plaintext_table(tmp_path)
    path = manifest_list_path(table)
    for schema, message in [
        ({"type": "record", "name": "r", "fields": [{"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A"]}}]}, "enum"),
        ({"type": "record", "name": "r", "fields": [{"name": "u", "type": ["int", "string"]}]}, "union"),
        ({"type": "array", "items": "int"}, "not a record"),
    ]:
        path.write_bytes(container(schema, []))
        with pytest.raises(FormatError, match=f"{path.name}: refused .*{message}"):
            EncryptedTable.load(table.location).scan().to_arrow()


def test_plaintext_avro_data_file_recursive(tmp_path):
    """A plaintext table's Avro data file with a recursive schema is refused by the scan
    (it went straight to fastavro)."""
    table = plaintext_table(tmp_path)
    path = with_avro_data_file(table, container(RECURSIVE, [(1, b"\x02" * 100_000)]))
    outcome = run_child("icecrypt.table.EncryptedTable.load(sys.argv[1]).scan().to_arrow()", table.location)
    assert_refused(outcome, path.name, "recursive Avro type 'R'")


#: the plaintext table's schema as a data file's writer schema (field ids as Iceberg's)
TABLE_AVRO_SCHEMA = {"type": "record", "name": "r", "fields": [
    {"name": "id", "type": ["null", "long"], "field-id": 1},
    {"name": "s", "type": ["null", "string"], "field-id": 2},
]}


def zero_string_blocks(blocks: int, records: int = 4, length: int = 256 << 10) -> bytes:
    """A data file of ``blocks`` deflate blocks of ``records`` rows, each a string of
    ``length`` zero bytes: every block passes the per-block checks (it inflates to about
    1 MiB, well under 64 MiB, and holds few values) and is stored in about 1 kB."""
    row = b"\x02\x00" + b"\x02" + _bytes(bytes(length))  # id 0, s = "\0" * length
    block = zlib.compressobj(9, zlib.DEFLATED, -15)
    data = block.compress(row * records) + block.flush()
    return container(TABLE_AVRO_SCHEMA, [(records, data)] * blocks, codec="deflate")


def test_avro_data_file_inflating_past_the_file_cap(tmp_path, monkeypatch):
    """Each block is capped, the file was not: a data file of many blocks of deflated
    zeros that each pass inflated without end (about a thousandfold its stored size).
    Its blocks now inflate to at most ICECRYPT_MAX_AVRO_FILE_BYTES in all (set to 8 MiB
    here; 24 blocks of just over 1 MiB): a FormatError naming the file at the block that passes
    the cap, in a child whose memory stays bounded; under the default cap it reads."""
    table = plaintext_table(tmp_path)
    path = with_avro_data_file(table, zero_string_blocks(24))
    assert path.stat().st_size < 64 << 10
    monkeypatch.setenv("ICECRYPT_MAX_AVRO_FILE_BYTES", str(8 << 20))
    outcome = run_child("icecrypt.table.EncryptedTable.load(sys.argv[1]).scan().to_arrow()", table.location)
    assert_refused(outcome, path.name, "Avro block 8 refused: the data file inflates to more than 8388608 bytes",
                   "ICECRYPT_MAX_AVRO_FILE_BYTES")
    monkeypatch.delenv("ICECRYPT_MAX_AVRO_FILE_BYTES")
    assert EncryptedTable.load(table.location).scan().count() == 24 * 4


def test_encrypted_avro_data_file_inflating_past_the_file_cap(tmp_path, monkeypatch):
    """The same cap on an encrypted table's Avro data file, written by icecrypt itself
    (highly compressible values): with the cap below what the file inflates to, the scan
    fails naming the data file; the manifests (metadata, capped otherwise) still read."""
    from icecrypt.kms.memory import MemoryKms

    kms = MemoryKms.with_iceberg_test_keys()
    table = EncryptedTable.create(str(tmp_path / "t"), pa.schema([("id", pa.int64()), ("s", pa.string())]), kms=kms,
                                  table_key_id="keyA", properties={"write.format.default": "avro"})
    table.append(pa.table({"id": pa.array(range(40), pa.int64()), "s": ["\0" * (256 << 10)] * 40}))
    data_file = next(iter(table.scan().plan_files())).file
    assert data_file.file_format == "AVRO"
    monkeypatch.setenv("ICECRYPT_MAX_AVRO_FILE_BYTES", str(4 << 20))
    with pytest.raises(FormatError, match=r"the data file inflates to more than 4194304 bytes") as caught:
        table.scan().to_arrow()
    assert Path(data_file.path).name in str(caught.value)
    assert table.scan(columns=["id"]).plan_files()  # planning (manifests) is not what is capped
    monkeypatch.setenv("ICECRYPT_MAX_AVRO_FILE_BYTES", "-1")
    with pytest.raises(ValueError, match="ICECRYPT_MAX_AVRO_FILE_BYTES must be a positive number of bytes"):
        table.scan().to_arrow()
    monkeypatch.delenv("ICECRYPT_MAX_AVRO_FILE_BYTES")
    assert table.scan().count() == 40


def test_legitimate_large_blocks_still_read(tmp_path):
    """A block of large values (what a data file with big strings holds) is far above
    the schema bound and is walked, not refused."""
    schema = {"type": "record", "name": "r", "fields": [{"name": "s", "type": "string"}, {"name": "a", "type": {"type": "array", "items": "int"}}]}
    rows = [{"s": "x" * 200_000, "a": list(range(50))} for _ in range(30)]
    path = tmp_path / "big.avro"
    with open(path, "wb") as f:
        fastavro.writer(f, schema, rows, codec="deflate", sync_interval=10 << 20)
    from icecrypt.avro import _AvroFile

    with _AvroFile.unencrypted(str(path)) as f:
        assert list(f.records()) == rows


# --- item 9: deletion vectors ----------------------------------------------------------------------------


def test_overlapping_dv_runs_are_refused_before_allocating():
    blob = overlapping_dv()
    assert len(blob) == 291
    with pytest.raises(FormatError, match="dv.bin: Roaring runs are unsorted or overlap"):
        decode_deletion_vector(blob, "dv.bin")
    outcome = run_child(
        "icecrypt.table.files.deletes.decode_deletion_vector(bytes.fromhex(sys.argv[1]), 'dv.bin')", blob.hex()
    )
    assert_refused(outcome, "dv.bin", "overlap")


def _dv(bitmap: bytes) -> bytes:
    body = DV_MAGIC + struct.pack("<Q", 1) + struct.pack("<I", 0) + bitmap
    return struct.pack(">I", len(body)) + body + struct.pack(">I", zlib.crc32(body))


@pytest.mark.parametrize(
    ("bitmap", "message"),
    [
        # two runs in the wrong order (each alone is valid)
        (struct.pack("<I", 12347) + b"\x01" + struct.pack("<HH", 0, 19) + struct.pack("<H", 2) + struct.pack("<HHHH", 100, 9, 10, 9), "unsorted or overlap"),
        # runs that overlap by one value, cardinality adding up
        (struct.pack("<I", 12347) + b"\x01" + struct.pack("<HH", 0, 19) + struct.pack("<H", 2) + struct.pack("<HHHH", 10, 9, 19, 9), "unsorted or overlap"),
        # a run container whose runs do not add up to its cardinality
        (struct.pack("<I", 12347) + b"\x01" + struct.pack("<HH", 0, 4) + struct.pack("<H", 1) + struct.pack("<HH", 10, 9), "cardinality mismatch"),
        # a container count of 2^32 - 1 in the no-run layout: refused before any array of that size
        (struct.pack("<II", 12346, 0xFFFFFFFF), "containers"),
    ],
    ids=["unsorted", "overlapping", "cardinality", "container-count"],
)
def test_malformed_run_containers(bitmap, message):
    with pytest.raises(FormatError, match=f"dv.bin: .*{message}"):
        decode_deletion_vector(_dv(bitmap), "dv.bin")


def test_dv_positions_beyond_the_manifest_cardinality_are_refused_before_decoding():
    """A valid vector of 65,536 positions where the manifest says 3: refused from the
    declared cardinalities, before the positions are made."""
    runs = struct.pack("<I", 12347) + b"\x01" + struct.pack("<HH", 0, 0xFFFF) + struct.pack("<H", 1) + struct.pack("<HH", 0, 0xFFFF)
    blob = _dv(runs)
    assert len(decode_deletion_vector(blob, "dv.bin")) == 65536
    with pytest.raises(FormatError, match="more positions than the manifest says"):
        decode_deletion_vector(blob, "dv.bin", expected_cardinality=3)


def test_writer_decodes_vectors_with_the_checked_decoder():
    from icecrypt.table.files.write_dv import decode_dv, encode_dv

    assert decode_dv(encode_dv(np.array([3, 1, 70000]))).tolist() == [1, 3, 70000]
    with pytest.raises(FormatError, match="overlap"):
        decode_dv(overlapping_dv(), name="dv.bin")


def test_plain_dv_range_beyond_the_file(tmp_path):
    from icecrypt.table.files.deletes import read_dv_blob

    path = tmp_path / "x.puffin"
    path.write_bytes(b"PFA1" + bytes(100))
    with pa.OSFile(str(path)) as source, pytest.raises(FormatError, match="beyond the file"):
        read_dv_blob(source, 4, 1 << 40, name="x.puffin")


# --- item 9: metadata.json ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_gzip_metadata_bomb(tmp_path):
    """A ~520 KB gzip ``metadata.json`` inflating to 513 MiB (+513 MiB before): refused
    at the cap while inflating, the memory bounded by the cap."""
    table = plaintext_table(tmp_path)
    doc = json.loads(Path(table.metadata_location).read_text())
    padding = 513 << 20
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    head = json.dumps(doc)[:-1] + ', "pad": "'
    parts = [packer.compress(head.encode())]
    chunk = b" " * (1 << 20)
    parts += [packer.compress(chunk) for _ in range(padding >> 20)]
    parts.append(packer.compress(b'"}') + packer.flush())
    bomb = tmp_path / "t" / "metadata" / "v3.gz.metadata.json"
    bomb.write_bytes(b"".join(parts))
    assert bomb.stat().st_size < 600_000
    outcome = run_child("icecrypt.table.EncryptedTable.load(sys.argv[1])", str(bomb))
    assert_refused(outcome, str(bomb), "inflates to more than", "ICECRYPT_MAX_METADATA_BYTES")


def test_metadata_size_cap_is_configurable(tmp_path, monkeypatch):
    table = plaintext_table(tmp_path)
    location = table.metadata_location
    size = Path(location).stat().st_size
    monkeypatch.setenv("ICECRYPT_MAX_METADATA_BYTES", str(size - 1))
    with pytest.raises(FormatError, match=f"{Path(location).name}: table metadata of {size} bytes is larger than the limit"):
        EncryptedTable.load(location)
    gz = Path(location).with_name("v9.gz.metadata.json")
    gz.write_bytes(gzip.compress(Path(location).read_bytes()))
    with pytest.raises(FormatError, match="inflates to more than"):
        EncryptedTable.load(str(gz))
    monkeypatch.setenv("ICECRYPT_MAX_METADATA_BYTES", str(size))
    assert EncryptedTable.load(str(gz)).metadata == EncryptedTable.load(location).metadata


# --- whole-file reads -------------------------------------------------------------------------------------


def test_whole_file_read_compares_the_size_first(tmp_path):
    """A small file of an encrypted table swapped for a larger one is refused from its
    stored size, before it is read into memory."""
    from icecrypt import ags1
    from icecrypt.keys import StandardKeyMetadata
    from icecrypt.table import Locations
    from icecrypt.table.files.io import read_small_file

    key, aad = os.urandom(16), os.urandom(16)
    ciphertext = ags1.encrypt(b"PFA1" + bytes(50), key, aad)
    km = StandardKeyMetadata(key, aad, len(ciphertext))
    path = tmp_path / "d.puffin"
    path.write_bytes(ciphertext + bytes(1 << 20))
    with pytest.raises(FormatError, match="d.puffin: file is longer than its key metadata says"):
        read_small_file("deletion vector file", str(path), Locations(), km, encrypted=True)
    path.write_bytes(ciphertext)
    assert read_small_file("deletion vector file", str(path), Locations(), km, encrypted=True) == b"PFA1" + bytes(50)


def test_avro_reads_through_the_guard_still_match_fastavro(tmp_path):
    """Every codec reads back the same through the checked path (zstandard blocks made
    here: this fastavro writes it only with a library that is not installed)."""
    import io

    import zstandard

    from icecrypt.avro import _AvroFile

    schema = {"type": "record", "name": "r", "fields": [
        {"name": "id", "type": "long"}, {"name": "m", "type": {"type": "map", "values": ["null", "double"]}},
        {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}},
    ]}
    rows = [{"id": i, "m": {str(i): None, "x": i / 3}, "e": "AB"[i % 2]} for i in range(3000)]
    for codec in ("null", "deflate", "bzip2", "xz"):
        path = tmp_path / f"{codec}.avro"
        with open(path, "wb") as f:
            fastavro.writer(f, schema, rows, codec=codec, sync_interval=2000)
        with _AvroFile.unencrypted(str(path)) as af:
            assert list(af.records()) == rows, codec
    blocks = []
    for start in range(0, len(rows), 500):
        out = io.BytesIO()
        for row in rows[start : start + 500]:
            fastavro.schemaless_writer(out, fastavro.parse_schema(schema), row)
        blocks.append((len(rows[start : start + 500]), zstandard.ZstdCompressor().compress(out.getvalue())))
    path = tmp_path / "zstd.avro"
    path.write_bytes(container(schema, blocks, codec="zstandard"))
    with _AvroFile.unencrypted(str(path)) as af:
        assert list(af.records()) == rows


def test_encrypted_files_in_a_plaintext_table_are_named(tmp_path):
    """An AGS1 manifest list or Avro data file in a plaintext table: the error says what
    it is (the checked reader finds no Avro header, the magic says why)."""
    from icecrypt import ags1

    table = plaintext_table(tmp_path)
    sealed = ags1.encrypt(container(RECURSIVE, []), os.urandom(16), os.urandom(16))
    path = with_avro_data_file(table, sealed)
    with pytest.raises(FormatError, match=f"{path.name} is encrypted \\(AGS1\\), but the table has no encryption.key-id"):
        EncryptedTable.load(table.location).scan().to_arrow()
    manifest_list_path(table).write_bytes(sealed)
    with pytest.raises(FormatError, match=r"manifest list .* is encrypted \(AGS1\), but the table has no encryption.key-id"):
        EncryptedTable.load(table.location).scan().to_arrow()


# --- write and maintenance paths over crafted files -------------------------------------------------------


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    "operation", ["append", "delete", "rewrite_manifests", "rewrite_data_files", "expire_snapshots", "remove_orphan_files"]
)
@pytest.mark.parametrize("target", ["manifest list", "manifest"])
def test_write_paths_refuse_a_recursive_file(tmp_path, operation, target):
    """The write and maintenance paths read the current manifests through the same
    checks (TableIO.read_avro): a recursive manifest list or manifest is refused in a
    child process (no crash), naming the file, and nothing in the table changes."""
    table = plaintext_table(tmp_path)
    table.append(pa.table({"id": [4], "s": ["d"]}))
    table = EncryptedTable.load(table.location)
    if target == "manifest list":
        path = manifest_list_path(table)
    else:
        path = Path(table.fs_path(table.manifests(table.current_snapshot())[0].path))
    path.write_bytes(container(RECURSIVE, [(1, b"\x02" * 100_000)]))
    root = Path(table.location)
    before = _files(root)
    body = {
        "append": "t.append(pyarrow.table({'id': [9], 's': ['z']}))",
        "delete": "t.delete('id = 1')",
        "rewrite_manifests": "t.rewrite_manifests()",
        "rewrite_data_files": "t.rewrite_data_files()",
        "expire_snapshots": "t.expire_snapshots(2 ** 62)",
        # every file is old enough: a manifest that cannot be read must not make the
        # files it lists look like orphans
        "remove_orphan_files": "t.remove_orphan_files(older_than=2 ** 62)",
    }[operation]
    outcome = run_child(f"t = icecrypt.table.EncryptedTable.load(sys.argv[1])\n{body}", table.location)
    if operation == "append" and target == "manifest":
        # an append lists the current manifests without opening them (fast append): it
        # commits; the crafted manifest stays refused for every read
        assert outcome["error"] is None, outcome
        with pytest.raises(FormatError, match=f"{path.name}: refused .*recursive Avro type 'R'"):
            EncryptedTable.load(table.location).scan().to_arrow()
        return
    assert_refused(outcome, path.name, "recursive Avro type 'R'")
    assert _files(root) == before


# --- whole-file reads of small documents: a version hint, a key manifest ----------------------------


def test_a_huge_version_hint_is_not_read_whole(tmp_path):
    """A 1 GiB (sparse) ``version-hint.text`` is no number: the listing names the version,
    and reading the hint costs its first bytes only."""
    table = plaintext_table(tmp_path)
    table.append(pa.table({"id": pa.array([1, 2], pa.int64())}))
    hint = Path(table.location) / "metadata" / "version-hint.text"
    with open(hint, "r+b") as f:
        f.truncate(1 << 30)
    outcome = run_child(
        """
        table = icecrypt.table.EncryptedTable.load(sys.argv[1])
        print(table.scan().to_arrow().num_rows, file=sys.stderr)
        """,
        table.location,
    )
    assert outcome["error"] is None, outcome["error"]
    assert outcome["grew"] < CEILING, f"peak RSS grew by {outcome['grew'] >> 20} MiB"


def test_a_key_manifest_larger_than_the_cap_is_refused(tmp_path):
    """A key manifest past ``$ICECRYPT_MAX_METADATA_BYTES`` is refused before its JSON is
    parsed (or read whole)."""
    manifest = tmp_path / "keys.json"
    with open(manifest, "wb") as f:
        f.write(b'{"format": "' + b" " * 100)
        f.truncate(1 << 30)
    env = dict(os.environ, ICECRYPT_MAX_METADATA_BYTES=str(1 << 20))
    code = (
        "import sys\n"
        "from icecrypt.keys.manifest import _load\n"
        "try:\n"
        "    _load(None, None, sys.argv[1])\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__ + ': ' + str(exc))\n"
    )
    env["PYTHONPATH"] = str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", code, str(manifest)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("FormatError") and "larger than 1048576 bytes" in proc.stdout, proc.stdout
