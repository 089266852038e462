"""Damaged, truncated, foreign and wrongly keyed files: every reader fails closed with
an icecrypt exception naming the file, and never returns unauthenticated data."""

from __future__ import annotations

import io
import json

import fastavro
import pyarrow as pa
import pytest

import icecrypt
from icecrypt import ags1, avro
from icecrypt.avro._container import Header
from icecrypt.keys import StandardKeyMetadata

KEY = bytes(range(16))
AAD = b"avro-tamper-aad!"
SCHEMA = {"type": "record", "name": "r", "fields": [{"name": "i", "type": "long"}, {"name": "s", "type": "string"}]}


def container(codec: str = "null", n: int = 2000) -> bytes:
    buf = io.BytesIO()
    fastavro.writer(buf, SCHEMA, ({"i": i, "s": f"row {i}" * 3} for i in range(n)), codec=codec, sync_interval=4000)
    return buf.getvalue()


def layout(plain: bytes) -> tuple[int, list[int]]:
    """Header end and the end of every block (just after its sync marker)."""
    sync = plain[-16:]  # a container ends with a sync marker; the header's is the first
    header_end = plain.find(sync) + 16
    ends, pos = [], header_end
    while (hit := plain.find(sync, pos)) >= 0:
        ends.append(hit + 16)
        pos = hit + 16
    return header_end, ends


def sealed(tmp_path, name: str, plain: bytes) -> tuple:
    path = tmp_path / name
    path.write_bytes(ags1.encrypt(plain, KEY, AAD))
    return path, StandardKeyMetadata(KEY, AAD, path.stat().st_size)


def all_readers(path, km):
    """Each public reader, run to the end."""
    yield "read", lambda: avro.read(path, km)
    yield "read_records", lambda: list(avro.read_records(path, km))
    yield "read_split", lambda: list(avro.read_split(path, km, 0, avro.plaintext_size(km)))
    yield "read_schema", lambda: avro.read_schema(path, km)


def damaged_plaintexts():
    good = container()
    header_end, ends = layout(good)
    yield "bad-magic", b"Obj\x02" + good[4:], True
    yield "not-avro", b"PAR1" + bytes(100), True
    yield "empty", b"", True
    yield "header-cut", good[:10], True
    yield "header-sync-cut", good[: header_end - 1], True
    yield "schema-not-json", _replace_meta(good, "avro.schema", b"{nope"), True
    yield "unknown-codec", _replace_meta(good, "avro.codec", b"brotli"), True
    yield "block-cut", good[: header_end + 5], False
    yield "last-sync-cut", good[:-1], False
    yield "mid-block-cut", good[: ends[2] - 100], False
    bad_sync = bytearray(good)
    bad_sync[ends[1] - 3] ^= 0x40
    yield "bad-sync", bytes(bad_sync), False
    negative = bytearray(good)
    negative[ends[0]] = 0x01  # block count -1
    yield "negative-count", bytes(negative), False
    huge = bytearray(good)
    huge[ends[0] : ends[0] + 1] = b"\x02\xfe\xff\xff\xff\x0f"  # count 1, size ~2**31: past the end
    yield "size-past-end", bytes(huge), False
    deflated = container("deflate")
    _d_end, d_ends = layout(deflated)
    garbage = bytearray(deflated)
    for k in range(d_ends[0] + 4, d_ends[0] + 40):
        garbage[k] ^= 0xA5
    yield "deflate-garbage", bytes(garbage), False


def _replace_meta(plain: bytes, key: str, value: bytes) -> bytes:
    """The container with one header metadata value replaced (same sync and blocks)."""
    header_end, _ = layout(plain)
    parsed = fastavro.reader(io.BytesIO(plain))._header
    meta = dict(parsed["meta"], **{key: value})
    return Header(meta, None, "null", parsed["sync"], header_end).encode() + plain[header_end:]


@pytest.mark.parametrize(("case", "plain", "in_header"), [pytest.param(*c, id=c[0]) for c in damaged_plaintexts()])
def test_damaged_avro_inside_valid_ags1(tmp_path, case, plain, in_header):
    path, km = sealed(tmp_path, f"{case}.avro", plain)
    for name, run in all_readers(path, km):
        if name == "read_schema" and not in_header:
            run()  # the header is intact: the schema reads
            continue
        with pytest.raises(icecrypt.FormatError, match=f"{case}.avro") as info:
            run()
        assert KEY.hex() not in str(info.value)


def test_wrong_key_and_aad(tmp_path):
    path, km = sealed(tmp_path, "k.avro", container())
    for bad in (StandardKeyMetadata(bytes(16), AAD, km.file_length), StandardKeyMetadata(KEY, b"x", km.file_length),
                StandardKeyMetadata(KEY, None, km.file_length)):
        for name, run in all_readers(path, bad):
            with pytest.raises(icecrypt.AuthenticationError, match="k.avro"):
                run()


def two_block_file(tmp_path):
    plain = container(n=120_000)
    assert len(plain) > ags1.PLAIN_BLOCK_SIZE
    return sealed(tmp_path, "two.avro", plain)


def test_tampered_later_block(tmp_path):
    path, km = two_block_file(tmp_path)
    data = bytearray(path.read_bytes())
    data[ags1.HEADER_LENGTH + ags1.CIPHER_BLOCK_SIZE + 100] ^= 1  # inside AGS1 block 1
    path.write_bytes(bytes(data))
    with pytest.raises(icecrypt.AuthenticationError, match="two.avro"):
        avro.read(path, km)
    with pytest.raises(icecrypt.AuthenticationError, match="two.avro"):
        list(avro.read_records(path, km))
    with pytest.raises(icecrypt.AuthenticationError, match="two.avro"):
        list(avro.read_split(path, km, ags1.PLAIN_BLOCK_SIZE, 1000))
    # a split that lives in block 0 reads, having authenticated everything it returns
    stats = avro.ReadStats()
    rows = pa.Table.from_batches(list(avro.read_split(path, km, 0, 10_000, stats=stats)))
    assert rows.num_rows > 0 and stats.blocks == [0]
    assert avro.read_schema(path, km).names == ["i", "s"]


def test_truncated_ciphertext(tmp_path):
    path, km = two_block_file(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:-1])
    with pytest.raises(icecrypt.FormatError, match="two.avro"):
        avro.read(path, km)
    # a whole trailing AGS1 block dropped, and no trusted length to notice it: the Avro
    # layer still finds the file truncated
    path.write_bytes(data[: ags1.HEADER_LENGTH + ags1.CIPHER_BLOCK_SIZE])
    with pytest.raises(icecrypt.FormatError, match="two.avro.*truncated"):
        avro.read(path, km.with_file_length(None))
    path.write_bytes(data + b"junk")
    with pytest.raises(icecrypt.FormatError, match="two.avro"):
        avro.read(path, km)


def test_plaintext_file_is_refused(tmp_path):
    path = tmp_path / "plain.avro"
    path.write_bytes(container())
    km = StandardKeyMetadata(KEY, AAD)
    for name, run in all_readers(path, km.with_file_length(path.stat().st_size)):
        if name == "read_split":
            continue  # plaintext_size of a non-AGS1 length is itself refused below
        with pytest.raises(icecrypt.FormatError, match="plain.avro"):
            run()
    with pytest.raises(icecrypt.FormatError, match="plain.avro"):
        list(avro.read_split(path, km, 0, 100))


def test_bad_key_metadata(tmp_path):
    path, km = sealed(tmp_path, "m.avro", container())
    with pytest.raises(ValueError, match="m.avro.*no key metadata"):
        avro.read(path, None)
    with pytest.raises(ValueError, match="no key metadata"):
        avro.read_split(path, None, 0, 10)
    with pytest.raises(icecrypt.FormatError, match="m.avro.*malformed key metadata"):
        avro.read_schema(path, b"\x01")
    with pytest.raises(icecrypt.FormatError, match="m.avro.*unusable key"):
        avro.read(path, StandardKeyMetadata(b"short", AAD, km.file_length))
    with pytest.raises(TypeError):
        avro.read(path, "key")
    with pytest.raises(ValueError, match="file_length"):
        avro.plaintext_size(km.with_file_length(None))
    assert avro.plaintext_size(km) == avro.plaintext_size(km.file_length) == len(container())


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        avro.read(tmp_path / "absent.avro", StandardKeyMetadata(KEY, AAD, 100))


def test_header_only_file(tmp_path):
    """A valid file without records reads as an empty table of its schema."""
    buf = io.BytesIO()
    fastavro.writer(buf, SCHEMA, [])
    path, km = sealed(tmp_path, "empty.avro", buf.getvalue())
    table = avro.read(path, km)
    assert table.num_rows == 0 and table.schema.names == ["i", "s"]
    assert json.loads(avro.read_records(path, km).metadata["avro.schema"]) == SCHEMA


@pytest.mark.parametrize("damage", ["flip-header", "flip-tag", "cut", "extend", "length-lies"])
def test_one_block_file_read_whole(tmp_path, damage):
    """A one-block file (a manifest) is read and decrypted in one call: any damage falls
    back to the block reader, which names the file and the fault; nothing is yielded."""
    path, km = sealed(tmp_path, "small.avro", container(n=200))
    data = bytearray(path.read_bytes())
    expected = icecrypt.AuthenticationError
    if damage == "flip-header":
        data[ags1.HEADER_LENGTH + 20] ^= 1
    elif damage == "flip-tag":
        data[-1] ^= 0x80
    elif damage == "cut":
        del data[-1]
        expected = icecrypt.FormatError
    elif damage == "extend":
        data += b"\0"
        expected = icecrypt.FormatError
    else:
        km = km.with_file_length(km.file_length - 1)
        expected = icecrypt.FormatError
    path.write_bytes(bytes(data))
    records = None
    with pytest.raises(expected, match="small.avro"):
        records = list(avro.read_records(path, km))
    assert records is None
